// Split families, backward: the three kernels with their workspace, and the
// resident kernel (kernels.cuh, resident_kernels.cuh), on the plan's
// geometry.

#include "cuda/core/dispatch.cuh"
#include "cuda/core/launch.cuh"
#include "cuda/families/split/kernels.cuh"
#include "cuda/families/split/resident_kernels.cuh"
#include "cuda/families/split/resident_launch.cuh"

namespace softmax_ext::cuda {

void split_backward(const Plan& plan, const Buffers& b, void* workspace) {
  const Problem& p = plan.problem;
  const SplitShape& g = plan.geometry_as<SplitShape>();
  const auto layout = make_row_indexer<3>(p, {kIn0, kIn1, kOut});
  dispatch_types<true>(p, "softmax_ext cuda.split_backward",
                 [&]<typename scalar_t, typename E>(KernelTypes<scalar_t, scalar_t, E>) {
    using acc_t = acc_type<scalar_t>;
    using Epilogue = typename E::template BackwardFor<scalar_t>;
    constexpr int kPacks = elems_per_thread(is_double_acc_v<scalar_t>, true) / kPack<scalar_t>;
    auto* partials = static_cast<acc_t*>(workspace);
    auto* totals = reinterpret_cast<acc_t*>(static_cast<char*>(workspace) + split_partials_bytes(p));
    const auto* dy = static_cast<const scalar_t*>(b.in0);
    const auto* y = static_cast<const scalar_t*>(b.in1);
    launch_kernel(softmax_split_backward_stats_kernel<Epilogue::template type, scalar_t, kPacks>,
                  grid_for_rows(g.rows * g.chunks), kSplitThreads, 0, dy, y, partials, layout, g);
    launch_kernel(softmax_split_combine_kernel<acc_t, acc_t>, grid_for_rows(g.rows), kSplitCombineThreads, 0,
                  partials, totals, g);
    static_assert(split_apply_divisor(sizeof(scalar_t), true) == 1, "the backward apply keeps the stats tiles");
    launch_kernel(softmax_split_backward_apply_kernel<Epilogue::template type, scalar_t, kPacks,
                                                      split_apply_blocks_per_sm(sizeof(scalar_t), true)>,
                  grid_for_rows(g.rows * g.apply_tiles), kSplitThreads, 0, dy, y, static_cast<scalar_t*>(b.out),
                  totals, layout, g);
  });
}

namespace {

// The resident kernel of p's type and kind: f(kernel, its KernelTypes).
template <typename F>
void with_resident_kernel(const Problem& p, F&& f) {
  dispatch_types<true>(p, "softmax_ext cuda.split_resident_backward",
                 [&]<typename scalar_t, typename E>(KernelTypes<scalar_t, scalar_t, E>) {
    using Epilogue = typename E::template BackwardFor<scalar_t>;
    constexpr int kPacks = elems_per_thread(is_double_acc_v<scalar_t>, true) / kPack<scalar_t>;
    static_assert(HeldTiles<2, kPacks>::kTileBytes ==
                  resident_tile_thread_bytes(sizeof(scalar_t), is_double_acc_v<scalar_t>, true));
    f(softmax_split_resident_backward_kernel<Epilogue::template type, scalar_t, kPacks>,
      KernelTypes<scalar_t, scalar_t, E>{});
  });
}

}  // namespace

int64_t resident_blocks_backward(const Problem& p, int64_t smem_bytes) {
  int64_t blocks = 0;
  with_resident_kernel(p, [&](auto kernel, auto) { blocks = resident_blocks(kernel, smem_bytes); });
  return blocks;
}

void split_resident_backward(const Plan& plan, const Buffers& b, void* workspace) {
  const Problem& p = plan.problem;
  const ResidentGeometry& g = plan.geometry_as<ResidentGeometry>();
  const auto layout = make_row_indexer<3>(p, {kIn0, kIn1, kOut});
  unsigned* arrivals = resident_arrivals(p, workspace);
  with_resident_kernel(p, [&]<typename scalar_t, typename E>(auto kernel, KernelTypes<scalar_t, scalar_t, E>) {
    launch_resident(kernel, p, g, arrivals, static_cast<const scalar_t*>(b.in0), static_cast<const scalar_t*>(b.in1),
                    static_cast<scalar_t*>(b.out), static_cast<acc_type<scalar_t>*>(workspace), arrivals, layout,
                    g.shape);
  });
}

}  // namespace softmax_ext::cuda
