// Column tiles of a strided axis (the strided and strided split families):
// where a tile's columns start in each operand, loading and storing a
// thread's P columns at a run of axis positions, and folding per-column
// partials over lanes and warps in a fixed order. A block's threads (tx, ty)
// = (tid % columns, tid / columns) hold P columns each, threads coalesced
// along the inner run.
#pragma once

#include "cuda/core/budget.h"
#include "cuda/core/columns.h"
#include "cuda/core/numerics.cuh"
#include "cuda/core/reduce.cuh"
#include "cuda/core/row_indexer.cuh"
#include "cuda/core/vector_io.cuh"

#include <algorithm>
#include <array>
#include <cstdint>

namespace softmax_ext::cuda {

// Where column tiles start: the outer (non-axis, non-inner) dims of the
// Problem, plus the inner run and the axis stride of each operand; and the
// tile geometry's derived counts. A kernel reads these from its parameters
// rather than holding them in registers, which the kernels have none spare of.
template <int N>
struct StridedLayout {
  RowIndexer<N> outer;  // rows = outer tiles; axis_size / axis_stride = the axis
  int64_t inner;        // contiguous columns
  int64_t col_blocks;   // tiles across the inner run
  int64_t tiles;        // outer.rows * col_blocks
  int64_t pitch[N];     // elements between a thread's axis positions in operand f
};

template <int N>
inline StridedLayout<N> make_strided_layout(const Problem& p, const std::array<Operand, N>& slots) {
  StridedLayout<N> s{make_row_indexer<N>(p, slots), p.inner_size()};
  s.outer.batch_rank -= 1;  // the innermost batch dim is the inner run
  s.outer.rows = p.rows / s.inner;
  return s;
}

// The layout for tiles of `columns` threads of P columns each, in blocks
// of `threads` threads.
template <int N>
inline StridedLayout<N> with_tile_geometry(StridedLayout<N> s, int columns, int P, int threads) {
  s.col_blocks = ceil_div(s.inner, int64_t{columns} * P);
  s.tiles = s.outer.rows * s.col_blocks;
  for (int f = 0; f < N; ++f) s.pitch[f] = int64_t{threads / columns} * s.outer.axis_stride[f];
  return s;
}

// Where thread tx's P columns of tile `tile` start in each operand (before
// the axis walk's first position) and how many of them lie in the run.
template <int N>
struct TileColumns {
  int64_t offset[N];
  int valid;
  __device__ __forceinline__ TileColumns(const StridedLayout<N>& layout, int64_t tile, int64_t width, int tx,
                                         int P) {
    int64_t col_block;
    const int64_t o = divmod(tile, layout.col_blocks, col_block);
    layout.outer.row_offsets(o, offset);
    const int64_t c0 = col_block * width + int64_t{tx} * P;
#pragma unroll
    for (int f = 0; f < N; ++f) offset[f] += c0;
    valid = static_cast<int>(std::clamp<int64_t>(layout.inner - c0, 0, P));
  }
};

// Loads P columns of one axis position into v (fill outside the row/run).
template <typename out_t, typename in_t, int P, typename acc_t>
__device__ __forceinline__ void load_columns(const in_t* __restrict__ src, bool in_axis, int valid,
                                             acc_t (&v)[P], acc_t fill) {
  if (in_axis && valid >= P) {
    Pack<in_t, P> pk;
    pk.load(src);
#pragma unroll
    for (int p = 0; p < P; ++p) v[p] = load_as<out_t>(pk.v[p]);
  } else {
#pragma unroll
    for (int p = 0; p < P; ++p) v[p] = (in_axis && p < valid) ? load_as<out_t>(src[p]) : fill;
  }
}

// A thread's column fragment of kFrags operands (the backward's dy and y):
// axis positions e < kAxis at src[f] + e * pitch[f], P columns each; the
// first `count` positions lie inside the axis and the first `valid` columns
// inside the run (fill elsewhere). When all do, every load is issued before
// any is converted (as load_fragments in fragment.cuh); otherwise position
// by position.
template <typename out_t, int kFrags, typename in_t, int kAxis, int P, typename acc_t>
__device__ __forceinline__ void load_column_fragments(const in_t* const (&src)[kFrags],
                                                      const int64_t (&pitch)[kFrags], int count, int valid,
                                                      acc_t (&v)[kFrags][kAxis][P], acc_t fill) {
  if (valid >= P && count >= kAxis) {
    Pack<in_t, P> packs[kFrags][kAxis];
#pragma unroll
    for (int f = 0; f < kFrags; ++f)
#pragma unroll
      for (int e = 0; e < kAxis; ++e) packs[f][e].load(src[f] + e * pitch[f]);
#pragma unroll
    for (int f = 0; f < kFrags; ++f)
#pragma unroll
      for (int e = 0; e < kAxis; ++e)
#pragma unroll
        for (int p = 0; p < P; ++p) v[f][e][p] = load_as<out_t>(packs[f][e].v[p]);
    return;
  }
#pragma unroll
  for (int f = 0; f < kFrags; ++f)
#pragma unroll
    for (int e = 0; e < kAxis; ++e) {
      const bool in_axis = e < count;
      load_columns<out_t, in_t, P>(src[f] + (in_axis ? e * pitch[f] : 0), in_axis, valid, v[f][e], fill);
    }
}

template <typename out_t, int P, typename Value>
__device__ __forceinline__ void store_columns(out_t* __restrict__ dst, int valid, Value&& value) {
  Pack<out_t, P> pk;
#pragma unroll
  for (int p = 0; p < P; ++p) pk.v[p] = convert<out_t>(value(p));
  if (valid >= P) {
    pk.store(dst);
  } else {
#pragma unroll
    for (int p = 0; p < P; ++p)
      if (p < valid) dst[p] = pk.v[p];
  }
}

// Folds per-thread column values (P per thread) over the lanes of a warp
// that hold the same columns (lane ^ columns, ...); every such lane gets the
// result.
template <typename T, int P, typename Combine>
__device__ __forceinline__ void fold_column_lanes(T (&part)[P], int columns, Combine combine) {
  for (int offset = columns; offset < kWarpSize; offset *= 2)
#pragma unroll
    for (int p = 0; p < P; ++p) part[p] = combine(part[p], shfl_xor(part[p], offset));
}

// Lanes that fold one column's `sources` partials together in reduce_columns:
// a power of two, at most the sources and a warp, such that every column
// still has its group of lanes in the block.
__device__ __forceinline__ int column_group_lanes(int width, int sources) {
  int g = 1;
  while (g * 2 <= sources && g * 2 <= kWarpSize && width * g * 2 <= static_cast<int>(blockDim.x)) g *= 2;
  return g;
}

// sink(c, total) for c < width, total = source(k, c) folded over k <
// sources, by groups of lanes (column_group_lanes): lane j of a column's
// group folds sources j, j + g, ..., then the g lanes fold by shuffles; lane
// 0 of the group passes the total on. The order is fixed (deterministic) and
// short: log2(g) + sources / g steps, where one thread per column took
// `sources` dependent steps (each with two exps for the forward's MaxSum).
// Every thread of the block must call it.
template <typename T, typename Source, typename Sink, typename Combine>
__device__ __forceinline__ void fold_column_sources(int width, int sources, Source source, Sink sink,
                                                    Combine combine) {
  const int g = column_group_lanes(width, sources);
  const int j = static_cast<int>(threadIdx.x) % g;
  const int per_pass = static_cast<int>(blockDim.x) / g;
  for (int base = 0; base < width; base += per_pass) {  // block-uniform: the shuffles see whole warps
    const int c = base + static_cast<int>(threadIdx.x) / g;
    const int column = c < width ? c : 0;
    T total = source(j, column);
    for (int k = j + g; k < sources; k += g) total = combine(total, source(k, column));
    for (int offset = 1; offset < g; offset *= 2) total = combine(total, shfl_xor(total, offset));
    if (j == 0 && c < width) sink(c, total);
  }
}

}  // namespace softmax_ext::cuda
