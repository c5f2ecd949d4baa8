// Split family (KernelFamily::kCudaSplit): rows longer than a block or a
// cluster holds, down to a single row of 2^28+ elements, spread over every SM.
// A row is cut into tiles of blockDim.x * kPacks * P view positions (the
// fragment layout of fragment.cuh), and the tiles into chunks of
// consecutive tiles (config.h). Rows of which a group fits in L2 run on one
// resident kernel (below); longer ones on three kernels, no atomics:
//   stats    one block per chunk: the chunk's partial into the workspace
//   combine  one block per row: the row's partials folded in chunk order
//   apply    one block per (smaller) tile: the output from the row's
//            combined value
// The apply kernel visits the tiles in reverse, so the tiles the stats
// kernel read last are read first, while they may still sit in L2.
#pragma once

#include "cuda/block_kernels.cuh"  // persistent_clusters
#include "cuda/common.cuh"
#include "cuda/fragment.cuh"
#include "cuda/launch.h"
#include "cuda/reduce.cuh"
#include "cuda/staging.cuh"

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <algorithm>

namespace softmax_ext::cuda {

constexpr int kSplitCombineThreads = 256;

// How a row is cut: `tiles` stats tiles, folded by the stats kernel in
// `chunks` chunks of chunk_tiles tiles; `apply_tiles` tiles of the apply
// kernel, which holds fewer elements per thread (config.h).
struct SplitShape {
  int64_t rows;
  int64_t tiles;
  int64_t chunk_tiles;
  int64_t chunks;
  int64_t apply_tiles;
};

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
  const int64_t tile_positions = int64_t{blockDim.x} * kPacks * P;
  const int64_t stride = int64_t{blockDim.x} * P;
  for (int64_t item = blockIdx.x; item < g.rows * g.chunks; item += gridDim.x) {
    const SplitChunk at(item, g);
    int64_t offset[2];
    layout.row_offsets(at.row, offset);
    const in_t* x_row = x + offset[0];
    const RowView view = make_view(x_row, layout.axis_size, g.tiles * tile_positions);
    // Running per-thread statistics over the chunk's tiles, one rescale per tile.
    MaxSum<acc_t> stats = empty_stats<acc_t>();
    for (int64_t tile = at.begin; tile < at.end; ++tile) {
      acc_t v[kPacks][P];
      load_fragment<out_t>(x_row, view, tile * tile_positions + int64_t{threadIdx.x} * P, stride, v,
                           neg_infinity<acc_t>());
      stats = combine(stats, tile_stats<out_t>(v));
    }
    stats = block_all_reduce(stats, CombineMaxSum{}, empty_stats<acc_t>(), scratch);
    if (threadIdx.x == 0) partials[at.row * g.chunks + at.chunk] = stats;
  }
}

template <typename acc_t>
__global__ void __launch_bounds__(kSplitCombineThreads)
    softmax_split_combine_kernel(const MaxSum<acc_t>* __restrict__ partials,
                                 MaxSum<acc_t>* __restrict__ totals, const SplitShape g) {
  __shared__ acc_t scratch[kWarpSize];
  for (int64_t row = blockIdx.x; row < g.rows; row += gridDim.x) {
    const MaxSum<acc_t> total = fold_partials(partials + row * g.chunks, g.chunks, scratch);
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
  const int64_t tile_positions = int64_t{blockDim.x} * kPacks * P;
  const int64_t stride = int64_t{blockDim.x} * P;
  for (int64_t item = blockIdx.x; item < g.rows * g.apply_tiles; item += gridDim.x) {
    const SplitTile at(item, g);
    int64_t offset[2];
    layout.row_offsets(at.row, offset);
    const in_t* x_row = x + offset[0];
    const RowView view = make_view(x_row, layout.axis_size, g.apply_tiles * tile_positions);
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
__global__ void __launch_bounds__(kSplitThreads, 2)
    softmax_split_backward_stats_kernel(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ y,
                                        acc_type<scalar_t>* __restrict__ partials,
                                        const RowIndexer<3> layout, const SplitShape g) {
  using acc_t = acc_type<scalar_t>;
  using Epi = Epilogue<acc_t>;
  constexpr int P = kPack<scalar_t>;
  __shared__ acc_t scratch[kWarpSize];
  const int64_t tile_positions = int64_t{blockDim.x} * kPacks * P;
  const int64_t stride = int64_t{blockDim.x} * P;
  for (int64_t item = blockIdx.x; item < g.rows * g.chunks; item += gridDim.x) {
    const SplitChunk at(item, g);
    int64_t offset[3];
    layout.row_offsets(at.row, offset);
    const RowView view = make_view(dy + offset[0], layout.axis_size, g.tiles * tile_positions);
    acc_t sum = 0;
    for (int64_t tile = at.begin; tile < at.end; ++tile) {
      const int64_t first = tile * tile_positions + int64_t{threadIdx.x} * P;
      acc_t gv[kPacks][P], v[kPacks][P];
      if constexpr (Epi::kReduceReadsY) {
        load_fragment_pair(dy + offset[0], y + offset[1], view, first, stride, gv, v);
      } else {
        load_fragment<scalar_t>(dy + offset[0], view, first, stride, gv, acc_t(0));
      }
      sum = add_reduce_terms<Epi>(sum, gv, v);
    }
    sum = block_all_reduce(sum, Sum{}, acc_t(0), scratch);
    if (threadIdx.x == 0) partials[at.row * g.chunks + at.chunk] = sum;
  }
}

template <typename acc_t>
__global__ void __launch_bounds__(kSplitCombineThreads)
    softmax_split_backward_combine_kernel(const acc_t* __restrict__ partials, acc_t* __restrict__ totals,
                                          const SplitShape g) {
  __shared__ acc_t scratch[kWarpSize];
  for (int64_t row = blockIdx.x; row < g.rows; row += gridDim.x) {
    const acc_t total = fold_partials(partials + row * g.chunks, g.chunks, scratch);
    if (threadIdx.x == 0) totals[row] = total;
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
  const int64_t tile_positions = int64_t{blockDim.x} * kPacks * P;
  const int64_t stride = int64_t{blockDim.x} * P;
  for (int64_t item = blockIdx.x; item < g.rows * g.apply_tiles; item += gridDim.x) {
    const SplitTile at(item, g);
    int64_t offset[3];
    layout.row_offsets(at.row, offset);
    const RowView view = make_view(dy + offset[0], layout.axis_size, g.apply_tiles * tile_positions);
    const int64_t first = at.tile * tile_positions + int64_t{threadIdx.x} * P;

    acc_t gv[kPacks][P], v[kPacks][P];
    load_fragment_pair(dy + offset[0], y + offset[1], view, first, stride, gv, v);
    const Epi epilogue(totals[at.row]);
    store_fragment<scalar_t, kPacks, P>(dx + offset[2], view, first, stride,
                                        [&](int k, int e) { return epilogue(gv[k][e], v[k][e]); });
  }
}

// Resident form (config.h, split_resident): one kernel whose blocks are all
// resident at once (a cooperative launch) takes the rows in groups, a row
// cut into blocks_per_row slices of consecutive tiles, one per block. A
// block copies the first tiles of its slice into shared memory (HeldTiles,
// staging.cuh; for rows after its first, while it writes the row before,
// each slot refilled as soon as it is read), folds its slice, publishes the partial and counts itself in
// on the row's arrival counter, waits for the row's other blocks, folds the
// row's partials in slice order (every block the same way, so all agree bit
// for bit) and writes its slice in reverse: the last tile from the registers
// it was read into, the held ones from shared memory, any others (a slice
// longer than the block holds, where fewer blocks are resident than planned)
// from L2 or memory. No atomics take part in the sums; the counters only
// order them.
struct ResidentShape {
  int64_t rows;
  int64_t tiles;        // stats tiles per row
  int64_t slice_tiles;  // tiles per slice
  int blocks_per_row;
  int group_rows;       // gridDim.x == group_rows * blocks_per_row
  int held_tiles;       // tiles of a slice a block may hold in shared memory
};

// Thread 0, after writing its block's partial: counts the block in.
__device__ __forceinline__ void arrive(unsigned* counter) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
}
// Every thread of the block returns once `expected` blocks have arrived;
// partials written before their arrival are then visible (read them with
// __ldcg: this SM's L1 is not coherent with the writers').
__device__ __forceinline__ void wait_arrivals(const unsigned* counter, unsigned expected) {
  if (threadIdx.x == 0) {
    unsigned seen;
    while (true) {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
      if (seen >= expected) break;
      __nanosleep(64);
    }
  }
  __syncthreads();
}

// This block's part of the grid: its slice of a row (the same in every
// group), and its first row.
struct ResidentSlice {
  int64_t part;
  int64_t first_row;
  int64_t begin;
  int64_t end;
  __device__ __forceinline__ explicit ResidentSlice(const ResidentShape& g) {
    part = blockIdx.x % static_cast<unsigned>(g.blocks_per_row);
    first_row = blockIdx.x / static_cast<unsigned>(g.blocks_per_row);
    begin = part * g.slice_tiles;
    end = begin + g.slice_tiles < g.tiles ? begin + g.slice_tiles : g.tiles;
  }
  // Tiles held in shared memory, the slice's first: all but the last tile,
  // which stays in registers, up to g.held_tiles.
  __device__ __forceinline__ int held(const ResidentShape& g) const {
    return end - begin - 1 < g.held_tiles ? static_cast<int>(end - begin - 1) : g.held_tiles;
  }
};

template <template <typename> class Epilogue, typename in_t, typename out_t, int kPacks>
__global__ void __launch_bounds__(kSplitThreads, 2)
    softmax_split_resident_kernel(const in_t* __restrict__ x, out_t* __restrict__ y,
                                  MaxSum<acc_type<out_t>>* __restrict__ partials, unsigned* __restrict__ arrivals,
                                  const RowIndexer<2> layout, const ResidentShape g) {
  using acc_t = acc_type<out_t>;
  constexpr int P = kPack<in_t>;
  extern __shared__ __align__(kVectorBytes) unsigned char held_shared[];
  __shared__ MaxSum<acc_t> scratch[kWarpSize];
  __shared__ acc_t value_scratch[kWarpSize];
  const int64_t tile_positions = int64_t{blockDim.x} * kPacks * P;
  const int64_t stride = int64_t{blockDim.x} * P;
  const ResidentSlice slice(g);
  const int held_count = slice.held(g);
  auto tile_first = [&](int64_t tile) { return tile * tile_positions + int64_t{threadIdx.x} * P; };
  // Row `row`'s x and view.
  auto row_view = [&](int64_t row, const in_t*& x_row, out_t*& y_row) {
    int64_t offset[2];
    layout.row_offsets(row, offset);
    x_row = x + offset[0];
    y_row = y + offset[1];
    return make_view(x_row, layout.axis_size, g.tiles * tile_positions);
  };
  HeldTiles<1, kPacks> held(held_shared);
  for (int64_t row = slice.first_row; row < g.rows; row += g.group_rows) {
    const in_t* x_row;
    out_t* y_row;
    const RowView view = row_view(row, x_row, y_row);
    if (row == slice.first_row) {  // later rows' copies start as the row before is written
      const in_t* const rows[1] = {x_row};
      for (int h = 0; h < held_count; ++h) held.issue(h, rows, view, tile_first(slice.begin + h), stride);
      cp_async_commit();
    }

    // The streamed tiles, the held ones (arrived meanwhile) before the last,
    // which stays in v.
    MaxSum<acc_t> stats = empty_stats<acc_t>();
    acc_t v[kPacks][P];
    for (int64_t tile = slice.begin + held_count; tile < slice.end; ++tile) {
      if (tile == slice.end - 1) {
        cp_async_wait_all();
        for (int h = 0; h < held_count; ++h) {
          if (held.has(h)) held.template read<out_t, in_t>(h, 0, v);
          else load_fragment<out_t>(x_row, view, tile_first(slice.begin + h), stride, v, neg_infinity<acc_t>());
          stats = combine(stats, tile_stats<out_t>(v));
        }
      }
      load_fragment<out_t>(x_row, view, tile_first(tile), stride, v, neg_infinity<acc_t>());
      stats = combine(stats, tile_stats<out_t>(v));
    }
    stats = block_all_reduce(stats, CombineMaxSum{}, empty_stats<acc_t>(), scratch);
    const MaxSum<acc_t>* row_partials = partials + row * g.blocks_per_row;
    if (threadIdx.x == 0) {
      partials[row * g.blocks_per_row + slice.part] = stats;
      arrive(arrivals + row);
    }
    wait_arrivals(arrivals + row, g.blocks_per_row);

    const MaxSum<acc_t> total = fold_partials(row_partials, g.blocks_per_row, value_scratch);
    const Epilogue<acc_t> epilogue(total.max, total.sum);

    // Written in reverse: the register tile, the streamed ones from L2, the
    // held ones from shared memory, each slot refilled with the next row's
    // tile as soon as it is read.
    const int64_t next = row + g.group_rows;
    const in_t* next_x = nullptr;
    out_t* next_y = nullptr;
    const RowView next_view = next < g.rows ? row_view(next, next_x, next_y) : view;
    const in_t* const next_rows[1] = {next_x};
    HeldTiles<1, kPacks> refill(held_shared);
    for (int64_t tile = slice.end - 1; tile >= slice.begin; --tile) {
      const int64_t first = tile_first(tile);
      const int h = static_cast<int>(tile - slice.begin);
      if (h < held_count && held.has(h)) held.template read<out_t, in_t>(h, 0, v);
      else if (tile != slice.end - 1) load_fragment<out_t>(x_row, view, first, stride, v, neg_infinity<acc_t>());
      if (h < held_count && next < g.rows) refill.issue(h, next_rows, next_view, first, stride);
      store_fragment<out_t, kPacks, P>(y_row, view, first, stride, [&](int k, int e) { return epilogue(v[k][e]); });
    }
    cp_async_commit();
    held.held = refill.held;
  }
}

template <template <typename> class Epilogue, typename scalar_t, int kPacks>
__global__ void __launch_bounds__(kSplitThreads, 2)
    softmax_split_resident_backward_kernel(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ y,
                                           scalar_t* __restrict__ dx, acc_type<scalar_t>* __restrict__ partials,
                                           unsigned* __restrict__ arrivals, const RowIndexer<3> layout,
                                           const ResidentShape g) {
  using acc_t = acc_type<scalar_t>;
  using Epi = Epilogue<acc_t>;
  constexpr int P = kPack<scalar_t>;
  extern __shared__ __align__(kVectorBytes) unsigned char held_shared[];
  __shared__ acc_t scratch[kWarpSize];
  const int64_t tile_positions = int64_t{blockDim.x} * kPacks * P;
  const int64_t stride = int64_t{blockDim.x} * P;
  const ResidentSlice slice(g);
  const int held_count = slice.held(g);
  auto tile_first = [&](int64_t tile) { return tile * tile_positions + int64_t{threadIdx.x} * P; };
  // Row `row`'s dy, y and dx and its view.
  auto row_view = [&](int64_t row, const scalar_t* (&in)[2], scalar_t*& dx_row) {
    int64_t offset[3];
    layout.row_offsets(row, offset);
    in[0] = dy + offset[0];
    in[1] = y + offset[1];
    dx_row = dx + offset[2];
    return make_view(in[0], layout.axis_size, g.tiles * tile_positions);
  };
  // Held tiles keep dy and y (the log_softmax sums read dy alone, its
  // output both).
  HeldTiles<2, kPacks> held(held_shared);
  for (int64_t row = slice.first_row; row < g.rows; row += g.group_rows) {
    const scalar_t* rows[2];
    scalar_t* dx_row;
    const RowView view = row_view(row, rows, dx_row);
    const scalar_t* dy_row = rows[0];
    const scalar_t* y_row = rows[1];
    if (row == slice.first_row) {  // later rows' copies start as the row before is written
      for (int h = 0; h < held_count; ++h) held.issue(h, rows, view, tile_first(slice.begin + h), stride);
      cp_async_commit();
    }

    acc_t sum = 0;
    acc_t gv[kPacks][P], v[kPacks][P];  // after the loop: the slice's last tile
    for (int64_t tile = slice.begin + held_count; tile < slice.end; ++tile) {
      if (tile == slice.end - 1) {
        cp_async_wait_all();
        for (int h = 0; h < held_count; ++h) {
          if (held.has(h)) {
            held.template read<scalar_t, scalar_t>(h, 0, gv);
            held.template read<scalar_t, scalar_t>(h, 1, v);
          } else {
            load_fragment_pair(dy_row, y_row, view, tile_first(slice.begin + h), stride, gv, v);
          }
          sum += add_reduce_terms<Epi>(acc_t(0), gv, v);
        }
      }
      if constexpr (Epi::kReduceReadsY) {
        load_fragment_pair(dy_row, y_row, view, tile_first(tile), stride, gv, v);
      } else {
        load_fragment<scalar_t>(dy_row, view, tile_first(tile), stride, gv, acc_t(0));
      }
      sum += add_reduce_terms<Epi>(acc_t(0), gv, v);
    }
    sum = block_all_reduce(sum, Sum{}, acc_t(0), scratch);
    const acc_t* row_partials = partials + row * g.blocks_per_row;
    if (threadIdx.x == 0) {
      partials[row * g.blocks_per_row + slice.part] = sum;
      arrive(arrivals + row);
    }
    wait_arrivals(arrivals + row, g.blocks_per_row);
    const Epi epilogue(fold_partials(row_partials, g.blocks_per_row, scratch));

    // As the forward: each held slot refilled with the next row's tile as
    // soon as it is read.
    const int64_t next = row + g.group_rows;
    const scalar_t* next_rows[2] = {nullptr, nullptr};
    scalar_t* next_dx = nullptr;
    const RowView next_view = next < g.rows ? row_view(next, next_rows, next_dx) : view;
    HeldTiles<2, kPacks> refill(held_shared);
    for (int64_t tile = slice.end - 1; tile >= slice.begin; --tile) {
      const int64_t first = tile_first(tile);
      const int h = static_cast<int>(tile - slice.begin);
      if (h < held_count && held.has(h)) {
        held.template read<scalar_t, scalar_t>(h, 0, gv);
        held.template read<scalar_t, scalar_t>(h, 1, v);
      } else if (tile != slice.end - 1) {
        load_fragment_pair(dy_row, y_row, view, first, stride, gv, v);
      } else if constexpr (!Epi::kReduceReadsY) {
        load_fragment<scalar_t>(y_row, view, first, stride, v, acc_t(0));  // the sums read dy alone
      }
      if (h < held_count && next < g.rows) refill.issue(h, next_rows, next_view, first, stride);
      store_fragment<scalar_t, kPacks, P>(dx_row, view, first, stride,
                                          [&](int k, int e) { return epilogue(gv[k][e], v[k][e]); });
    }
    cp_async_commit();
    held.held = refill.held;
  }
}

// Host: the cooperative launch of a resident kernel for p on `stream`, its
// shape sized to the blocks the device holds at once; zeroes the arrival
// counters. A row takes the fewest blocks that hold it (held tiles and one
// in registers each), as many rows at once as the other blocks take, and
// then every block the device holds is given a slice of a row of the group.
// Not copyable: the configuration points at its own attribute.
struct ResidentLaunch {
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute attribute{};
  ResidentShape shape{};
  void* partials;
  unsigned* arrivals;

  ResidentLaunch(const void* kernel, const Problem& p, void* workspace, cudaStream_t stream)
      : partials(workspace),
        arrivals(reinterpret_cast<unsigned*>(static_cast<char*>(workspace) + resident_partials_bytes(p))) {
    config.blockDim = dim3(kSplitThreads);
    config.gridDim = dim3(1);
    config.stream = stream;
    attribute.id = cudaLaunchAttributeCooperative;
    attribute.val.cooperative = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    const bool dbl = p.out_dtype == c10::ScalarType::Double;
    const int64_t in_bytes = static_cast<int64_t>(c10::elementSize(p.in_dtype));
    const int64_t held_tiles = resident_held_tiles(shared_bytes_per_block(p.device_index, kResidentBlocksPerSM),
                                                   in_bytes, dbl, p.is_backward());
    config.dynamicSmemBytes =
        static_cast<size_t>(held_tiles * resident_tile_thread_bytes(in_bytes, dbl, p.is_backward()) * kSplitThreads);
    const int64_t resident = persistent_clusters(kernel, config);
    const int64_t tiles = split_tiles(p);
    const int64_t holding = std::min({ceil_div(tiles, held_tiles + 1), resident, kResidentMaxBlocksPerRow});
    const int64_t group = std::clamp<int64_t>(resident / holding, 1, p.rows);
    int64_t per_row = std::min({resident / group, tiles, kResidentMaxBlocksPerRow});
    const int64_t slice = ceil_div(tiles, per_row);
    per_row = ceil_div(tiles, slice);  // no empty slice
    shape = {p.rows, tiles, slice, static_cast<int>(per_row), static_cast<int>(group), static_cast<int>(held_tiles)};
    config.gridDim = dim3(static_cast<unsigned>(group * per_row));
    C10_CUDA_CHECK(cudaMemsetAsync(arrivals, 0, p.rows * sizeof(unsigned), stream));
  }
  ResidentLaunch(const ResidentLaunch&) = delete;
  ResidentLaunch& operator=(const ResidentLaunch&) = delete;
};

// Host: how the rows of p are cut.
inline SplitShape split_shape(const Problem& p) {
  const int64_t tiles = split_tiles(p);
  return {p.rows, tiles, split_chunk_tiles(tiles), split_chunks(p), split_apply_tiles(p)};
}

}  // namespace softmax_ext::cuda
