// The CPU entry points: pick the instruction-set build, then run it.

#include "cpu/softmax_cpu.h"

#include "cpu/isa.h"

#include <ATen/Version.h>

#include <string>

namespace softmax_ext::cpu {

Isa cpu_isa() {
#if SOFTMAX_EXT_CPU_X86
  static const Isa isa = [] {
    __builtin_cpu_init();
    const std::string level = at::get_cpu_capability();  // "DEFAULT", "AVX2", "AVX512"
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                      __builtin_cpu_supports("f16c");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                        __builtin_cpu_supports("avx512dq");
    if (avx512 && level == "AVX512") return Isa::kAvx512;
    if (avx2 && (level == "AVX2" || level == "AVX512")) return Isa::kAvx2;
    return Isa::kDefault;
  }();
  return isa;
#else
  return Isa::kDefault;
#endif
}

// Calls ISA::fn(problem, buffers) for the selected build.
#if SOFTMAX_EXT_CPU_X86
#define SOFTMAX_EXT_RUN_CPU(fn)                                            \
  switch (cpu_isa()) {                                                     \
    case Isa::kAvx512: return AVX512::fn(problem, buffers);                \
    case Isa::kAvx2: return AVX2::fn(problem, buffers);                    \
    case Isa::kDefault: break;                                             \
  }                                                                        \
  return DEFAULT::fn(problem, buffers)
#else
#define SOFTMAX_EXT_RUN_CPU(fn) return DEFAULT::fn(problem, buffers)
#endif

void run_lastdim(const Problem& problem, const Buffers& buffers) {
  SOFTMAX_EXT_RUN_CPU(lastdim);
}

void run_inner(const Problem& problem, const Buffers& buffers) {
  SOFTMAX_EXT_RUN_CPU(inner);
}

void run_strided(const Problem& problem, const Buffers& buffers) {
  SOFTMAX_EXT_RUN_CPU(strided);
}

#undef SOFTMAX_EXT_RUN_CPU

}  // namespace softmax_ext::cpu
