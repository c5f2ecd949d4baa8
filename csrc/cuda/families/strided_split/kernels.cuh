// Strided split family kernels (policy.h). The columns are cut into the
// strided family's tiles (core/columns.cuh: 128 bytes wide, threads
// coalesced along the inner run) and the axis into chunks of
// kStridedSplitChunk positions. Three kernels, no
// atomics, as the split family of contiguous rows:
//   stats    one block per (chunk, tile): each column's partial of the
//            chunk, streamed through registers, into the workspace
//   combine  one thread per column: its partials folded in chunk order
//   apply    one block per (chunk, tile): the output from the columns'
//            combined values, the items in reverse, so the chunks the
//            stats kernel read last are read first, while they may still
//            sit in L2
// Inputs are read twice: about 2/3 of the copy bandwidth at best forward.
#pragma once

#include "cuda/core/columns.cuh"
#include "cuda/core/epilogues.cuh"
#include "cuda/families/strided_split/policy.h"

namespace softmax_ext::cuda {

// Item `item`: its chunk and tile, and this thread's positions in the chunk,
// first + k * rows_step for k < count, kGroup at a time.
template <int N>
struct StridedSplitItem {
  int64_t chunk;
  int64_t tile;
  int64_t first;  // this thread's first axis position
  int64_t count;  // its positions in the chunk
  __device__ __forceinline__ StridedSplitItem(const StridedLayout<N>& layout, const StridedSplitShape& g,
                                              int64_t item, int rows_step, int ty) {
    chunk = divmod(item, layout.tiles, tile);
    first = chunk * g.chunk + ty;
    const int64_t last = std::min(layout.outer.axis_size, (chunk + 1) * g.chunk);
    count = first < last ? ceil_div(last - first, int64_t{rows_step}) : 0;
  }
};

// Column c (< width) of tile `tile`: its index among all the problem's
// columns (outer rows x the inner run), or -1 past the inner run.
template <int N>
__device__ __forceinline__ int64_t tile_column(const StridedLayout<N>& layout, int64_t tile, int64_t width,
                                               int64_t c) {
  int64_t col_block;
  const int64_t o = divmod(tile, layout.col_blocks, col_block);
  const int64_t in_run = col_block * width + c;
  return in_run < layout.inner ? o * layout.inner + in_run : -1;
}

// Calls f(at, cols) for each of this block's items (grid-stride, in reverse
// when kReverse): `at` its chunk, tile and this thread's positions, `cols`
// where the thread's P columns of the tile start in each operand.
template <int N, int P, bool kReverse, typename F>
__device__ __forceinline__ void for_each_split_item(const StridedLayout<N>& layout, int columns,
                                                    const StridedSplitShape& g, F&& f) {
  const int tx = threadIdx.x % columns;
  const int ty = threadIdx.x / columns;
  const int rows_step = blockDim.x / columns;
  for (int64_t item = blockIdx.x; item < g.items; item += gridDim.x) {
    const StridedSplitItem<N> at(layout, g, kReverse ? g.items - 1 - item : item, rows_step, ty);
    const TileColumns<N> cols(layout, at.tile, int64_t{columns} * P, tx, P);
    f(at, cols);
  }
}

// Folds the block's per-thread column values (P per thread, lanes holding the
// same columns folded first) in a fixed order and hands column c < width of
// the tile to sink(c, total). parts: a row of kPitch >= width values per warp.
template <typename T, int P, int kPitch, typename Combine, typename Sink>
__device__ __forceinline__ void fold_tile_columns(T (&part)[P], int columns, T (*parts)[kPitch],
                                                  Combine combine, Sink sink) {
  fold_column_lanes(part, columns, combine);
  if (static_cast<int>(threadIdx.x % kWarpSize) < columns)
#pragma unroll
    for (int p = 0; p < P; ++p) parts[threadIdx.x / kWarpSize][threadIdx.x % columns * P + p] = part[p];
  __syncthreads();
  fold_column_sources<T>(columns * P, static_cast<int>(blockDim.x) / kWarpSize,
                         [&](int w, int c) { return parts[w][c]; }, sink, combine);
  __syncthreads();  // parts are read before the next item writes them
}

// Forward statistics: (max, sum of exp(x - max)) of each column over a chunk.
template <typename in_t, typename out_t, int P>
__global__ void __launch_bounds__(kStridedSplitThreads)
    softmax_strided_split_stats_kernel(const in_t* __restrict__ x, MaxSum<acc_type<out_t>>* __restrict__ partials,
                                       const StridedLayout<2> layout, const int columns,
                                       const StridedSplitShape g) {
  using acc_t = acc_type<out_t>;
  using Part = MaxSum<acc_t>;
  constexpr int kGroup = elems_per_thread(is_double_acc_v<out_t>, false) / P;
  __shared__ Part parts[kStridedSplitThreads / kWarpSize][strided_max_columns(sizeof(in_t))];
  const RowIndexer<2>& outer = layout.outer;
  for_each_split_item<2, P, false>(layout, columns, g, [&](const StridedSplitItem<2>& at, const TileColumns<2>& cols) {
    const in_t* src = x + cols.offset[0] + at.first * outer.axis_stride[0];
    Part part[P];
#pragma unroll
    for (int p = 0; p < P; ++p) part[p] = empty_stats<acc_t>();
    // kGroup positions at a time: their max, then one rescale of the running sum.
    for (int64_t k = 0; k < at.count; k += kGroup) {
      const in_t* const s[1] = {src + k * layout.pitch[0]};
      const int64_t pitch[1] = {layout.pitch[0]};
      acc_t v[1][kGroup][P];
      load_column_fragments<out_t>(s, pitch, static_cast<int>(std::min<int64_t>(kGroup, at.count - k)),
                                   cols.valid, v, neg_infinity<acc_t>());
#pragma unroll
      for (int p = 0; p < P; ++p) {
        acc_t max = v[0][0][p];
#pragma unroll
        for (int e = 1; e < kGroup; ++e) max = NanMax{}(max, v[0][e][p]);
        acc_t sum = 0;
#pragma unroll
        for (int e = 0; e < kGroup; ++e) sum += exp_policy_t<out_t>::exp(v[0][e][p] - max);
        part[p] = combine(part[p], Part{max, max == neg_infinity<acc_t>() ? acc_t(0) : sum});
      }
    }
    fold_tile_columns<Part, P>(part, columns, parts, CombineMaxSum{}, [&](int c, const Part& total) {
      const int64_t column = tile_column(layout, at.tile, int64_t{columns} * P, c);
      if (column >= 0) partials[at.chunk * outer.rows * layout.inner + column] = total;
    });
  });
}

// Backward statistics: the sum of reduce_term(dy, y) of each column over a
// chunk; y is read only where the term uses it (softmax, not log_softmax).
template <template <typename> class Epilogue, typename scalar_t, int P>
__global__ void __launch_bounds__(kStridedSplitThreads)
    softmax_strided_split_backward_stats_kernel(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ y,
                                                acc_type<scalar_t>* __restrict__ partials,
                                                const StridedLayout<3> layout, const int columns,
                                                const StridedSplitShape g) {
  using acc_t = acc_type<scalar_t>;
  using Epi = Epilogue<acc_t>;
  constexpr int kGroup = elems_per_thread(is_double_acc_v<scalar_t>, true) / P;
  __shared__ acc_t parts[kStridedSplitThreads / kWarpSize][strided_max_columns(sizeof(scalar_t))];
  const RowIndexer<3>& outer = layout.outer;
  for_each_split_item<3, P, false>(layout, columns, g, [&](const StridedSplitItem<3>& at, const TileColumns<3>& cols) {
    constexpr int kOperands = Epi::kReduceReadsY ? 2 : 1;
    acc_t part[P] = {};
    for (int64_t k = 0; k < at.count; k += kGroup) {
      const scalar_t* const s[2] = {dy + cols.offset[0] + (at.first * outer.axis_stride[0] + k * layout.pitch[0]),
                                    y + cols.offset[1] + (at.first * outer.axis_stride[1] + k * layout.pitch[1])};
      const int64_t pitch[2] = {layout.pitch[0], layout.pitch[1]};
      acc_t v[kOperands][kGroup][P];
      load_column_fragments<scalar_t>(reinterpret_cast<const scalar_t* const(&)[kOperands]>(s),
                                      reinterpret_cast<const int64_t(&)[kOperands]>(pitch),
                                      static_cast<int>(std::min<int64_t>(kGroup, at.count - k)), cols.valid, v,
                                      acc_t(0));
#pragma unroll
      for (int e = 0; e < kGroup; ++e)
#pragma unroll
        for (int p = 0; p < P; ++p)  // without y loaded, its slot is dy's: a term that reads no y ignores it
          part[p] += Epi::reduce_term(v[0][e][p], v[kOperands - 1][e][p]);
    }
    fold_tile_columns<acc_t, P>(part, columns, parts, Sum{}, [&](int c, const acc_t& total) {
      const int64_t column = tile_column(layout, at.tile, int64_t{columns} * P, c);
      if (column >= 0) partials[at.chunk * outer.rows * layout.inner + column] = total;
    });
  });
}

// Combine: column `column`'s partials folded in chunk order (max first, then
// the sums rescaled to it), or summed (backward).
template <typename acc_t>
__global__ void __launch_bounds__(kStridedSplitCombineThreads)
    softmax_strided_split_combine_kernel(const MaxSum<acc_t>* __restrict__ partials, MaxSum<acc_t>* __restrict__ totals,
                                         const int64_t columns, const StridedSplitShape g) {
  for (int64_t column = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; column < columns;
       column += int64_t{gridDim.x} * blockDim.x) {
    acc_t max = neg_infinity<acc_t>();
    for (int64_t c = 0; c < g.chunks; ++c) max = NanMax{}(max, partials[c * columns + column].max);
    acc_t sum = 0;
    for (int64_t c = 0; c < g.chunks; ++c) sum += rescaled_sum(partials[c * columns + column], max);
    totals[column] = {max, sum};
  }
}

template <typename acc_t>
__global__ void __launch_bounds__(kStridedSplitCombineThreads)
    softmax_strided_split_backward_combine_kernel(const acc_t* __restrict__ partials, acc_t* __restrict__ totals,
                                                  const int64_t columns, const StridedSplitShape g) {
  for (int64_t column = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; column < columns;
       column += int64_t{gridDim.x} * blockDim.x) {
    acc_t sum = 0;
    for (int64_t c = 0; c < g.chunks; ++c) sum += partials[c * columns + column];
    totals[column] = sum;
  }
}

// Apply (forward): y from each column's (max, sum), kGroup positions at a time.
template <template <typename> class Epilogue, typename in_t, typename out_t, int P>
__global__ void __launch_bounds__(kStridedSplitThreads)
    softmax_strided_split_apply_kernel(const in_t* __restrict__ x, out_t* __restrict__ y,
                                       const MaxSum<acc_type<out_t>>* __restrict__ totals,
                                       const StridedLayout<2> layout, const int columns, const StridedSplitShape g) {
  using acc_t = acc_type<out_t>;
  using Epi = Epilogue<acc_t>;
  constexpr int kGroup = elems_per_thread(is_double_acc_v<out_t>, false) / P;
  const RowIndexer<2>& outer = layout.outer;
  for_each_split_item<2, P, true>(layout, columns, g, [&](const StridedSplitItem<2>& at, const TileColumns<2>& cols) {
    Epi epilogue[P];
    const int64_t column = tile_column(layout, at.tile, int64_t{columns} * P, threadIdx.x % columns * P);
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const MaxSum<acc_t> total = p < cols.valid ? totals[column + p] : empty_stats<acc_t>();
      epilogue[p] = Epi(total.max, total.sum);
    }
    const in_t* src = x + cols.offset[0] + at.first * outer.axis_stride[0];
    out_t* dst = y + cols.offset[1] + at.first * outer.axis_stride[1];
    for (int64_t k = 0; k < at.count; k += kGroup) {
      const int count = static_cast<int>(std::min<int64_t>(kGroup, at.count - k));
      const in_t* const s[1] = {src + k * layout.pitch[0]};
      const int64_t pitch[1] = {layout.pitch[0]};
      acc_t v[1][kGroup][P];
      load_column_fragments<out_t>(s, pitch, count, cols.valid, v, acc_t(0));
#pragma unroll
      for (int e = 0; e < kGroup; ++e)
        if (e < count)
          store_columns<out_t, P>(dst + (k + e) * layout.pitch[1], cols.valid,
                                  [&](int p) { return epilogue[p](v[0][e][p]); });
    }
  });
}

// Apply (backward): dx from dy, y and each column's sum.
template <template <typename> class Epilogue, typename scalar_t, int P>
__global__ void __launch_bounds__(kStridedSplitThreads)
    softmax_strided_split_backward_apply_kernel(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ y,
                                                scalar_t* __restrict__ dx, const acc_type<scalar_t>* __restrict__ totals,
                                                const StridedLayout<3> layout, const int columns,
                                                const StridedSplitShape g) {
  using acc_t = acc_type<scalar_t>;
  using Epi = Epilogue<acc_t>;
  constexpr int kGroup = elems_per_thread(is_double_acc_v<scalar_t>, true) / P;
  const RowIndexer<3>& outer = layout.outer;
  for_each_split_item<3, P, true>(layout, columns, g, [&](const StridedSplitItem<3>& at, const TileColumns<3>& cols) {
    Epi epilogue[P];
    const int64_t column = tile_column(layout, at.tile, int64_t{columns} * P, threadIdx.x % columns * P);
#pragma unroll
    for (int p = 0; p < P; ++p) epilogue[p] = Epi(p < cols.valid ? totals[column + p] : acc_t(0));
    for (int64_t k = 0; k < at.count; k += kGroup) {
      const int count = static_cast<int>(std::min<int64_t>(kGroup, at.count - k));
      const scalar_t* const s[2] = {dy + cols.offset[0] + (at.first * outer.axis_stride[0] + k * layout.pitch[0]),
                                    y + cols.offset[1] + (at.first * outer.axis_stride[1] + k * layout.pitch[1])};
      const int64_t pitch[2] = {layout.pitch[0], layout.pitch[1]};
      acc_t v[2][kGroup][P];
      load_column_fragments<scalar_t>(s, pitch, count, cols.valid, v, acc_t(0));
      scalar_t* dst = dx + cols.offset[2] + (at.first * outer.axis_stride[2] + k * layout.pitch[2]);
#pragma unroll
      for (int e = 0; e < kGroup; ++e)
        if (e < count)
          store_columns<scalar_t, P>(dst + e * layout.pitch[2], cols.valid,
                                     [&](int p) { return epilogue[p](v[0][e][p], v[1][e][p]); });
    }
  });
}

}  // namespace softmax_ext::cuda
