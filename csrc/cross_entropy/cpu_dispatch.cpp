// cpu_forward / cpu_backward: the cross-entropy CPU kernels of the widest
// instruction-set build this CPU and ATen's dispatch level allow (the
// softmax kernels' choice, cpu/isa.h).

#include "cpu/isa.h"
#include "cross_entropy/plan.h"

namespace softmax_ext::ce {

#define SOFTMAX_EXT_CE_DECLARE(ISA)                                                                 \
  namespace ISA {                                                                                   \
  bool forward(const CePlan& plan, const CeBuffers& buffers, void* workspace, int64_t& bad_target); \
  bool backward(const CePlan& plan, const CeBuffers& buffers, int64_t& bad_target);                 \
  }
SOFTMAX_EXT_CE_DECLARE(DEFAULT)
#if SOFTMAX_EXT_CPU_X86
SOFTMAX_EXT_CE_DECLARE(AVX2)
SOFTMAX_EXT_CE_DECLARE(AVX512)
#endif
#undef SOFTMAX_EXT_CE_DECLARE

bool cpu_forward(const CePlan& plan, const CeBuffers& buffers, void* workspace, int64_t& bad_target) {
#if SOFTMAX_EXT_CPU_X86
  switch (cpu::cpu_isa()) {
    case cpu::Isa::kAvx512: return AVX512::forward(plan, buffers, workspace, bad_target);
    case cpu::Isa::kAvx2: return AVX2::forward(plan, buffers, workspace, bad_target);
    case cpu::Isa::kDefault: break;
  }
#endif
  return DEFAULT::forward(plan, buffers, workspace, bad_target);
}

bool cpu_backward(const CePlan& plan, const CeBuffers& buffers, int64_t& bad_target) {
#if SOFTMAX_EXT_CPU_X86
  switch (cpu::cpu_isa()) {
    case cpu::Isa::kAvx512: return AVX512::backward(plan, buffers, bad_target);
    case cpu::Isa::kAvx2: return AVX2::backward(plan, buffers, bad_target);
    case cpu::Isa::kDefault: break;
  }
#endif
  return DEFAULT::backward(plan, buffers, bad_target);
}

}  // namespace softmax_ext::ce
