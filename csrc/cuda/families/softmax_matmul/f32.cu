// softmax_matmul forward, float32 (kernel.cuh): TF32 mma.sync m16n8k8 when
// TF32 is allowed, else the 3xTF32 split (float32-accurate).
#include "cuda/families/softmax_matmul/kernel.cuh"

#include <cuda_runtime.h>

namespace softmax_ext::smm::cuda {
void launch_f32(const Args& a, int warps, int bn, bool split3) {
  if (split3) launch_tile<float, kSplit3Mode>(a, warps, bn);
  else launch_tile<float, kTF32Mode>(a, warps, bn);
}
}  // namespace softmax_ext::smm::cuda
