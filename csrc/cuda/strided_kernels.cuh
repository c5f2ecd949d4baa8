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

#include "cuda/common.cuh"
#include "cuda/fragment.cuh"
#include "cuda/reduce.cuh"

namespace softmax_ext::cuda {

// Largest tile width in columns (64 bf16 columns, 128 bytes).
constexpr int kStridedMaxColumns = kStridedTileBytes / 2;

// Host side (softmax_strided.cu): tile geometry and the tile layout.
struct StridedShape {
  int pack;          // P: 1, or the vector width when every access is aligned
  int columns;       // threads across the tile (W / P), at most 32
  int threads;       // block size
  int cluster_size;  // blocks along the axis
};
StridedShape strided_shape(const Problem& p, const Buffers& b, int64_t per_thread, int max_cluster);

// Launches a strided kernel with P = shape.pack (1 or the vector width):
// f(std::integral_constant<int, P>{}) must launch.
template <typename in_t, typename F>
void dispatch_strided_pack(const StridedShape& shape, F&& f) {
  if (shape.pack == 1) {
    f(std::integral_constant<int, 1>{});
  } else {
    TORCH_INTERNAL_ASSERT(shape.pack == kPack<in_t>, "softmax_ext: strided pack ", shape.pack);
    f(std::integral_constant<int, kPack<in_t>>{});
  }
}

// Where column tiles start: the outer (non-axis, non-inner) dims of the
// Problem, plus the inner run and the axis stride of each operand.
template <int N>
struct StridedLayout {
  RowIndexer<N> outer;  // rows = outer tiles; axis_size / axis_stride = the axis
  int64_t inner;        // contiguous columns
};

template <int N>
inline StridedLayout<N> make_strided_layout(const Problem& p, const std::array<Operand, N>& slots) {
  StridedLayout<N> s{make_row_indexer<N>(p, slots), p.inner_size()};
  s.outer.batch_rank -= 1;  // the innermost batch dim is the inner run
  s.outer.rows = p.rows / s.inner;
  return s;
}

// Per-tile loop shared by both directions.
struct StridedTiles {
  int64_t col_blocks;
  int64_t count;
  int cluster_size;
  __device__ __forceinline__ int64_t start() const { return blockIdx.x / cluster_size; }
  __device__ __forceinline__ int64_t step() const { return gridDim.x / cluster_size; }
};

// Loads P columns of one axis position into v (fill outside the row/run).
template <typename out_t, typename in_t, int P, typename acc_t>
__device__ __forceinline__ void load_columns(const in_t* __restrict__ src, bool in_axis, int64_t valid,
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
// axis positions j0 + e * step (e < kAxis) of P columns from base[f], whose
// axis stride is axis_stride[f]. When every position is inside the axis and
// the run, all loads are issued before any is converted (as load_fragments
// in fragment.cuh); otherwise position by position.
template <typename out_t, int kFrags, typename in_t, int kAxis, int P, typename acc_t>
__device__ __forceinline__ void load_column_fragments(const in_t* const (&base)[kFrags],
                                                      const int64_t (&axis_stride)[kFrags], int64_t j0, int step,
                                                      int64_t axis_size, int64_t valid,
                                                      acc_t (&v)[kFrags][kAxis][P], acc_t fill) {
  if (valid >= P && j0 + int64_t{kAxis - 1} * step < axis_size) {
    Pack<in_t, P> packs[kFrags][kAxis];
#pragma unroll
    for (int f = 0; f < kFrags; ++f)
#pragma unroll
      for (int e = 0; e < kAxis; ++e) packs[f][e].load(base[f] + (j0 + int64_t{e} * step) * axis_stride[f]);
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
      const int64_t j = j0 + int64_t{e} * step;
      const bool in_axis = j < axis_size;
      load_columns<out_t, in_t, P>(base[f] + (in_axis ? j * axis_stride[f] : 0), in_axis, valid, v[f][e], fill);
    }
}

template <typename out_t, int P, typename Value>
__device__ __forceinline__ void store_columns(out_t* __restrict__ dst, int64_t valid, Value&& value) {
  if (valid >= P) {
    Pack<out_t, P> pk;
#pragma unroll
    for (int p = 0; p < P; ++p) pk.v[p] = convert<out_t>(value(p));
    pk.store(dst);
  } else {
#pragma unroll
    for (int p = 0; p < P; ++p)
      if (p < valid) dst[p] = convert<out_t>(value(p));
  }
}

// Folds per-thread column partials (P per thread) over the block's threads
// and then the cluster's blocks, in a fixed order; returns this thread's P
// column totals. T is MaxSum<acc_t> (forward) or acc_t (backward).
template <typename T, int P, typename Combine>
__device__ __forceinline__ void reduce_columns(T (&part)[P], int columns, int cluster_size,
                                               bool& arrive_pending, T (*warp_parts)[kStridedMaxColumns],
                                               T* slot, T* totals, Combine combine) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int width = columns * P;
  // Lanes with the same tx hold the same columns: fold them (xor by columns).
  for (int offset = columns; offset < kWarpSize; offset *= 2)
#pragma unroll
    for (int p = 0; p < P; ++p) {
      T other;
      if constexpr (std::is_arithmetic_v<T>) {
        other = __shfl_xor_sync(0xffffffffu, part[p], offset);
      } else {
        other = shfl_xor(part[p], offset);
      }
      part[p] = combine(part[p], other);
    }
  if (lane < columns)
#pragma unroll
    for (int p = 0; p < P; ++p) warp_parts[warp][lane * P + p] = part[p];
  __syncthreads();
  if (cluster_size > 1 && arrive_pending) cluster_wait();
  // A tile may be wider than the block (64 columns, 32 threads): stride.
  for (int c = threadIdx.x; c < width; c += blockDim.x) {
    T total = warp_parts[0][c];
    for (int w = 1; w < static_cast<int>(blockDim.x / kWarpSize); ++w) total = combine(total, warp_parts[w][c]);
    (cluster_size > 1 ? slot : totals)[c] = total;
  }
  if (cluster_size > 1) {
    cluster_sync();
    for (int c = threadIdx.x; c < width; c += blockDim.x) {
      T total = cluster_load(slot, 0, c);
      for (int r = 1; r < cluster_size; ++r) total = combine(total, cluster_load(slot, r, c));
      totals[c] = total;
    }
    cluster_arrive();
    arrive_pending = true;
  }
  __syncthreads();
  const int tx = threadIdx.x % columns;
#pragma unroll
  for (int p = 0; p < P; ++p) part[p] = totals[tx * P + p];
}

template <template <typename> class Epilogue, typename in_t, typename out_t, int P, int kAxisPerThread>
__global__ void __launch_bounds__(kMaxBlockThreads)
    softmax_strided_forward_kernel(const in_t* __restrict__ x, out_t* __restrict__ y,
                                   const StridedLayout<2> layout, const int columns,
                                   const int cluster_size) {
  using acc_t = acc_type<out_t>;
  using Part = MaxSum<acc_t>;
  __shared__ Part warp_parts[kWarpSize][kStridedMaxColumns];
  __shared__ Part slot[kStridedMaxColumns];
  __shared__ Part totals[kStridedMaxColumns];

  const RowIndexer<2>& outer = layout.outer;
  const int tx = threadIdx.x % columns;
  const int ty = threadIdx.x / columns;
  const int rows_step = blockDim.x / columns;
  const int64_t width = int64_t{columns} * P;
  const int64_t axis_first = cluster_rank() * int64_t{rows_step} * kAxisPerThread + ty;
  const StridedTiles tiles{ceil_div(layout.inner, width), outer.rows * ceil_div(layout.inner, width),
                           cluster_size};
  bool arrive_pending = false;

  for (int64_t tile = tiles.start(); tile < tiles.count; tile += tiles.step()) {
    int64_t col_block;
    const int64_t o = divmod(tile, tiles.col_blocks, col_block);
    int64_t offset[2];
    outer.row_offsets(o, offset);
    const int64_t c0 = col_block * width + int64_t{tx} * P;
    const int64_t valid = layout.inner - c0;

    const in_t* const base[1] = {x + offset[0] + c0};
    const int64_t axis_stride[1] = {outer.axis_stride[0]};
    acc_t frag[1][kAxisPerThread][P];
    load_column_fragments<out_t>(base, axis_stride, axis_first, rows_step, outer.axis_size, valid, frag,
                                 neg_infinity<acc_t>());
    auto& v = frag[0];
    // Each exp is taken twice (statistics, then output): the per-column
    // state leaves no registers to keep them.
    using Epi = Epilogue<acc_t>;
    Part part[P];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      acc_t m = neg_infinity<acc_t>();
#pragma unroll
      for (int e = 0; e < kAxisPerThread; ++e) m = NanMax{}(m, v[e][p]);
      acc_t s = 0;
#pragma unroll
      for (int e = 0; e < kAxisPerThread; ++e) s += exp_term<typename Epi::Exp>(v[e][p], m);
      part[p] = {m, s};
    }
    reduce_columns<Part, P>(part, columns, cluster_size, arrive_pending, warp_parts, slot, totals,
                            [](const Part& a, const Part& b) { return combine(a, b); });
    Epi epilogue[P];
#pragma unroll
    for (int p = 0; p < P; ++p) epilogue[p] = Epi(part[p].max, part[p].sum);

#pragma unroll
    for (int e = 0; e < kAxisPerThread; ++e) {
      const int64_t j = axis_first + int64_t{e} * rows_step;
      if (j < outer.axis_size)
        store_columns<out_t, P>(y + offset[1] + c0 + j * outer.axis_stride[1], valid,
                                [&](int p) { return epilogue[p](v[e][p]); });
    }
  }
  if (arrive_pending) cluster_wait();
}

template <template <typename> class Epilogue, typename scalar_t, int P, int kAxisPerThread>
__global__ void __launch_bounds__(kMaxBlockThreads)
    softmax_strided_backward_kernel(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ y,
                                    scalar_t* __restrict__ dx, const StridedLayout<3> layout,
                                    const int columns, const int cluster_size) {
  using acc_t = acc_type<scalar_t>;
  using Epi = Epilogue<acc_t>;
  __shared__ acc_t warp_parts[kWarpSize][kStridedMaxColumns];
  __shared__ acc_t slot[kStridedMaxColumns];
  __shared__ acc_t totals[kStridedMaxColumns];

  const RowIndexer<3>& outer = layout.outer;
  const int tx = threadIdx.x % columns;
  const int ty = threadIdx.x / columns;
  const int rows_step = blockDim.x / columns;
  const int64_t width = int64_t{columns} * P;
  const int64_t axis_first = cluster_rank() * int64_t{rows_step} * kAxisPerThread + ty;
  const StridedTiles tiles{ceil_div(layout.inner, width), outer.rows * ceil_div(layout.inner, width),
                           cluster_size};
  bool arrive_pending = false;

  for (int64_t tile = tiles.start(); tile < tiles.count; tile += tiles.step()) {
    int64_t col_block;
    const int64_t o = divmod(tile, tiles.col_blocks, col_block);
    int64_t offset[3];
    outer.row_offsets(o, offset);
    const int64_t c0 = col_block * width + int64_t{tx} * P;
    const int64_t valid = layout.inner - c0;

    const scalar_t* const base[2] = {dy + offset[0] + c0, y + offset[1] + c0};
    const int64_t axis_stride[2] = {outer.axis_stride[0], outer.axis_stride[1]};
    acc_t frag[2][kAxisPerThread][P];
    load_column_fragments<scalar_t>(base, axis_stride, axis_first, rows_step, outer.axis_size, valid, frag,
                                    acc_t(0));
    auto& g = frag[0];
    auto& v = frag[1];
    acc_t part[P];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      part[p] = 0;
#pragma unroll
      for (int e = 0; e < kAxisPerThread; ++e) part[p] += Epi::reduce_term(g[e][p], v[e][p]);
    }
    reduce_columns<acc_t, P>(part, columns, cluster_size, arrive_pending, warp_parts, slot, totals,
                             [](acc_t a, acc_t b) { return a + b; });
    Epi epilogue[P];
#pragma unroll
    for (int p = 0; p < P; ++p) epilogue[p] = Epi(part[p]);

#pragma unroll
    for (int e = 0; e < kAxisPerThread; ++e) {
      const int64_t j = axis_first + int64_t{e} * rows_step;
      if (j < outer.axis_size)
        store_columns<scalar_t, P>(dx + offset[2] + c0 + j * outer.axis_stride[2], valid,
                                   [&](int p) { return epilogue[p](g[e][p], v[e][p]); });
    }
  }
  if (arrive_pending) cluster_wait();
}

}  // namespace softmax_ext::cuda
