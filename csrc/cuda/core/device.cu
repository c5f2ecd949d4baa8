// The facts of a CUDA device that select() needs (plan/family.h,
// DeviceFacts), queried once per device and cached.

#include "cuda/core/budget.h"
#include "cuda/core/device.h"
#include "cuda/core/launch.cuh"
#include "plan/family.h"

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

namespace softmax_ext {

int DeviceFacts::shared_bytes_per_block(int blocks) const {
  return std::max(shared_per_sm / blocks - shared_reserved_per_block - 1024, 0);
}

namespace cuda {
namespace {

// Clusters need sm_90 hardware and sm_90 code in this build (a build for
// older architectures runs on Hopper through PTX, without cluster code). The
// largest size is what the occupancy calculator grants the cluster family's
// kernel (cluster_probe_kernel): 16 where the non-portable size is allowed,
// else 8.
int query_max_cluster(int arch) {
  if (arch < 90) return 1;
  const void* kernel = cluster_probe_kernel();
  cudaFuncAttributes attributes{};
  C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  if (attributes.binaryVersion < 90) return 1;

  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  for (int size : {kMaxClusterSize, kPortableClusterSize}) {
    const ClusterLaunch launch(size, kMaxBlockThreads, size, nullptr);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config) == cudaSuccess && clusters > 0)
      return size;
    (void)cudaGetLastError();  // a refused size sets a (non-sticky) error: clear it
  }
  return 1;
}

}  // namespace

const DeviceFacts& device_facts(int device) {
  static std::mutex mutex;
  static std::unordered_map<int, DeviceFacts> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(device);
  if (it != cache.end()) return it->second;
  int previous = 0;
  C10_CUDA_CHECK(cudaGetDevice(&previous));
  C10_CUDA_CHECK(cudaSetDevice(device));
  DeviceFacts f;
  int major = 0, minor = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  f.arch = major * 10 + minor;
  f.max_cluster = query_max_cluster(f.arch);
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&f.shared_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  C10_CUDA_CHECK(
      cudaDeviceGetAttribute(&f.shared_reserved_per_block, cudaDevAttrReservedSharedMemoryPerBlock, device));
  C10_CUDA_CHECK(cudaSetDevice(previous));
  return cache.emplace(device, f).first->second;
}

}  // namespace cuda
}  // namespace softmax_ext
