// Strided split family, forward: workspace layout and the three launches
// (kernels in strided_split_kernels.cuh).

#include "cuda/launch.h"
#include "cuda/strided_split_kernels.cuh"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

namespace softmax_ext::cuda {

void strided_split_forward(const Problem& p, const Buffers& b, void* workspace) {
  const auto layout = make_strided_layout<2>(p, {kIn0, kOut});
  const auto stream = c10::cuda::getCurrentCUDAStream();
  dispatch_fast_pair(p.in_dtype, p.out_dtype, "softmax_ext cuda.strided_split", [&](auto in_tag, auto out_tag) {
    using in_t = typename decltype(in_tag)::type;
    using out_t = typename decltype(out_tag)::type;
    using acc_t = acc_type<out_t>;
    auto* partials = static_cast<MaxSum<acc_t>*>(workspace);
    auto* totals = reinterpret_cast<MaxSum<acc_t>*>(static_cast<char*>(workspace) + strided_split_partials_bytes(p));
    const auto* x = static_cast<const in_t*>(b.in0);
    const int pack = strided_pack(p, b, kPack<in_t>);
    const int columns = strided_split_columns(p, pack);
    dispatch_kind(p.kind, [&](auto epilogues) {
      using E = decltype(epilogues);
      dispatch_strided_pack<in_t, kPack<in_t>>(pack, [&](auto vector) {
        constexpr int P = decltype(vector)::value;
        const auto tiled = with_tile_geometry(layout, columns, P, kStridedSplitThreads);
        const StridedSplitShape g = strided_split_shape(p, tiled.tiles);
        softmax_strided_split_stats_kernel<in_t, out_t, P>
            <<<grid_for_rows(g.items), kStridedSplitThreads, 0, stream>>>(x, partials, tiled, columns, g);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        softmax_strided_split_combine_kernel<acc_t>
            <<<grid_for_rows(ceil_div(p.rows, kStridedSplitCombineThreads)), kStridedSplitCombineThreads, 0,
               stream>>>(partials, totals, p.rows, g);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        softmax_strided_split_apply_kernel<E::template ForwardFor<out_t>::template type, in_t, out_t, P>
            <<<grid_for_rows(g.items), kStridedSplitThreads, 0, stream>>>(x, static_cast<out_t*>(b.out), totals,
                                                                          tiled, columns, g);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  });
}

}  // namespace softmax_ext::cuda
