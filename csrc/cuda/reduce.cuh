// Deterministic reductions for the fast kernel families: across the lanes of
// a (sub-)warp, across a block of any size, and across the blocks of a
// thread-block cluster through distributed shared memory (sm_90+). Every
// combination happens in a fixed order, so results are bit-identical from run
// to run; nothing here uses atomics.
#pragma once

#include "cuda/common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#include <cooperative_groups.h>
#define SOFTMAX_EXT_HAS_CLUSTERS 1
#endif

namespace softmax_ext::cuda {

// exp(x - max) for the row sum. An element equal to -inf adds 0, also when the
// max is -inf: a block or lane whose elements are all -inf (or padding) then
// contributes (max -inf, sum 0) to the combination below. A row of only -inf
// still ends as NaN, as in torch: the epilogues compute x - max = NaN.
template <typename Exp = AccurateExp, typename acc_t>
__device__ __forceinline__ acc_t exp_term(acc_t x, acc_t max) {
  return x == neg_infinity<acc_t>() ? acc_t(0) : Exp::exp(x - max);
}

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
// As exp_term, with the -inf test taken once per fragment rather than per
// element: below a max that is not -inf, exp(-inf - max) is 0 already; a
// max of -inf means every element is -inf (or padding).
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

template <bool kKeepExp, typename Exp, int kPacks, int P, typename acc_t>
__device__ __forceinline__ MaxSum<acc_t> fragment_stats(acc_t (&v)[kPacks][P]) {
  const acc_t max = fragment_max(v);
  return {max, fragment_exp_sum<kKeepExp, Exp>(v, max)};
}

// The same statistics of any fragment whose element (k, e) is at(k, e).
template <typename Exp, int kPacks, int P, typename At>
__device__ __forceinline__ auto fragment_stats_at(At at) {
  using acc_t = decltype(at(0, 0));
  acc_t max = neg_infinity<acc_t>();
#pragma unroll
  for (int k = 0; k < kPacks; ++k)
#pragma unroll
    for (int e = 0; e < P; ++e) max = NanMax{}(max, at(k, e));
  acc_t sum = 0;
#pragma unroll
  for (int k = 0; k < kPacks; ++k)
#pragma unroll
    for (int e = 0; e < P; ++e) sum += Exp::exp(at(k, e) - max);
  return MaxSum<acc_t>{max, max == neg_infinity<acc_t>() ? acc_t(0) : sum};
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

//////////////////////////////////////////////////////////////////////////////
// Thread-block clusters (sm_90+)
//////////////////////////////////////////////////////////////////////////////

// The split cluster barrier: arrive after a block has read its peers' shared
// memory, wait before it writes that memory again (or exits), so the barrier
// latency overlaps the row's stores.
__device__ __forceinline__ void cluster_arrive() {
#ifdef SOFTMAX_EXT_HAS_CLUSTERS
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#ifdef SOFTMAX_EXT_HAS_CLUSTERS
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}

// local[index] in the shared memory of cluster block `rank` (a distributed
// shared memory load).
template <typename T>
__device__ __forceinline__ T cluster_load(T* local, unsigned rank, int index) {
#ifdef SOFTMAX_EXT_HAS_CLUSTERS
  namespace cg = cooperative_groups;
  return cg::this_cluster().map_shared_rank(local, rank)[index];
#else
  return local[index];
#endif
}

__device__ __forceinline__ unsigned cluster_rank() {
#ifdef SOFTMAX_EXT_HAS_CLUSTERS
  namespace cg = cooperative_groups;
  return cg::this_cluster().block_rank();
#else
  return 0;
#endif
}

__device__ __forceinline__ void cluster_sync() {
  cluster_arrive();
  cluster_wait();
}

// Combines one partial per block of the cluster: every block has written its
// partial to `slot` (its own shared memory) and waited for any earlier
// cluster_arrive; afterwards every thread of every block holds the same
// combination, folded in rank order by warp 0 of each block. `fold` reduces
// the lanes' values (lanes >= cluster_size hold `identity`) with
// warp_all_reduce. Ends with cluster_arrive: the caller must cluster_wait
// before writing `slot` again or exiting. `result` is one shared T.
template <typename T, typename Fold>
__device__ __forceinline__ T cluster_all_reduce(T* slot, int cluster_size, T identity, T* result,
                                                Fold fold) {
  cluster_sync();
  if (threadIdx.x < kWarpSize) {
    const int lane = threadIdx.x;
    T value = lane < cluster_size ? cluster_load(slot, lane, 0) : identity;
    value = fold(value);
    if (lane == 0) *result = value;
  }
  cluster_arrive();
  __syncthreads();
  return *result;
}

}  // namespace softmax_ext::cuda
