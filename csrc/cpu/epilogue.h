// What differs between softmax and log_softmax, as functors over
// V = at::vec::Vectorized<acc_t>. Every kernel family runs the same passes
// and calls these at the points where the two differ.
//
// Forward<K, kFastExp> (kFastExp picks the exp, see numerics.h), per row,
// after max m and s = sum(exp(x - m)):
//   c = finish(s)                     softmax: 1 / s   log_softmax: log(s)
//   y = apply(x, m, c)                exp(x - m) * c   (x - m) - c   (torch's order)
//   y = from_exp(e, c), e = exp(x-m)  softmax only, when pass 2 cached e
// Backward<K, kFastExp>, per row, s = sum(term(dy, y)):
//   dx = apply(dy, y, s)              y * (dy - s)     dy - exp(y) * s
#pragma once

#ifndef CPU_CAPABILITY
#error "include from a per-ISA TU (kernels_*.cpp) that defines CPU_CAPABILITY"
#endif

#include "cpu/numerics.h"
#include "plan/problem.h"

#include <cmath>

namespace softmax_ext::cpu::CPU_CAPABILITY {

// kFastExp: which exp computes exp(x - m) (numerics.h, exp_shifted).
template <bool kFastExp>
struct ForwardExp {
  template <typename V>
  static V exp(const V& shifted) { return exp_shifted<kFastExp>(shifted); }
};

template <Kind K, bool kFastExp>
struct Forward;

template <bool kFastExp>
struct Forward<Kind::Softmax, kFastExp> : ForwardExp<kFastExp> {
  using ForwardExp<kFastExp>::exp;
  // Pass 2 computes e = exp(x - m) anyway; keeping it saves an exp in pass 3.
  static constexpr bool kCachesExp = true;
  // Multiplying by the reciprocal, as torch's CPU kernel does: a vector
  // division costs several times a multiplication (and, with the exp, most
  // of the last pass), for at most one more rounding (<= 1.5 ulp in all).
  template <typename V>
  static V finish(const V& sum) { return V(typename V::value_type(1)) / sum; }
  // The same for one row's sum.
  template <typename V>
  static V finish_row(typename V::value_type sum) { return V(typename V::value_type(1) / sum); }
  template <typename V>
  static V apply(const V& x, const V& max, const V& c) { return exp(x - max) * c; }
  template <typename V>
  static V from_exp(const V& e, const V& c) { return e * c; }
};

template <bool kFastExp>
struct Forward<Kind::LogSoftmax, kFastExp> : ForwardExp<kFastExp> {
  static constexpr bool kCachesExp = false;
  template <typename V>
  static V finish(const V& sum) { return vlog(sum); }
  // One row's sum: the scalar log (correctly rounded in glibc) rather than a
  // vector log call for one value, which short rows would pay per row.
  template <typename V>
  static V finish_row(typename V::value_type sum) { return V(std::log(sum)); }
  template <typename V>
  static V apply(const V& x, const V& max, const V& c) { return (x - max) - c; }
  template <typename V>
  static V from_exp(const V& e, const V& c) = delete;
};

// kFastExp (16-bit gradients): log_softmax's exp(y) by exp_shifted's fast
// exp, whose error vanishes in the rounding of dx to 8 or 11 bits (y, a
// log-probability, is <= 0 as exp_shifted's argument).
template <Kind K, bool kFastExp = false>
struct Backward;

template <bool kFastExp>
struct Backward<Kind::Softmax, kFastExp> {
  template <typename V>
  static V term(const V& dy, const V& y) { return dy * y; }
  template <typename V>
  static V apply(const V& dy, const V& y, const V& s) { return y * (dy - s); }
};

template <bool kFastExp>
struct Backward<Kind::LogSoftmax, kFastExp> {
  template <typename V>
  static V term(const V& dy, const V& /*y*/) { return dy; }
  template <typename V>
  static V apply(const V& dy, const V& y, const V& s) { return dy - exp_shifted<kFastExp>(y) * s; }
};

}  // namespace softmax_ext::cpu::CPU_CAPABILITY
