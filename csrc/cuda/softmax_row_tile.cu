// Row-tile family: tile geometry (both directions) and the forward
// instantiation (kernels in row_tile_kernels.cuh; which rows it takes:
// row_tile_takes, config.h).

#include "cuda/launch.h"
#include "cuda/row_tile_kernels.cuh"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

namespace softmax_ext::cuda {

// Lanes of a row: row_tile_group_values (config.h) over row_tile_per_lane.
// Rows of a tile: as many whole rows as kRowTileBytes holds, less room for
// the run's offset from the kRowTileAlign grid, rounded down to a multiple of
// the block's lane groups where it holds that many.
static RowTileShape row_tile_shape(const Problem& p, int64_t element_bytes) {
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

RowTileLaunch row_tile_launch(const Problem& p, int64_t element_bytes, int inputs, const Buffers& b) {
  RowTileLaunch l{};
  l.per_lane = row_tile_per_lane(p.axis_size);
  l.shape = row_tile_shape(p, element_bytes);
  l.in_place = (reinterpret_cast<uintptr_t>(b.in0) - reinterpret_cast<uintptr_t>(b.out)) % kRowTileAlign == 0;
  l.shared_bytes = (l.in_place ? inputs : inputs + 1) * int64_t{l.shape.region};
  l.grid = grid_for_each(ceil_div(p.rows, int64_t{l.shape.tile_rows}));
  return l;
}

// f32 only: row_tile_forward_fits (config.h) says which forward rows gain.
void row_tile_forward(const Problem& p, const Buffers& b) {
  TORCH_INTERNAL_ASSERT(row_tile_forward_fits(p.in_dtype, p.out_dtype, p.axis_size),
                        "softmax_ext cuda.row_tile: ", p.in_dtype, " -> ", p.out_dtype, " rows of ", p.axis_size);
  const RowTileLaunch l = row_tile_launch(p, sizeof(float), 1, b);  // y over x where it can
  dispatch_kind(p.kind, [&](auto epilogues) {
    using E = decltype(epilogues);
    dispatch_per_lane(l.per_lane, [&](auto lanes) {
      softmax_row_tile_forward_kernel<E::template ForwardFor<float>::template type, float, decltype(lanes)::value>
          <<<l.grid, kRowTileThreads, l.shared_bytes, c10::cuda::getCurrentCUDAStream()>>>(
              static_cast<const float*>(b.in0), static_cast<float*>(b.out), l.shape, l.in_place);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

}  // namespace softmax_ext::cuda
