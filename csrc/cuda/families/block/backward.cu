// Block and cluster families, backward: the launch of the plan's geometry
// (kernels.cuh).

#include "cuda/core/dispatch.cuh"
#include "cuda/core/launch.cuh"
#include "cuda/families/block/geometry.h"
#include "cuda/families/block/kernels.cuh"

namespace softmax_ext::cuda {

void block_backward(const Plan& plan, const Buffers& b, void*) {
  const Problem& p = plan.problem;
  const BlockGeometry& g = plan.geometry_as<BlockGeometry>();
  const auto layout = make_row_indexer<3>(p, {kIn0, kIn1, kOut});
  dispatch_types<true>(p, "softmax_ext cuda.block_backward",
                 [&]<typename scalar_t, typename E>(KernelTypes<scalar_t, scalar_t, E>) {
    dispatch_bool(g.packed, [&](auto packed) {
      constexpr bool kPacked = decltype(packed)::value && is_reduced_float_v<scalar_t>;
      constexpr int kPacks = elems_per_thread(is_double_acc_v<scalar_t>, true) * (kPacked ? 2 : 1) / kPack<scalar_t>;
      TORCH_INTERNAL_ASSERT(kPacks == g.packs, "softmax_ext cuda.block_backward: ", g.packs, " packs planned");
      dispatch_bool(g.staged, [&](auto staged) {
        constexpr bool kStaged = decltype(staged)::value && (kPacked || !is_reduced_float_v<scalar_t>);
        launch_row_blocks(softmax_block_backward_kernel<E::template BackwardFor<scalar_t>::template type, scalar_t,
                                                        kPacks, kPacked, kStaged>,
                          p.rows, g.launch, static_cast<const scalar_t*>(b.in0), static_cast<const scalar_t*>(b.in1),
                          static_cast<scalar_t*>(b.out), layout, g.launch.cluster_size);
      });
    });
  });
}

}  // namespace softmax_ext::cuda
