// run_cpu: the sharded-axis CPU kernels (rows_cpu_kernels.h) of the widest
// instruction-set build this CPU and ATen's dispatch level allow (the
// softmax kernels' choice, cpu/isa.h).

#include "cpu/isa.h"
#include "distributed/rows.h"

namespace softmax_ext::distributed {

#define SOFTMAX_EXT_ROWS_DECLARE(ISA) \
  namespace ISA {                     \
  void run(const RowsPlan& plan, const RowsBuffers& buffers); \
  }
SOFTMAX_EXT_ROWS_DECLARE(DEFAULT)
#if SOFTMAX_EXT_CPU_X86
SOFTMAX_EXT_ROWS_DECLARE(AVX2)
SOFTMAX_EXT_ROWS_DECLARE(AVX512)
#endif
#undef SOFTMAX_EXT_ROWS_DECLARE

void run_cpu(const RowsPlan& plan, const RowsBuffers& buffers) {
#if SOFTMAX_EXT_CPU_X86
  switch (cpu::cpu_isa()) {
    case cpu::Isa::kAvx512: return AVX512::run(plan, buffers);
    case cpu::Isa::kAvx2: return AVX2::run(plan, buffers);
    case cpu::Isa::kDefault: break;
  }
#endif
  DEFAULT::run(plan, buffers);
}

}  // namespace softmax_ext::distributed
