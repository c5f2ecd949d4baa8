// softmax_matmul forward, float16 (kernel.cuh): mma.sync m16n8k16, f32 accumulation.
#include "cuda/families/softmax_matmul/kernel.cuh"

namespace softmax_ext::smm::cuda {
void launch_f16(const Args& a, int warps, int bn) {
  launch_tile<__half, kHalfMode>(a, warps, bn);
}
}  // namespace softmax_ext::smm::cuda
