// Warp family, backward: the launch of the plan's geometry (kernels.cuh).

#include "cuda/core/dispatch.cuh"
#include "cuda/core/launch.cuh"
#include "cuda/families/warp/kernels.cuh"

namespace softmax_ext::cuda {

void warp_backward(const Plan& plan, const Buffers& b, void*) {
  const Problem& p = plan.problem;
  const WarpGeometry& g = plan.geometry_as<WarpGeometry>();
  const auto layout = make_row_indexer<3>(p, {kIn0, kIn1, kOut});
  dispatch_types<true>(p, "softmax_ext cuda.warp_backward",
                 [&]<typename scalar_t, typename E>(KernelTypes<scalar_t, scalar_t, E>) {
    constexpr int kMaxPacks = elems_per_thread(is_double_acc_v<scalar_t>, true) / kPack<scalar_t>;
    dispatch_packs<kMaxPacks>(g.shape.packs, [&](auto packs) {
      launch_kernel(softmax_warp_backward_kernel<E::template BackwardFor<scalar_t>::template type, scalar_t,
                                                 decltype(packs)::value>,
                    g.grid, kWarpBlockThreads, 0, static_cast<const scalar_t*>(b.in0),
                    static_cast<const scalar_t*>(b.in1), static_cast<scalar_t*>(b.out), layout, g.shape.group);
    });
  });
}

}  // namespace softmax_ext::cuda
