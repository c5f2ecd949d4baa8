// The warp family's registry entry (plan/registry.cpp) and the geometry
// select() computes for it (policy.h).

#include "cuda/core/grid.h"
#include "cuda/core/row_views.h"
#include "cuda/families/warp/policy.h"
#include "plan/family.h"

#include <algorithm>

namespace softmax_ext::cuda {
namespace {

// The group and packs a lane for rows of `needed` view positions, `pack`
// elements a pack, at most max_packs packs a lane.
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

bool takes_warp(const Problem& p, const DeviceFacts*) {
  return has_fast_kernels(p.in_dtype, p.out_dtype) && p.axis_contiguous() &&
         p.axis_size <= warp_capacity(p.acc_dtype() == c10::ScalarType::Double, p.is_backward());
}

void plan_warp(const Problem& p, const DeviceFacts*, Plan& plan) {
  const bool bw = p.is_backward();
  const int64_t in_bytes = c10::elementSize(p.in_dtype);
  const int pack = pack_size(in_bytes);
  const int max_packs = elems_per_thread(p.out_dtype == c10::ScalarType::Double, bw) / pack;
  WarpGeometry& g = plan.geometry_as<WarpGeometry>();
  g.shape = warp_shape(p.axis_size + view_slack(p, kIn0, in_bytes), pack, max_packs, bw);
  g.grid = warp_grid(p.rows, g.shape.group, g.shape.packs, max_packs, grid_walks_rows(p.in_dtype, p.axis_size, bw));
  g.view_align = bw ? kVectorBytes : warp_view_align(p.axis_size, g.shape, in_bytes);
}

void warp_limits(c10::ScalarType dtype, bool backward, const DeviceFacts&, Limits& out) {
  out.emplace_back("warp", warp_capacity(dtype == c10::ScalarType::Double, backward));
}

}  // namespace
}  // namespace softmax_ext::cuda

namespace softmax_ext {

extern const Family kCudaWarp = {"cuda.warp", c10::DeviceType::CUDA, /*deterministic=*/true, /*uses_atomics=*/false,
                                 /*relayout_helps=*/false, cuda::takes_warp, cuda::plan_warp, nullptr, cuda::warp_forward,
                                 cuda::warp_backward, cuda::warp_limits};

}  // namespace softmax_ext
