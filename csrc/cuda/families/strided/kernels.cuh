// Strided family (KernelFamily::kCudaStrided): softmax over an axis that is
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

#include "cuda/block_kernels.cuh"  // BlockShape, ClusterLaunch, launch_row_blocks
#include "cuda/common.cuh"
#include "cuda/fragment.cuh"
#include "cuda/reduce.cuh"

namespace softmax_ext::cuda {

// Largest width in columns of a tile of in_t that reduces through shared
// memory (128 bytes); a tile is at most a warp wide in threads. A one-warp
// tile reduces by shuffles alone and may be wider (strided_shape).
constexpr int strided_max_columns(int64_t element_bytes) {
  return kStridedTileBytes / static_cast<int>(element_bytes);
}

// Dynamic shared memory of a strided launch (reduce_columns), whose tiles
// are at most `pitch` columns wide (strided_max_columns), in blocks of
// `threads` threads: each warp's partials and the column totals,
// `value_bytes` each, then in a cluster the exchange's barriers and two
// slot sets of `width` per block. A one-warp tile reduces by shuffles
// alone. Sized to the launch, so small blocks of short axes keep their
// occupancy (a static size for the widest tile and largest cluster,
// 17-33 KB, held bf16 blocks of one warp to 6 per SM: 45% of the copy
// bandwidth on (4096, 16, 4096) dim 1 forward, against 89%).
constexpr int64_t kExchangeBarrierBytes = 16;
constexpr int64_t strided_reduction_bytes(int64_t value_bytes, int threads, int pitch, int width,
                                          int cluster_size) {
  if (threads <= kWarpSize && cluster_size == 1) return 0;
  const int64_t exchange =
      cluster_size > 1 ? kExchangeBarrierBytes + 2 * int64_t{cluster_size} * width * value_bytes : 0;
  return (int64_t{threads / kWarpSize} + 1) * pitch * value_bytes + exchange;
}

// Host side (softmax_strided.cu): tile geometry and the tile layout.
struct StridedShape {
  int pack;          // P: 1, or the vector width when every access is aligned
  int columns;       // threads across the tile (W / P), at most 32
  int threads;       // block size
  int cluster_size;  // blocks along the axis
  // The launch of a kernel on elements of `element_bytes` whose reduction
  // keeps values of `value_bytes`: blocks of more than 512 threads on a
  // persistent grid (config.h, strided_persistent).
  BlockShape launch(int64_t element_bytes, int64_t value_bytes) const {
    const int pitch = strided_max_columns(element_bytes);
    return {threads, cluster_size,
            strided_reduction_bytes(value_bytes, threads, pitch, columns * pack, cluster_size),
            strided_persistent(threads)};
  }
};
// The elements P of a thread's vector accesses: `vector` where every operand
// is aligned to it, else 1.
int strided_pack(const Problem& p, const Buffers& b, int vector);
// The widest tile in columns for accesses of `pack` elements: 128 bytes
// (strided_tile_columns), at most a warp of scalar columns, and no wider
// than the inner run (rounded up to a power of two).
inline int64_t strided_widest_tile(const Problem& p, int pack) {
  int64_t width = strided_tile_columns(c10::elementSize(p.in_dtype));
  if (pack == 1) width = std::min<int64_t>(width, kWarpSize);
  return std::min(width, std::max<int64_t>(next_pow2(p.inner_size()), pack));
}
// The tile for accesses of `pack` elements and `per_thread` elements a thread.
StridedShape strided_shape(const Problem& p, int pack, int64_t per_thread, int max_cluster);

// 16-bit operands stay packed in 8-byte vectors where aligned
// (StridedFragment): two values a register, so a thread holds twice the
// elements, in packs of half a 16-byte vector's columns. On H200 this beat
// 16-byte vectors widened at the load on every axis measured (16 to 8192),
// forward and backward; e.g. % of the copy bandwidth, bf16 backward over
// dim 1 of (4096, 16, 4096) 75.5 -> 87.4, (1024, 64, 4096) 68.3 -> 101.9,
// (32, 21, 262144) 54.7 -> 79.2.
template <typename in_t>
struct StridedPacking {
  static constexpr int kVector = is_reduced_float_v<in_t> ? kPack<in_t> / 2 : kPack<in_t>;
  // Whether accesses of P elements (1 or kVector) keep the values packed.
  static constexpr bool packed(int P) { return is_reduced_float_v<in_t> && P > 1; }
  // Elements a thread holds, `per_thread` being its accumulator values.
  static constexpr int elements(int per_thread, int P) { return per_thread * (packed(P) ? 2 : 1); }
};

// The tile of a strided launch of in_t operands with `per_thread`
// accumulator values a thread: the pack their alignment allows, and the
// elements a thread holds with it.
template <typename in_t>
StridedShape strided_launch_shape(const Problem& p, const Buffers& b, int per_thread, int max_cluster) {
  using Packing = StridedPacking<in_t>;
  const int pack = strided_pack(p, b, Packing::kVector);
  return strided_shape(p, pack, Packing::elements(per_thread, pack), max_cluster);
}

// Launches a strided kernel with P = pack (1 or the vector width kVector,
// by default the strided family's): f(std::integral_constant<int, P>{})
// must launch.
template <typename in_t, int kVector = StridedPacking<in_t>::kVector, typename F>
void dispatch_strided_pack(int pack, F&& f) {
  if (pack == 1) {
    f(std::integral_constant<int, 1>{});
  } else {
    TORCH_INTERNAL_ASSERT(pack == kVector, "softmax_ext: strided pack ", pack);
    f(std::integral_constant<int, kVector>{});
  }
}

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
// register, widened where the maths reads them (fragment.cuh, widen_half):
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

// Folds the lane-folded column partials (fold_column_lanes) over the block's
// warps and then the cluster's blocks, in a fixed order; returns this
// thread's P column totals. T is MaxSum<acc_t> (forward) or acc_t (backward).
// In a cluster, the block's column totals go to every block of the cluster
// (cluster_exchange_push, one thread per block and column), and each block
// folds the totals it received in rank order: `round` counts the exchanges
// (reduce.cuh).
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
  ColumnReduction<Part, strided_max_columns(sizeof(in_t))> reduction{columns * P, cluster_size};
  if (cluster_size > 1) cluster_exchange_init(reduction);
  unsigned round = 0;

  const RowIndexer<2>& outer = layout.outer;
  const int tx = threadIdx.x % columns;
  const int ty = threadIdx.x / columns;
  const int rows_step = blockDim.x / columns;
  const int64_t width = int64_t{columns} * P;
  const StridedAxisWalk<kAxisPerThread, 2> walk(outer, rows_step, ty);
  const ClusterRowLoop tiles{cluster_size};

  for (int64_t tile = tiles.start(); tile < layout.tiles; tile += tiles.step()) {
    const TileColumns<2> at(layout, tile, width, tx, P);
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
  }
  if (cluster_size > 1) cluster_exchange_exit(round);
}

// kPacked: 16-bit dy and y in 8-byte packs stay packed (StridedFragment).
template <template <typename> class Epilogue, typename scalar_t, int P, int kAxisPerThread, bool kPacked>
__global__ void __launch_bounds__(kMaxBlockThreads)
    softmax_strided_backward_kernel(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ y,
                                    scalar_t* __restrict__ dx, const StridedLayout<3> layout,
                                    const int columns, const int cluster_size) {
  using acc_t = acc_type<scalar_t>;
  using Epi = Epilogue<acc_t>;
  ColumnReduction<acc_t, strided_max_columns(sizeof(scalar_t))> reduction{columns * P, cluster_size};
  if (cluster_size > 1) cluster_exchange_init(reduction);
  unsigned round = 0;

  const RowIndexer<3>& outer = layout.outer;
  const int tx = threadIdx.x % columns;
  const int ty = threadIdx.x / columns;
  const int rows_step = blockDim.x / columns;
  const int64_t width = int64_t{columns} * P;
  const StridedAxisWalk<kAxisPerThread, 3> walk(outer, rows_step, ty);
  const ClusterRowLoop tiles{cluster_size};

  for (int64_t tile = tiles.start(); tile < layout.tiles; tile += tiles.step()) {
    const TileColumns<3> at(layout, tile, width, tx, P);
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
  }
  if (cluster_size > 1) cluster_exchange_exit(round);
}

}  // namespace softmax_ext::cuda
