// The AVX-512 build of the sharded-axis CPU kernels (F/BW/VL/DQ + FMA).

#include "cpu/isa.h"

#if SOFTMAX_EXT_CPU_X86
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#include "distributed/rows.h"

#include "cpu/x86_build.h"
#include "distributed/rows_cpu_kernels.h"
#endif
