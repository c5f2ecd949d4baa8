// The CPU kernels are compiled once per instruction set, each build in its own
// namespace softmax_ext::cpu::<ISA> (kernels.h is the one body they share):
//
//   DEFAULT  kernels_default.cpp  baseline flags; runs everywhere
//   AVX2     kernels_avx2.cpp     AVX2 + FMA + F16C         (x86-64, GCC)
//   AVX512   kernels_avx512.cpp   AVX-512 F/BW/VL/DQ + FMA  (x86-64, GCC)
//
// softmax_cpu.cpp picks one at run time (cpu_isa). Nothing here touches
// at::Tensor, so the per-ISA TUs stay free of it.
#pragma once

#include "plan/plan.h"

// Whether the x86 builds exist: they need GCC's `#pragma GCC target`
// (x86_build.h) and __builtin_cpu_supports.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define SOFTMAX_EXT_CPU_X86 1
#else
#define SOFTMAX_EXT_CPU_X86 0
#endif

namespace softmax_ext::cpu {

#define SOFTMAX_EXT_DECLARE_CPU_KERNELS(ISA)                    \
  namespace ISA {                                               \
  void lastdim(const Problem& problem, const Buffers& buffers); \
  void inner(const Problem& problem, const Buffers& buffers);   \
  void strided(const Problem& problem, const Buffers& buffers); \
  }

SOFTMAX_EXT_DECLARE_CPU_KERNELS(DEFAULT)
#if SOFTMAX_EXT_CPU_X86
SOFTMAX_EXT_DECLARE_CPU_KERNELS(AVX2)
SOFTMAX_EXT_DECLARE_CPU_KERNELS(AVX512)
#endif

#undef SOFTMAX_EXT_DECLARE_CPU_KERNELS

enum class Isa { kDefault, kAvx2, kAvx512 };

// The widest build that exists, that the CPU runs, and that ATen's own
// dispatch level allows (ATEN_CPU_CAPABILITY=default / avx2 cap it, as they
// cap torch's kernels). Decided once.
Isa cpu_isa();

}  // namespace softmax_ext::cpu
