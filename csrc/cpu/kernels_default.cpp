// The DEFAULT build of the CPU kernels: the extension's baseline flags, where
// at::vec::Vectorized is ATen's portable array implementation. Runs on any
// CPU; chosen when no x86 build applies (softmax_cpu.cpp, cpu_isa).

#define CPU_CAPABILITY DEFAULT
#define CPU_CAPABILITY_DEFAULT

#include "cpu/baseline_includes.h"

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include "cpu/kernels.h"
