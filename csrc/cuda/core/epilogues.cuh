// Epilogues: softmax and log_softmax share every kernel body; the kernel
// takes the epilogue as a template template parameter, Epilogue<acc_t>.
#pragma once

#include "cuda/core/numerics.cuh"

#include <type_traits>

namespace softmax_ext::cuda {

// Forward: built once per row from the row max and sum(exp(x - max)), then
// applied to every element. Edge cases fall out of x - max: a NaN max (NaN in
// the row), -inf - -inf (all -inf row) and inf - inf (+inf in the row) all
// give NaN sums, hence NaN rows. Subtracting the max first keeps inputs near
// the float limits from overflowing.
// One division per row: elements are scaled by 1 / sum (within an ulp of a
// per-element division, and no division subroutine in the register-bound
// kernels).
//
// operator()(x) computes the output from x (reference, split and strided
// kernels, and packed rows, which take each exp twice). The warp, block and
// cluster kernels take each exp once: they keep `kept` = exp(x - local_max)
// in place of x when kKeepsExp (softmax), where local_max is the max over
// the values the thread (or its lane group) saw, and finish with
// finish(kept, scale_from(local_max)); log_softmax keeps x itself.
template <typename acc_t, typename ExpPolicy = AccurateExp>
struct SoftmaxForwardEpilogue {
  using Exp = ExpPolicy;
  static constexpr bool kKeepsExp = true;
  acc_t max;
  acc_t inv_sum;
  SoftmaxForwardEpilogue() = default;
  __device__ __forceinline__ SoftmaxForwardEpilogue(acc_t row_max, acc_t row_sum)
      : max(row_max), inv_sum(acc_t(1) / row_sum) {}
  __device__ __forceinline__ acc_t operator()(acc_t x) const {
    return Exp::exp(x - max) * inv_sum;
  }
  // exp(local_max - max) / sum; 1 / sum when local_max is the row max. A
  // NaN or all -inf row gives NaN, as operator() would.
  __device__ __forceinline__ acc_t scale_from(acc_t local_max) const {
    return Exp::exp(local_max - max) * inv_sum;
  }
  __device__ __forceinline__ acc_t finish(acc_t kept, acc_t scale) const { return kept * scale; }
};

template <typename acc_t, typename ExpPolicy = AccurateExp>
struct LogSoftmaxForwardEpilogue {
  using Exp = ExpPolicy;
  static constexpr bool kKeepsExp = false;
  acc_t max;
  acc_t log_sum;
  LogSoftmaxForwardEpilogue() = default;
  __device__ __forceinline__ LogSoftmaxForwardEpilogue(acc_t row_max, acc_t row_sum)
      : max(row_max), log_sum(acc_log(row_sum)) {}
  // (x - max) first: no rounding of max + log(sum) for large max, and no
  // overflow when max is near the float limit.
  __device__ __forceinline__ acc_t operator()(acc_t x) const {
    return (x - max) - log_sum;
  }
  __device__ __forceinline__ acc_t scale_from(acc_t) const { return acc_t(0); }
  __device__ __forceinline__ acc_t finish(acc_t x, acc_t) const { return (*this)(x); }
};

// Backward: the row sums reduce_term(dy, y); the epilogue, built from that
// sum, gives dx. kReduceReadsY lets a kernel skip loading y in the reduction
// pass when the term does not use it.
template <typename acc_t>
struct SoftmaxBackwardEpilogue {
  static constexpr bool kReduceReadsY = true;
  __device__ static __forceinline__ acc_t reduce_term(acc_t dy, acc_t y) { return dy * y; }

  acc_t sum;  // sum(dy * y)
  SoftmaxBackwardEpilogue() = default;
  __device__ __forceinline__ explicit SoftmaxBackwardEpilogue(acc_t row_sum) : sum(row_sum) {}
  __device__ __forceinline__ acc_t operator()(acc_t dy, acc_t y) const {
    return y * (dy - sum);
  }
};

template <typename acc_t, typename ExpPolicy = AccurateExp>
struct LogSoftmaxBackwardEpilogue {
  static constexpr bool kReduceReadsY = false;
  __device__ static __forceinline__ acc_t reduce_term(acc_t dy, acc_t) { return dy; }

  acc_t sum;  // sum(dy)
  LogSoftmaxBackwardEpilogue() = default;
  __device__ __forceinline__ explicit LogSoftmaxBackwardEpilogue(acc_t row_sum)
      : sum(row_sum) {}
  __device__ __forceinline__ acc_t operator()(acc_t dy, acc_t y) const {
    return dy - ExpPolicy::exp(y) * sum;
  }
};

template <typename out_t>
using exp_policy_t = std::conditional_t<is_reduced_float_v<out_t>, FastExp, AccurateExp>;

// The epilogues of one kind, so host code can pick them with one switch:
// dispatch_kind(kind, [&](auto e) { kernel<decltype(e)::template Forward, ...> }).
// ForwardFor<out_t>::type is the forward epilogue with out_t's exp policy,
// BackwardFor<scalar_t>::type the backward one with scalar_t's.
struct SoftmaxEpilogues {
  template <typename acc_t>
  using Forward = SoftmaxForwardEpilogue<acc_t>;
  template <typename out_t>
  struct ForwardFor {
    template <typename acc_t>
    using type = SoftmaxForwardEpilogue<acc_t, exp_policy_t<out_t>>;
  };
  template <typename scalar_t>
  struct BackwardFor {
    template <typename acc_t>
    using type = SoftmaxBackwardEpilogue<acc_t>;
  };
};
struct LogSoftmaxEpilogues {
  template <typename acc_t>
  using Forward = LogSoftmaxForwardEpilogue<acc_t>;
  template <typename out_t>
  struct ForwardFor {
    template <typename acc_t>
    using type = LogSoftmaxForwardEpilogue<acc_t, exp_policy_t<out_t>>;
  };
  template <typename scalar_t>
  struct BackwardFor {
    template <typename acc_t>
    using type = LogSoftmaxBackwardEpilogue<acc_t, exp_policy_t<scalar_t>>;
  };
};

}  // namespace softmax_ext::cuda
