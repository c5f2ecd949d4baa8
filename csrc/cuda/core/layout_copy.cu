// A copy between two layouts of one shape whose fastest dims differ (a
// transposed view into a contiguous tensor, say): the backward's grad_output
// taken into the layout of output when the two differ. Element by element,
// one side of such a copy reads or writes a stride at every step; here a
// block moves a tile through shared memory instead, reading rows along the
// source's fastest dim and writing rows along the destination's, both
// coalesced.

#include "cuda/core/layout_copy.h"

#include "cuda/core/budget.h"
#include "cuda/core/launch.cuh"
#include "cuda/core/row_indexer.cuh"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace softmax_ext::cuda {
namespace {

constexpr int kCopyMaxBatch = 6;  // dims besides the two of the tile
// A tile is kTileBytes / e elements along each dim (one 128-byte line per
// row read and per row written), 32 bytes per thread: blocks of 256
// (2-byte), 128 (4-byte) or 64 threads (8-byte elements).
constexpr int kTileBytes = 128;
constexpr int kThreadBytes = 32;
template <typename T>
constexpr int tile_side() {
  return kTileBytes / static_cast<int>(sizeof(T));
}
template <typename T>
constexpr int per_thread() {
  return kThreadBytes / static_cast<int>(sizeof(T));
}
template <typename T>
constexpr int copy_threads() {
  return tile_side<T>() * tile_side<T>() / per_thread<T>();
}

// The tile's dims and the others (batch), in elements. Dim A is the
// destination's fastest, dim B the source's.
struct CopyLayout {
  int64_t size_a, size_b;
  int64_t src_stride_a;  // the source's stride along A (along B it is 1)
  int64_t dst_stride_b;  // the destination's stride along B (along A it is 1)
  int64_t tiles_a, tiles_b, tiles;
  int batch_rank;
  int64_t batch_size[kCopyMaxBatch];  // outermost first
  int64_t src_batch_stride[kCopyMaxBatch];
  int64_t dst_batch_stride[kCopyMaxBatch];
};

template <typename T>
__global__ void __launch_bounds__(copy_threads<T>())
    copy_tiles_kernel(const T* __restrict__ src, T* __restrict__ dst, const CopyLayout layout) {
  constexpr int kA = tile_side<T>(), kB = kA, kThreads = copy_threads<T>(), kPerThread = per_thread<T>();
  // Rows padded to an odd number of 4-byte words (17 8-byte words for T of
  // 8 bytes, read by half-warps): the column reads of the store phase fall in
  // distinct banks.
  constexpr int kPad = sizeof(T) == 2 ? 2 : 1;
  __shared__ T tile[kA][kB + kPad];

  for (int64_t t = blockIdx.x; t < layout.tiles; t += gridDim.x) {
    int64_t rest;
    int64_t batch = divmod(t, layout.tiles_a * layout.tiles_b, rest);
    int64_t tb;
    const int64_t ta = divmod(rest, layout.tiles_b, tb);
    int64_t src_off = 0, dst_off = 0;
    for (int d = layout.batch_rank - 1; d >= 0; --d) {
      int64_t idx = batch;
      if (d > 0) batch = divmod(batch, layout.batch_size[d], idx);
      src_off += idx * layout.src_batch_stride[d];
      dst_off += idx * layout.dst_batch_stride[d];
    }
    const int64_t a0 = ta * kA, b0 = tb * kB;
    const int64_t na = layout.size_a - a0, nb = layout.size_b - b0;
    const T* s = src + src_off + a0 * layout.src_stride_a + b0;
    T* d = dst + dst_off + b0 * layout.dst_stride_b + a0;

    // Thread t reads rows a_t + i * kRowsA (lane b_t) and writes rows
    // b_t' + i * kRowsB (lane a_t'): one base pointer and one step per side.
    constexpr int kRowsA = kThreads / kB, kRowsB = kThreads / kA;
    const int a_t = threadIdx.x / kB, b_t = threadIdx.x % kB;
    const T* sp = s + a_t * layout.src_stride_a + b_t;
    const int64_t s_step = kRowsA * layout.src_stride_a;
    T v[kPerThread] = {};
#pragma unroll
    for (int i = 0; i < kPerThread; ++i)
      if (a_t + i * kRowsA < na && b_t < nb) v[i] = sp[i * s_step];
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) tile[a_t + i * kRowsA][b_t] = v[i];
    __syncthreads();
    const int b_w = threadIdx.x / kA, a_w = threadIdx.x % kA;
    T* dp = d + b_w * layout.dst_stride_b + a_w;
    const int64_t d_step = kRowsB * layout.dst_stride_b;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i)
      if (b_w + i * kRowsB < nb && a_w < na) dp[i * d_step] = tile[a_w][b_w + i * kRowsB];
    __syncthreads();
  }
}

template <typename T>
void launch_copy_tiles(const void* src, void* dst, CopyLayout layout) {
  constexpr int kThreads = copy_threads<T>();
  layout.tiles_a = ceil_div(layout.size_a, int64_t{tile_side<T>()});
  layout.tiles_b = ceil_div(layout.size_b, int64_t{tile_side<T>()});
  layout.tiles = layout.tiles_a * layout.tiles_b;
  for (int d = 0; d < layout.batch_rank; ++d) layout.tiles *= layout.batch_size[d];
  // A grid of as many blocks as the device runs at once (queried once per
  // device and kernel), each looping over tiles.
  ClusterLaunch launch(1, kThreads, 1, c10::cuda::getCurrentCUDAStream());
  const int resident = persistent_clusters(reinterpret_cast<const void*>(copy_tiles_kernel<T>), launch.config);
  launch.config.gridDim.x = static_cast<unsigned>(std::min<int64_t>(layout.tiles, resident));
  C10_CUDA_CHECK(cudaLaunchKernelEx(&launch.config, copy_tiles_kernel<T>, static_cast<const T*>(src),
                                    static_cast<T*>(dst), layout));
}

// The dim of stride 1 and size > 1, or -1.
int fastest_dim(c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  for (size_t d = 0; d < sizes.size(); ++d)
    if (sizes[d] > 1 && strides[d] == 1) return static_cast<int>(d);
  return -1;
}

}  // namespace

bool copy_across_layouts(const void* src, void* dst, int64_t element_bytes, c10::IntArrayRef sizes,
                         c10::IntArrayRef src_strides, c10::IntArrayRef dst_strides) {
  const int a = fastest_dim(sizes, dst_strides);
  const int b = fastest_dim(sizes, src_strides);
  if (a < 0 || b < 0 || a == b) return false;
  if (element_bytes != 2 && element_bytes != 4 && element_bytes != 8) return false;
  CopyLayout layout{};
  layout.size_a = sizes[a];
  layout.size_b = sizes[b];
  layout.src_stride_a = src_strides[a];
  layout.dst_stride_b = dst_strides[b];
  for (int d = 0; d < static_cast<int>(sizes.size()); ++d) {
    if (d == a || d == b || sizes[d] == 1) continue;
    if (layout.batch_rank == kCopyMaxBatch) return false;
    layout.batch_size[layout.batch_rank] = sizes[d];
    layout.src_batch_stride[layout.batch_rank] = src_strides[d];
    layout.dst_batch_stride[layout.batch_rank] = dst_strides[d];
    ++layout.batch_rank;
  }
  switch (element_bytes) {
    case 2: launch_copy_tiles<uint16_t>(src, dst, layout); break;
    case 4: launch_copy_tiles<uint32_t>(src, dst, layout); break;
    default: launch_copy_tiles<uint64_t>(src, dst, layout); break;
  }
  return true;
}

}  // namespace softmax_ext::cuda
