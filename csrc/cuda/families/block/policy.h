// Block and cluster families (cuda.block, cuda.cluster): a contiguous row
// held in the registers of one block, or of the blocks of a thread-block
// cluster (sm_90+) exchanging their partial statistics through distributed
// shared memory; one read and one write of global memory. The numbers below
// come from docs/tuning/block.md unless a line says otherwise. Plain C++.
#pragma once

#include "cuda/core/budget.h"
#include "plan/plan.h"

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace softmax_ext::cuda {

// A block grows to the hardware's 1024 threads; where clusters exist
// (sm_90+) a backward block has at most 512, so two share an SM and one's
// loads overlap the other's reductions, and longer rows go to a cluster.
constexpr int max_block_threads(bool clusters, bool backward) {
  return clusters && backward ? kClusterBlockThreads : kMaxBlockThreads;
}
// The smallest block the family launches; shorter rows are the warp family's.
constexpr int kMinBlockThreads = 64;
constexpr int64_t block_capacity(bool double_acc, bool backward, bool clusters) {
  return int64_t{max_block_threads(clusters, backward)} * elems_per_thread(double_acc, backward);
}

// Cluster blocks have 1024 threads (one per SM), or 512 where that takes at
// least 1/kClusterHalfBlockSaving fewer threads for the row (the registers
// of threads past the row's end are lost to every row), or where a 16-bit
// backward cluster stages nothing (cluster_takes_half_blocks).
constexpr int kClusterHalfBlockSaving = 8;
// 16-bit rows longer than kPackedMinRow elements (every row of the cluster
// family) stay in registers as they are in memory, two values a register,
// widened only for the maths (Fragment, core/fragment.cuh): a row needs half
// the threads.
constexpr int64_t kPackedMinRow = 4096;
constexpr bool packs_registers(c10::ScalarType in) { return is_16bit_float(in); }
constexpr bool keeps_packed(c10::ScalarType in, int64_t axis_size, bool cluster) {
  return packs_registers(in) && (cluster || axis_size > kPackedMinRow);
}
constexpr int cluster_elems_per_thread(c10::ScalarType in, bool double_acc, bool backward) {
  return elems_per_thread(double_acc, backward) * (packs_registers(in) ? 2 : 1);
}
// Clusters run on a persistent grid (as many clusters as the GPU holds at
// once, each looping over rows) and stage the next row in shared memory
// while they reduce and store the current one (core/staging.cuh): every
// forward cluster; backward clusters of at least kStagedMinBackwardThreads
// threads, whose exchange across six or more SMs is long enough to hide
// loads behind.
constexpr int kStagedMinBackwardThreads = 6 * kMaxBlockThreads;
constexpr bool stages_rows(int cluster_size, int threads, bool backward) {
  return cluster_size > 1 && (!backward || cluster_size * threads >= kStagedMinBackwardThreads);
}
// A backward cluster that does not stage its rows and needs two or more
// 1024-thread blocks, one per SM, overlaps nothing with its exchange across
// the cluster: 16-bit rows take twice as many 512-thread blocks, two per SM,
// even where that spares no threads.
constexpr bool cluster_takes_half_blocks(c10::ScalarType in, bool backward, int64_t blocks, int64_t half_blocks) {
  const int64_t full_threads = blocks * kMaxBlockThreads;
  if ((full_threads - half_blocks * kClusterBlockThreads) * kClusterHalfBlockSaving >= full_threads) return true;
  return backward && is_16bit_float(in) && blocks >= 2 &&
         !stages_rows(static_cast<int>(blocks), kMaxBlockThreads, backward);
}
constexpr int64_t cluster_capacity(c10::ScalarType in, bool double_acc, bool backward, int cluster_size) {
  return int64_t{kMaxBlockThreads} * cluster_elems_per_thread(in, double_acc, backward) * cluster_size;
}

void block_forward(const Plan& plan, const Buffers& buffers, void* workspace);   // forward.cu
void block_backward(const Plan& plan, const Buffers& buffers, void* workspace);  // backward.cu

}  // namespace softmax_ext::cuda
