// Host side of the resident kernels (resident_kernels.cuh): their
// occupancy, which select() sizes the row groups by, and their cooperative
// launch on the plan's geometry.
#pragma once

#include "cuda/core/launch.cuh"
#include "cuda/families/split/policy.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <utility>

namespace softmax_ext::cuda {

// How many blocks of `kernel` the current device runs at once with
// `smem_bytes` of dynamic shared memory (setting the attributes that takes).
template <typename... Params>
int64_t resident_blocks(void (*kernel)(Params...), int64_t smem_bytes) {
  const CooperativeLaunch probe(1, kSplitThreads, smem_bytes, nullptr);
  return persistent_clusters(reinterpret_cast<const void*>(kernel), probe.config);
}

// Zeroes the rows' arrival counters (after the partials in the workspace)
// and launches `kernel` cooperatively on the current stream over the plan's
// group of rows; `args` end with the partials and the counters' places.
template <typename... Params, typename... Args>
void launch_resident(void (*kernel)(Params...), const Problem& p, const ResidentGeometry& g, unsigned* arrivals,
                     Args&&... args) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const CooperativeLaunch launch(static_cast<unsigned>(int64_t{g.shape.group_rows} * g.shape.blocks_per_row),
                                 kSplitThreads, g.smem_bytes, stream);
  C10_CUDA_CHECK(cudaMemsetAsync(arrivals, 0, p.rows * sizeof(unsigned), stream));
  C10_CUDA_CHECK(cudaLaunchKernelEx(&launch.config, kernel, std::forward<Args>(args)...));
}

// Where the arrival counters sit in the resident workspace.
inline unsigned* resident_arrivals(const Problem& p, void* workspace) {
  return reinterpret_cast<unsigned*>(static_cast<char*>(workspace) + resident_partials_bytes(p));
}

}  // namespace softmax_ext::cuda
