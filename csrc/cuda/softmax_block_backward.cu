// Block and cluster families, backward: instantiation (kernels in
// block_kernels.cuh, geometry in softmax_block.cu).

#include "cuda/block_kernels.cuh"
#include "cuda/launch.h"

namespace softmax_ext::cuda {

void block_backward(const Problem& p, const Buffers& b, int max_cluster) {
  const auto layout = make_row_indexer<3>(p, {kIn0, kIn1, kOut});
  dispatch_floating_type(p.out_dtype, "softmax_ext cuda.block_backward", [&](auto tag) {
    using scalar_t = typename decltype(tag)::type;
    with_block_geometry<scalar_t, scalar_t, true>(
        p, b.in0, max_cluster, [&](auto packed, auto packs, auto staged, const BlockShape& shape) {
      dispatch_kind(p.kind, [&](auto epilogues) {
        using E = decltype(epilogues);
        launch_row_blocks(softmax_block_backward_kernel<E::template BackwardFor<scalar_t>::template type, scalar_t, decltype(packs)::value,
                                                        decltype(packed)::value, decltype(staged)::value>,
                          p.rows, shape, static_cast<const scalar_t*>(b.in0), static_cast<const scalar_t*>(b.in1),
                          static_cast<scalar_t*>(b.out), layout, shape.cluster_size);
      });
    });
  });
}

}  // namespace softmax_ext::cuda
