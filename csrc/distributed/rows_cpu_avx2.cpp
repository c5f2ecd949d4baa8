// The AVX2 build of the sharded-axis CPU kernels (AVX2 + FMA + F16C).

#include "cpu/isa.h"

#if SOFTMAX_EXT_CPU_X86
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#include "distributed/rows.h"

#include "cpu/x86_build.h"
#include "distributed/rows_cpu_kernels.h"
#endif
