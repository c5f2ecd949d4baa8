// Warp family kernels (policy.h): a row in the registers of a group of
// lanes, one read, one write; reductions are shuffles within the group, no
// shared memory.
#pragma once

#include "cuda/core/epilogues.cuh"
#include "cuda/core/fragment.cuh"
#include "cuda/core/reduce.cuh"
#include "cuda/core/row_indexer.cuh"
#include "cuda/families/warp/policy.h"

namespace softmax_ext::cuda {

struct WarpRowLoop {
  int group;
  int rows_per_pass;  // kRows * groups per block
  __device__ __forceinline__ int64_t start() const { return int64_t{blockIdx.x} * rows_per_pass; }
  __device__ __forceinline__ int64_t step() const { return int64_t{gridDim.x} * rows_per_pass; }
  // Row r of this thread's group in the pass starting at `base`.
  __device__ __forceinline__ int64_t row(int64_t base, int r) const {
    return base + int64_t{r} * (blockDim.x / group) + threadIdx.x / group;
  }
  __device__ __forceinline__ int lane() const { return threadIdx.x % group; }
};

template <template <typename> class Epilogue, typename in_t, typename out_t, int kPacks>
__global__ void __launch_bounds__(kWarpBlockThreads)
    softmax_warp_forward_kernel(const in_t* __restrict__ x, out_t* __restrict__ y,
                                const RowIndexer<2> layout, const int group, const int view_align) {
  using acc_t = acc_type<out_t>;
  constexpr int P = kPack<in_t>;
  constexpr int kRows = warp_rows(kPacks, elems_per_thread(is_double_acc_v<out_t>, false) / P);
  const WarpRowLoop loop{group, kRows * (kWarpBlockThreads / group)};
  const int64_t capacity = int64_t{group} * kPacks * P;
  const int first = loop.lane() * P;
  const int stride = group * P;

  for (int64_t base = loop.start(); base < layout.rows; base += loop.step()) {
    int64_t offset[kRows][2];
    RowView view[kRows];
    const in_t* x_row[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = loop.row(base, r);
      offset[r][0] = offset[r][1] = 0;
      if (row < layout.rows) layout.row_offsets(row, offset[r]);
      x_row[r] = x + offset[r][0];
      view[r] = row < layout.rows ? make_view(x_row[r], layout.axis_size, capacity, view_align)
                                : RowView{0, 0, false};
    }
    acc_t v[kRows][kPacks][P];
    load_fragments<out_t>(x_row, view, first, stride, v, neg_infinity<acc_t>());
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      // Two shuffle passes (max, then sum) rather than one of (max, sum)
      // pairs: pairs cost two exps per combining step, which made rows of
      // 128 floats compute-bound.
      using Epi = Epilogue<acc_t>;
      const acc_t max = warp_all_reduce(fragment_max(v[r]), NanMax{}, group);
      const acc_t sum = warp_all_reduce(fragment_exp_sum<Epi::kKeepsExp, typename Epi::Exp>(v[r], max), Sum{}, group);
      const Epi epilogue(max, sum);
      const acc_t scale = epilogue.scale_from(max);
      store_fragment<out_t, kPacks, P>(y + offset[r][1], view[r], first, stride,
                                       [&](int k, int e) { return epilogue.finish(v[r][k][e], scale); });
    }
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
  constexpr int kRows = warp_rows(kPacks, elems_per_thread(is_double_acc_v<scalar_t>, true) / P);
  const WarpRowLoop loop{group, kRows * (kWarpBlockThreads / group)};
  const int64_t capacity = int64_t{group} * kPacks * P;
  const int first = loop.lane() * P;
  const int stride = group * P;

  for (int64_t base = loop.start(); base < layout.rows; base += loop.step()) {
    int64_t offset[kRows][3];
    RowView view[kRows];
    // Fragments 0..kRows-1 are dy, kRows..2*kRows-1 are y, of the same rows.
    const scalar_t* src[2 * kRows];
    RowView views[2 * kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = loop.row(base, r);
      offset[r][0] = offset[r][1] = offset[r][2] = 0;
      if (row < layout.rows) layout.row_offsets(row, offset[r]);
      view[r] = row < layout.rows ? make_view(dy + offset[r][0], layout.axis_size, capacity)
                                  : RowView{0, 0, false};
      src[r] = dy + offset[r][0];
      src[kRows + r] = y + offset[r][1];
      views[r] = views[kRows + r] = view[r];
    }
    acc_t t[2 * kRows][kPacks][P];
    load_fragments<scalar_t>(src, views, first, stride, t, acc_t(0));
    auto& g = reinterpret_cast<acc_t(&)[kRows][kPacks][P]>(t[0]);
    auto& v = reinterpret_cast<acc_t(&)[kRows][kPacks][P]>(t[kRows]);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      acc_t sum = 0;
#pragma unroll
      for (int k = 0; k < kPacks; ++k)
#pragma unroll
        for (int e = 0; e < P; ++e) sum += Epi::reduce_term(g[r][k][e], v[r][k][e]);
      const Epi epilogue(warp_all_reduce(sum, Sum{}, group));
      store_fragment<scalar_t, kPacks, P>(dx + offset[r][2], view[r], first, stride,
                                          [&](int k, int e) { return epilogue(g[r][k][e], v[r][k][e]); });
    }
  }
}

}  // namespace softmax_ext::cuda
