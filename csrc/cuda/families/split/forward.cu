// Split families, forward: the three kernels with their workspace, and the
// resident kernel (kernels.cuh, resident_kernels.cuh), on the plan's
// geometry.

#include "cuda/core/dispatch.cuh"
#include "cuda/core/launch.cuh"
#include "cuda/families/split/kernels.cuh"
#include "cuda/families/split/resident_kernels.cuh"
#include "cuda/families/split/resident_launch.cuh"

namespace softmax_ext::cuda {

void split_forward(const Plan& plan, const Buffers& b, void* workspace) {
  const Problem& p = plan.problem;
  const SplitShape& g = plan.geometry_as<SplitShape>();
  const auto layout = make_row_indexer<2>(p, {kIn0, kOut});
  dispatch_types<false>(p, "softmax_ext cuda.split",
                 [&]<typename in_t, typename out_t, typename E>(KernelTypes<in_t, out_t, E>) {
    using acc_t = acc_type<out_t>;
    constexpr int kPacks = elems_per_thread(is_double_acc_v<out_t>, false) / kPack<in_t>;
    auto* partials = static_cast<MaxSum<acc_t>*>(workspace);
    auto* totals = reinterpret_cast<MaxSum<acc_t>*>(static_cast<char*>(workspace) + split_partials_bytes(p));
    const auto* x = static_cast<const in_t*>(b.in0);
    launch_kernel(softmax_split_stats_kernel<in_t, out_t, kPacks>, grid_for_rows(g.rows * g.chunks), kSplitThreads,
                  0, x, partials, layout, g);
    launch_kernel(softmax_split_combine_kernel<acc_t, MaxSum<acc_t>>, grid_for_rows(g.rows), kSplitCombineThreads,
                  0, partials, totals, g);
    constexpr int kDivisor = split_apply_divisor(sizeof(in_t), false);
    launch_kernel(softmax_split_apply_kernel<E::template ForwardFor<out_t>::template type, in_t, out_t,
                                             kPacks / kDivisor, split_apply_blocks_per_sm(sizeof(in_t), false)>,
                  grid_for_rows(g.rows * g.apply_tiles), kSplitThreads, 0, x, static_cast<out_t*>(b.out), totals,
                  layout, g);
  });
}

namespace {

// The resident kernel of p's types and kind: f(kernel, its KernelTypes).
template <typename F>
void with_resident_kernel(const Problem& p, F&& f) {
  dispatch_types<false>(p, "softmax_ext cuda.split_resident",
                 [&]<typename in_t, typename out_t, typename E>(KernelTypes<in_t, out_t, E>) {
    constexpr int kPacks = elems_per_thread(is_double_acc_v<out_t>, false) / kPack<in_t>;
    static_assert(HeldTiles<1, kPacks>::kTileBytes ==
                  resident_tile_thread_bytes(sizeof(in_t), is_double_acc_v<out_t>, false));
    f(softmax_split_resident_kernel<E::template ForwardFor<out_t>::template type, in_t, out_t, kPacks>,
      KernelTypes<in_t, out_t, E>{});
  });
}

}  // namespace

int64_t resident_blocks_forward(const Problem& p, int64_t smem_bytes) {
  int64_t blocks = 0;
  with_resident_kernel(p, [&](auto kernel, auto) { blocks = resident_blocks(kernel, smem_bytes); });
  return blocks;
}

void split_resident_forward(const Plan& plan, const Buffers& b, void* workspace) {
  const Problem& p = plan.problem;
  const ResidentGeometry& g = plan.geometry_as<ResidentGeometry>();
  const auto layout = make_row_indexer<2>(p, {kIn0, kOut});
  unsigned* arrivals = resident_arrivals(p, workspace);
  with_resident_kernel(p, [&]<typename in_t, typename out_t, typename E>(auto kernel, KernelTypes<in_t, out_t, E>) {
    launch_resident(kernel, p, g, arrivals, static_cast<const in_t*>(b.in0), static_cast<out_t*>(b.out),
                    static_cast<MaxSum<acc_type<out_t>>*>(workspace), arrivals, layout, g.shape);
  });
}

}  // namespace softmax_ext::cuda
