// Split family (KernelFamily::kCudaSplit): rows longer than a block or a
// cluster holds, down to a single row of 2^28+ elements, spread over every SM.
// A row is cut into tiles of blockDim.x * kPacks * P view positions (the
// fragment layout of fragment.cuh); three kernels, no atomics:
//   stats    one block per tile: the tile's partial into the workspace
//   combine  one block per row: the row's partials folded in tile order
//   apply    one block per tile: the output from the row's combined value
// The apply kernel visits tiles in reverse, so the tiles the stats kernel
// read last are read first, while they may still sit in L2.
#pragma once

#include "cuda/common.cuh"
#include "cuda/fragment.cuh"
#include "cuda/reduce.cuh"

namespace softmax_ext::cuda {

constexpr int kSplitCombineThreads = 256;

// Where tile `item` (row-major over rows x tiles) of a row sits.
struct SplitTile {
  int64_t row;
  int64_t tile;
  __device__ __forceinline__ SplitTile(int64_t item, int64_t tiles) {
    row = divmod(item, tiles, tile);
  }
};

template <typename in_t, typename out_t, int kPacks>
__global__ void __launch_bounds__(kMaxBlockThreads)
    softmax_split_stats_kernel(const in_t* __restrict__ x, MaxSum<acc_type<out_t>>* __restrict__ partials,
                               const RowIndexer<2> layout, const int64_t tiles) {
  using acc_t = acc_type<out_t>;
  constexpr int P = kPack<in_t>;
  __shared__ MaxSum<acc_t> scratch[kWarpSize];
  const int64_t tile_positions = int64_t{blockDim.x} * kPacks * P;
  const int64_t stride = int64_t{blockDim.x} * P;
  for (int64_t item = blockIdx.x; item < layout.rows * tiles; item += gridDim.x) {
    const SplitTile at(item, tiles);
    int64_t offset[2];
    layout.row_offsets(at.row, offset);
    const in_t* x_row = x + offset[0];
    const RowView view = make_view(x_row, layout.axis_size, tiles * tile_positions);
    const int64_t first = at.tile * tile_positions + int64_t{threadIdx.x} * P;

    acc_t v[kPacks][P];
    load_fragment<out_t>(x_row, view, first, stride, v, neg_infinity<acc_t>());
    const MaxSum<acc_t> stats =
        block_all_reduce(fragment_stats<exp_policy_t<out_t>, kPacks, P>([&](int k, int e) { return v[k][e]; }),
                         CombineMaxSum{}, empty_stats<acc_t>(), scratch);
    if (threadIdx.x == 0) partials[item] = stats;
  }
}

template <typename acc_t>
__global__ void __launch_bounds__(kSplitCombineThreads)
    softmax_split_combine_kernel(const MaxSum<acc_t>* __restrict__ partials,
                                 MaxSum<acc_t>* __restrict__ totals, const int64_t rows,
                                 const int64_t tiles) {
  __shared__ acc_t scratch[kWarpSize];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const MaxSum<acc_t>* part = partials + row * tiles;
    acc_t max = neg_infinity<acc_t>();
    for (int64_t i = threadIdx.x; i < tiles; i += blockDim.x) max = NanMax{}(max, part[i].max);
    max = block_all_reduce(max, NanMax{}, neg_infinity<acc_t>(), scratch);
    acc_t sum = 0;
    for (int64_t i = threadIdx.x; i < tiles; i += blockDim.x) sum += rescaled_sum(part[i], max);
    sum = block_all_reduce(sum, Sum{}, acc_t(0), scratch);
    if (threadIdx.x == 0) totals[row] = {max, sum};
  }
}

template <template <typename> class Epilogue, typename in_t, typename out_t, int kPacks>
__global__ void __launch_bounds__(kMaxBlockThreads)
    softmax_split_apply_kernel(const in_t* __restrict__ x, out_t* __restrict__ y,
                               const MaxSum<acc_type<out_t>>* __restrict__ totals,
                               const RowIndexer<2> layout, const int64_t tiles) {
  using acc_t = acc_type<out_t>;
  constexpr int P = kPack<in_t>;
  const int64_t tile_positions = int64_t{blockDim.x} * kPacks * P;
  const int64_t stride = int64_t{blockDim.x} * P;
  const int64_t items = layout.rows * tiles;
  for (int64_t i = blockIdx.x; i < items; i += gridDim.x) {
    const SplitTile at(items - 1 - i, tiles);
    int64_t offset[2];
    layout.row_offsets(at.row, offset);
    const in_t* x_row = x + offset[0];
    const RowView view = make_view(x_row, layout.axis_size, tiles * tile_positions);
    const int64_t first = at.tile * tile_positions + int64_t{threadIdx.x} * P;

    acc_t v[kPacks][P];
    load_fragment<out_t>(x_row, view, first, stride, v, neg_infinity<acc_t>());
    const MaxSum<acc_t> total = totals[at.row];
    const Epilogue<acc_t> epilogue(total.max, total.sum);
    store_fragment<out_t, kPacks, P>(y + offset[1], view, first, stride,
                                     [&](int k, int e) { return epilogue(v[k][e]); });
  }
}

// Backward: the partials are sums of reduce_term(dy, y).
template <template <typename> class Epilogue, typename scalar_t, int kPacks>
__global__ void __launch_bounds__(kMaxBlockThreads)
    softmax_split_backward_stats_kernel(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ y,
                                        acc_type<scalar_t>* __restrict__ partials,
                                        const RowIndexer<3> layout, const int64_t tiles) {
  using acc_t = acc_type<scalar_t>;
  using Epi = Epilogue<acc_t>;
  constexpr int P = kPack<scalar_t>;
  __shared__ acc_t scratch[kWarpSize];
  const int64_t tile_positions = int64_t{blockDim.x} * kPacks * P;
  const int64_t stride = int64_t{blockDim.x} * P;
  for (int64_t item = blockIdx.x; item < layout.rows * tiles; item += gridDim.x) {
    const SplitTile at(item, tiles);
    int64_t offset[3];
    layout.row_offsets(at.row, offset);
    const RowView view = make_view(dy + offset[0], layout.axis_size, tiles * tile_positions);
    const int64_t first = at.tile * tile_positions + int64_t{threadIdx.x} * P;

    acc_t g[kPacks][P], v[kPacks][P];
    if constexpr (Epi::kReduceReadsY) {
      load_fragment_pair(dy + offset[0], y + offset[1], view, first, stride, g, v);
    } else {
      load_fragment<scalar_t>(dy + offset[0], view, first, stride, g, acc_t(0));
    }
    acc_t sum = 0;
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
#pragma unroll
      for (int e = 0; e < P; ++e) sum += Epi::reduce_term(g[k][e], Epi::kReduceReadsY ? v[k][e] : acc_t(0));
    sum = block_all_reduce(sum, Sum{}, acc_t(0), scratch);
    if (threadIdx.x == 0) partials[item] = sum;
  }
}

template <typename acc_t>
__global__ void __launch_bounds__(kSplitCombineThreads)
    softmax_split_backward_combine_kernel(const acc_t* __restrict__ partials, acc_t* __restrict__ totals,
                                          const int64_t rows, const int64_t tiles) {
  __shared__ acc_t scratch[kWarpSize];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    acc_t sum = 0;
    for (int64_t i = threadIdx.x; i < tiles; i += blockDim.x) sum += partials[row * tiles + i];
    sum = block_all_reduce(sum, Sum{}, acc_t(0), scratch);
    if (threadIdx.x == 0) totals[row] = sum;
  }
}

template <template <typename> class Epilogue, typename scalar_t, int kPacks>
__global__ void __launch_bounds__(kMaxBlockThreads)
    softmax_split_backward_apply_kernel(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ y,
                                        scalar_t* __restrict__ dx,
                                        const acc_type<scalar_t>* __restrict__ totals,
                                        const RowIndexer<3> layout, const int64_t tiles) {
  using acc_t = acc_type<scalar_t>;
  using Epi = Epilogue<acc_t>;
  constexpr int P = kPack<scalar_t>;
  const int64_t tile_positions = int64_t{blockDim.x} * kPacks * P;
  const int64_t stride = int64_t{blockDim.x} * P;
  const int64_t items = layout.rows * tiles;
  for (int64_t i = blockIdx.x; i < items; i += gridDim.x) {
    const SplitTile at(items - 1 - i, tiles);
    int64_t offset[3];
    layout.row_offsets(at.row, offset);
    const RowView view = make_view(dy + offset[0], layout.axis_size, tiles * tile_positions);
    const int64_t first = at.tile * tile_positions + int64_t{threadIdx.x} * P;

    acc_t g[kPacks][P], v[kPacks][P];
    load_fragment_pair(dy + offset[0], y + offset[1], view, first, stride, g, v);
    const Epi epilogue(totals[at.row]);
    store_fragment<scalar_t, kPacks, P>(dx + offset[2], view, first, stride,
                                        [&](int k, int e) { return epilogue(g[k][e], v[k][e]); });
  }
}

}  // namespace softmax_ext::cuda
