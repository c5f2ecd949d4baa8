// Strided split family, backward: workspace layout and the three launches
// (kernels in strided_split_kernels.cuh).

#include "cuda/launch.h"
#include "cuda/strided_split_kernels.cuh"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

namespace softmax_ext::cuda {

void strided_split_backward(const Problem& p, const Buffers& b, void* workspace) {
  const auto layout = make_strided_layout<3>(p, {kIn0, kIn1, kOut});
  const auto stream = c10::cuda::getCurrentCUDAStream();
  dispatch_floating_type(p.out_dtype, "softmax_ext cuda.strided_split_backward", [&](auto tag) {
    using scalar_t = typename decltype(tag)::type;
    using acc_t = acc_type<scalar_t>;
    auto* partials = static_cast<acc_t*>(workspace);
    auto* totals = reinterpret_cast<acc_t*>(static_cast<char*>(workspace) + strided_split_partials_bytes(p));
    const auto* dy = static_cast<const scalar_t*>(b.in0);
    const auto* y = static_cast<const scalar_t*>(b.in1);
    const int pack = strided_pack(p, b, kPack<scalar_t>);
    const int columns = strided_split_columns(p, pack);
    dispatch_kind(p.kind, [&](auto epilogues) {
      using E = decltype(epilogues);
      dispatch_strided_pack<scalar_t, kPack<scalar_t>>(pack, [&](auto vector) {
        constexpr int P = decltype(vector)::value;
        const auto tiled = with_tile_geometry(layout, columns, P, kStridedSplitThreads);
        const StridedSplitShape g = strided_split_shape(p, tiled.tiles);
        softmax_strided_split_backward_stats_kernel<E::template BackwardFor<scalar_t>::template type, scalar_t, P>
            <<<grid_for_rows(g.items), kStridedSplitThreads, 0, stream>>>(dy, y, partials, tiled, columns, g);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        softmax_strided_split_backward_combine_kernel<acc_t>
            <<<grid_for_rows(ceil_div(p.rows, kStridedSplitCombineThreads)), kStridedSplitCombineThreads, 0,
               stream>>>(partials, totals, p.rows, g);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        softmax_strided_split_backward_apply_kernel<E::template BackwardFor<scalar_t>::template type, scalar_t,
                                                    P>
            <<<grid_for_rows(g.items), kStridedSplitThreads, 0, stream>>>(dy, y, static_cast<scalar_t*>(b.out),
                                                                          totals, tiled, columns, g);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  });
}

}  // namespace softmax_ext::cuda
