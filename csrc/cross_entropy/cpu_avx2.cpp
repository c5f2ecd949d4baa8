// The AVX2 build of the cross-entropy CPU kernels (AVX2 + FMA + F16C).

#include "cpu/isa.h"

#if SOFTMAX_EXT_CPU_X86
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#include "cross_entropy/plan.h"

#include <atomic>  // (read at the baseline ISA: see cpu/x86_build.h)

#include "cpu/x86_build.h"
#include "cross_entropy/cpu_kernels.h"
#endif
