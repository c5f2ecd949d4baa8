// Device facts select() needs, queried once per device and cached.

#include "cuda/block_kernels.cuh"
#include "cuda/launch.h"

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

namespace softmax_ext::cuda {
namespace {

struct DeviceFacts {
  int arch = 0;
  int max_cluster = 1;
  int sms = 0;
  int shared_per_sm = 0;
  int shared_reserved_per_block = 0;
};

// Clusters need sm_90 hardware and sm_90 code in this build (a build for
// older architectures runs on Hopper through PTX, without cluster code). The
// largest size is what the occupancy calculator grants a representative
// kernel: 16 where the non-portable size is allowed, else 8.
int query_max_cluster(int device, int arch) {
  if (arch < 90) return 1;
  auto* kernel = softmax_block_forward_kernel<SoftmaxEpilogues::Forward, float, float,
                                              elems_per_thread(false, false) / kPack<float>, false, false>;
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

const DeviceFacts& facts(int device) {
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
  f.max_cluster = query_max_cluster(device, f.arch);
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&f.shared_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  C10_CUDA_CHECK(
      cudaDeviceGetAttribute(&f.shared_reserved_per_block, cudaDevAttrReservedSharedMemoryPerBlock, device));
  C10_CUDA_CHECK(cudaSetDevice(previous));
  return cache.emplace(device, f).first->second;
}

}  // namespace

int device_arch(int device) { return facts(device).arch; }
int max_cluster_size(int device) { return facts(device).max_cluster; }
int sm_count(int device) { return facts(device).sms; }
// Less the hardware's reserve per block and a kilobyte for the kernel's own
// (static) shared memory.
int shared_bytes_per_block(int device, int blocks) {
  const DeviceFacts& f = facts(device);
  return std::max(f.shared_per_sm / blocks - f.shared_reserved_per_block - 1024, 0);
}

}  // namespace softmax_ext::cuda
