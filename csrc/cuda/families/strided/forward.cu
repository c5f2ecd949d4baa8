// Strided family, forward: tile geometry and instantiation (kernels in
// strided_kernels.cuh).

#include "cuda/block_kernels.cuh"
#include "cuda/launch.h"
#include "cuda/strided_kernels.cuh"

#include <c10/core/ScalarType.h>

namespace softmax_ext::cuda {

// Vector accesses of `vector` elements need every column pack aligned to
// them (at most 16 bytes) in every operand: base pointers, the axis stride
// and the outer strides.
int strided_pack(const Problem& p, const Buffers& b, int vector) {
  const void* bases[kNumOperands] = {b.in0, b.in1, b.out};
  for (int k : {kIn0, kIn1, kOut}) {
    if (k == kIn1 && !p.is_backward()) continue;
    const int64_t bytes = c10::elementSize(k == kOut ? p.out_dtype : p.in_dtype);
    const int64_t align = std::min<int64_t>(kVectorBytes, vector * bytes);
    if (reinterpret_cast<uintptr_t>(bases[k]) % align != 0) return 1;
    if (p.axis_stride[k] * bytes % align != 0) return 1;
    for (int d = 0; d + 1 < p.batch_rank; ++d)
      if (p.batch_stride[k][d] * bytes % align != 0) return 1;
  }
  return vector;
}

// The tile (strided_shape, which checks it).
static StridedShape strided_tile(const Problem& p, int pack, int64_t per_thread, int max_cluster) {
  const int64_t bytes = c10::elementSize(p.in_dtype);
  StridedShape s{};
  s.pack = pack;
  int64_t width = strided_widest_tile(p, pack);
  const int64_t axis_per_thread = per_thread / s.pack;
  const int64_t rows_needed = ceil_div(p.axis_size, axis_per_thread);
  // Halve the tile until the largest cluster holds the axis (config.h).
  const int64_t min_width = std::max<int64_t>(strided_min_tile_columns(bytes), s.pack);
  while (width > min_width && p.axis_size > strided_axis_capacity(per_thread, width, std::max(max_cluster, 1)))
    width /= 2;
  // Narrower tiles rather than clusters of more than 8 blocks (config.h).
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
  // One block of up to 1024 threads before any cluster (config.h).
  if (rows_needed * s.columns <= kMaxBlockThreads || max_cluster <= 1) {
    TORCH_INTERNAL_ASSERT(rows_needed <= kMaxBlockThreads / s.columns, "softmax_ext cuda.strided: an axis of ",
                          p.axis_size, " exceeds a block");
    const int64_t rows_multiple = kWarpSize / s.columns;
    s.threads = static_cast<int>(ceil_div(rows_needed, rows_multiple) * rows_multiple * s.columns);
    s.cluster_size = 1;
    return s;
  }
  // Clusters of up to kStridedWideClusterMax 1024-thread blocks, else of
  // 512-thread blocks while the cluster size allows (config.h).
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

void strided_forward(const Problem& p, const Buffers& b, int max_cluster) {
  const auto layout = make_strided_layout<2>(p, {kIn0, kOut});
  dispatch_fast_pair(p.in_dtype, p.out_dtype, "softmax_ext cuda.strided", [&](auto in_tag, auto out_tag) {
    using in_t = typename decltype(in_tag)::type;
    using out_t = typename decltype(out_tag)::type;
    constexpr int kPerThread = strided_elems_per_thread(is_double_acc_v<out_t>, false);
    using Packing = StridedPacking<in_t>;
    const StridedShape shape = strided_launch_shape<in_t>(p, b, kPerThread, max_cluster);
    dispatch_kind(p.kind, [&](auto epilogues) {
      using E = decltype(epilogues);
      dispatch_strided_pack<in_t>(shape.pack, [&](auto vector) {
        constexpr int P = decltype(vector)::value;
        constexpr int kAxis = Packing::elements(kPerThread, P) / P;
        const auto tiled = with_tile_geometry(layout, shape.columns, P, shape.threads);
        dispatch_bool(shape.threads == kWarpSize && shape.cluster_size == 1, [&](auto one_warp) {
          launch_row_blocks(softmax_strided_forward_kernel<E::template ForwardFor<out_t>::template type, in_t, out_t,
                                                           P, kAxis, decltype(one_warp)::value,
                                                           Packing::packed(P)>,
                            tiled.tiles, shape.launch(sizeof(in_t), sizeof(MaxSum<acc_type<out_t>>)),
                            static_cast<const in_t*>(b.in0), static_cast<out_t*>(b.out), tiled, shape.columns,
                            shape.cluster_size);
        });
      });
    });
  });
}

}  // namespace softmax_ext::cuda
