// Split family, forward: the resident kernel where a group of rows fits in
// L2, else the three kernels with their workspace layout (kernels in
// split_kernels.cuh).

#include "cuda/launch.h"
#include "cuda/split_kernels.cuh"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

namespace softmax_ext::cuda {

void split_forward(const Problem& p, const Buffers& b, void* workspace, bool resident) {
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
      using Epilogue = typename E::template ForwardFor<out_t>;
      if (resident) {
        auto* kernel = softmax_split_resident_kernel<Epilogue::template type, in_t, out_t, kPacks>;
        static_assert(HeldTiles<1, kPacks>::kTileBytes ==
                      resident_tile_thread_bytes(sizeof(in_t), is_double_acc_v<out_t>, false));
        const ResidentLaunch launch(reinterpret_cast<const void*>(kernel), p, workspace, stream);
        C10_CUDA_CHECK(cudaLaunchKernelEx(&launch.config, kernel, x, static_cast<out_t*>(b.out),
                                          static_cast<MaxSum<acc_t>*>(launch.partials), launch.arrivals, layout,
                                          launch.shape));
        return;
      }
      const SplitShape g = split_shape(p);
      softmax_split_stats_kernel<in_t, out_t, kPacks>
          <<<grid_for_rows(g.rows * g.chunks), kSplitThreads, 0, stream>>>(x, partials, layout, g);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      softmax_split_combine_kernel<acc_t>
          <<<grid_for_rows(g.rows), kSplitCombineThreads, 0, stream>>>(partials, totals, g);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      constexpr int kDivisor = split_apply_divisor(sizeof(in_t), false);
      softmax_split_apply_kernel<Epilogue::template type, in_t, out_t, kPacks / kDivisor,
                                 split_apply_blocks_per_sm(sizeof(in_t), false)>
          <<<grid_for_rows(g.rows * g.apply_tiles), kSplitThreads, 0, stream>>>(x, static_cast<out_t*>(b.out),
                                                                                 totals, layout, g);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

}  // namespace softmax_ext::cuda
