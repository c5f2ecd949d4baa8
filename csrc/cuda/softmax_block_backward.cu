// Block and cluster families, backward: instantiation (kernels in
// block_kernels.cuh, geometry in softmax_block.cu).

#include "cuda/block_kernels.cuh"
#include "cuda/launch.h"

namespace softmax_ext::cuda {

void block_backward(const Problem& p, const Buffers& b, int max_cluster) {
  const auto layout = make_row_indexer<3>(p, {kIn0, kIn1, kOut});
  dispatch_floating_type(p.out_dtype, "softmax_ext cuda.block_backward", [&](auto tag) {
    using scalar_t = typename decltype(tag)::type;
    constexpr int P = kPack<scalar_t>;
    dispatch_bool(keeps_packed(p.in_dtype, p.axis_size, max_cluster > 1), [&](auto packed) {
      constexpr bool kPacked = decltype(packed)::value && is_reduced_float_v<scalar_t>;
      constexpr int kPacks = elems_per_thread(is_double_acc_v<scalar_t>, true) * (kPacked ? 2 : 1) / P;
      const BlockShape shape = block_shape(p.axis_size + view_slack(p, kIn0, b.in0, sizeof(scalar_t)),
                                           kPacks * P, max_cluster, max_cluster_size(p.device_index), true);
      dispatch_kind(p.kind, [&](auto epilogues) {
        using E = decltype(epilogues);
        launch_row_blocks(softmax_block_backward_kernel<E::template Backward, scalar_t, kPacks, kPacked>, p.rows,
                          shape, static_cast<const scalar_t*>(b.in0), static_cast<const scalar_t*>(b.in1),
                          static_cast<scalar_t*>(b.out), layout, shape.cluster_size);
      });
    });
  });
}

}  // namespace softmax_ext::cuda
