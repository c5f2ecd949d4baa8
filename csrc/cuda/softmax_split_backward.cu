// Split family, backward: the resident kernel where a group of rows fits in
// L2, else the three kernels with their workspace layout (kernels in
// split_kernels.cuh).

#include "cuda/launch.h"
#include "cuda/split_kernels.cuh"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

namespace softmax_ext::cuda {

void split_backward(const Problem& p, const Buffers& b, void* workspace, bool resident) {
  const auto layout = make_row_indexer<3>(p, {kIn0, kIn1, kOut});
  const auto stream = c10::cuda::getCurrentCUDAStream();
  dispatch_floating_type(p.out_dtype, "softmax_ext cuda.split_backward", [&](auto tag) {
    using scalar_t = typename decltype(tag)::type;
    using acc_t = acc_type<scalar_t>;
    constexpr int kPacks = elems_per_thread(is_double_acc_v<scalar_t>, true) / kPack<scalar_t>;
    auto* partials = static_cast<acc_t*>(workspace);
    auto* totals = reinterpret_cast<acc_t*>(static_cast<char*>(workspace) + split_partials_bytes(p));
    const auto* dy = static_cast<const scalar_t*>(b.in0);
    const auto* y = static_cast<const scalar_t*>(b.in1);
    dispatch_kind(p.kind, [&](auto epilogues) {
      using E = decltype(epilogues);
      using Epilogue = typename E::template BackwardFor<scalar_t>;
      if (resident) {
        auto* kernel = softmax_split_resident_backward_kernel<Epilogue::template type, scalar_t, kPacks>;
        static_assert(HeldTiles<2, kPacks>::kTileBytes ==
                      resident_tile_thread_bytes(sizeof(scalar_t), is_double_acc_v<scalar_t>, true));
        const ResidentLaunch launch(reinterpret_cast<const void*>(kernel), p, workspace, stream);
        C10_CUDA_CHECK(cudaLaunchKernelEx(&launch.config, kernel, dy, y, static_cast<scalar_t*>(b.out),
                                          static_cast<acc_t*>(launch.partials), launch.arrivals, layout,
                                          launch.shape));
        return;
      }
      const SplitShape g = split_shape(p);
      softmax_split_backward_stats_kernel<Epilogue::template type, scalar_t, kPacks>
          <<<grid_for_rows(g.rows * g.chunks), kSplitThreads, 0, stream>>>(dy, y, partials, layout, g);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      softmax_split_backward_combine_kernel<acc_t>
          <<<grid_for_rows(g.rows), kSplitCombineThreads, 0, stream>>>(partials, totals, g);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      static_assert(split_apply_divisor(sizeof(scalar_t), true) == 1, "the backward apply keeps the stats tiles");
      softmax_split_backward_apply_kernel<Epilogue::template type, scalar_t, kPacks,
                                          split_apply_blocks_per_sm(sizeof(scalar_t), true)>
          <<<grid_for_rows(g.rows * g.apply_tiles), kSplitThreads, 0, stream>>>(dy, y, static_cast<scalar_t*>(b.out),
                                                                                 totals, layout, g);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

}  // namespace softmax_ext::cuda
