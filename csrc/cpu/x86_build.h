// The prologue of an x86 build of CPU kernels (cpu/kernels_avx2.cpp,
// cpu/kernels_avx512.cpp, cross_entropy/cpu_avx2.cpp, ...), which define
// CPU_CAPABILITY and CPU_CAPABILITY_<ISA>, include the headers of their own
// that declare the kernels' interface (read at the baseline ISA), then this,
// once, and then their kernel bodies.
//
// Every .cpp of the extension is compiled with the same flags (setup.py), so
// these TUs cannot get -mavx2 / -mavx512f. They switch the instruction set
// themselves:
//
//  1. CPU_CAPABILITY selects ATen's matching vector library, in namespace
//     at::vec::<ISA> (as in torch's own per-ISA builds).
//  2. baseline_includes.h brings in every other header while the ISA is
//     still the baseline, so no inline function of torch, c10 or the
//     standard library gets an AVX body here (see that file for why).
//  3. `#pragma GCC target` makes GCC generate code for the ISA for every
//     function defined after it: at::vec::<ISA> and the kernels, which live
//     in softmax_ext::cpu::<ISA>. The flags are torch's for that level.
//  4. GCC's C++ front end does not define __AVX__, __AVX2__, __FMA__ or
//     __AVX512F__ for a target pragma (it lexes the TU before pragmas
//     apply), and sleef.h declares its 256/512-bit functions (exp, log) only
//     under them. They are defined around sleef.h alone (and restored after,
//     so a -march build that predefines them keeps its own).
// No static initialiser follows the pragma, so loading the library never
// runs AVX code; softmax_cpu.cpp calls into a build only after checking the
// CPU.
#pragma once

#if !defined(CPU_CAPABILITY_AVX2) && !defined(CPU_CAPABILITY_AVX512)
#error "define CPU_CAPABILITY and CPU_CAPABILITY_AVX2 or CPU_CAPABILITY_AVX512 first"
#endif

// GCC 12 reports the self-initialised `__m512 __Y = __Y` of its own
// _mm512_undefined_ps as uninitialised wherever it is inlined. The warning is
// placed at the intrinsics header, so it must be off before that is read.
// (The same kernel code still gets these warnings in the DEFAULT build.)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "cpu/baseline_includes.h"

#if defined(CPU_CAPABILITY_AVX512)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#else
#pragma GCC target("avx2,fma,f16c")
#endif
// GCC notes that wide vector arguments pass differently with AVX on; every
// function taking them is defined below, with the same ISA, so they agree.
#pragma GCC diagnostic ignored "-Wpsabi"

#pragma push_macro("__AVX__")
#pragma push_macro("__AVX2__")
#pragma push_macro("__FMA__")
#pragma push_macro("__AVX512F__")
#define __AVX__ 1
#define __AVX2__ 1
#define __FMA__ 1
#if defined(CPU_CAPABILITY_AVX512)
#define __AVX512F__ 1
#endif
#include <sleef.h>
#pragma pop_macro("__AVX__")
#pragma pop_macro("__AVX2__")
#pragma pop_macro("__FMA__")
#pragma pop_macro("__AVX512F__")

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
