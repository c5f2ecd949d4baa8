// persistent_clusters (launch.cuh): the occupancy of a persistent launch,
// queried once per device, kernel and shape; allow_dynamic_shared: the
// shared memory opt-in, set once per device and kernel.

#include "cuda/core/launch.cuh"

#include <map>
#include <mutex>
#include <tuple>
#include <utility>

namespace softmax_ext::cuda {

void allow_dynamic_shared(const void* kernel, size_t bytes) {
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, size_t> allowed;
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  size_t& limit = allowed[{device, kernel}];
  if (bytes <= limit) return;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  limit = bytes;
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
  // flight (docs/tuning/strided.md).
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

}  // namespace softmax_ext::cuda
