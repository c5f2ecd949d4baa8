// run(): hands a selected plan to its kernel family (CPU or CUDA launcher).

#include "plan/plan.h"

#include "cpu/softmax_cpu.h"
#ifdef SOFTMAX_EXT_WITH_CUDA
#include "cuda/launch.h"
#endif

#include <c10/util/Exception.h>

namespace softmax_ext {

void run(const Plan& plan, const Buffers& buffers, void* /*workspace*/) {
  const Problem& p = plan.problem;
  if (p.numel() == 0) return;
  switch (plan.family) {
    case KernelFamily::kCpuLastDim: return cpu::run_lastdim(p, buffers);
    case KernelFamily::kCpuInner: return cpu::run_inner(p, buffers);
    case KernelFamily::kCpuStrided: return cpu::run_strided(p, buffers);
    case KernelFamily::kCudaReference:
#ifdef SOFTMAX_EXT_WITH_CUDA
      return p.is_backward() ? cuda::reference_backward(p, buffers)
                             : cuda::reference_forward(p, buffers);
#else
      break;
#endif
  }
  TORCH_INTERNAL_ASSERT(false, "softmax_ext: plan names kernel ", plan.kernel,
                        " which this build does not contain");
}

}  // namespace softmax_ext
