// Warp family (KernelFamily::kCudaWarp): short contiguous rows, each held in
// the registers of a group of `group` lanes (1, 2, 4, ..., 32), so a warp
// serves 32 / group rows at once and tiny rows waste no lane. One read, one
// write; reductions are warp shuffles within the group, no shared memory.
#pragma once

#include "cuda/common.cuh"
#include "cuda/fragment.cuh"
#include "cuda/reduce.cuh"

namespace softmax_ext::cuda {

// 128 threads: four warps per block keep many blocks resident per SM.
constexpr int kWarpBlockThreads = 128;

// Host: the group size and packs per lane for rows needing `needed` view
// positions (softmax_warp.cu), and the grid for `rows` rows.
struct WarpShape {
  int group;  // lanes per row: 1, 2, 4, 8, 16 or 32
  int packs;  // packs per lane: 1 below 32 lanes, up to max_packs at 32
};
WarpShape warp_shape(int64_t needed, int pack, int max_packs);
unsigned int warp_grid(int64_t rows, int group);

// Rows of the whole block are processed together; the loop bound is uniform
// across the block so every lane takes part in every shuffle.
struct WarpRowLoop {
  int group;
  int64_t rows;
  __device__ __forceinline__ int64_t rows_per_block() const { return blockDim.x / group; }
  __device__ __forceinline__ int64_t start() const { return blockIdx.x * rows_per_block(); }
  __device__ __forceinline__ int64_t step() const { return gridDim.x * rows_per_block(); }
  __device__ __forceinline__ int64_t row_of(int64_t base) const { return base + threadIdx.x / group; }
  __device__ __forceinline__ int lane() const { return threadIdx.x % group; }
};

template <template <typename> class Epilogue, typename in_t, typename out_t, int kPacks>
__global__ void __launch_bounds__(kWarpBlockThreads)
    softmax_warp_forward_kernel(const in_t* __restrict__ x, out_t* __restrict__ y,
                                const RowIndexer<2> layout, const int group) {
  using acc_t = acc_type<out_t>;
  constexpr int P = kPack<in_t>;
  const WarpRowLoop loop{group, layout.rows};
  const int64_t capacity = int64_t{group} * kPacks * P;
  const int64_t first = int64_t{loop.lane()} * P;
  const int64_t stride = int64_t{group} * P;

  for (int64_t base = loop.start(); base < layout.rows; base += loop.step()) {
    const int64_t row = loop.row_of(base);
    int64_t offset[2] = {0, 0};
    if (row < layout.rows) layout.row_offsets(row, offset);
    const in_t* x_row = x + offset[0];
    out_t* y_row = y + offset[1];
    const RowView view =
        row < layout.rows ? make_view(x_row, layout.axis_size, capacity) : RowView{0, 0, false};

    acc_t v[kPacks][P];
    load_fragment<out_t>(x_row, view, first, stride, v, neg_infinity<acc_t>());
    const acc_t max = warp_all_reduce(fragment_max(v), NanMax{}, group);
    acc_t sum = 0;
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
#pragma unroll
      for (int e = 0; e < P; ++e) sum += exp_term(v[k][e], max);
    sum = warp_all_reduce(sum, Sum{}, group);

    const Epilogue<acc_t> epilogue(max, sum);
    store_fragment<out_t, kPacks, P>(y_row, view, first, stride,
                                     [&](int k, int e) { return epilogue(v[k][e]); });
  }
}

// Backward twin: dy and y in registers, one reduction of reduce_term(dy, y).
template <template <typename> class Epilogue, typename scalar_t, int kPacks>
__global__ void __launch_bounds__(kWarpBlockThreads)
    softmax_warp_backward_kernel(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ y,
                                 scalar_t* __restrict__ dx, const RowIndexer<3> layout,
                                 const int group) {
  using acc_t = acc_type<scalar_t>;
  using Epi = Epilogue<acc_t>;
  constexpr int P = kPack<scalar_t>;
  const WarpRowLoop loop{group, layout.rows};
  const int64_t capacity = int64_t{group} * kPacks * P;
  const int64_t first = int64_t{loop.lane()} * P;
  const int64_t stride = int64_t{group} * P;

  for (int64_t base = loop.start(); base < layout.rows; base += loop.step()) {
    const int64_t row = loop.row_of(base);
    int64_t offset[3] = {0, 0, 0};
    if (row < layout.rows) layout.row_offsets(row, offset);
    const RowView view = row < layout.rows ? make_view(dy + offset[0], layout.axis_size, capacity)
                                           : RowView{0, 0, false};
    acc_t g[kPacks][P], v[kPacks][P];
    load_fragment<scalar_t>(dy + offset[0], view, first, stride, g, acc_t(0));
    load_fragment<scalar_t>(y + offset[1], view, first, stride, v, acc_t(0));
    acc_t sum = 0;
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
#pragma unroll
      for (int e = 0; e < P; ++e) sum += Epi::reduce_term(g[k][e], v[k][e]);
    sum = warp_all_reduce(sum, Sum{}, group);

    const Epi epilogue(sum);
    store_fragment<scalar_t, kPacks, P>(dx + offset[2], view, first, stride,
                                        [&](int k, int e) { return epilogue(g[k][e], v[k][e]); });
  }
}

}  // namespace softmax_ext::cuda
