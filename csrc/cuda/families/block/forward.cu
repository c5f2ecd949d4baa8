// Block and cluster families, forward: the launch of the plan's geometry
// (kernels.cuh), and the kernel the device's cluster size is probed with.

#include "cuda/core/device.h"
#include "cuda/core/dispatch.cuh"
#include "cuda/core/launch.cuh"
#include "cuda/families/block/geometry.h"
#include "cuda/families/block/kernels.cuh"

namespace softmax_ext::cuda {

void block_forward(const Plan& plan, const Buffers& b, void*) {
  const Problem& p = plan.problem;
  const BlockGeometry& g = plan.geometry_as<BlockGeometry>();
  const auto layout = make_row_indexer<2>(p, {kIn0, kOut});
  dispatch_types<false>(p, "softmax_ext cuda.block",
                 [&]<typename in_t, typename out_t, typename E>(KernelTypes<in_t, out_t, E>) {
    dispatch_bool(g.packed, [&](auto packed) {
      constexpr bool kPacked = decltype(packed)::value && is_reduced_float_v<in_t>;
      constexpr int kPacks = elems_per_thread(is_double_acc_v<out_t>, false) * (kPacked ? 2 : 1) / kPack<in_t>;
      TORCH_INTERNAL_ASSERT(kPacks == g.packs, "softmax_ext cuda.block: ", g.packs, " packs planned");
      dispatch_bool(g.staged, [&](auto staged) {
        // Clusters keep 16-bit rows packed: no unpacked 16-bit row is staged.
        constexpr bool kStaged = decltype(staged)::value && (kPacked || !is_reduced_float_v<in_t>);
        launch_row_blocks(softmax_block_forward_kernel<E::template ForwardFor<out_t>::template type, in_t, out_t,
                                                       kPacks, kPacked, kStaged>,
                          p.rows, g.launch, static_cast<const in_t*>(b.in0), static_cast<out_t*>(b.out), layout,
                          g.launch.cluster_size);
      });
    });
  });
}

const void* cluster_probe_kernel() {
  return reinterpret_cast<const void*>(
      softmax_block_forward_kernel<SoftmaxEpilogues::Forward, float, float,
                                   elems_per_thread(false, false) / kPack<float>, false, false>);
}

}  // namespace softmax_ext::cuda
