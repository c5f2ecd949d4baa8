// The AVX2 build of the CPU kernels (AVX2 + FMA + F16C); see x86_build.h.

#include "cpu/isa.h"

#if SOFTMAX_EXT_CPU_X86
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#include "cpu/x86_build.h"
#include "cpu/kernels.h"
#endif
