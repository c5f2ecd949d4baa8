// Strided split family, backward: the three launches on the plan's geometry
// and its workspace (kernels.cuh).

#include "cuda/core/dispatch.cuh"
#include "cuda/core/launch.cuh"
#include "cuda/families/strided_split/kernels.cuh"

namespace softmax_ext::cuda {

void strided_split_backward(const Plan& plan, const Buffers& b, void* workspace) {
  const Problem& p = plan.problem;
  const StridedSplitGeometry& geo = plan.geometry_as<StridedSplitGeometry>();
  const StridedSplitShape& g = geo.shape;
  const auto layout = make_strided_layout<3>(p, {kIn0, kIn1, kOut});
  dispatch_types<true>(p, "softmax_ext cuda.strided_split_backward",
                 [&]<typename scalar_t, typename E>(KernelTypes<scalar_t, scalar_t, E>) {
    using acc_t = acc_type<scalar_t>;
    auto* partials = static_cast<acc_t*>(workspace);
    auto* totals = reinterpret_cast<acc_t*>(static_cast<char*>(workspace) + strided_split_partials_bytes(p));
    const auto* dy = static_cast<const scalar_t*>(b.in0);
    const auto* y = static_cast<const scalar_t*>(b.in1);
    dispatch_int<1, kPack<scalar_t>>(geo.pack, [&](auto vector) {
      constexpr int P = decltype(vector)::value;
      const auto tiled = with_tile_geometry(layout, geo.columns, P, kStridedSplitThreads);
      launch_kernel(softmax_strided_split_backward_stats_kernel<E::template BackwardFor<scalar_t>::template type,
                                                                scalar_t, P>,
                    grid_for_rows(g.items), kStridedSplitThreads, 0, dy, y, partials, tiled, geo.columns, g);
      launch_kernel(softmax_strided_split_backward_combine_kernel<acc_t>,
                    grid_for_rows(ceil_div(p.rows, kStridedSplitCombineThreads)), kStridedSplitCombineThreads, 0,
                    partials, totals, p.rows, g);
      launch_kernel(softmax_strided_split_backward_apply_kernel<E::template BackwardFor<scalar_t>::template type,
                                                                scalar_t, P>,
                    grid_for_rows(g.items), kStridedSplitThreads, 0, dy, y, static_cast<scalar_t*>(b.out), totals,
                    tiled, geo.columns, g);
    });
  });
}

}  // namespace softmax_ext::cuda
