// Row-tile family (cuda.row_tile): short rows laid out one after another
// (row stride = row length in every operand), staged a tile of whole rows at
// a time through shared memory as flat 16-byte copies, so no lane idles on
// the part of a power-of-two lane group that a row leaves empty. Which rows
// it takes and its tile sizes come from docs/tuning/row_tile.md unless a
// line says otherwise. Plain C++.
#pragma once

#include "cuda/core/budget.h"
#include "plan/plan.h"

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace softmax_ext::cuda {

constexpr int kRowTileThreads = 128;
constexpr int64_t kRowTileMaxRow = 512;        // rows of 1000 (16 values a lane) gained nothing
constexpr int64_t kRowTileMinForwardRow = 32;  // shorter forward rows: not measured
constexpr int64_t kRowTileBytes = 16384;       // of whole rows per operand and tile
// A run sits in its shared region at its offset from the 32-byte grid (not
// just the 16-byte one), and regions are 32-byte multiples, so every 32-byte
// sector of global memory lands on one 32-byte span of shared memory.
constexpr int64_t kRowTileAlign = 32;
static_assert(kRowTileAlign <= kBaseAlign, "the plan keeps base offsets from the kBaseAlign grid");

// Backward: f32, bf16 and f16 rows (f64 rows stay with the warp family).
constexpr bool row_tile_dtype(c10::ScalarType t) { return t == c10::ScalarType::Float || is_16bit_float(t); }
// Elements a lane holds of a row: 8 up to rows of 256, else 16.
constexpr int row_tile_per_lane(int64_t n) { return n <= 256 ? 8 : 16; }
// Values a row's lane group holds: a power of two of lanes, per_lane each.
constexpr int64_t row_tile_group_values(int64_t n) {
  int64_t values = row_tile_per_lane(n);
  while (values < n) values *= 2;
  return values;
}
// Forward: f32 rows (y f32 too) that fill most of their lane group: at
// least 90% of it for rows of 33 to 128, 97% for longer ones (16-bit
// forward rows lost at every length tried).
constexpr bool row_tile_forward_fits(c10::ScalarType in, c10::ScalarType out, int64_t n) {
  if (in != c10::ScalarType::Float || out != in || n <= kRowTileMinForwardRow) return false;
  return n * 100 >= row_tile_group_values(n) * (n <= 128 ? 90 : 97);
}
// The longest row the family takes for `in` rows (0: none).
constexpr int64_t row_tile_capacity(c10::ScalarType in, bool backward) {
  return (backward ? row_tile_dtype(in) : in == c10::ScalarType::Float) ? kRowTileMaxRow : 0;
}
// Rows of a power-of-two length stay with the warp family: groups of lanes
// reading rows whose starts share a shared-memory bank would conflict.
inline bool row_tile_takes(const Problem& p) {
  const int64_t n = p.axis_size;
  if (n > row_tile_capacity(p.in_dtype, p.is_backward()) || is_pow2(n)) return false;
  if (!p.is_backward() && !row_tile_forward_fits(p.in_dtype, p.out_dtype, n)) return false;
  // Flat: every operand's rows follow one another (one batch dim after
  // coalescing, of stride n).
  if (p.batch_rank > 1) return false;
  for (int k = 0; k < kNumOperands; ++k) {
    if (k == kIn1 && !p.is_backward()) continue;  // forward has no second input
    if (p.axis_stride[k] != 1 || (p.batch_rank == 1 && p.batch_stride[k][0] != n)) return false;
  }
  return true;
}

// A tile's geometry, the same for every block (a kernel parameter).
struct RowTileShape {
  int64_t rows;    // rows of the problem
  int n;           // elements of a row
  int tile_rows;   // rows a block stages at once
  int group;       // lanes per row (a power of two, at most a warp)
  int region;      // bytes of shared memory per operand region (kRowTileAlign multiple)
};

// What select() decides for a row-tile launch (Plan::geometry_as): the
// output goes over the first input in shared memory (in_place) where both
// sit at the same offset from the kRowTileAlign grid, so every tile's runs
// do.
struct RowTileGeometry {
  RowTileShape shape;
  int per_lane;  // row_tile_per_lane
  bool in_place;
  int64_t shared_bytes;
  unsigned int grid;
};

void row_tile_forward(const Plan& plan, const Buffers& buffers, void* workspace);   // forward.cu
void row_tile_backward(const Plan& plan, const Buffers& buffers, void* workspace);  // backward.cu

}  // namespace softmax_ext::cuda
