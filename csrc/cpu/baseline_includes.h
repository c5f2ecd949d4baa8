// Every header the kernels need apart from ATen's vector library, for a
// per-ISA TU to include BEFORE it switches the instruction set.
//
// Why: inline functions and templates of these headers are emitted as weak
// symbols in every TU that uses them, and the linker keeps one copy. If they
// were first seen after `#pragma GCC target("avx2")` (x86_build.h), the
// kept copy could be the AVX2 one, and the DEFAULT build would then execute
// AVX2 code on a CPU without it. Compiled here, they get the baseline ISA in
// every TU. The vector library (at::vec) is not listed: it lives in a
// namespace named after the ISA (CPU_CAPABILITY), so each build gets its own
// copy by name.
#pragma once

#include "cpu/heuristics.h"
#include "cpu/isa.h"
#include "plan/plan.h"
#include "plan/problem.h"

#include <ATen/AccumulateType.h>
#include <ATen/NumericUtils.h>
#include <ATen/Parallel.h>
#include <ATen/native/Math.h>
#include <ATen/native/quantized/AffineQuantizerBase.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <c10/util/Load.h>
#include <c10/util/TypeCast.h>
#include <c10/util/complex.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <tuple>
#include <type_traits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
