// Strided split family, forward: the three launches on the plan's geometry
// and its workspace (kernels.cuh).

#include "cuda/core/dispatch.cuh"
#include "cuda/core/launch.cuh"
#include "cuda/families/strided_split/kernels.cuh"

namespace softmax_ext::cuda {

void strided_split_forward(const Plan& plan, const Buffers& b, void* workspace) {
  const Problem& p = plan.problem;
  const StridedSplitGeometry& geo = plan.geometry_as<StridedSplitGeometry>();
  const StridedSplitShape& g = geo.shape;
  const auto layout = make_strided_layout<2>(p, {kIn0, kOut});
  dispatch_types<false>(p, "softmax_ext cuda.strided_split",
                 [&]<typename in_t, typename out_t, typename E>(KernelTypes<in_t, out_t, E>) {
    using acc_t = acc_type<out_t>;
    auto* partials = static_cast<MaxSum<acc_t>*>(workspace);
    auto* totals = reinterpret_cast<MaxSum<acc_t>*>(static_cast<char*>(workspace) + strided_split_partials_bytes(p));
    const auto* x = static_cast<const in_t*>(b.in0);
    dispatch_int<1, kPack<in_t>>(geo.pack, [&](auto vector) {
      constexpr int P = decltype(vector)::value;
      const auto tiled = with_tile_geometry(layout, geo.columns, P, kStridedSplitThreads);
      launch_kernel(softmax_strided_split_stats_kernel<in_t, out_t, P>, grid_for_rows(g.items), kStridedSplitThreads,
                    0, x, partials, tiled, geo.columns, g);
      launch_kernel(softmax_strided_split_combine_kernel<acc_t>,
                    grid_for_rows(ceil_div(p.rows, kStridedSplitCombineThreads)), kStridedSplitCombineThreads, 0,
                    partials, totals, p.rows, g);
      launch_kernel(softmax_strided_split_apply_kernel<E::template ForwardFor<out_t>::template type, in_t, out_t, P>,
                    grid_for_rows(g.items), kStridedSplitThreads, 0, x, static_cast<out_t*>(b.out), totals, tiled,
                    geo.columns, g);
    });
  });
}

}  // namespace softmax_ext::cuda
