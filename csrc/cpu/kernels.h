// The entry points of one instruction-set build (isa.h), defined in
// softmax_ext::cpu::CPU_CAPABILITY. Included exactly once, by the TU of that
// build (kernels_default.cpp, or kernels_avx2.cpp / kernels_avx512.cpp
// through x86_build.h), after it has set up the ISA.
#pragma once

#ifndef CPU_CAPABILITY
#error "include from a per-ISA TU (kernels_*.cpp) that defines CPU_CAPABILITY"
#endif

#include "cpu/dtype_dispatch.h"
#include "cpu/inner_kernel.h"
#include "cpu/lastdim_kernel.h"
#include "cpu/strided_kernel.h"

namespace softmax_ext::cpu::CPU_CAPABILITY {

void lastdim(const Problem& problem, const Buffers& buffers) {
  dispatch<LastDim>(problem, buffers);
}

void inner(const Problem& problem, const Buffers& buffers) {
  dispatch<Inner>(problem, buffers);
}

void strided(const Problem& problem, const Buffers& buffers) {
  dispatch<Strided>(problem, buffers);
}

}  // namespace softmax_ext::cpu::CPU_CAPABILITY
