// Split family, forward: workspace layout and the three launches (kernels in
// split_kernels.cuh).

#include "cuda/launch.h"
#include "cuda/split_kernels.cuh"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdlib>

namespace softmax_ext::cuda {

void split_forward(const Problem& p, const Buffers& b, void* workspace) {
  const auto layout = make_row_indexer<2>(p, {kIn0, kOut});
  const auto stream = c10::cuda::getCurrentCUDAStream();
  dispatch_fast_pair(p.in_dtype, p.out_dtype, "softmax_ext cuda.split", [&](auto in_tag, auto out_tag) {
    using in_t = typename decltype(in_tag)::type;
    using out_t = typename decltype(out_tag)::type;
    using acc_t = acc_type<out_t>;
    constexpr int kPacks = elems_per_thread(is_double_acc_v<out_t>, false) / kPack<in_t>;
    auto* partials = static_cast<MaxSum<acc_t>*>(workspace);
    auto* totals = reinterpret_cast<MaxSum<acc_t>*>(static_cast<char*>(workspace) + split_partials_bytes(p));
    const auto* x = static_cast<const in_t*>(b.in0);
    dispatch_kind(p.kind, [&](auto epilogues) {
      using E = decltype(epilogues);
      SplitShape g = split_shape(p);
      softmax_split_stats_kernel<in_t, out_t, kPacks>
          <<<grid_for_rows(g.rows * g.chunks), kSplitThreads, 0, stream>>>(x, partials, layout, g);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      softmax_split_combine_kernel<acc_t>
          <<<grid_for_rows(g.rows), kSplitCombineThreads, 0, stream>>>(partials, totals, g);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      // LAB: apply variants (divisor, blocks per SM)
      const char* lab = std::getenv("LAB_APPLY");
      const int variant = lab ? std::atoi(lab) : 4;
      auto apply = [&](auto div_tag, auto blocks_tag) {
        constexpr int kDiv = decltype(div_tag)::value;
        constexpr int kBlocks = decltype(blocks_tag)::value;
        const int64_t pack = kPack<in_t>;
        g.apply_tiles = ceil_div(p.axis_size + pack - 1, int64_t{kSplitThreads} * kPacks / kDiv * pack);
        const char* fw = std::getenv("LAB_APPLY_FWD");
        g.lab_forward = fw && fw[0] == '1';
        const char* gr = std::getenv("LAB_APPLY_GRID");
        int64_t grid = g.rows * g.apply_tiles;
        if (gr && std::atoi(gr) > 0) grid = std::min<int64_t>(grid, int64_t{std::atoi(gr)} * 132 * kBlocks);
        softmax_split_apply_kernel<E::template ForwardFor<out_t>::template type, in_t, out_t, kPacks / kDiv, kBlocks>
            <<<grid_for_rows(grid), kSplitThreads, 0, stream>>>(x, static_cast<out_t*>(b.out),
                                                                                   totals, layout, g);
      };
      if (variant == 1) apply(std::integral_constant<int, 1>{}, std::integral_constant<int, 2>{});
      else if (variant == 2) apply(std::integral_constant<int, 2>{}, std::integral_constant<int, 3>{});
      else apply(std::integral_constant<int, 4>{}, std::integral_constant<int, 4>{});
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

}  // namespace softmax_ext::cuda
