// Block and cluster family kernels (policy.h): a
// contiguous row held in the registers of one block (blockDim.x threads), or
// of the `cluster_size` blocks of a thread-block cluster on sm_90+, which
// exchange their partial statistics through distributed shared memory. Either
// way global memory is read once and written once.
//
// Block b of a cluster holds view positions [b * C, (b + 1) * C) of the row,
// C = blockDim.x * kPacks * P. Blocks and clusters walk the rows
// grid-stride, clusters on a persistent grid, staging the next row in shared
// memory (core/staging.cuh; policy.h, stages_rows); a cluster of one block
// is the plain block family. kPacked: the rows stay packed in registers
// (Fragment, core/fragment.cuh; policy.h says where).
#pragma once

#include "cuda/core/cluster.cuh"
#include "cuda/core/epilogues.cuh"
#include "cuda/core/fragment.cuh"
#include "cuda/core/reduce.cuh"
#include "cuda/core/row_indexer.cuh"
#include "cuda/core/staging.cuh"
#include "cuda/families/block/policy.h"

namespace softmax_ext::cuda {

// This thread's view positions of a row held by a cluster of `cluster_size`
// blocks: first, first + stride, ... (kPacks packs of P), in block b's
// [b * C, (b + 1) * C), C = blockDim.x * kPacks * P; capacity = cluster_size * C.
template <int kPacks, int P>
struct ClusterRowSpan {
  int first;
  int stride;
  int64_t capacity;
  __device__ __forceinline__ explicit ClusterRowSpan(int cluster_size) {
    const int block_positions = blockDim.x * kPacks * P;
    first = static_cast<int>(cluster_rank()) * block_positions + static_cast<int>(threadIdx.x) * P;
    stride = blockDim.x * P;
    capacity = int64_t{block_positions} * cluster_size;
  }
};

template <template <typename> class Epilogue, typename in_t, typename out_t, int kPacks, bool kPacked,
          bool kStaged>
__global__ void __launch_bounds__(kMaxBlockThreads)
    softmax_block_forward_kernel(const in_t* __restrict__ x, out_t* __restrict__ y,
                                 const RowIndexer<2> layout, const int cluster_size) {
  using acc_t = acc_type<out_t>;
  constexpr int P = kPack<in_t>;
  __shared__ MaxSum<acc_t> scratch[kWarpSize];
  __shared__ MaxSum<acc_t> combined;
  __shared__ ClusterExchange<MaxSum<acc_t>> exchange;
  if (cluster_size > 1) cluster_exchange_init(exchange);
  unsigned round = 0;

  const ClusterRowLoop loop{cluster_size};
  const ClusterRowSpan<kPacks, P> span(cluster_size);

  extern __shared__ uint4 stage_shared[];
  StageOf<kStaged, 1, kPacks> stage(stage_shared);
  const in_t* const staged_operands[1] = {x};
  if constexpr (kStaged)
    if (loop.start() < layout.rows)
      stage.issue_row(layout, loop.start(), staged_operands, span.capacity, span.first, span.stride);

  for (int64_t row = loop.start(); row < layout.rows; row += loop.step()) {
    int64_t offset[2];
    layout.row_offsets(row, offset);
    const in_t* x_row = x + offset[0];
    const RowView view = make_view(x_row, layout.axis_size, span.capacity);

    Fragment<in_t, out_t, kPacks, kPacked> v;
    if constexpr (kStaged) {
      stage.wait();
      v.load_staged(stage, 0, x_row, view, span.first, span.stride, neg_infinity<acc_t>());
      if (row + loop.step() < layout.rows)
        stage.issue_row(layout, row + loop.step(), staged_operands, span.capacity, span.first, span.stride);
    } else {
      v.load(x_row, view, span.first, span.stride, neg_infinity<acc_t>());
    }
    using Epi = Epilogue<acc_t>;
    // Unpacked softmax keeps exp(x - m) in place of x, m the thread's own
    // max, and scales by exp(m - max) / sum at the store: one exp per
    // element. Otherwise the exps are taken again for the output (packed
    // rows have no room to keep them; log_softmax needs none there).
    constexpr bool kKeep = !kPacked && Epi::kKeepsExp;
    const acc_t local_max = v.max();
    MaxSum<acc_t> stats{local_max, v.template exp_sum<kKeep, typename Epi::Exp>(local_max)};
    stats = block_all_reduce(stats, CombineMaxSum{}, empty_stats<acc_t>(), scratch);
    if (cluster_size > 1)
      stats = cluster_exchange(exchange, stats, cluster_size, round++, empty_stats<acc_t>(), &combined,
                               [](MaxSum<acc_t> part) { return warp_all_reduce(part, CombineMaxSum{}); });

    const Epi epilogue(stats.max, stats.sum);
    if constexpr (kKeep) {
      const acc_t scale = epilogue.scale_from(local_max);
      store_fragment<out_t, kPacks, P>(y + offset[1], view, span.first, span.stride,
                                       [&](int k, int e) { return epilogue.finish(v.v[k][e], scale); });
    } else {
      store_fragment<out_t, kPacks, P>(y + offset[1], view, span.first, span.stride,
                                       [&](int k, int e) { return epilogue(v.template at<1>(k, e)); });
    }
  }
  if (cluster_size > 1) cluster_exchange_exit(round);
}

template <template <typename> class Epilogue, typename scalar_t, int kPacks, bool kPacked, bool kStaged>
__global__ void __launch_bounds__(kMaxBlockThreads)
    softmax_block_backward_kernel(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ y,
                                  scalar_t* __restrict__ dx, const RowIndexer<3> layout,
                                  const int cluster_size) {
  using acc_t = acc_type<scalar_t>;
  using Epi = Epilogue<acc_t>;
  constexpr int P = kPack<scalar_t>;
  __shared__ acc_t scratch[kWarpSize];
  __shared__ acc_t combined;
  __shared__ ClusterExchange<acc_t> exchange;
  if (cluster_size > 1) cluster_exchange_init(exchange);
  unsigned round = 0;

  const ClusterRowLoop loop{cluster_size};
  const ClusterRowSpan<kPacks, P> span(cluster_size);

  extern __shared__ uint4 stage_shared[];
  StageOf<kStaged, 2, kPacks> stage(stage_shared);
  const scalar_t* const staged_operands[2] = {dy, y};
  if constexpr (kStaged)
    if (loop.start() < layout.rows)
      stage.issue_row(layout, loop.start(), staged_operands, span.capacity, span.first, span.stride);

  for (int64_t row = loop.start(); row < layout.rows; row += loop.step()) {
    int64_t offset[3];
    layout.row_offsets(row, offset);
    const RowView view = make_view(dy + offset[0], layout.axis_size, span.capacity);

    using Frag = Fragment<scalar_t, scalar_t, kPacks, kPacked>;
    Frag g, v;
    if constexpr (kStaged) {
      stage.wait();
      g.load_staged(stage, 0, dy + offset[0], view, span.first, span.stride, acc_t(0));
      v.load_staged(stage, 1, y + offset[1], view, span.first, span.stride, acc_t(0));
      if (row + loop.step() < layout.rows)
        stage.issue_row(layout, row + loop.step(), staged_operands, span.capacity, span.first, span.stride);
    } else {
      Frag::load_pair(g, v, dy + offset[0], y + offset[1], view, span.first, span.stride);
    }
    acc_t sum = 0;
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
#pragma unroll
      for (int e = 0; e < P; ++e) sum += Epi::reduce_term(g.template at<0>(k, e), v.template at<0>(k, e));
    sum = block_all_reduce(sum, Sum{}, acc_t(0), scratch);

    if (cluster_size > 1)
      sum = cluster_exchange(exchange, sum, cluster_size, round++, acc_t(0), &combined,
                             [](acc_t part) { return warp_all_reduce(part, Sum{}); });

    const Epi epilogue(sum);
    store_fragment<scalar_t, kPacks, P>(dx + offset[2], view, span.first, span.stride,
                                        [&](int k, int e) { return epilogue(g.template at<1>(k, e), v.template at<1>(k, e)); });
  }
  if (cluster_size > 1) cluster_exchange_exit(round);
}

}  // namespace softmax_ext::cuda
