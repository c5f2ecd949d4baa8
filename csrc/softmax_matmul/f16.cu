// softmax_matmul forward, float16 (kernel.cuh): mma.sync m16n8k16, f32 accumulation.
#include "softmax_matmul/kernel.cuh"

namespace softmax_ext::smm::cuda {
void launch_f16(const Args& a, int bn) {
  if (bn == 64) launch<__half, 64, kHalfMode>(a);
  else launch<__half, 128, kHalfMode>(a);
}
}  // namespace softmax_ext::smm::cuda
