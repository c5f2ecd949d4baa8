// Split family kernels (policy.h), and what the resident kernels
// (resident_kernels.cuh) share with them. A row is cut into tiles of
// blockDim.x * kPacks * P view positions (the fragment layout of
// core/fragment.cuh), and the tiles into chunks of consecutive tiles. Rows
// the GPU holds on chip run on the resident kernel; longer ones on three
// kernels, no atomics:
//   stats    one block per chunk: the chunk's partial into the workspace
//   combine  one block per row: the row's partials folded in chunk order
//   apply    one block per (smaller) tile: the output from the row's
//            combined value
// The apply kernel visits the tiles in reverse, so the tiles the stats
// kernel read last are read first, while they may still sit in L2.
#pragma once

#include "cuda/core/epilogues.cuh"
#include "cuda/core/fragment.cuh"
#include "cuda/core/reduce.cuh"
#include "cuda/core/row_indexer.cuh"
#include "cuda/families/split/policy.h"

namespace softmax_ext::cuda {

// Chunk `item` (row-major over rows x chunks): its row and the tiles
// [begin, end) it folds.
struct SplitChunk {
  int64_t row;
  int64_t chunk;
  int64_t begin;
  int64_t end;
  __device__ __forceinline__ SplitChunk(int64_t item, const SplitShape& g) {
    row = divmod(item, g.chunks, chunk);
    begin = chunk * g.chunk_tiles;
    end = begin + g.chunk_tiles < g.tiles ? begin + g.chunk_tiles : g.tiles;
  }
};

// Apply tile `item` of rows x apply_tiles, counted from the end.
struct SplitTile {
  int64_t row;
  int64_t tile;
  __device__ __forceinline__ SplitTile(int64_t item, const SplitShape& g) {
    row = divmod(g.rows * g.apply_tiles - 1 - item, g.apply_tiles, tile);
  }
};

// A thread's view positions in the tiles of a row: tile t holds
// [t * positions, (t + 1) * positions); the thread's kPacks packs of P start
// at first(t), `stride` apart.
template <int kPacks, int P>
struct SplitTiles {
  int64_t positions;
  int64_t stride;
  __device__ __forceinline__ SplitTiles()
      : positions(int64_t{blockDim.x} * kPacks * P), stride(int64_t{blockDim.x} * P) {}
  __device__ __forceinline__ int64_t first(int64_t tile) const { return tile * positions + int64_t{threadIdx.x} * P; }
};

// A row's partials folded into one, by every thread of the block, in the
// same order wherever it runs: the max of their maxes, then their sums
// rescaled to it (forward); their sum (backward). __ldcg: the partials may
// come from other SMs in this launch (the resident form), past this SM's L1.
template <typename acc_t>
__device__ __forceinline__ MaxSum<acc_t> fold_partials(const MaxSum<acc_t>* part, int64_t count, acc_t* scratch) {
  acc_t max = neg_infinity<acc_t>();
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) max = NanMax{}(max, __ldcg(&part[i].max));
  max = block_all_reduce(max, NanMax{}, neg_infinity<acc_t>(), scratch);
  acc_t sum = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x)
    sum += rescaled_sum(MaxSum<acc_t>{__ldcg(&part[i].max), __ldcg(&part[i].sum)}, max);
  return {max, block_all_reduce(sum, Sum{}, acc_t(0), scratch)};
}
template <typename acc_t>
__device__ __forceinline__ acc_t fold_partials(const acc_t* part, int64_t count, acc_t* scratch) {
  acc_t sum = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) sum += __ldcg(&part[i]);
  return block_all_reduce(sum, Sum{}, acc_t(0), scratch);
}

// A tile's statistics: its max and the sum of exp(v - max) (forward).
template <typename out_t, typename acc_t, int kPacks, int P>
__device__ __forceinline__ MaxSum<acc_t> tile_stats(acc_t (&v)[kPacks][P]) {
  const acc_t max = fragment_max(v);
  return {max, fragment_exp_sum<false, exp_policy_t<out_t>>(v, max)};
}
// `sum` plus the tile's reduce_term(dy, y), element by element (backward).
template <typename Epi, typename acc_t, int kPacks, int P>
__device__ __forceinline__ acc_t add_reduce_terms(acc_t sum, const acc_t (&gv)[kPacks][P],
                                                  const acc_t (&v)[kPacks][P]) {
#pragma unroll
  for (int k = 0; k < kPacks; ++k)
#pragma unroll
    for (int e = 0; e < P; ++e) sum += Epi::reduce_term(gv[k][e], Epi::kReduceReadsY ? v[k][e] : acc_t(0));
  return sum;
}

template <typename in_t, typename out_t, int kPacks>
__global__ void __launch_bounds__(kSplitThreads, 2)
    softmax_split_stats_kernel(const in_t* __restrict__ x, MaxSum<acc_type<out_t>>* __restrict__ partials,
                               const RowIndexer<2> layout, const SplitShape g) {
  using acc_t = acc_type<out_t>;
  constexpr int P = kPack<in_t>;
  __shared__ MaxSum<acc_t> scratch[kWarpSize];
  const SplitTiles<kPacks, P> tiles;
  for (int64_t item = blockIdx.x; item < g.rows * g.chunks; item += gridDim.x) {
    const SplitChunk at(item, g);
    int64_t offset[2];
    layout.row_offsets(at.row, offset);
    const in_t* x_row = x + offset[0];
    const RowView view = make_view(x_row, layout.axis_size, g.tiles * tiles.positions);
    // Running per-thread statistics over the chunk's tiles, one rescale per tile.
    MaxSum<acc_t> stats = empty_stats<acc_t>();
    for (int64_t tile = at.begin; tile < at.end; ++tile) {
      acc_t v[kPacks][P];
      load_fragment<out_t>(x_row, view, tiles.first(tile), tiles.stride, v, neg_infinity<acc_t>());
      stats = combine(stats, tile_stats<out_t>(v));
    }
    stats = block_all_reduce(stats, CombineMaxSum{}, empty_stats<acc_t>(), scratch);
    if (threadIdx.x == 0) partials[at.row * g.chunks + at.chunk] = stats;
  }
}

// Each row's partials folded into its total (fold_partials), one block per
// row: Part is MaxSum<acc_t> in the forward, acc_t in the backward.
template <typename acc_t, typename Part>
__global__ void __launch_bounds__(kSplitCombineThreads)
    softmax_split_combine_kernel(const Part* __restrict__ partials, Part* __restrict__ totals, const SplitShape g) {
  __shared__ acc_t scratch[kWarpSize];
  for (int64_t row = blockIdx.x; row < g.rows; row += gridDim.x) {
    const Part total = fold_partials(partials + row * g.chunks, g.chunks, scratch);
    if (threadIdx.x == 0) totals[row] = total;
  }
}

template <template <typename> class Epilogue, typename in_t, typename out_t, int kPacks, int kBlocksPerSM>
__global__ void __launch_bounds__(kSplitThreads, kBlocksPerSM)
    softmax_split_apply_kernel(const in_t* __restrict__ x, out_t* __restrict__ y,
                               const MaxSum<acc_type<out_t>>* __restrict__ totals,
                               const RowIndexer<2> layout, const SplitShape g) {
  using acc_t = acc_type<out_t>;
  constexpr int P = kPack<in_t>;
  const SplitTiles<kPacks, P> tiles;
  for (int64_t item = blockIdx.x; item < g.rows * g.apply_tiles; item += gridDim.x) {
    const SplitTile at(item, g);
    int64_t offset[2];
    layout.row_offsets(at.row, offset);
    const in_t* x_row = x + offset[0];
    const RowView view = make_view(x_row, layout.axis_size, g.apply_tiles * tiles.positions);
    const int64_t first = tiles.first(at.tile);

    acc_t v[kPacks][P];
    load_fragment<out_t>(x_row, view, first, tiles.stride, v, neg_infinity<acc_t>());
    const MaxSum<acc_t> total = totals[at.row];
    const Epilogue<acc_t> epilogue(total.max, total.sum);
    store_fragment<out_t, kPacks, P>(y + offset[1], view, first, tiles.stride,
                                     [&](int k, int e) { return epilogue(v[k][e]); });
  }
}

// Backward: the partials are sums of reduce_term(dy, y).
template <template <typename> class Epilogue, typename scalar_t, int kPacks>
__global__ void __launch_bounds__(kSplitThreads, 2)
    softmax_split_backward_stats_kernel(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ y,
                                        acc_type<scalar_t>* __restrict__ partials,
                                        const RowIndexer<3> layout, const SplitShape g) {
  using acc_t = acc_type<scalar_t>;
  using Epi = Epilogue<acc_t>;
  constexpr int P = kPack<scalar_t>;
  __shared__ acc_t scratch[kWarpSize];
  const SplitTiles<kPacks, P> tiles;
  for (int64_t item = blockIdx.x; item < g.rows * g.chunks; item += gridDim.x) {
    const SplitChunk at(item, g);
    int64_t offset[3];
    layout.row_offsets(at.row, offset);
    const RowView view = make_view(dy + offset[0], layout.axis_size, g.tiles * tiles.positions);
    acc_t sum = 0;
    for (int64_t tile = at.begin; tile < at.end; ++tile) {
      const int64_t first = tiles.first(tile);
      acc_t gv[kPacks][P], v[kPacks][P];
      if constexpr (Epi::kReduceReadsY) {
        load_fragment_pair(dy + offset[0], y + offset[1], view, first, tiles.stride, gv, v);
      } else {
        load_fragment<scalar_t>(dy + offset[0], view, first, tiles.stride, gv, acc_t(0));
      }
      sum = add_reduce_terms<Epi>(sum, gv, v);
    }
    sum = block_all_reduce(sum, Sum{}, acc_t(0), scratch);
    if (threadIdx.x == 0) partials[at.row * g.chunks + at.chunk] = sum;
  }
}

template <template <typename> class Epilogue, typename scalar_t, int kPacks, int kBlocksPerSM>
__global__ void __launch_bounds__(kSplitThreads, kBlocksPerSM)
    softmax_split_backward_apply_kernel(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ y,
                                        scalar_t* __restrict__ dx,
                                        const acc_type<scalar_t>* __restrict__ totals,
                                        const RowIndexer<3> layout, const SplitShape g) {
  using acc_t = acc_type<scalar_t>;
  using Epi = Epilogue<acc_t>;
  constexpr int P = kPack<scalar_t>;
  const SplitTiles<kPacks, P> tiles;
  for (int64_t item = blockIdx.x; item < g.rows * g.apply_tiles; item += gridDim.x) {
    const SplitTile at(item, g);
    int64_t offset[3];
    layout.row_offsets(at.row, offset);
    const RowView view = make_view(dy + offset[0], layout.axis_size, g.apply_tiles * tiles.positions);
    const int64_t first = tiles.first(at.tile);

    acc_t gv[kPacks][P], v[kPacks][P];
    load_fragment_pair(dy + offset[0], y + offset[1], view, first, tiles.stride, gv, v);
    const Epi epilogue(totals[at.row]);
    store_fragment<scalar_t, kPacks, P>(dx + offset[2], view, first, tiles.stride,
                                        [&](int k, int e) { return epilogue(gv[k][e], v[k][e]); });
  }
}

}  // namespace softmax_ext::cuda
