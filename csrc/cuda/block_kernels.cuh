// Block and cluster families (KernelFamily::kCudaBlock, kCudaCluster): a
// contiguous row held in the registers of one block (blockDim.x threads), or
// of the `cluster_size` blocks of a thread-block cluster on sm_90+, which
// exchange their partial statistics through distributed shared memory. Either
// way global memory is read once and written once.
//
// Block b of a cluster holds view positions [b * C, (b + 1) * C) of the row,
// C = blockDim.x * kPacks * P. Blocks and clusters walk the rows
// grid-stride, clusters on a persistent grid, staging the next row in shared
// memory (staging.cuh; config.h, stages_rows); a cluster of one block is the
// plain block family. kPacked: the rows stay packed in
// registers (Fragment, fragment.cuh; config.h says where).
#pragma once

#include "cuda/common.cuh"
#include "cuda/fragment.cuh"
#include "cuda/launch.h"
#include "cuda/reduce.cuh"
#include "cuda/staging.cuh"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

namespace softmax_ext::cuda {

// Host side (softmax_block.cu). The geometry for a row of `needed` view
// positions, `per_thread` of them per thread, on a device whose largest
// cluster is `device_cluster`, with at most `max_cluster` blocks per row (1:
// the block family): a block just large enough for the row (up to
// max_block_threads, config.h), or a cluster of 1024-thread blocks (of
// 512-thread blocks where that spares threads; config.h).
struct BlockShape {
  int threads;
  int cluster_size;
  int64_t smem_bytes = 0;   // dynamic shared memory per block
  bool persistent = false;  // a grid of as many clusters as run at once
  bool walks_rows = true;   // kMaxGridBlocks blocks (clusters), else a block per row
};
BlockShape block_shape(int64_t needed, int64_t per_thread, int max_cluster, int device_cluster, bool backward,
                       c10::ScalarType in);

// The register layout and launch geometry of contiguous rows of in_t with
// out_t's accumulator: calls launch(kPacked, kPacks, kStaged, shape), the
// first three as std::integral_constant. Long 16-bit rows stay packed
// (config.h, keeps_packed), twice the elements per thread; clusters stage
// the next row in shared memory (staging.cuh, config.h: stages_rows).
template <typename in_t, typename out_t, bool kBackward, typename Launch>
void with_block_geometry(const Problem& p, const void* in0, int max_cluster, Launch&& launch) {
  constexpr int P = kPack<in_t>;
  dispatch_bool(keeps_packed(p.in_dtype, p.axis_size, max_cluster > 1), [&](auto packed) {
    constexpr bool kPacked = decltype(packed)::value && is_reduced_float_v<in_t>;
    constexpr int kPacks = elems_per_thread(is_double_acc_v<out_t>, kBackward) * (kPacked ? 2 : 1) / P;
    BlockShape shape = block_shape(p.axis_size + view_slack(p, kIn0, in0, sizeof(in_t)), kPacks * P,
                                   max_cluster, max_cluster_size(p.device_index), kBackward, p.in_dtype);
    dispatch_bool(stages_rows(shape.cluster_size, shape.threads, kBackward), [&](auto staged) {
      // Clusters keep 16-bit rows packed: no unpacked 16-bit row is staged.
      constexpr bool kStaged = decltype(staged)::value && (kPacked || !is_reduced_float_v<in_t>);
      if (kStaged) shape.smem_bytes = stage_bytes(kBackward ? 2 : 1, kPacks, shape.threads);
      shape.persistent = shape.cluster_size > 1;
      shape.walks_rows = shape.persistent || grid_walks_rows(p.in_dtype, p.axis_size, kBackward);
      launch(std::bool_constant<kPacked>{}, std::integral_constant<int, kPacks>{}, std::bool_constant<kStaged>{},
             shape);
    });
  });
}

// A launch configuration of `blocks` blocks of `threads` threads, grouped in
// clusters of `cluster_size` along x when that is above 1. Not copyable: the
// configuration points at its own attribute.
struct ClusterLaunch {
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute attribute{};
  ClusterLaunch(unsigned int blocks, int threads, int cluster_size, cudaStream_t stream, size_t smem_bytes = 0) {
    config.gridDim = dim3(blocks);
    config.blockDim = dim3(threads);
    config.dynamicSmemBytes = smem_bytes;
    config.stream = stream;
    if (cluster_size > 1) {
      attribute.id = cudaLaunchAttributeClusterDimension;
      attribute.val.clusterDim.x = cluster_size;
      attribute.val.clusterDim.y = 1;
      attribute.val.clusterDim.z = 1;
      config.attrs = &attribute;
      config.numAttrs = 1;
    }
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// Readies `kernel` for a persistent launch of `config`'s shape (its cluster
// attribute, block size and dynamic shared memory) on the current device,
// setting the attributes that shape needs, and returns how many such
// clusters (blocks, for a cluster of one) the device runs at once. Both
// happen once per device, kernel and shape, not on every launch.
int persistent_clusters(const void* kernel, const cudaLaunchConfig_t& config);

// Dynamic shared memory a kernel takes without opting in to more
// (cudaFuncAttributeMaxDynamicSharedMemorySize, which persistent launches
// set).
constexpr int64_t kDefaultSharedBytes = 48 * 1024;

// Launches `kernel` on the current stream over `rows` rows, as clusters of
// shape.cluster_size blocks when that is above 1, with shape.smem_bytes of
// dynamic shared memory, and checks the launch.
template <typename... Params, typename... Args>
void launch_row_blocks(void (*kernel)(Params...), int64_t rows, const BlockShape& shape, Args&&... args) {
  const int c = shape.cluster_size;
  TORCH_INTERNAL_ASSERT(shape.smem_bytes <= kDefaultSharedBytes || shape.persistent,
                        "softmax_ext: dynamic shared memory beyond the default is set up by persistent launches");
  const unsigned int blocks =
      shape.walks_rows ? grid_for_rows(std::min<int64_t>(rows, kMaxGridBlocks / c)) * c : grid_for_each(rows);
  ClusterLaunch launch(blocks, shape.threads, c, c10::cuda::getCurrentCUDAStream(),
                       static_cast<size_t>(shape.smem_bytes));
  if (shape.persistent) {  // config.h, stages_rows
    const int resident = persistent_clusters(reinterpret_cast<const void*>(kernel), launch.config);
    launch.config.gridDim.x = static_cast<unsigned>(std::min<int64_t>(rows, resident) * c);
  } else if (c > kPortableClusterSize) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  }
  C10_CUDA_CHECK(cudaLaunchKernelEx(&launch.config, kernel, std::forward<Args>(args)...));
}

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
  const int block_positions = blockDim.x * kPacks * P;
  const int first = static_cast<int>(cluster_rank()) * block_positions + static_cast<int>(threadIdx.x) * P;
  const int stride = blockDim.x * P;
  const int64_t capacity = int64_t{block_positions} * cluster_size;

  extern __shared__ uint4 stage_shared[];
  StageOf<kStaged, 1, kPacks> stage(stage_shared);
  const in_t* const staged_operands[1] = {x};
  if constexpr (kStaged)
    if (loop.start() < layout.rows)
      stage.issue_row(layout, loop.start(), staged_operands, capacity, first, stride);

  for (int64_t row = loop.start(); row < layout.rows; row += loop.step()) {
    int64_t offset[2];
    layout.row_offsets(row, offset);
    const in_t* x_row = x + offset[0];
    const RowView view = make_view(x_row, layout.axis_size, capacity);

    Fragment<in_t, out_t, kPacks, kPacked> v;
    if constexpr (kStaged) {
      stage.wait();
      v.load_staged(stage, 0, x_row, view, first, stride, neg_infinity<acc_t>());
      if (row + loop.step() < layout.rows)
        stage.issue_row(layout, row + loop.step(), staged_operands, capacity, first, stride);
    } else {
      v.load(x_row, view, first, stride, neg_infinity<acc_t>());
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
      store_fragment<out_t, kPacks, P>(y + offset[1], view, first, stride,
                                       [&](int k, int e) { return epilogue.finish(v.v[k][e], scale); });
    } else {
      store_fragment<out_t, kPacks, P>(y + offset[1], view, first, stride,
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
  const int block_positions = blockDim.x * kPacks * P;
  const int first = static_cast<int>(cluster_rank()) * block_positions + static_cast<int>(threadIdx.x) * P;
  const int stride = blockDim.x * P;
  const int64_t capacity = int64_t{block_positions} * cluster_size;

  extern __shared__ uint4 stage_shared[];
  StageOf<kStaged, 2, kPacks> stage(stage_shared);
  const scalar_t* const staged_operands[2] = {dy, y};
  if constexpr (kStaged)
    if (loop.start() < layout.rows)
      stage.issue_row(layout, loop.start(), staged_operands, capacity, first, stride);

  for (int64_t row = loop.start(); row < layout.rows; row += loop.step()) {
    int64_t offset[3];
    layout.row_offsets(row, offset);
    const RowView view = make_view(dy + offset[0], layout.axis_size, capacity);

    using Frag = Fragment<scalar_t, scalar_t, kPacks, kPacked>;
    Frag g, v;
    if constexpr (kStaged) {
      stage.wait();
      g.load_staged(stage, 0, dy + offset[0], view, first, stride, acc_t(0));
      v.load_staged(stage, 1, y + offset[1], view, first, stride, acc_t(0));
      if (row + loop.step() < layout.rows)
        stage.issue_row(layout, row + loop.step(), staged_operands, capacity, first, stride);
    } else {
      Frag::load_pair(g, v, dy + offset[0], y + offset[1], view, first, stride);
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
    store_fragment<scalar_t, kPacks, P>(dx + offset[2], view, first, stride,
                                        [&](int k, int e) { return epilogue(g.template at<1>(k, e), v.template at<1>(k, e)); });
  }
  if (cluster_size > 1) cluster_exchange_exit(round);
}

}  // namespace softmax_ext::cuda
