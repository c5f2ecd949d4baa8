// The DEFAULT build of the cross-entropy CPU kernels (baseline flags, ATen's
// portable Vectorized); runs on any CPU.

#define CPU_CAPABILITY DEFAULT
#define CPU_CAPABILITY_DEFAULT

#include "cpu/baseline_includes.h"

#include "cross_entropy/cpu_kernels.h"
