// The strided family's registry entry (plan/registry.cpp) and the geometry
// select() computes for it (policy.h, geometry.h).

#include "cuda/core/columns.h"
#include "cuda/families/strided/geometry.h"
#include "cuda/families/strided/policy.h"
#include "plan/family.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace softmax_ext::cuda {
namespace {

// The tile (strided_shape, which checks it).
StridedShape strided_tile(const Problem& p, int pack, int64_t per_thread, int max_cluster) {
  const int64_t bytes = c10::elementSize(p.in_dtype);
  StridedShape s{};
  s.pack = pack;
  int64_t width = strided_widest_tile(p, pack);
  const int64_t axis_per_thread = per_thread / s.pack;
  const int64_t rows_needed = ceil_div(p.axis_size, axis_per_thread);
  // Halve the tile until the largest cluster holds the axis (policy.h).
  const int64_t min_width = std::max<int64_t>(strided_min_tile_columns(bytes), s.pack);
  while (width > min_width && p.axis_size > strided_axis_capacity(per_thread, width, std::max(max_cluster, 1)))
    width /= 2;
  // Narrower tiles rather than clusters of more than 8 blocks (policy.h).
  const int64_t narrow = std::max<int64_t>(kStridedNarrowTileBytes / bytes, min_width);
  while (max_cluster > 1 && width > narrow &&
         rows_needed * (width / s.pack) > int64_t{kStridedPreferredCluster} * kClusterBlockThreads)
    width /= 2;
  s.columns = static_cast<int>(width / s.pack);
  // An axis shorter than a warp's rows: the tile widens into the idle rows,
  // as far as the inner run goes (a one-warp tile reduces by shuffles alone,
  // so its width is not bound by the shared-memory partials).
  const int64_t run_columns = std::max<int64_t>(next_pow2(p.inner_size()) / s.pack, 1);
  while (s.columns * 2 <= std::min<int64_t>(kWarpSize, run_columns) && rows_needed * s.columns * 2 <= kWarpSize)
    s.columns *= 2;
  // One block of up to 1024 threads before any cluster (policy.h).
  if (rows_needed * s.columns <= kMaxBlockThreads || max_cluster <= 1) {
    TORCH_INTERNAL_ASSERT(rows_needed <= kMaxBlockThreads / s.columns, "softmax_ext cuda.strided: an axis of ",
                          p.axis_size, " exceeds a block");
    const int64_t rows_multiple = kWarpSize / s.columns;
    s.threads = static_cast<int>(ceil_div(rows_needed, rows_multiple) * rows_multiple * s.columns);
    s.cluster_size = 1;
    return s;
  }
  // Clusters of up to kStridedWideClusterMax 1024-thread blocks, else of
  // 512-thread blocks while the cluster size allows (policy.h).
  const int64_t wide_blocks = ceil_div(rows_needed, kMaxBlockThreads / s.columns);
  if (wide_blocks <= std::min(kStridedWideClusterMax, max_cluster)) {
    s.threads = kMaxBlockThreads;
    s.cluster_size = static_cast<int>(wide_blocks);
    return s;
  }
  for (int threads : {kClusterBlockThreads, kMaxBlockThreads}) {
    const int64_t blocks = ceil_div(rows_needed, threads / s.columns);
    if (blocks <= max_cluster) {
      s.threads = threads;
      s.cluster_size = static_cast<int>(blocks);
      return s;
    }
  }
  TORCH_INTERNAL_ASSERT(false, "softmax_ext cuda.strided: an axis of ", p.axis_size, " exceeds a cluster");
  return s;
}

StridedShape strided_shape(const Problem& p, int pack, int64_t per_thread, int max_cluster) {
  const StridedShape s = strided_tile(p, pack, per_thread, max_cluster);
  // reduce_columns pushes a block's column totals with one thread each.
  TORCH_INTERNAL_ASSERT(s.cluster_size == 1 || int64_t{s.cluster_size} * s.columns * s.pack <= s.threads,
                        "softmax_ext cuda.strided: a cluster of ", s.cluster_size, " tiles ", s.columns * s.pack,
                        " wide in blocks of ", s.threads);
  return s;
}

// The geometry of a launch of in_bytes elements whose reduction keeps
// values of value_bytes, `per_thread` accumulator values a thread.
bool takes_strided(const Problem& p, const DeviceFacts* device) {
  return has_fast_kernels(p.in_dtype, p.out_dtype) && !p.axis_contiguous() && p.inner_size() >= kStridedMinInner &&
         p.axis_size <= strided_reach(p.acc_dtype() == c10::ScalarType::Double, p.is_backward(),
                                      c10::elementSize(p.in_dtype), device->max_cluster);
}

void plan_strided(const Problem& p, const DeviceFacts* device, Plan& plan) {
  const bool bw = p.is_backward();
  const int64_t in_bytes = c10::elementSize(p.in_dtype);
  const bool reduced = is_16bit_float(p.in_dtype);
  const int vector = reduced ? pack_size(in_bytes) / 2 : pack_size(in_bytes);
  const int per_thread = strided_elems_per_thread(p.out_dtype == c10::ScalarType::Double, bw);
  const int pack = strided_pack(p, vector);
  StridedGeometry& g = plan.geometry_as<StridedGeometry>();
  g.shape = strided_shape(p, pack, int64_t{per_thread} * (reduced && pack > 1 ? 2 : 1), device->max_cluster);
  // The reduction keeps (max, sum) pairs forward, sums backward.
  const int64_t value_bytes = (p.out_dtype == c10::ScalarType::Double ? 8 : 4) * (bw ? 1 : 2);
  g.launch = {g.shape.threads, g.shape.cluster_size,
              strided_reduction_bytes(value_bytes, g.shape.threads, strided_max_columns(in_bytes),
                                      g.shape.columns * g.shape.pack, g.shape.cluster_size),
              strided_persistent(g.shape.threads)};
  g.one_warp = g.shape.threads == kWarpSize && g.shape.cluster_size == 1;
}

void strided_limits(c10::ScalarType dtype, bool backward, const DeviceFacts& device, Limits& out) {
  out.emplace_back("strided", strided_reach(dtype == c10::ScalarType::Double, backward, c10::elementSize(dtype),
                                            device.max_cluster));
  out.emplace_back("strided_min_inner", kStridedMinInner);
}

}  // namespace
}  // namespace softmax_ext::cuda

namespace softmax_ext {

extern const Family kCudaStrided = {"cuda.strided", c10::DeviceType::CUDA, /*deterministic=*/true,
                                    /*uses_atomics=*/false, /*relayout_helps=*/false, cuda::takes_strided, cuda::plan_strided, nullptr,
                                    cuda::strided_forward, cuda::strided_backward, cuda::strided_limits};

}  // namespace softmax_ext
