// Elementwise math of the kernels on at::vec::Vectorized<acc_t>.
//
// vmax propagates NaN (std::max / fmax would drop it): a NaN anywhere in a
// row must make the row's max NaN, and then every output of the row NaN.
#pragma once

#ifndef CPU_CAPABILITY
#error "include from a per-ISA TU (kernels_*.cpp) that defines CPU_CAPABILITY"
#endif

#include <ATen/cpu/vec/vec.h>

#include <type_traits>

namespace softmax_ext::cpu::CPU_CAPABILITY {

template <typename T>
using Vec = at::vec::Vectorized<T>;

// Accumulator for an output dtype: double for double, float otherwise.
template <typename out_t>
using acc_type_t = std::conditional_t<std::is_same_v<out_t, double>, double, float>;

template <typename T>
inline Vec<T> vmax(const Vec<T>& a, const Vec<T>& b) {
  return at::vec::maximum(a, b);
}

template <typename T>
inline Vec<T> vexp(const Vec<T>& x) {
  return x.exp();
}

// exp(x - max), whose argument is <= 0 or NaN. kFast (used when the output
// is 16-bit) takes ATen's polynomial exp_u20, several times faster than
// Sleef's exp: its error (tens of float ulps, more only where the result is
// below 1e-37 and adds nothing to the sum) vanishes in rounding to 8 or 11
// bits. Float and double outputs keep Sleef's exp (1 ulp), like torch.
// exp_u20 turns NaN into inf, so NaN lanes are put back.
template <bool kFast, typename T>
inline Vec<T> exp_shifted(const Vec<T>& x) {
  if constexpr (kFast) {
    return Vec<T>::blendv(x.exp_u20(), x, x.isnan());
  } else {
    return x.exp();
  }
}

template <typename T>
inline Vec<T> vlog(const Vec<T>& x) {
  return x.log();
}

}  // namespace softmax_ext::cpu::CPU_CAPABILITY
