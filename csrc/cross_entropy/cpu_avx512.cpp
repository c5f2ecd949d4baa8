// The AVX-512 build of the cross-entropy CPU kernels (F/BW/VL/DQ + FMA).

#include "cpu/isa.h"

#if SOFTMAX_EXT_CPU_X86
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#include "cross_entropy/plan.h"

#include <atomic>  // (read at the baseline ISA: see cpu/x86_build.h)

#include "cpu/x86_build.h"
#include "cross_entropy/cpu_kernels.h"
#endif
