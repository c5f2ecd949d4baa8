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
  int packs;  // packs per lane, up to max_packs
};
// A row's group is a power of two of lanes, at least kWarpMinGroup and
// enough to hold the row in max_packs packs each. Backward: the fewest
// lanes that hold it in target_packs packs each. Forward: the most lanes of
// which each still gets target_packs of the row's packs on average, so a
// lane keeps that many loads in flight where the row does not fill its
// group (f32 rows of 100 fill 25 of 32 packs); the backward has two
// operands' loads in flight. Measured on H200, % of the copy bandwidth,
// "at most" -> "at least" target_packs packs a lane: forward f32 rows of 48
// 74.1 -> 95.0, 80 61.8 -> 80.3, 100 74.9 -> 82.5, 200 71.3 -> 91.8, f64
// rows of 100 55.7 -> 72.2 (powers of two unchanged); backward f32 rows of
// 100 98.6 -> 90.3, 200 98.6 -> 97.4 (80: 93.1 -> 99.0).
// A lane's fixed work per row (indexing, shuffles, the epilogue's division)
// is spread over more elements with more packs, while rows of one lane lose
// coalescing. Measured on H200 (forward rows of 16 to 1024):
// one pack per lane, a row over up to 32 lanes, ran f32 rows of 32 and 128
// at 76-77% of the copy bandwidth and bf16 rows of 128 at 67%, compute
// bound; two packs ran them at 97-98%. Four packs suit 16-bit forward rows
// (bf16 rows of 512: 97% with four, 90% with two). Fewer lanes lost
// coalescing: f32 rows of 32 over two lanes of four packs ran at 91%
// (backward 82%), rows of 16 and bf16 rows of 32 in one lane at 66-73%.
// f32 forward rows of a power of two of packs take two packs a lane, other
// f32 rows four: their lanes with packs past the row's end pay bounds tests
// on every pack, which fewer lanes with more packs amortise. f64 forward
// rows take four (two values a pack). Measured on H200, two -> four packs:
// f32 rows of 32 98.1 -> 90.5, 64 97.4 -> 96.5, 128 98.2 -> 97.1, 512 and
// 1024 equal; rows of 100 76.0 -> 78.3, 200 93.7 -> 96.6, 300 79.3 -> 87.1;
// f64 rows of 100 76.0 -> 82.7, 32 87.5 -> 96.7, 64 79.3 -> 97.8, 128
// 77.9 -> 97.6. Rows of four packs a lane keep at least kWarpMinWideGroup
// lanes (64 bytes of f32 per access) where each still gets two packs: f32
// rows of 48 over two lanes of eight packs ran at 78.2, over four lanes of
// four at 94.0; f64 rows of 8 over four lanes of one pack at 63.4, over two
// lanes of two at 86.0.
constexpr int kWarpMinGroup = 2;
constexpr int kWarpMinWideGroup = 4;
constexpr int warp_target_packs(int64_t element_bytes, bool backward, int64_t packs_needed) {
  if (backward) return 2;
  if (element_bytes == 4) return is_pow2(packs_needed) ? 2 : 4;
  return 4;
}
WarpShape warp_shape(int64_t needed, int pack, int max_packs, bool backward);
// `walk`: config.h, grid_walks_rows.
unsigned int warp_grid(int64_t rows, int group, int packs, int max_packs, bool walk);
// The boundary forward rows are viewed from (make_view). f32 rows filling
// at least 72% (kWarpWideViewFillNum / Den) of their group's capacity: the
// bytes one access of the group spans (a 16-byte vector a lane), at most a
// line, so that each access covers whole sectors; the rest: 16 bytes.
// Measured on H200, % of the copy bandwidth, f32 softmax forward, 16 bytes
// -> the span, rows of (fill of the capacity):
//   52 (.81) 87.0 -> 91.2, 60 (.94) 84.5 -> 88.6, 92 (.72) 86.3 -> 93.7,
//   100 (.78) 83.3 -> 93.5, 108 (.84) 82.0 -> 93.4, 116 (.91) 79.5 -> 93.7,
//   124 (.97) 78.7 -> 87.3, 196 (.77) 94.8 -> 97.0, 212 (.83) 94.3 -> 96.7,
//   244 (.95) 93.5 -> 95.6, 380 (.74) 93.1 -> 95.0, 460 (.90) 96.3 -> 97.2;
// but rows filling less lost: 36 (.56) 77.8 -> 71.1, 44 (.69) 83.1 -> 77.3,
//   68 (.53) 81.3 -> 75.0, 76 (.59) 83.6 -> 81.0, 180 (.70) 91.5 -> 88.6,
//   132 (.52) 77.7 -> 76.1.
// (Probably because a warp's rows then start at different view positions,
// so its lanes branch apart on more of their packs; a full row has few
// such packs. Not measured.)
// (Contiguous f32 rows of 60, 116 and 124 now run on the row tile,
// config.h, row_tile_forward_fits.)
// 16-bit and f64 rows and the backward lost on it too (bf16 backward rows
// of 200 89.8 -> 86.2, f16 forward rows of 1000 88.0 -> 85.6, f64 forward
// rows of 100 87.8 -> 85.7).
constexpr int kWarpViewAlignMax = 128;
constexpr int64_t kWarpWideViewFillNum = 23, kWarpWideViewFillDen = 32;  // 72%
constexpr int warp_view_align(int64_t n, const WarpShape& shape, int64_t element_bytes) {
  const int64_t capacity = int64_t{shape.group} * shape.packs * pack_size(element_bytes);
  if (element_bytes != 4 || n * kWarpWideViewFillDen < capacity * kWarpWideViewFillNum) return kVectorBytes;
  return shape.group * kVectorBytes < kWarpViewAlignMax ? shape.group * kVectorBytes : kWarpViewAlignMax;
}

// Rows of the whole block are processed together; the loop bound is uniform
// across the block so every lane takes part in every shuffle. A group holds
// warp_rows(packs, max_packs) rows at once, so each lane has at least two
// vector loads per operand in flight however short its rows, within the
// register budget of max_packs packs per operand (config.h). (Four, on
// H100, ran rows of 32 and 128 floats 2% slower: 58 registers rather than
// 42, half the SM's threads resident.)
constexpr int kWarpMinPacksInFlight = 2;
constexpr int warp_rows(int packs, int max_packs) {
  const int rows = (max_packs < kWarpMinPacksInFlight ? max_packs : kWarpMinPacksInFlight) / packs;
  return rows > 1 ? rows : 1;
}

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
