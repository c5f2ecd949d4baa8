// The AVX-512 build of the CPU kernels (F, BW, VL, DQ + FMA, the set torch's
// AVX512 level requires); see x86_build.h.

#include "cpu/isa.h"

#if SOFTMAX_EXT_CPU_X86
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#include "cpu/x86_build.h"
#include "cpu/kernels.h"
#endif
