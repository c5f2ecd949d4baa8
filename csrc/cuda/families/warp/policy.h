// Warp family (cuda.warp): short contiguous rows, each held in the
// registers of a group of 1, 2, 4, ..., 32 lanes, so a warp serves several
// rows at once and tiny rows waste no lane. The numbers below come from
// docs/tuning/warp.md unless a line says otherwise. Plain C++.
#pragma once

#include "cuda/core/budget.h"
#include "plan/plan.h"

#include <cstdint>

namespace softmax_ext::cuda {

// The longest row: a warp's register budget (core/budget.h).
constexpr int64_t warp_capacity(bool double_acc, bool backward) {
  return int64_t{kWarpSize} * elems_per_thread(double_acc, backward);
}

// 128 threads: four warps per block keep many blocks resident per SM.
constexpr int kWarpBlockThreads = 128;

// A row's group is a power of two of lanes, at least kWarpMinGroup and
// enough to hold the row in max_packs packs each. Backward: the fewest lanes
// that hold it in target_packs packs each. Forward: the most lanes of which
// each still gets target_packs of the row's packs on average, so a lane
// keeps that many loads in flight where the row does not fill its group.
// Two packs a lane; four for f32 forward rows that are not a power of two
// of packs and for 16-bit and f64 forward rows; rows of four packs a lane
// keep at least kWarpMinWideGroup lanes where each still gets two packs.
constexpr int kWarpMinGroup = 2;
constexpr int kWarpMinWideGroup = 4;
constexpr int warp_target_packs(int64_t element_bytes, bool backward, int64_t packs_needed) {
  if (backward) return 2;
  if (element_bytes == 4) return is_pow2(packs_needed) ? 2 : 4;
  return 4;
}

// The lanes and packs a lane of a row's group.
struct WarpShape {
  int group;  // lanes per row: 1, 2, 4, 8, 16 or 32
  int packs;  // packs per lane, up to max_packs
};

// The boundary forward rows are viewed from (make_view): for f32 rows
// filling at least 72% (kWarpWideViewFillNum / Den) of their group's
// capacity, the bytes one access of the group spans (a 16-byte vector a
// lane), at most a line, so that each access covers whole sectors; else 16
// bytes.
constexpr int kWarpViewAlignMax = 128;
constexpr int64_t kWarpWideViewFillNum = 23, kWarpWideViewFillDen = 32;  // 72%
constexpr int warp_view_align(int64_t n, const WarpShape& shape, int64_t element_bytes) {
  const int64_t capacity = int64_t{shape.group} * shape.packs * pack_size(element_bytes);
  if (element_bytes != 4 || n * kWarpWideViewFillDen < capacity * kWarpWideViewFillNum) return kVectorBytes;
  return shape.group * kVectorBytes < kWarpViewAlignMax ? shape.group * kVectorBytes : kWarpViewAlignMax;
}

// Rows of the whole block are processed together; the loop bound is uniform
// across the block so every lane takes part in every shuffle. A group holds
// warp_rows(packs, max_packs) rows at once, so each lane has at least
// kWarpMinPacksInFlight vector loads per operand in flight however short its
// rows, within the register budget of max_packs packs per operand.
constexpr int kWarpMinPacksInFlight = 2;
constexpr int warp_rows(int packs, int max_packs) {
  const int rows = (max_packs < kWarpMinPacksInFlight ? max_packs : kWarpMinPacksInFlight) / packs;
  return rows > 1 ? rows : 1;
}

// What select() decides for a warp launch (Plan::geometry_as).
struct WarpGeometry {
  WarpShape shape;
  unsigned int grid;
  int view_align;  // forward: warp_view_align
};

void warp_forward(const Plan& plan, const Buffers& buffers, void* workspace);   // forward.cu
void warp_backward(const Plan& plan, const Buffers& buffers, void* workspace);  // backward.cu

}  // namespace softmax_ext::cuda
