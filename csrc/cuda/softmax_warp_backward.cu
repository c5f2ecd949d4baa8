// Warp family, backward: launch geometry and instantiation (kernels in
// warp_kernels.cuh; geometry helpers in softmax_warp.cu).

#include "cuda/launch.h"
#include "cuda/warp_kernels.cuh"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

namespace softmax_ext::cuda {

void warp_backward(const Problem& p, const Buffers& b) {
  const auto layout = make_row_indexer<3>(p, {kIn0, kIn1, kOut});
  dispatch_floating_type(p.out_dtype, "softmax_ext cuda.warp_backward", [&](auto tag) {
    using scalar_t = typename decltype(tag)::type;
    constexpr int P = kPack<scalar_t>;
    constexpr int kMaxPacks = elems_per_thread(is_double_acc_v<scalar_t>, true) / P;
    const WarpShape shape =
        warp_shape(p.axis_size + view_slack(p, kIn0, b.in0, sizeof(scalar_t)), P, kMaxPacks, true);
    const unsigned int grid =
        warp_grid(p.rows, shape.group, shape.packs, kMaxPacks, grid_walks_rows(p.in_dtype, p.axis_size, true));
    dispatch_kind(p.kind, [&](auto epilogues) {
      using E = decltype(epilogues);
      dispatch_packs<kMaxPacks>(shape.packs, [&](auto packs) {
        softmax_warp_backward_kernel<E::template BackwardFor<scalar_t>::template type, scalar_t, decltype(packs)::value>
            <<<grid, kWarpBlockThreads, 0,
               c10::cuda::getCurrentCUDAStream()>>>(
                static_cast<const scalar_t*>(b.in0), static_cast<const scalar_t*>(b.in1),
                static_cast<scalar_t*>(b.out), layout, shape.group);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  });
}

}  // namespace softmax_ext::cuda
