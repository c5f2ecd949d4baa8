// The row-tile family's registry entry (plan/registry.cpp) and the geometry
// select() computes for it (policy.h).

#include "cuda/core/grid.h"
#include "cuda/families/row_tile/policy.h"
#include "plan/family.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace softmax_ext::cuda {
namespace {

// Lanes of a row: row_tile_group_values over row_tile_per_lane. Rows of a
// tile: as many whole rows as kRowTileBytes holds, less room for the run's
// offset from the kRowTileAlign grid, rounded down to a multiple of the
// block's lane groups where it holds that many.
RowTileShape row_tile_shape(const Problem& p, int64_t element_bytes) {
  RowTileShape s{};
  s.rows = p.rows;
  s.n = static_cast<int>(p.axis_size);
  s.group = static_cast<int>(row_tile_group_values(p.axis_size) / row_tile_per_lane(p.axis_size));
  TORCH_INTERNAL_ASSERT(s.group <= kWarpSize, "softmax_ext cuda.row_tile: a row of ", p.axis_size);
  const int groups = kRowTileThreads / s.group;
  int64_t tile_rows = std::max<int64_t>((kRowTileBytes - kRowTileAlign) / (p.axis_size * element_bytes), 1);
  if (tile_rows >= groups) tile_rows = tile_rows / groups * groups;
  s.tile_rows = static_cast<int>(std::min(tile_rows, p.rows));
  s.region = static_cast<int>(ceil_div(s.tile_rows * p.axis_size * element_bytes + kRowTileAlign, kRowTileAlign) *
                              kRowTileAlign);
  return s;
}

// A launch over the staged inputs (forward x; backward dy and y), the
// output last.
bool takes_row_tile(const Problem& p, const DeviceFacts*) {
  return has_fast_kernels(p.in_dtype, p.out_dtype) && p.axis_contiguous() && row_tile_takes(p);
}

void plan_row_tile(const Problem& p, const DeviceFacts*, Plan& plan) {
  const int64_t element_bytes = c10::elementSize(p.in_dtype);
  const int inputs = p.num_inputs();
  RowTileGeometry& g = plan.geometry_as<RowTileGeometry>();
  g.per_lane = row_tile_per_lane(p.axis_size);
  g.shape = row_tile_shape(p, element_bytes);
  g.in_place = p.base_offset[kIn0] % kRowTileAlign == p.base_offset[kOut] % kRowTileAlign;
  g.shared_bytes = (g.in_place ? inputs : inputs + 1) * int64_t{g.shape.region};
  g.grid = grid_for_each(ceil_div(p.rows, int64_t{g.shape.tile_rows}));
}

void row_tile_limits(c10::ScalarType dtype, bool backward, const DeviceFacts&, Limits& out) {
  out.emplace_back("row_tile", row_tile_capacity(dtype, backward));
}

}  // namespace
}  // namespace softmax_ext::cuda

namespace softmax_ext {

extern const Family kCudaRowTile = {"cuda.row_tile", c10::DeviceType::CUDA, /*deterministic=*/true,
                                    /*uses_atomics=*/false, /*relayout_helps=*/false, cuda::takes_row_tile, cuda::plan_row_tile, nullptr,
                                    cuda::row_tile_forward, cuda::row_tile_backward, cuda::row_tile_limits};

}  // namespace softmax_ext
