// Row-tile family, forward: the launch of the plan's geometry (kernels.cuh);
// f32 rows only (row_tile_forward_fits, policy.h).

#include "cuda/core/dispatch.cuh"
#include "cuda/core/launch.cuh"
#include "cuda/families/row_tile/kernels.cuh"

#include <type_traits>

namespace softmax_ext::cuda {

void row_tile_forward(const Plan& plan, const Buffers& b, void*) {
  const RowTileGeometry& g = plan.geometry_as<RowTileGeometry>();
  dispatch_types<false>(plan.problem, "softmax_ext cuda.row_tile", [&]<typename in_t, typename out_t, typename E>(KernelTypes<in_t, out_t, E>) {
    if constexpr (std::is_same_v<in_t, float> && std::is_same_v<out_t, float>) {
      dispatch_int<8, 16>(g.per_lane, [&](auto lanes) {  // y over x where it can
        launch_kernel(softmax_row_tile_forward_kernel<E::template ForwardFor<float>::template type, float,
                                                      decltype(lanes)::value>,
                      g.grid, kRowTileThreads, g.shared_bytes, static_cast<const float*>(b.in0),
                      static_cast<float*>(b.out), g.shape, g.in_place);
      });
    } else {
      TORCH_INTERNAL_ASSERT(false, "softmax_ext cuda.row_tile: ", plan.problem.in_dtype, " -> ",
                            plan.problem.out_dtype, " rows");
    }
  });
}

}  // namespace softmax_ext::cuda
