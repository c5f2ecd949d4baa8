// Thread-block clusters (sm_90+): the split cluster barrier, the walk of
// clusters over rows or tiles, and the all-reduce across a cluster's blocks
// by pushing partials into every peer's shared memory. Fixed order, no
// atomics.
#pragma once

#include "cuda/core/budget.h"

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#include <cooperative_groups.h>
#include <cuda/ptx>
#define SOFTMAX_EXT_HAS_CLUSTERS 1
#endif

namespace softmax_ext::cuda {

// The split cluster barrier, which the exchange below meets once, at its
// start: a block arrives once its barriers exist and waits before its first
// push, so its first loads overlap the wait.
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

// The grid-stride walk of clusters (of one block or more) over rows or
// tiles: cluster blockIdx.x / cluster_size takes every (gridDim.x /
// cluster_size)-th.
struct ClusterRowLoop {
  int cluster_size;
  __device__ __forceinline__ int64_t start() const { return blockIdx.x / cluster_size; }
  __device__ __forceinline__ int64_t step() const { return gridDim.x / cluster_size; }
};

__device__ __forceinline__ unsigned cluster_rank() {
#ifdef SOFTMAX_EXT_HAS_CLUSTERS
  namespace cg = cooperative_groups;
  return cg::this_cluster().block_rank();
#else
  return 0;
#endif
}

// Cluster all-reduce by pushing (sm_90): each block stores its partials
// (one per row, or one per column of a strided tile) into slots
// [round % 2][its rank][...] of every block of the cluster with st.async,
// which also counts the bytes on the receiver's mbarrier [round % 2]; each
// block waits on its own mbarrier alone, then folds the slots in rank order.
// No cluster-wide barrier and no remote reads on the critical path
// (docs/tuning/block.md: against a cluster barrier and reads of the peers'
// slots). Two slot sets and barriers suffice: a block pushes round
// r + 2 only after every block has pushed round r + 1, which each does after
// reading round r.
//
// An exchange X names its shared memory: X::value_type, X::slot(set, rank,
// index) and X::full(set). ClusterExchange holds one value per block in
// static shared memory.
template <typename T>
struct ClusterExchange {
  using value_type = T;
  T slots[2][kMaxClusterSize];
  uint64_t barriers[2];
  __device__ __forceinline__ T* slot(int set, unsigned rank, int) { return &slots[set][rank]; }
  __device__ __forceinline__ uint64_t* full(int set) { return &barriers[set]; }
};

// Every thread of every block of the cluster, once, before its first round:
// initialises the barriers and arrives on the cluster barrier; the first
// round waits on it before pushing, so the first loads overlap the wait.
template <typename X>
__device__ __forceinline__ void cluster_exchange_init(X& x) {
#ifdef SOFTMAX_EXT_HAS_CLUSTERS
  if (threadIdx.x == 0) {
    ::cuda::ptx::mbarrier_init(x.full(0), 1);
    ::cuda::ptx::mbarrier_init(x.full(1), 1);
    ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
  }
  cluster_arrive();
#endif
}

// Round `round` (0, 1, 2, ...) of an exchange uses slot set and barrier
// `set`, whose phase `parity` it waits for.
struct ExchangeRound {
  unsigned round;
  int set;
  uint32_t parity;
  __device__ __forceinline__ explicit ExchangeRound(unsigned r) : round(r), set(r & 1), parity((r >> 1) & 1) {}
};

// Every thread, at the start of a round, before any pushes: the first round
// waits until every block's barriers exist; thread 0 arms this block's
// barrier for the `values` partials its peers push.
template <typename X>
__device__ __forceinline__ void cluster_exchange_open(X& x, const ExchangeRound& r, int values) {
#ifdef SOFTMAX_EXT_HAS_CLUSTERS
  namespace ptx = ::cuda::ptx;
  if (r.round == 0) cluster_wait();
  if (threadIdx.x == 0)
    ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, x.full(r.set),
                                   static_cast<uint32_t>(values * sizeof(typename X::value_type)));
#endif
}

// Stores `value` into slot [set][this block's rank][index] of cluster block
// `rank` (any thread; fire and forget).
template <typename X, typename T = typename X::value_type>
__device__ __forceinline__ void cluster_exchange_push(X& x, const ExchangeRound& r, unsigned rank, int index,
                                                      const T& value) {
#ifdef SOFTMAX_EXT_HAS_CLUSTERS
  namespace cg = cooperative_groups;
  namespace ptx = ::cuda::ptx;
  static_assert(sizeof(T) % 4 == 0 && sizeof(T) <= 16, "pushed in 4- or 8-byte words");
  using Word = std::conditional_t<sizeof(T) % 8 == 0, uint64_t, uint32_t>;
  constexpr int kWords = sizeof(T) / sizeof(Word);
  const cg::cluster_group cluster = cg::this_cluster();
  Word* slot = reinterpret_cast<Word*>(cluster.map_shared_rank(x.slot(r.set, cluster_rank(), index), rank));
  uint64_t* full = cluster.map_shared_rank(x.full(r.set), rank);
  Word words[kWords];
  memcpy(words, &value, sizeof(T));
#pragma unroll
  for (int w = 0; w < kWords; ++w) ptx::st_async(slot + w, words[w], full);
#endif
}

// Waits until every push of the round into this block has landed; its
// slots [set] are then readable.
template <typename X>
__device__ __forceinline__ void cluster_exchange_wait(X& x, const ExchangeRound& r) {
#ifdef SOFTMAX_EXT_HAS_CLUSTERS
  namespace ptx = ::cuda::ptx;
  while (!ptx::mbarrier_try_wait_parity(ptx::sem_acquire, ptx::scope_cluster, x.full(r.set), r.parity)) {
  }
#endif
}

// The end of both folds below: the first warp's lanes hold one value each
// (the parts in order, then the identity), `fold` reduces them with
// warp_all_reduce, and every thread of the block gets the result through
// `result` (one shared T).
template <typename T, typename Fold>
__device__ __forceinline__ T fold_first_warp(T lane_value, T* result, Fold fold) {
  if (threadIdx.x < kWarpSize) {
    const T v = fold(lane_value);
    if (threadIdx.x == 0) *result = v;
  }
  __syncthreads();
  return *result;
}

// One value per block: every thread passes the block's partial `value`;
// every thread gets the fold of all blocks' partials in rank order (`fold`
// reduces the lanes' values, lanes >= cluster_size holding `identity`, with
// warp_all_reduce). `result` is one shared T. Every push into a block has
// landed by the end of its last round; cluster_exchange_exit closes the
// exchange.
template <typename T, typename Fold>
__device__ __forceinline__ T cluster_exchange(ClusterExchange<T>& x, const T& value, int cluster_size,
                                              unsigned round, T identity, T* result, Fold fold) {
#ifdef SOFTMAX_EXT_HAS_CLUSTERS
  const ExchangeRound r(round);
  cluster_exchange_open(x, r, cluster_size);
  if (threadIdx.x < static_cast<unsigned>(cluster_size)) cluster_exchange_push(x, r, threadIdx.x, 0, value);
  T v = identity;
  if (threadIdx.x < kWarpSize) {
    cluster_exchange_wait(x, r);
    if (static_cast<int>(threadIdx.x) < cluster_size) v = *x.slot(r.set, threadIdx.x, 0);
  }
  return fold_first_warp(v, result, fold);
#else
  return value;
#endif
}

// What cluster_exchange returns to a cluster of kParts blocks whose
// partials were `parts`, computed by one block that holds them all: the
// same fold in the same order, so a block that walks a cluster's parts of a
// row itself gets the cluster's bits. Every thread passes `parts`; `result`
// is one shared T.
template <int kParts, typename T, typename Fold>
__device__ __forceinline__ T fold_as_cluster(const T (&parts)[kParts], T identity, T* result, Fold fold) {
  static_assert(kParts <= kWarpSize, "one lane a part");
  T v = identity;
  if (threadIdx.x < kWarpSize) {
#pragma unroll
    for (int i = 0; i < kParts; ++i)
      if (static_cast<int>(threadIdx.x) == i) v = parts[i];
  }
  return fold_first_warp(v, result, fold);
}

// Every thread, before the block exits, after `rounds` rounds: a block that
// ran none still owes the wait matching cluster_exchange_init's arrive.
__device__ __forceinline__ void cluster_exchange_exit(unsigned rounds) {
  if (rounds == 0) cluster_wait();
}

}  // namespace softmax_ext::cuda
