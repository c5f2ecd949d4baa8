// Row-tile family, backward: tile geometry and instantiation (kernel in
// row_tile_kernels.cuh; which rows it takes: row_tile_takes, config.h).

#include "cuda/launch.h"
#include "cuda/row_tile_kernels.cuh"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

namespace softmax_ext::cuda {

// Rows of a tile: as many whole rows as kRowTileBytes holds, less room for
// the run's offset from the kRowTileAlign grid, rounded down to a multiple of
// the block's lane groups where it holds that many.
static RowTileShape row_tile_shape(const Problem& p, int per_lane, int64_t element_bytes) {
  RowTileShape s{};
  s.rows = p.rows;
  s.n = static_cast<int>(p.axis_size);
  s.group = static_cast<int>(next_pow2(ceil_div(p.axis_size, int64_t{per_lane})));
  TORCH_INTERNAL_ASSERT(s.group <= kWarpSize, "softmax_ext cuda.row_tile: a row of ", p.axis_size);
  const int groups = kRowTileThreads / s.group;
  int64_t tile_rows = std::max<int64_t>((kRowTileBytes - kRowTileAlign) / (p.axis_size * element_bytes), 1);
  if (tile_rows >= groups) tile_rows = tile_rows / groups * groups;
  s.tile_rows = static_cast<int>(std::min(tile_rows, p.rows));
  s.region = static_cast<int>(ceil_div(s.tile_rows * p.axis_size * element_bytes + kRowTileAlign, kRowTileAlign) *
                              kRowTileAlign);
  return s;
}

void row_tile_backward(const Problem& p, const Buffers& b) {
  TORCH_INTERNAL_ASSERT(row_tile_dtype(p.in_dtype), "softmax_ext cuda.row_tile_backward: dtype ", p.in_dtype);
  dispatch_floating_type(p.out_dtype, "softmax_ext cuda.row_tile_backward", [&](auto tag) {
    using scalar_t = typename decltype(tag)::type;
    if constexpr (!std::is_same_v<scalar_t, double>) {  // row_tile_dtype: no f64 kernels
      const int per_lane = row_tile_per_lane(p.axis_size);
      const RowTileShape s = row_tile_shape(p, per_lane, sizeof(scalar_t));
      // dx goes over dy in shared memory where both sit at the same offset
      // from the kRowTileAlign grid (then every tile's runs do).
      const bool in_place =
          (reinterpret_cast<uintptr_t>(b.in0) - reinterpret_cast<uintptr_t>(b.out)) % kRowTileAlign == 0;
      const int64_t shared = (in_place ? 2 : 3) * int64_t{s.region};
      const unsigned int grid = grid_for_each(ceil_div(p.rows, int64_t{s.tile_rows}));
      dispatch_kind(p.kind, [&](auto epilogues) {
        using E = decltype(epilogues);
        auto launch = [&](auto lanes) {
          softmax_row_tile_backward_kernel<E::template BackwardFor<scalar_t>::template type, scalar_t,
                                           decltype(lanes)::value>
              <<<grid, kRowTileThreads, shared, c10::cuda::getCurrentCUDAStream()>>>(
                  static_cast<const scalar_t*>(b.in0), static_cast<const scalar_t*>(b.in1),
                  static_cast<scalar_t*>(b.out), s, in_place);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        };
        if (per_lane == 8) {
          launch(std::integral_constant<int, 8>{});
        } else {
          launch(std::integral_constant<int, 16>{});
        }
      });
    }
  });
}

}  // namespace softmax_ext::cuda
