// Deterministic reductions: across the lanes of a (sub-)warp and across a
// block of any size, of scalars and of (max, sum) partials. Every
// combination happens in a fixed order, so results are bit-identical from
// run to run; nothing here uses atomics. Across the blocks of a cluster:
// cluster.cuh.
#pragma once

#include "cuda/core/budget.h"
#include "cuda/core/numerics.cuh"

namespace softmax_ext::cuda {

// Partial softmax statistics of part of a row: its max and sum(exp(x - max)).
template <typename acc_t>
struct MaxSum {
  acc_t max;
  acc_t sum;
};

// Combines partials in the given order: max first, then every sum rescaled to
// the combined max (a partial with max -inf adds 0; a NaN max poisons all).
template <typename acc_t>
__device__ __forceinline__ acc_t rescaled_sum(const MaxSum<acc_t>& part, acc_t max) {
  return part.max == neg_infinity<acc_t>() ? acc_t(0) : part.sum * acc_exp(part.max - max);
}

template <typename acc_t>
__device__ __forceinline__ MaxSum<acc_t> combine(const MaxSum<acc_t>& a, const MaxSum<acc_t>& b) {
  const acc_t max = NanMax{}(a.max, b.max);
  return {max, rescaled_sum(a, max) + rescaled_sum(b, max)};
}

struct CombineMaxSum {
  template <typename acc_t>
  __device__ __forceinline__ MaxSum<acc_t> operator()(const MaxSum<acc_t>& a, const MaxSum<acc_t>& b) const {
    return combine(a, b);
  }
};

// Per-thread statistics of a register fragment v[k][e] (padding -inf).
template <int kPacks, int P, typename acc_t>
__device__ __forceinline__ acc_t fragment_max(const acc_t (&v)[kPacks][P]) {
  acc_t max = neg_infinity<acc_t>();
#pragma unroll
  for (int k = 0; k < kPacks; ++k)
#pragma unroll
    for (int e = 0; e < P; ++e) max = NanMax{}(max, v[k][e]);
  return max;
}

// sum(exp(v - max)); with kKeepExp the fragment keeps exp(v - max) in place
// of v, so the epilogue needs no second exp (SoftmaxForwardEpilogue).
// Elements equal to -inf add 0: below a max that is not -inf, exp(-inf -
// max) is 0 already, and a max of -inf means every element is -inf (or
// padding), so the fragment contributes (max -inf, sum 0) to the
// combination. A row of only -inf still ends as NaN, as in torch: the
// epilogues compute x - max = NaN. (The strided forward applies the same
// rule per column.)
template <bool kKeepExp, typename Exp, int kPacks, int P, typename acc_t>
__device__ __forceinline__ acc_t fragment_exp_sum(acc_t (&v)[kPacks][P], acc_t max) {
  const bool empty = max == neg_infinity<acc_t>();
  acc_t sum = 0;
#pragma unroll
  for (int k = 0; k < kPacks; ++k)
#pragma unroll
    for (int e = 0; e < P; ++e) {
      const acc_t t = Exp::exp(v[k][e] - max);
      sum += t;
      if constexpr (kKeepExp) v[k][e] = empty ? acc_t(0) : t;
    }
  return empty ? acc_t(0) : sum;
}

template <typename acc_t>
__device__ __forceinline__ MaxSum<acc_t> empty_stats() {
  return {neg_infinity<acc_t>(), acc_t(0)};
}

// __shfl_xor_sync for the reduced types: scalars and MaxSum pairs.
template <typename T>
__device__ __forceinline__ T shfl_xor(T v, int offset) {
  return __shfl_xor_sync(0xffffffffu, v, offset);
}
template <typename acc_t>
__device__ __forceinline__ MaxSum<acc_t> shfl_xor(const MaxSum<acc_t>& v, int offset) {
  return {__shfl_xor_sync(0xffffffffu, v.max, offset), __shfl_xor_sync(0xffffffffu, v.sum, offset)};
}

// Butterfly all-reduce over aligned groups of `width` lanes (a power of two
// <= 32): every lane of a group ends with the group's result. All 32 lanes of
// the warp must call it.
template <typename T, typename Op>
__device__ __forceinline__ T warp_all_reduce(T value, Op op, int width = 32) {
  for (int offset = width / 2; offset > 0; offset /= 2)
    value = op(value, shfl_xor(value, offset));
  return value;
}

// (max, sum) partials: the group max first, then each lane's sum rescaled to
// it, then the sums. One exp per lane, where combining pairs step by step
// takes two per step (ten accurate expf per lane over a warp, which made
// the reductions a large part of the kernels' instructions).
template <typename acc_t>
__device__ __forceinline__ MaxSum<acc_t> warp_all_reduce(const MaxSum<acc_t>& part, CombineMaxSum,
                                                         int width = 32) {
  const acc_t max = warp_all_reduce(part.max, NanMax{}, width);
  return {max, warp_all_reduce(rescaled_sum(part, max), Sum{}, width)};
}

// All-reduce over a 1-D block of any multiple of 32 threads (<= 1024); every
// thread gets the result. `scratch` is 32 values of shared memory, free on
// entry and free again on return.
template <typename T, typename Op>
__device__ __forceinline__ T block_all_reduce(T value, Op op, T identity, T* scratch) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  value = warp_all_reduce(value, op);
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  value = lane < static_cast<int>(blockDim.x / kWarpSize) ? scratch[lane] : identity;
  value = warp_all_reduce(value, op);
  __syncthreads();
  return value;
}

}  // namespace softmax_ext::cuda
