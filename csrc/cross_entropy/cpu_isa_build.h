// The prologue of an x86 build of the cross-entropy CPU kernels
// (cpu_avx2.cpp, cpu_avx512.cpp): the same steps as cpu/x86_build.h (see
// there for why each is needed), without its softmax kernel body. Every other
// header comes in while the ISA is still the baseline, then
// `#pragma GCC target` switches code generation to the ISA, sleef.h is read
// with the ISA's macros, and ATen's vector library of that ISA follows.
#pragma once

#if !defined(CPU_CAPABILITY_AVX2) && !defined(CPU_CAPABILITY_AVX512)
#error "define CPU_CAPABILITY and CPU_CAPABILITY_AVX2 or CPU_CAPABILITY_AVX512 first"
#endif

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "cpu/baseline_includes.h"
#include "cross_entropy/plan.h"

#include <atomic>

#if defined(CPU_CAPABILITY_AVX512)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#else
#pragma GCC target("avx2,fma,f16c")
#endif
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
