// Launch utilities every family uses: a launch on the current stream with
// its check, a grid over a batch in chunks (launch_batch_chunks), launches
// of clusters (ClusterLaunch), persistent grids (as many
// blocks or clusters as the device runs at once: persistent_clusters), the
// grid-stride launch of a row or tile loop (launch_row_blocks), and launches
// that overlap the kernel before them (launch_after_prior).
#pragma once

#include "cuda/core/budget.h"
#include "cuda/core/grid.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <utility>

namespace softmax_ext::cuda {

// Launches kernel<<<grid, threads, smem_bytes>>> on the current stream and
// checks the launch.
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), unsigned int grid, int threads, int64_t smem_bytes, Args&&... args) {
  kernel<<<grid, threads, static_cast<size_t>(smem_bytes), c10::cuda::getCurrentCUDAStream()>>>(
      std::forward<Args>(args)...);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// A grid of `blocks` blocks along x over a batch along y: launch(grid, b0)
// for each chunk of at most kMaxGridBlocks batch entries (gridDim.y's
// limit), b0 the chunk's first entry; checks each launch.
template <typename Launch>
void launch_batch_chunks(int64_t blocks, int64_t batch, const Launch& launch) {
  for (int64_t b0 = 0; b0 < batch; b0 += kMaxGridBlocks) {
    launch(dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(std::min(kMaxGridBlocks, batch - b0))), b0);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

// Programmatic dependent launch (sm_90 on): a kernel launched after its
// prior (the kernel before it in the stream) may start while that kernel
// still runs, once each of the prior's blocks has called allow_dependents()
// or exited. Before it reads what the prior writes, or writes what the
// prior reads, every thread that does calls wait_for_prior(): it returns
// once the prior has finished and its writes are visible. What kernels
// before the prior wrote may be read at once where the prior itself was
// launched the usual way (it started only after they had finished). On
// older GPUs, and in a kernel launched the usual way, both are no-ops.
__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_prior() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// A launch configuration of `blocks` blocks of `threads` threads, grouped in
// clusters of `cluster_size` along x when that is above 1, and launched
// after its prior (above) when `after_prior` is set (callers set it on
// sm_90 and later only). Not copyable: the configuration points at its own
// attributes.
struct ClusterLaunch {
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute attributes[2]{};
  ClusterLaunch(unsigned int blocks, int threads, int cluster_size, cudaStream_t stream, size_t smem_bytes = 0,
                bool after_prior = false) {
    config.gridDim = dim3(blocks);
    config.blockDim = dim3(threads);
    config.dynamicSmemBytes = smem_bytes;
    config.stream = stream;
    config.attrs = attributes;
    if (cluster_size > 1) {
      cudaLaunchAttribute& a = attributes[config.numAttrs++];
      a.id = cudaLaunchAttributeClusterDimension;
      a.val.clusterDim.x = cluster_size;
      a.val.clusterDim.y = 1;
      a.val.clusterDim.z = 1;
    }
    if (after_prior) {
      cudaLaunchAttribute& a = attributes[config.numAttrs++];
      a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      a.val.programmaticStreamSerializationAllowed = 1;
    }
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// kernel<<<blocks, threads>>>(args...) on `stream`, launched after its prior
// when `after_prior` is set (the kernel calls wait_for_prior() before it
// touches the prior's data; a plain launch otherwise); checks the launch.
template <typename... Params, typename... Args>
void launch_after_prior(bool after_prior, void (*kernel)(Params...), unsigned int blocks, int threads,
                        cudaStream_t stream, Args&&... args) {
  if (!after_prior) {
    kernel<<<blocks, threads, 0, stream>>>(std::forward<Args>(args)...);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  ClusterLaunch launch(blocks, threads, 1, stream, 0, /*after_prior=*/true);
  C10_CUDA_CHECK(cudaLaunchKernelEx(&launch.config, kernel, std::forward<Args>(args)...));
}

// A cooperative launch (every block resident at once) of `blocks` blocks of
// `threads` threads with `smem_bytes` of dynamic shared memory. Not
// copyable: the configuration points at its own attribute.
struct CooperativeLaunch {
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute attribute{};
  CooperativeLaunch(unsigned int blocks, int threads, int64_t smem_bytes, cudaStream_t stream) {
    config.blockDim = dim3(threads);
    config.gridDim = dim3(blocks);
    config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
    config.stream = stream;
    attribute.id = cudaLaunchAttributeCooperative;
    attribute.val.cooperative = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  CooperativeLaunch(const CooperativeLaunch&) = delete;
  CooperativeLaunch& operator=(const CooperativeLaunch&) = delete;
};

// Readies `kernel` for a persistent launch of `config`'s shape (its cluster
// attribute, block size and dynamic shared memory) on the current device,
// setting the attributes that shape needs, and returns how many such
// clusters (blocks, for a cluster of one) the device runs at once. Both
// happen once per device, kernel and shape, not on every launch (launch.cu).
int persistent_clusters(const void* kernel, const cudaLaunchConfig_t& config);

// How many blocks of `kernel` (threads, smem_bytes of dynamic shared memory,
// no cluster) run at once on the current device: persistent_clusters' count.
template <typename... Params>
int resident_blocks(void (*kernel)(Params...), int threads, int64_t smem_bytes) {
  ClusterLaunch probe(1, threads, 1, c10::cuda::getCurrentCUDAStream(), static_cast<size_t>(smem_bytes));
  return persistent_clusters(reinterpret_cast<const void*>(kernel), probe.config);
}

// Lets `kernel` take `bytes` of dynamic shared memory on the current device
// (cudaFuncAttributeMaxDynamicSharedMemorySize), once per device and kernel
// and only ever raising the limit: later launches find it in a cache
// instead of calling the driver again.
void allow_dynamic_shared(const void* kernel, size_t bytes);
template <typename... Params>
void allow_dynamic_shared(void (*kernel)(Params...), size_t bytes) {
  allow_dynamic_shared(reinterpret_cast<const void*>(kernel), bytes);
}

// Dynamic shared memory a kernel takes without opting in to more
// (cudaFuncAttributeMaxDynamicSharedMemorySize, which persistent launches
// set).
constexpr int64_t kDefaultSharedBytes = 48 * 1024;

// kernel(first, b0, rest...) on `stream`: blocks of `threads` threads with
// `smem_bytes` of dynamic shared memory (the kernel's limit raised first
// where that passes the default), `blocks` of them along x over the batch
// along y (launch_batch_chunks; b0 the chunk's first batch entry); checks
// each launch.
template <typename... Params, typename First, typename... Rest>
void launch_batch_grid(void (*kernel)(Params...), int64_t blocks, int64_t batch, int threads, int64_t smem_bytes,
                       cudaStream_t stream, const First& first, const Rest&... rest) {
  if (smem_bytes > kDefaultSharedBytes) allow_dynamic_shared(kernel, static_cast<size_t>(smem_bytes));
  launch_batch_chunks(blocks, batch, [&](dim3 grid, int64_t b0) {
    kernel<<<grid, threads, static_cast<size_t>(smem_bytes), stream>>>(first, b0, rest...);
  });
}

// The launch of a loop over rows (or tiles): blocks of `threads` threads,
// in clusters of `cluster_size`, with `smem_bytes` of dynamic shared memory;
// a persistent grid, or kMaxGridBlocks blocks (clusters) walking the rows,
// or a block per row.
struct BlockShape {
  int threads;
  int cluster_size;
  int64_t smem_bytes = 0;   // dynamic shared memory per block
  bool persistent = false;  // a grid of as many clusters as run at once
  bool walks_rows = true;   // kMaxGridBlocks blocks (clusters), else a block per row
  bool after_prior = false;  // launched after its prior (ClusterLaunch)
};

// Launches `kernel` on the current stream over `rows` rows, as clusters of
// shape.cluster_size blocks when that is above 1, with shape.smem_bytes of
// dynamic shared memory, and checks the launch. Dynamic shared memory beyond
// the default: a persistent launch sets the kernel's limit itself; any other
// caller first raises it (allow_dynamic_shared: a lookup on every call, so
// it is left to the launches that need it).
template <typename... Params, typename... Args>
void launch_row_blocks(void (*kernel)(Params...), int64_t rows, const BlockShape& shape, Args&&... args) {
  const int c = shape.cluster_size;
  const unsigned int blocks =
      shape.walks_rows ? grid_for_rows(std::min<int64_t>(rows, kMaxGridBlocks / c)) * c : grid_for_each(rows);
  ClusterLaunch launch(blocks, shape.threads, c, c10::cuda::getCurrentCUDAStream(),
                       static_cast<size_t>(shape.smem_bytes), shape.after_prior);
  if (shape.persistent) {
    const int resident = persistent_clusters(reinterpret_cast<const void*>(kernel), launch.config);
    launch.config.gridDim.x = static_cast<unsigned>(std::min<int64_t>(rows, resident) * c);
  } else if (c > kPortableClusterSize) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  }
  C10_CUDA_CHECK(cudaLaunchKernelEx(&launch.config, kernel, std::forward<Args>(args)...));
}

}  // namespace softmax_ext::cuda
