// Strided family, backward: instantiation (kernels in strided_kernels.cuh,
// geometry in softmax_strided.cu).

#include "cuda/block_kernels.cuh"
#include "cuda/launch.h"
#include "cuda/strided_kernels.cuh"

namespace softmax_ext::cuda {

void strided_backward(const Problem& p, const Buffers& b, int max_cluster) {
  const auto layout = make_strided_layout<3>(p, {kIn0, kIn1, kOut});
  dispatch_floating_type(p.out_dtype, "softmax_ext cuda.strided_backward", [&](auto tag) {
    using scalar_t = typename decltype(tag)::type;
    constexpr int kPerThread = strided_elems_per_thread(is_double_acc_v<scalar_t>, true);
    using Packing = StridedPacking<scalar_t>;
    const StridedShape shape = strided_launch_shape<scalar_t>(p, b, kPerThread, max_cluster);
    dispatch_kind(p.kind, [&](auto epilogues) {
      using E = decltype(epilogues);
      dispatch_strided_pack<scalar_t>(shape.pack, [&](auto pack) {
        constexpr int P = decltype(pack)::value;
        constexpr int kAxis = Packing::elements(kPerThread, P) / P;
        const auto tiled = with_tile_geometry(layout, shape.columns, P, shape.threads);
        launch_row_blocks(softmax_strided_backward_kernel<E::template BackwardFor<scalar_t>::template type, scalar_t,
                                                          P, kAxis, Packing::packed(P)>,
                          tiled.tiles, shape.launch(sizeof(scalar_t), sizeof(acc_type<scalar_t>)),
                          static_cast<const scalar_t*>(b.in0), static_cast<const scalar_t*>(b.in1),
                          static_cast<scalar_t*>(b.out), tiled, shape.columns, shape.cluster_size);
      });
    });
  });
}

}  // namespace softmax_ext::cuda
