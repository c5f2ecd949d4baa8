// Split family, resident kernels (cuda.split_resident; policy.h): rows the
// GPU's blocks hold on chip, read once.
#pragma once

#include "cuda/core/staging.cuh"
#include "cuda/families/split/kernels.cuh"

namespace softmax_ext::cuda {

// One kernel whose blocks are all resident at once (a cooperative launch)
// takes the rows in groups, a row cut into blocks_per_row slices of
// consecutive tiles, one per block (ResidentShape, policy.h). A block copies
// the first tiles of its slice into shared memory (HeldTiles,
// core/staging.cuh; for rows after its first, while it writes the row
// before, each slot refilled as soon as it is read), folds its slice,
// publishes the partial and counts itself in on the row's arrival counter
// (an atomic increment), waits for the row's other blocks, folds the
// row's partials in slice order (every block the same way, so all agree bit
// for bit) and writes its slice in reverse: the last tile from the registers
// it was read into, the held ones from shared memory, any others (a slice
// longer than the block holds, where fewer blocks are resident than planned)
// from L2 or memory. No atomics take part in the sums; the counters only
// order them.

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
  const SplitTiles<kPacks, P> tiles;
  const ResidentSlice slice(g);
  const int held_count = slice.held(g);
  // Row `row`'s x and view.
  auto row_view = [&](int64_t row, const in_t*& x_row, out_t*& y_row) {
    int64_t offset[2];
    layout.row_offsets(row, offset);
    x_row = x + offset[0];
    y_row = y + offset[1];
    return make_view(x_row, layout.axis_size, g.tiles * tiles.positions);
  };
  HeldTiles<1, kPacks> held(held_shared);
  for (int64_t row = slice.first_row; row < g.rows; row += g.group_rows) {
    const in_t* x_row;
    out_t* y_row;
    const RowView view = row_view(row, x_row, y_row);
    if (row == slice.first_row) {  // later rows' copies start as the row before is written
      const in_t* const rows[1] = {x_row};
      for (int h = 0; h < held_count; ++h) held.issue(h, rows, view, tiles.first(slice.begin + h), tiles.stride);
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
          else
            load_fragment<out_t>(x_row, view, tiles.first(slice.begin + h), tiles.stride, v, neg_infinity<acc_t>());
          stats = combine(stats, tile_stats<out_t>(v));
        }
      }
      load_fragment<out_t>(x_row, view, tiles.first(tile), tiles.stride, v, neg_infinity<acc_t>());
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
      const int64_t first = tiles.first(tile);
      const int h = static_cast<int>(tile - slice.begin);
      if (h < held_count && held.has(h)) held.template read<out_t, in_t>(h, 0, v);
      else if (tile != slice.end - 1) load_fragment<out_t>(x_row, view, first, tiles.stride, v, neg_infinity<acc_t>());
      if (h < held_count && next < g.rows) refill.issue(h, next_rows, next_view, first, tiles.stride);
      store_fragment<out_t, kPacks, P>(y_row, view, first, tiles.stride, [&](int k, int e) { return epilogue(v[k][e]); });
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
  const SplitTiles<kPacks, P> tiles;
  const ResidentSlice slice(g);
  const int held_count = slice.held(g);
  // Row `row`'s dy, y and dx and its view.
  auto row_view = [&](int64_t row, const scalar_t* (&in)[2], scalar_t*& dx_row) {
    int64_t offset[3];
    layout.row_offsets(row, offset);
    in[0] = dy + offset[0];
    in[1] = y + offset[1];
    dx_row = dx + offset[2];
    return make_view(in[0], layout.axis_size, g.tiles * tiles.positions);
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
      for (int h = 0; h < held_count; ++h) held.issue(h, rows, view, tiles.first(slice.begin + h), tiles.stride);
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
            load_fragment_pair(dy_row, y_row, view, tiles.first(slice.begin + h), tiles.stride, gv, v);
          }
          sum += add_reduce_terms<Epi>(acc_t(0), gv, v);
        }
      }
      if constexpr (Epi::kReduceReadsY) {
        load_fragment_pair(dy_row, y_row, view, tiles.first(tile), tiles.stride, gv, v);
      } else {
        load_fragment<scalar_t>(dy_row, view, tiles.first(tile), tiles.stride, gv, acc_t(0));
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
      const int64_t first = tiles.first(tile);
      const int h = static_cast<int>(tile - slice.begin);
      if (h < held_count && held.has(h)) {
        held.template read<scalar_t, scalar_t>(h, 0, gv);
        held.template read<scalar_t, scalar_t>(h, 1, v);
      } else if (tile != slice.end - 1) {
        load_fragment_pair(dy_row, y_row, view, first, tiles.stride, gv, v);
      } else if constexpr (!Epi::kReduceReadsY) {
        load_fragment<scalar_t>(y_row, view, first, tiles.stride, v, acc_t(0));  // the sums read dy alone
      }
      if (h < held_count && next < g.rows) refill.issue(h, next_rows, next_view, first, tiles.stride);
      store_fragment<scalar_t, kPacks, P>(dx_row, view, first, tiles.stride,
                                          [&](int k, int e) { return epilogue(gv[k][e], v[k][e]); });
    }
    cp_async_commit();
    held.held = refill.held;
  }
}

}  // namespace softmax_ext::cuda
