// softmax_matmul forward, bfloat16 (kernel.cuh): mma.sync m16n8k16, f32 accumulation.
#include "cuda/families/softmax_matmul/kernel.cuh"

namespace softmax_ext::smm::cuda {
void launch_bf16(const Args& a, int warps, int bn) {
  launch_tile<__nv_bfloat16, kHalfMode>(a, warps, bn);
}
}  // namespace softmax_ext::smm::cuda
