// softmax_matmul forward, bfloat16 (kernel.cuh): mma.sync m16n8k16, f32 accumulation.
#include "softmax_matmul/kernel.cuh"

namespace softmax_ext::smm::cuda {
void launch_bf16(const Args& a, int bn) {
  if (bn == 64) launch<__nv_bfloat16, 64, kHalfMode>(a);
  else launch<__nv_bfloat16, 128, kHalfMode>(a);
}
}  // namespace softmax_ext::smm::cuda
