// Strided family, forward: the launch of the plan's geometry (kernels.cuh).

#include "cuda/core/dispatch.cuh"
#include "cuda/core/launch.cuh"
#include "cuda/families/strided/geometry.h"
#include "cuda/families/strided/kernels.cuh"

namespace softmax_ext::cuda {

void strided_forward(const Plan& plan, const Buffers& b, void*) {
  const Problem& p = plan.problem;
  const StridedGeometry& g = plan.geometry_as<StridedGeometry>();
  const auto layout = make_strided_layout<2>(p, {kIn0, kOut});
  dispatch_types<false>(p, "softmax_ext cuda.strided",
                 [&]<typename in_t, typename out_t, typename E>(KernelTypes<in_t, out_t, E>) {
    using Packing = StridedPacking<in_t>;
    constexpr int kPerThread = strided_elems_per_thread(is_double_acc_v<out_t>, false);
    dispatch_int<1, Packing::kVector>(g.shape.pack, [&](auto vector) {
      constexpr int P = decltype(vector)::value;
      constexpr int kAxis = Packing::elements(kPerThread, P) / P;
      const auto tiled = with_tile_geometry(layout, g.shape.columns, P, g.shape.threads);
      dispatch_bool(g.one_warp, [&](auto one_warp) {
        launch_row_blocks(softmax_strided_forward_kernel<E::template ForwardFor<out_t>::template type, in_t, out_t,
                                                         P, kAxis, decltype(one_warp)::value, Packing::packed(P)>,
                          tiled.tiles, g.launch, static_cast<const in_t*>(b.in0), static_cast<out_t*>(b.out), tiled,
                          g.shape.columns, g.shape.cluster_size);
      });
    });
  });
}

}  // namespace softmax_ext::cuda
