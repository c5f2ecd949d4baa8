// Warp family, forward: launch geometry and instantiation (kernels in
// warp_kernels.cuh).

#include "cuda/launch.h"
#include "cuda/warp_kernels.cuh"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

namespace softmax_ext::cuda {

WarpShape warp_shape(int64_t needed, int pack, int max_packs, bool backward) {
  const int64_t packs_needed = ceil_div(needed, pack);
  const int64_t holding = next_pow2(ceil_div(packs_needed, max_packs));
  const int64_t per_lane = std::min<int64_t>(warp_target_packs(kVectorBytes / pack, backward, packs_needed), max_packs);
  const int64_t lanes = backward ? next_pow2(ceil_div(packs_needed, per_lane))
                                 : prev_pow2(std::max<int64_t>(packs_needed / per_lane, 1));
  // Rows of four packs a lane keep kWarpMinWideGroup lanes where each still
  // gets two packs.
  const int64_t wide_floor = per_lane > 2 ? std::min<int64_t>(next_pow2(packs_needed) / 2, kWarpMinWideGroup) : 1;
  const int64_t group =
      std::clamp<int64_t>(std::max({holding, lanes, wide_floor}), std::min<int64_t>(packs_needed, kWarpMinGroup), kWarpSize);
  const int64_t packs = std::min<int64_t>(next_pow2(ceil_div(packs_needed, group)), max_packs);
  return {static_cast<int>(group), static_cast<int>(packs)};
}

unsigned int warp_grid(int64_t rows, int group, int packs, int max_packs, bool walk) {
  const int rows_per_block = warp_rows(packs, max_packs) * (kWarpBlockThreads / group);
  const int64_t passes = ceil_div(rows, rows_per_block);
  return walk ? grid_for_rows(passes) : grid_for_each(passes);
}

void warp_forward(const Problem& p, const Buffers& b) {
  const auto layout = make_row_indexer<2>(p, {kIn0, kOut});
  dispatch_fast_pair(p.in_dtype, p.out_dtype, "softmax_ext cuda.warp", [&](auto in_tag, auto out_tag) {
    using in_t = typename decltype(in_tag)::type;
    using out_t = typename decltype(out_tag)::type;
    constexpr int P = kPack<in_t>;
    constexpr int kMaxPacks = elems_per_thread(is_double_acc_v<out_t>, false) / P;
    const WarpShape shape =
        warp_shape(p.axis_size + view_slack(p, kIn0, b.in0, sizeof(in_t)), P, kMaxPacks, false);
    const unsigned int grid =
        warp_grid(p.rows, shape.group, shape.packs, kMaxPacks, grid_walks_rows(p.in_dtype, p.axis_size, false));
    const int view_align = warp_view_align(p.axis_size, shape, sizeof(in_t));
    dispatch_kind(p.kind, [&](auto epilogues) {
      using E = decltype(epilogues);
      dispatch_packs<kMaxPacks>(shape.packs, [&](auto packs) {
        softmax_warp_forward_kernel<E::template ForwardFor<out_t>::template type, in_t, out_t, decltype(packs)::value>
            <<<grid, kWarpBlockThreads, 0,
               c10::cuda::getCurrentCUDAStream()>>>(static_cast<const in_t*>(b.in0),
                                                    static_cast<out_t*>(b.out), layout, shape.group, view_align);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  });
}

}  // namespace softmax_ext::cuda
