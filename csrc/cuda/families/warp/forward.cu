// Warp family, forward: the launch of the plan's geometry (kernels.cuh).

#include "cuda/core/dispatch.cuh"
#include "cuda/core/launch.cuh"
#include "cuda/families/warp/kernels.cuh"

namespace softmax_ext::cuda {

void warp_forward(const Plan& plan, const Buffers& b, void*) {
  const Problem& p = plan.problem;
  const WarpGeometry& g = plan.geometry_as<WarpGeometry>();
  const auto layout = make_row_indexer<2>(p, {kIn0, kOut});
  dispatch_types<false>(p, "softmax_ext cuda.warp",
                 [&]<typename in_t, typename out_t, typename E>(KernelTypes<in_t, out_t, E>) {
    constexpr int kMaxPacks = elems_per_thread(is_double_acc_v<out_t>, false) / kPack<in_t>;
    dispatch_packs<kMaxPacks>(g.shape.packs, [&](auto packs) {
      launch_kernel(softmax_warp_forward_kernel<E::template ForwardFor<out_t>::template type, in_t, out_t,
                                                decltype(packs)::value>,
                    g.grid, kWarpBlockThreads, 0, static_cast<const in_t*>(b.in0), static_cast<out_t*>(b.out), layout,
                    g.shape.group, g.view_align);
    });
  });
}

}  // namespace softmax_ext::cuda
