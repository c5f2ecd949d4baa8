// Row-tile family, backward: the launch of the plan's geometry (kernels.cuh);
// f32, bf16 and f16 rows (row_tile_dtype, policy.h).

#include "cuda/core/dispatch.cuh"
#include "cuda/core/launch.cuh"
#include "cuda/families/row_tile/kernels.cuh"

#include <type_traits>

namespace softmax_ext::cuda {

void row_tile_backward(const Plan& plan, const Buffers& b, void*) {
  const RowTileGeometry& g = plan.geometry_as<RowTileGeometry>();
  dispatch_types<true>(plan.problem, "softmax_ext cuda.row_tile_backward", [&]<typename scalar_t, typename E>(KernelTypes<scalar_t, scalar_t, E>) {
    if constexpr (!std::is_same_v<scalar_t, double>) {
      dispatch_int<8, 16>(g.per_lane, [&](auto lanes) {  // dx over dy where it can
        launch_kernel(softmax_row_tile_backward_kernel<E::template BackwardFor<scalar_t>::template type, scalar_t,
                                                       decltype(lanes)::value>,
                      g.grid, kRowTileThreads, g.shared_bytes, static_cast<const scalar_t*>(b.in0),
                      static_cast<const scalar_t*>(b.in1), static_cast<scalar_t*>(b.out), g.shape, g.in_place);
      });
    } else {
      TORCH_INTERNAL_ASSERT(false, "softmax_ext cuda.row_tile_backward: dtype ", plan.problem.in_dtype);
    }
  });
}

}  // namespace softmax_ext::cuda
