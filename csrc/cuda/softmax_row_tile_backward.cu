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
      const RowTileLaunch l = row_tile_launch(p, sizeof(scalar_t), 2, b);  // dx over dy where it can
      dispatch_kind(p.kind, [&](auto epilogues) {
        using E = decltype(epilogues);
        dispatch_per_lane(l.per_lane, [&](auto lanes) {
          softmax_row_tile_backward_kernel<E::template BackwardFor<scalar_t>::template type, scalar_t,
                                           decltype(lanes)::value>
              <<<l.grid, kRowTileThreads, l.shared_bytes, c10::cuda::getCurrentCUDAStream()>>>(
                  static_cast<const scalar_t*>(b.in0), static_cast<const scalar_t*>(b.in1),
                  static_cast<scalar_t*>(b.out), l.shape, l.in_place);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        });
      });
    }
  });
}

}  // namespace softmax_ext::cuda
