// The registry entries of the block and cluster families
// (plan/registry.cpp) and the geometry select() computes for them
// (policy.h, geometry.h).

#include "cuda/core/grid.h"
#include "cuda/core/row_views.h"
#include "cuda/core/staging.cuh"
#include "cuda/families/block/geometry.h"
#include "cuda/families/block/policy.h"
#include "plan/family.h"

#include <algorithm>

namespace softmax_ext::cuda {
namespace {

// The shape for a row of `needed` view positions, `per_thread` of them per
// thread, on a device whose largest cluster is `device_cluster`, with at
// most `max_cluster` blocks per row (1: the block family).
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

// The register layout and launch geometry of contiguous rows: long 16-bit
// rows stay packed (keeps_packed), twice the elements a thread; clusters
// stage the next row in shared memory (stages_rows).
void block_geometry(const Problem& p, int max_cluster, int device_cluster, Plan& plan) {
  const bool bw = p.is_backward();
  const int64_t in_bytes = c10::elementSize(p.in_dtype);
  const bool reduced = is_16bit_float(p.in_dtype);
  BlockGeometry& g = plan.geometry_as<BlockGeometry>();
  g.packed = keeps_packed(p.in_dtype, p.axis_size, max_cluster > 1) && reduced;
  g.packs = elems_per_thread(p.out_dtype == c10::ScalarType::Double, bw) * (g.packed ? 2 : 1) / pack_size(in_bytes);
  g.launch = block_shape(p.axis_size + view_slack(p, kIn0, in_bytes), int64_t{g.packs} * pack_size(in_bytes),
                         max_cluster, device_cluster, bw, p.in_dtype);
  // Clusters keep 16-bit rows packed: no unpacked 16-bit row is staged.
  g.staged = stages_rows(g.launch.cluster_size, g.launch.threads, bw) && (g.packed || !reduced);
  if (g.staged) g.launch.smem_bytes = stage_bytes(bw ? 2 : 1, g.packs, g.launch.threads);
  g.launch.persistent = g.launch.cluster_size > 1;
  g.launch.walks_rows = g.launch.persistent || grid_walks_rows(p.in_dtype, p.axis_size, bw);
}

bool takes_block(const Problem& p, const DeviceFacts* device) {
  return has_fast_kernels(p.in_dtype, p.out_dtype) && p.axis_contiguous() &&
         p.axis_size <= block_capacity(p.acc_dtype() == c10::ScalarType::Double, p.is_backward(), device->max_cluster > 1);
}
void plan_block(const Problem& p, const DeviceFacts* device, Plan& plan) {
  block_geometry(p, 1, device->max_cluster, plan);
}

bool takes_cluster(const Problem& p, const DeviceFacts* device) {
  return has_fast_kernels(p.in_dtype, p.out_dtype) && p.axis_contiguous() && device->max_cluster > 1 &&
         p.axis_size <= cluster_capacity(p.in_dtype, p.acc_dtype() == c10::ScalarType::Double, p.is_backward(),
                                         device->max_cluster);
}
void plan_cluster(const Problem& p, const DeviceFacts* device, Plan& plan) {
  block_geometry(p, device->max_cluster, device->max_cluster, plan);
}

void block_limits(c10::ScalarType dtype, bool backward, const DeviceFacts& device, Limits& out) {
  out.emplace_back("block", block_capacity(dtype == c10::ScalarType::Double, backward, device.max_cluster > 1));
}

void cluster_limits(c10::ScalarType dtype, bool backward, const DeviceFacts& device, Limits& out) {
  const int clusters = device.max_cluster;
  out.emplace_back("cluster",
                   clusters > 1 ? cluster_capacity(dtype, dtype == c10::ScalarType::Double, backward, clusters) : 0);
  out.emplace_back("max_cluster_size", clusters);
}

}  // namespace
}  // namespace softmax_ext::cuda

namespace softmax_ext {

extern const Family kCudaBlock = {"cuda.block", c10::DeviceType::CUDA, /*deterministic=*/true,
                                  /*uses_atomics=*/false, /*relayout_helps=*/false, cuda::takes_block, cuda::plan_block, nullptr,
                                  cuda::block_forward, cuda::block_backward, cuda::block_limits};
// Cluster blocks exchange partials with st.async and mbarriers (no atomic
// arithmetic on the values); each block folds them in rank order.
extern const Family kCudaCluster = {"cuda.cluster", c10::DeviceType::CUDA, /*deterministic=*/true,
                                    /*uses_atomics=*/false, /*relayout_helps=*/false, cuda::takes_cluster, cuda::plan_cluster, nullptr,
                                    cuda::block_forward, cuda::block_backward, cuda::cluster_limits};

}  // namespace softmax_ext
