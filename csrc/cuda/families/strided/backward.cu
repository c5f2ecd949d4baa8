// Strided family, backward: the launch of the plan's geometry (kernels.cuh).

#include "cuda/core/dispatch.cuh"
#include "cuda/core/launch.cuh"
#include "cuda/families/strided/geometry.h"
#include "cuda/families/strided/kernels.cuh"

namespace softmax_ext::cuda {

void strided_backward(const Plan& plan, const Buffers& b, void*) {
  const Problem& p = plan.problem;
  const StridedGeometry& g = plan.geometry_as<StridedGeometry>();
  const auto layout = make_strided_layout<3>(p, {kIn0, kIn1, kOut});
  dispatch_types<true>(p, "softmax_ext cuda.strided_backward",
                 [&]<typename scalar_t, typename E>(KernelTypes<scalar_t, scalar_t, E>) {
    using Packing = StridedPacking<scalar_t>;
    constexpr int kPerThread = strided_elems_per_thread(is_double_acc_v<scalar_t>, true);
    dispatch_int<1, Packing::kVector>(g.shape.pack, [&](auto pack) {
      constexpr int P = decltype(pack)::value;
      constexpr int kAxis = Packing::elements(kPerThread, P) / P;
      const auto tiled = with_tile_geometry(layout, g.shape.columns, P, g.shape.threads);
      launch_row_blocks(softmax_strided_backward_kernel<E::template BackwardFor<scalar_t>::template type, scalar_t, P,
                                                        kAxis, Packing::packed(P)>,
                        tiled.tiles, g.launch, static_cast<const scalar_t*>(b.in0),
                        static_cast<const scalar_t*>(b.in1), static_cast<scalar_t*>(b.out), tiled, g.shape.columns,
                        g.shape.cluster_size);
    });
  });
}

}  // namespace softmax_ext::cuda
