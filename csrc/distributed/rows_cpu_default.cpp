// The DEFAULT build of the sharded-axis CPU kernels (baseline flags, ATen's
// portable Vectorized); runs on any CPU.

#define CPU_CAPABILITY DEFAULT
#define CPU_CAPABILITY_DEFAULT

#include "cpu/baseline_includes.h"

#include "distributed/rows_cpu_kernels.h"
