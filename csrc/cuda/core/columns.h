// Host side of the column tiles (columns.cuh) that the strided and strided
// split families share: their width and the vector their threads access.
// The numbers come from docs/tuning/strided.md. Plain C++.
#pragma once

#include "cuda/core/budget.h"
#include "plan/problem.h"

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstdint>

namespace softmax_ext::cuda {

// A tile is one 128-byte line of inner columns wide (fewer where the inner
// run is shorter). Inner runs shorter than kStridedMinInner go to the
// reference family.
constexpr int kStridedTileBytes = 128;
constexpr int64_t kStridedMinInner = 4;
constexpr int strided_tile_columns(int64_t element_bytes) {
  return kStridedTileBytes / static_cast<int>(element_bytes);
}
// Largest width in columns of a tile of in_t that reduces through shared
// memory (128 bytes); a tile is at most a warp wide in threads. A one-warp
// tile reduces by shuffles alone and may be wider (strided family).
constexpr int strided_max_columns(int64_t element_bytes) {
  return kStridedTileBytes / static_cast<int>(element_bytes);
}

// The widest tile in columns for accesses of `pack` elements: 128 bytes
// (strided_tile_columns), at most a warp of scalar columns, and no wider
// than the inner run (rounded up to a power of two).
inline int64_t strided_widest_tile(const Problem& p, int pack) {
  int64_t width = strided_tile_columns(c10::elementSize(p.in_dtype));
  if (pack == 1) width = std::min<int64_t>(width, kWarpSize);
  return std::min(width, std::max<int64_t>(next_pow2(p.inner_size()), pack));
}

// The elements P of a thread's vector accesses: `vector` where every column
// pack is aligned to them (at most 16 bytes) in every operand (base
// pointers, the axis stride and the outer strides), else 1.
inline int strided_pack(const Problem& p, int vector) {
  for (int k : {kIn0, kIn1, kOut}) {
    if (k == kIn1 && !p.is_backward()) continue;
    const int64_t bytes = c10::elementSize(k == kOut ? p.out_dtype : p.in_dtype);
    const int64_t align = std::min<int64_t>(kVectorBytes, vector * bytes);
    if (!p.base_aligned(static_cast<Operand>(k), align)) return 1;
    if (p.axis_stride[k] * bytes % align != 0) return 1;
    for (int d = 0; d + 1 < p.batch_rank; ++d)
      if (p.batch_stride[k][d] * bytes % align != 0) return 1;
  }
  return vector;
}

}  // namespace softmax_ext::cuda
