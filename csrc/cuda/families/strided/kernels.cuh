// Strided family kernels (policy.h): softmax over an axis that is
// not the fastest dimension (a non-last dim, a transposed view), with a run
// of `inner` contiguous columns. No transpose copy: a block holds a tile of
// W = columns * P inner columns by the axis in registers; the threads of a
// warp read W-wide (128-byte) stretches of several axis positions, one read
// and one write of global memory. On sm_90+ a cluster extends the tile along
// the axis, blocks exchanging per-column partials through distributed shared
// memory.
//
// Thread (tx, ty) = (tid % columns, tid / columns) of block `rank` holds
// inner columns c0 + tx * P + [0, P) at axis positions
//   rank * rows_per_block + e * TY + ty,   e < kAxisPerThread,
// TY = blockDim.x / columns and rows_per_block = TY * kAxisPerThread.
#pragma once

#include "cuda/core/cluster.cuh"
#include "cuda/core/columns.cuh"
#include "cuda/core/epilogues.cuh"
#include "cuda/core/vector_io.cuh"
#include "cuda/families/strided/policy.h"

namespace softmax_ext::cuda {

// A thread's axis positions in every tile: first + e * rows_step for the
// first `count` of e < kAxis (the others lie past the axis), layout.pitch[f]
// elements apart in operand f. Block `rank` of a cluster holds the tile's
// rank-th stretch of rows_step * kAxis positions.
template <int kAxis, int N>
struct StridedAxisWalk {
  int64_t first;
  int count;
  __device__ __forceinline__ StridedAxisWalk(const RowIndexer<N>& outer, int rows_step, int ty) {
    first = cluster_rank() * int64_t{rows_step} * kAxis + ty;
    count = first >= outer.axis_size
                ? 0
                : static_cast<int>(std::min<int64_t>(kAxis, ceil_div(outer.axis_size - first, rows_step)));
  }
  // Where operand f's positions start in a tile whose columns start at `base`.
  template <typename T>
  __device__ __forceinline__ T* start(T* base, const RowIndexer<N>& outer, int f) const {
    return base + first * outer.axis_stride[f];
  }
};

// The forward's column fragment of a thread: kAxis positions by P columns,
// read as accumulator values by at<kPass>(e, p). Unpacked: the values
// widened at load; softmax keeps exp(x - m) in their place (exp_sum).
template <typename in_t, typename out_t, int kAxis, int P, bool kPacked>
struct StridedFragment {
  using acc_t = acc_type<out_t>;
  acc_t v[1][kAxis][P];

  __device__ __forceinline__ void load(const in_t* src, int64_t pitch, int count, int valid, acc_t fill) {
    const in_t* const s[1] = {src};
    const int64_t pitches[1] = {pitch};
    load_column_fragments<out_t>(s, pitches, count, valid, v, fill);
  }
  template <int kPass>
  __device__ __forceinline__ acc_t at(int e, int p) const { return v[0][e][p]; }
  __device__ __forceinline__ void column_max(acc_t (&m)[P]) const {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      m[p] = v[0][0][p];
#pragma unroll
      for (int e = 1; e < kAxis; ++e) m[p] = NanMax{}(m[p], v[0][e][p]);
    }
  }
  // sum over e of exp(v - m) per column (0 where m is -inf, an empty column).
  template <bool kKeepExp, typename Exp>
  __device__ __forceinline__ void exp_sum(const acc_t (&m)[P], acc_t (&sum)[P]) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const bool empty = m[p] == neg_infinity<acc_t>();
      acc_t s = 0;
#pragma unroll
      for (int e = 0; e < kAxis; ++e) {
        const acc_t t = Exp::exp(v[0][e][p] - m[p]);
        s += t;
        if constexpr (kKeepExp) v[0][e][p] = empty ? acc_t(0) : t;
      }
      sum[p] = empty ? acc_t(0) : s;
    }
  }
};

// Packed (16-bit inputs, P = 4: 8-byte packs): the pairs as loaded, two per
// register, widened where the maths reads them (core/vector_io.cuh, widen_half):
// twice the axis positions in the same registers, so a tile holds as many
// bytes as in f32, with the per-column state of 4 columns, as in f32. No
// room for the forward's exps: the output takes them again.
template <typename in_t, typename out_t, int kAxis, int P>
struct StridedFragment<in_t, out_t, kAxis, P, true> {
  static_assert(is_reduced_float_v<in_t> && P == 4, "packed columns are 8-byte packs of 16-bit values");
  static constexpr int kWords = P / 2;
  uint32_t w[kAxis][kWords];

  __device__ __forceinline__ void load(const in_t* src, int64_t pitch, int count, int valid, float fill_value) {
    if (valid >= P && count >= kAxis) {
      uint2 r[kAxis];
#pragma unroll
      for (int e = 0; e < kAxis; ++e) r[e] = *reinterpret_cast<const uint2*>(src + e * pitch);
#pragma unroll
      for (int e = 0; e < kAxis; ++e) set(e, r[e]);
      return;
    }
    const uint32_t fill = in_t(fill_value).x;
#pragma unroll
    for (int e = 0; e < kAxis; ++e) {
      const in_t* at = src + (e < count ? e * pitch : 0);
      if (e < count && valid >= P) {
        set(e, *reinterpret_cast<const uint2*>(at));
      } else {
#pragma unroll
        for (int i = 0; i < kWords; ++i) {
          const uint32_t lo = e < count && 2 * i < valid ? at[2 * i].x : fill;
          const uint32_t hi = e < count && 2 * i + 1 < valid ? at[2 * i + 1].x : fill;
          w[e][i] = lo | hi << 16;
        }
      }
    }
  }
  __device__ __forceinline__ void set(int e, const uint2& r) {
    w[e][0] = r.x;
    w[e][1] = r.y;
  }
  template <int kPass>
  __device__ __forceinline__ float at(int e, int p) const { return widen_half<in_t, kPass>(w[e][p / 2], p); }
  // The max is taken on the packed pairs: one widening per column.
  __device__ __forceinline__ void column_max(float (&m)[P]) const {
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      uint32_t mw = w[0][i];
#pragma unroll
      for (int e = 1; e < kAxis; ++e) mw = max2<in_t>(mw, w[e][i]);
      m[2 * i] = widen_half<in_t, 0>(mw, 0);
      m[2 * i + 1] = widen_half<in_t, 0>(mw, 1);
    }
  }
  template <bool kKeepExp, typename Exp>
  __device__ __forceinline__ void exp_sum(const float (&m)[P], float (&sum)[P]) const {
    static_assert(!kKeepExp, "a packed fragment has no room for its exps");
#pragma unroll
    for (int p = 0; p < P; ++p) {
      float s = 0;
#pragma unroll
      for (int e = 0; e < kAxis; ++e) s += Exp::exp(at<0>(e, p) - m[p]);
      sum[p] = m[p] == neg_infinity<float>() ? 0.0f : s;
    }
  }
};

// The shared memory of reduce_columns for tiles of in_t (at most kPitch
// columns wide), laid out as strided_reduction_bytes counts it: the
// lane-folded partials of each warp, parts(warp)[column], then the column
// totals, then the cluster exchange (an exchange X of reduce.cuh: barriers,
// then slots [2][cluster_size][width]). Addresses are derived from the
// launch's constants where used, not held in registers.
template <typename T, int kPitch>
struct ColumnReduction {
  using value_type = T;
  int width;
  int cluster_size;
  __device__ __forceinline__ static char* base() {
    extern __shared__ uint4 reduction_shared[];
    return reinterpret_cast<char*>(reduction_shared);
  }
  __device__ __forceinline__ T* parts(int warp) const { return reinterpret_cast<T*>(base()) + warp * kPitch; }
  __device__ __forceinline__ T* totals() const { return parts(blockDim.x / kWarpSize); }
  __device__ __forceinline__ uint64_t* full(int set) const {
    return reinterpret_cast<uint64_t*>(parts(blockDim.x / kWarpSize + 1)) + set;
  }
  __device__ __forceinline__ T* slot(int set, unsigned rank, int index) const {
    return reinterpret_cast<T*>(full(0) + 2) + (set * cluster_size + rank) * width + index;
  }
};

// Where reduce_columns keeps the lane-folded partials of this thread's warp
// (a tile is at most a warp wide), until the next call.
template <typename T, int P, int kPitch>
__device__ __forceinline__ T* warp_column_parts(const ColumnReduction<T, kPitch>& r, int columns) {
  return r.parts(threadIdx.x / kWarpSize) + threadIdx.x % columns * P;
}

// Folds the lane-folded column partials (fold_column_lanes) over the block's
// warps and then the cluster's blocks, in a fixed order; returns this
// thread's P column totals. T is MaxSum<acc_t> (forward) or acc_t (backward).
// In a cluster, the block's column totals go to every block of the cluster
// (cluster_exchange_push, one thread per block and column), and each block
// folds the totals it received in rank order: `round` counts the exchanges
// (core/cluster.cuh).
template <typename T, int P, int kPitch, typename Combine>
__device__ __forceinline__ void reduce_columns(T (&part)[P], int columns, int cluster_size, unsigned& round,
                                               ColumnReduction<T, kPitch>& r, Combine combine) {
  const int width = columns * P;
  // The warp's lanes have read its previous partials (the forward's group
  // max, after the previous call) before its first lanes overwrite them.
  __syncwarp();
  if (static_cast<int>(threadIdx.x % kWarpSize) < columns) {
    T* mine = warp_column_parts<T, P>(r, columns);
#pragma unroll
    for (int p = 0; p < P; ++p) mine[p] = part[p];
  }
  __syncthreads();
  const int warps = static_cast<int>(blockDim.x) / kWarpSize;
  const auto warp_part = [&](int w, int c) { return r.parts(w)[c]; };
  const auto to_totals = [&](int c, const T& total) { r.totals()[c] = total; };
  fold_column_sources<T>(width, warps, warp_part, to_totals, combine);
  if (cluster_size > 1) {
    const ExchangeRound x(round++);
    cluster_exchange_open(r, x, cluster_size * width);
    __syncthreads();
    // A thread a push: cluster_size * width <= blockDim.x (strided_shape), and
    // the width is a power of two.
    const int c = threadIdx.x & (width - 1);
    if (static_cast<int>(threadIdx.x) < cluster_size * width)
      cluster_exchange_push(r, x, threadIdx.x >> __popc(width - 1), c, r.totals()[c]);
    cluster_exchange_wait(r, x);
    __syncthreads();  // the block's totals are read before they are overwritten
    fold_column_sources<T>(width, cluster_size, [&](int k, int c) { return *r.slot(x.set, k, c); },
                           to_totals, combine);
  }
  __syncthreads();
  const int tx = threadIdx.x % columns;
#pragma unroll
  for (int p = 0; p < P; ++p) part[p] = r.totals()[tx * P + p];
}

// The tile loop of both strided kernels, over tiles of in_t: sets up the
// block's column reduction of T (its cluster exchange opened before the first
// tile and closed after the last) and the thread's place in a tile, and runs
// body(at, walk, reduction, round) for each tile of this block
// (ClusterRowLoop): at, the thread's TileColumns<N> of the tile; walk, its
// StridedAxisWalk; reduction and round, what reduce_columns takes (round
// counts the cluster exchanges).
template <typename T, typename in_t, int P, int kAxisPerThread, int N, typename Body>
__device__ __forceinline__ void for_each_strided_tile(const StridedLayout<N>& layout, const int columns,
                                                      const int cluster_size, Body&& body) {
  ColumnReduction<T, strided_max_columns(sizeof(in_t))> reduction{columns * P, cluster_size};
  if (cluster_size > 1) cluster_exchange_init(reduction);
  unsigned round = 0;

  const int tx = threadIdx.x % columns;
  const int ty = threadIdx.x / columns;
  const int rows_step = blockDim.x / columns;
  const int64_t width = int64_t{columns} * P;
  const StridedAxisWalk<kAxisPerThread, N> walk(layout.outer, rows_step, ty);
  const ClusterRowLoop tiles{cluster_size};

  for (int64_t tile = tiles.start(); tile < layout.tiles; tile += tiles.step()) {
    const TileColumns<N> at(layout, tile, width, tx, P);
    body(at, walk, reduction, round);
  }
  if (cluster_size > 1) cluster_exchange_exit(round);
}

// kOneWarp: the tile is one warp (no cluster), whose lane fold has the
// column totals (a compile-time choice: the run-time test cost registers).
// kPacked: 16-bit inputs in 8-byte packs stay packed (StridedFragment).
template <template <typename> class Epilogue, typename in_t, typename out_t, int P, int kAxisPerThread,
          bool kOneWarp, bool kPacked>
__global__ void __launch_bounds__(kMaxBlockThreads)
    softmax_strided_forward_kernel(const in_t* __restrict__ x, out_t* __restrict__ y,
                                   const StridedLayout<2> layout, const int columns,
                                   const int cluster_size) {
  using acc_t = acc_type<out_t>;
  using Part = MaxSum<acc_t>;
  const RowIndexer<2>& outer = layout.outer;
  const auto tile_body = [&](const auto& at, const auto& walk, auto& reduction, unsigned& round) {
    const int valid = at.valid;
    StridedFragment<in_t, out_t, kAxisPerThread, P, kPacked> v;
    v.load(walk.start(x + at.offset[0], outer, 0), layout.pitch[0], walk.count, valid, neg_infinity<acc_t>());
    // As the block family: the lanes holding the same columns share a max
    // m; unpacked softmax keeps exp(x - m) in place of x, and the output is
    // that times exp(m - max) / sum: one exp per element.
    using Epi = Epilogue<acc_t>;
    constexpr bool kKeep = !kPacked && Epi::kKeepsExp;
    acc_t local_max[P];
    v.column_max(local_max);
    fold_column_lanes(local_max, columns, NanMax{});
    acc_t local_sum[P];
    v.template exp_sum<kKeep, typename Epi::Exp>(local_max, local_sum);
    Part part[P];
#pragma unroll
    for (int p = 0; p < P; ++p) part[p] = {local_max[p], local_sum[p]};
    fold_column_lanes(part, columns, [](const Part& a, const Part& b) { return Part{a.max, a.sum + b.sum}; });
    // The lane group's max is read back from `parts` rather than held in
    // registers through the reduction.
    if constexpr (!kOneWarp)
      reduce_columns<Part, P>(part, columns, cluster_size, round, reduction, CombineMaxSum{});
    const Part* group_parts = warp_column_parts<Part, P>(reduction, columns);
    Epi epilogue[P];
    acc_t scale[P];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      epilogue[p] = Epi(part[p].max, part[p].sum);
      scale[p] = epilogue[p].scale_from(kOneWarp ? part[p].max : group_parts[p].max);
    }

    out_t* const dst = walk.start(y + at.offset[1], outer, 1);
#pragma unroll
    for (int e = 0; e < kAxisPerThread; ++e) {
      if (e < walk.count)
        store_columns<out_t, P>(dst + e * layout.pitch[1], valid, [&](int p) {
          if constexpr (kKeep) return epilogue[p].finish(v.template at<1>(e, p), scale[p]);
          else return epilogue[p](v.template at<1>(e, p));
        });
    }
  };
  for_each_strided_tile<Part, in_t, P, kAxisPerThread>(layout, columns, cluster_size, tile_body);
}

// kPacked: 16-bit dy and y in 8-byte packs stay packed (StridedFragment).
template <template <typename> class Epilogue, typename scalar_t, int P, int kAxisPerThread, bool kPacked>
__global__ void __launch_bounds__(kMaxBlockThreads)
    softmax_strided_backward_kernel(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ y,
                                    scalar_t* __restrict__ dx, const StridedLayout<3> layout,
                                    const int columns, const int cluster_size) {
  using acc_t = acc_type<scalar_t>;
  using Epi = Epilogue<acc_t>;
  const RowIndexer<3>& outer = layout.outer;
  const auto tile_body = [&](const auto& at, const auto& walk, auto& reduction, unsigned& round) {
    const int valid = at.valid;
    StridedFragment<scalar_t, scalar_t, kAxisPerThread, P, kPacked> g, v;
    g.load(walk.start(dy + at.offset[0], outer, 0), layout.pitch[0], walk.count, valid, acc_t(0));
    v.load(walk.start(y + at.offset[1], outer, 1), layout.pitch[1], walk.count, valid, acc_t(0));
    acc_t part[P];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      part[p] = 0;
#pragma unroll
      for (int e = 0; e < kAxisPerThread; ++e)
        part[p] += Epi::reduce_term(g.template at<0>(e, p), v.template at<0>(e, p));
    }
    fold_column_lanes(part, columns, Sum{});
    if (blockDim.x > kWarpSize || cluster_size > 1)  // a one-warp tile's lane fold has the totals
      reduce_columns<acc_t, P>(part, columns, cluster_size, round, reduction, Sum{});
    Epi epilogue[P];
#pragma unroll
    for (int p = 0; p < P; ++p) epilogue[p] = Epi(part[p]);

    scalar_t* const dst = walk.start(dx + at.offset[2], outer, 2);
#pragma unroll
    for (int e = 0; e < kAxisPerThread; ++e) {
      if (e < walk.count)
        store_columns<scalar_t, P>(dst + e * layout.pitch[2], valid, [&](int p) {
          return epilogue[p](g.template at<1>(e, p), v.template at<1>(e, p));
        });
    }
  };
  for_each_strided_tile<acc_t, scalar_t, P, kAxisPerThread>(layout, columns, cluster_size, tile_body);
}

}  // namespace softmax_ext::cuda
