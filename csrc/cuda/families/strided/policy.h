// Strided family (cuda.strided): softmax over an axis that is not the
// fastest dimension (a non-last dim, a transposed view), with a contiguous
// inner run of at least kStridedMinInner columns (core/columns.h). No
// transpose copy: a block (on sm_90+ a cluster, along the axis) holds a
// tile of inner columns by the whole axis in registers; one read and one
// write. The numbers below come from docs/tuning/strided.md unless a line
// says otherwise. Plain C++.
#pragma once

#include "cuda/core/budget.h"
#include "cuda/core/columns.h"
#include "plan/plan.h"

#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace softmax_ext::cuda {

constexpr int strided_elems_per_thread(bool double_acc, bool backward) {
  return elems_per_thread(double_acc, backward);
}
// A tile is one block of up to kMaxBlockThreads threads before it is a
// cluster; a cluster of at most kStridedWideClusterMax blocks has
// 1024-thread blocks, longer axes take 512-thread blocks, two per SM.
constexpr int kStridedWideClusterMax = 2;
// Blocks of more than 512 threads have an SM each: they run on a persistent
// grid, each looping over tiles (clusters of 512-thread blocks do not).
constexpr bool strided_persistent(int threads) { return threads > kClusterBlockThreads; }
// An axis too long for 128-byte tiles runs in narrower ones, halving down to
// one 16-byte vector of columns.
constexpr int kStridedMinTileBytes = kVectorBytes;
constexpr int64_t strided_min_tile_columns(int64_t element_bytes) {
  return std::max<int64_t>(kStridedMinTileBytes / element_bytes, 1);
}
// Where the 128-byte tile of an axis would take a cluster of more than
// kStridedPreferredCluster 512-thread blocks, the tile narrows to
// kStridedNarrowTileBytes, halving the cluster: clusters of 16 blocks fill
// the GPCs poorly.
constexpr int kStridedPreferredCluster = kPortableClusterSize;
constexpr int kStridedNarrowTileBytes = 64;
// Axis positions a tile `columns` wide holds in a cluster of `cluster_size`
// blocks (1: one block), `per_thread` elements per thread whatever the
// pack; blocks grow to 1024 threads for the longest axes.
constexpr int64_t strided_axis_capacity(int64_t per_thread, int64_t columns, int cluster_size) {
  return int64_t{kMaxBlockThreads} * per_thread / columns * cluster_size;
}
// The family's capacity: its narrowest tiles.
constexpr int64_t strided_capacity(bool double_acc, bool backward, int64_t element_bytes, int cluster_size) {
  return strided_axis_capacity(strided_elems_per_thread(double_acc, backward),
                               strided_min_tile_columns(element_bytes), cluster_size);
}
// Axes longer than kStridedSplitMaxStrided take the strided split family
// even where a cluster of this family holds them, in narrow tiles.
constexpr int64_t kStridedSplitMaxStrided = 16384;
constexpr int64_t strided_reach(bool double_acc, bool backward, int64_t element_bytes, int cluster_size) {
  return std::min(strided_capacity(double_acc, backward, element_bytes, cluster_size), kStridedSplitMaxStrided);
}

// 16-bit operands stay packed in 8-byte vectors where aligned
// (StridedFragment, kernels.cuh): two values a register, so a thread holds
// twice the elements, in packs of half a 16-byte vector's columns.
template <typename in_t>
struct StridedPacking {
  static constexpr bool kReduced = std::is_same_v<in_t, c10::Half> || std::is_same_v<in_t, c10::BFloat16>;
  static constexpr int kVector = kReduced ? pack_size(sizeof(in_t)) / 2 : pack_size(sizeof(in_t));
  // Whether accesses of P elements (1 or kVector) keep the values packed.
  static constexpr bool packed(int P) { return kReduced && P > 1; }
  // Elements a thread holds, `per_thread` being its accumulator values.
  static constexpr int elements(int per_thread, int P) { return per_thread * (packed(P) ? 2 : 1); }
};

// Dynamic shared memory of a strided launch (reduce_columns), whose tiles
// are at most `pitch` columns wide (strided_max_columns), in blocks of
// `threads` threads: each warp's partials and the column totals,
// `value_bytes` each, then in a cluster the exchange's barriers and two
// slot sets of `width` per block. A one-warp tile reduces by shuffles
// alone. Sized to the launch, so small blocks of short axes keep their
// occupancy.
constexpr int64_t kExchangeBarrierBytes = 16;
constexpr int64_t strided_reduction_bytes(int64_t value_bytes, int threads, int pitch, int width,
                                          int cluster_size) {
  if (threads <= kWarpSize && cluster_size == 1) return 0;
  const int64_t exchange =
      cluster_size > 1 ? kExchangeBarrierBytes + 2 * int64_t{cluster_size} * width * value_bytes : 0;
  return (int64_t{threads / kWarpSize} + 1) * pitch * value_bytes + exchange;
}

// The tile: its accesses, its width and its block or cluster.
struct StridedShape {
  int pack;          // P: 1, or the vector width when every access is aligned
  int columns;       // threads across the tile (W / P), at most 32
  int threads;       // block size
  int cluster_size;  // blocks along the axis
};

void strided_forward(const Plan& plan, const Buffers& buffers, void* workspace);   // forward.cu
void strided_backward(const Plan& plan, const Buffers& buffers, void* workspace);  // backward.cu

}  // namespace softmax_ext::cuda
