// Block and cluster families, forward: geometry and instantiation (kernels in
// block_kernels.cuh).

#include "cuda/block_kernels.cuh"
#include "cuda/launch.h"

#include <map>
#include <mutex>
#include <tuple>

namespace softmax_ext::cuda {

BlockShape block_shape(int64_t needed, int64_t per_thread, int max_cluster, int device_cluster, bool backward,
                       c10::ScalarType in) {
  const int64_t threads = ceil_div(needed, per_thread);
  const int block_max = max_block_threads(device_cluster > 1, backward);
  if (threads <= block_max || max_cluster <= 1) {
    const int64_t warps = ceil_div(threads, kWarpSize);
    return {static_cast<int>(std::clamp<int64_t>(warps * kWarpSize, kMinBlockThreads, block_max)), 1};
  }
  const int64_t blocks = ceil_div(threads, kMaxBlockThreads);
  const int64_t half_blocks = ceil_div(threads, kClusterBlockThreads);
  if (half_blocks <= max_cluster && cluster_takes_half_blocks(in, backward, blocks, half_blocks))
    return {kClusterBlockThreads, static_cast<int>(half_blocks)};
  if (blocks <= max_cluster) return {kMaxBlockThreads, static_cast<int>(blocks)};
  // Only a row that starts off a 16-byte boundary and fills the largest
  // cluster exactly gets here; its view falls back to element accesses.
  return {kMaxBlockThreads, max_cluster};
}

int persistent_clusters(const void* kernel, const cudaLaunchConfig_t& config) {
  using Key = std::tuple<int, const void*, unsigned, size_t, unsigned>;
  static std::mutex mutex;
  static std::map<Key, int> cache;
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  unsigned cluster_size = 1;
  for (unsigned i = 0; i < config.numAttrs; ++i)
    if (config.attrs[i].id == cudaLaunchAttributeClusterDimension) cluster_size = config.attrs[i].val.clusterDim.x;
  const Key key{device, kernel, config.blockDim.x, config.dynamicSmemBytes, cluster_size};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cluster_size > kPortableClusterSize)
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  // The limit is only ever raised: the same kernel also runs with other
  // block sizes, whose cached launches rely on the larger limit set for them.
  cudaFuncAttributes attributes{};
  C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  if (config.dynamicSmemBytes > static_cast<size_t>(attributes.maxDynamicSharedSizeBytes))
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(config.dynamicSmemBytes)));
  // Stages (64 KB and more) take the largest carveout. Smaller dynamic
  // shared memory (the strided family's reductions, a few KB) leaves the
  // carveout to the driver: the rest of the unified L1 holds the loads in
  // flight (a strided tile of 1024 threads, 9 KB of shared memory, ran at
  // 60% of the copy bandwidth with the largest carveout, 83% without).
  if (config.dynamicSmemBytes > static_cast<size_t>(kDefaultSharedBytes)) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
  }
  int clusters = 0;
  if (cluster_size > 1) {
    cudaLaunchConfig_t probe = config;
    probe.gridDim = dim3(cluster_size);
    C10_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &probe));
  } else {  // single blocks: blocks per SM times SMs
    int per_sm = 0, sms = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, static_cast<int>(config.blockDim.x),
                                                                 config.dynamicSmemBytes));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    clusters = per_sm * sms;
  }
  clusters = std::max(clusters, 1);
  cache.emplace(key, clusters);
  return clusters;
}

void block_forward(const Problem& p, const Buffers& b, int max_cluster) {
  const auto layout = make_row_indexer<2>(p, {kIn0, kOut});
  dispatch_fast_pair(p.in_dtype, p.out_dtype, "softmax_ext cuda.block", [&](auto in_tag, auto out_tag) {
    using in_t = typename decltype(in_tag)::type;
    using out_t = typename decltype(out_tag)::type;
    with_block_geometry<in_t, out_t, false>(
        p, b.in0, max_cluster, [&](auto packed, auto packs, auto staged, const BlockShape& shape) {
      dispatch_kind(p.kind, [&](auto epilogues) {
        using E = decltype(epilogues);
        launch_row_blocks(softmax_block_forward_kernel<E::template ForwardFor<out_t>::template type, in_t, out_t,
                                                       decltype(packs)::value, decltype(packed)::value,
                                                       decltype(staged)::value>,
                          p.rows, shape, static_cast<const in_t*>(b.in0), static_cast<out_t*>(b.out), layout,
                          shape.cluster_size);
      });
    });
  });
}

}  // namespace softmax_ext::cuda
