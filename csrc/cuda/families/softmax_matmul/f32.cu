// softmax_matmul forward, float32 (kernel.cuh): TF32 mma.sync m16n8k8 when
// TF32 is allowed, else the 3xTF32 split (float32-accurate), plus the
// device-arch query the plan uses.
#include "cuda/families/softmax_matmul/kernel.cuh"

#include <cuda_runtime.h>

namespace softmax_ext::smm::cuda {
void launch_f32(const Args& a, int warps, int bn, bool split3) {
  if (split3) launch_tile<float, kSplit3Mode>(a, warps, bn);
  else launch_tile<float, kTF32Mode>(a, warps, bn);
}

int device_arch(int device) {
  int major = 0, minor = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor;
}
}  // namespace softmax_ext::smm::cuda
