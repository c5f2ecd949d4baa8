// Row-tile family, backward: instantiation (kernel in row_tile_kernels.cuh,
// geometry in softmax_row_tile.cu; which rows it takes: row_tile_takes,
// config.h).

#include "cuda/launch.h"
#include "cuda/row_tile_kernels.cuh"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

namespace softmax_ext::cuda {

void row_tile_backward(const Problem& p, const Buffers& b) {
  TORCH_INTERNAL_ASSERT(row_tile_dtype(p.in_dtype), "softmax_ext cuda.row_tile_backward: dtype ", p.in_dtype);
  dispatch_floating_type(p.out_dtype, "softmax_ext cuda.row_tile_backward", [&](auto tag) {
    using scalar_t = typename decltype(tag)::type;
    if constexpr (!std::is_same_v<scalar_t, double>) {  // row_tile_dtype: no f64 kernels
      const int per_lane = row_tile_per_lane(p.axis_size);
      const RowTileShape s = row_tile_shape(p, per_lane, sizeof(scalar_t));
      const bool in_place = row_tile_in_place(b.in0, b.out);  // dx over dy
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
        dispatch_per_lane(per_lane, launch);
      });
    }
  });
}

}  // namespace softmax_ext::cuda
