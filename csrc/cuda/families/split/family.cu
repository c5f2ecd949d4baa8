// The registry entries of the split families (plan/registry.cpp) and the
// geometry select() computes for them (policy.h).

#include "cuda/families/split/policy.h"
#include "plan/family.h"

#include <c10/cuda/CUDAGuard.h>

#include <algorithm>

namespace softmax_ext::cuda {
namespace {

bool takes_rows(const Problem& p) { return has_fast_kernels(p.in_dtype, p.out_dtype) && p.axis_contiguous(); }

int64_t resident_capacity(const Problem& p, const DeviceFacts& device) {
  return split_resident_capacity(c10::elementSize(p.in_dtype), p.out_dtype == c10::ScalarType::Double,
                                 p.is_backward(), device.shared_bytes_per_block(kResidentBlocksPerSM), device.sms);
}

// A row takes the fewest blocks that hold it (held tiles and one in
// registers each), as many rows at once as the other blocks take, and then
// every block the device holds is given a slice of a row of the group.
bool takes_split_resident(const Problem& p, const DeviceFacts* device) {
  return takes_rows(p) && p.axis_size <= resident_capacity(p, *device);
}

void plan_split_resident(const Problem& p, const DeviceFacts* device, Plan& plan) {
  const bool dbl = p.out_dtype == c10::ScalarType::Double;
  const bool bw = p.is_backward();
  const int64_t in_bytes = c10::elementSize(p.in_dtype);
  const int64_t held_tiles =
      resident_held_tiles(device->shared_bytes_per_block(kResidentBlocksPerSM), in_bytes, dbl, bw);
  ResidentGeometry& g = plan.geometry_as<ResidentGeometry>();
  g.smem_bytes = held_tiles * resident_tile_thread_bytes(in_bytes, dbl, bw) * kSplitThreads;
  int64_t resident = 0;
  {
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(p.device_index));
    resident = bw ? resident_blocks_backward(p, g.smem_bytes) : resident_blocks_forward(p, g.smem_bytes);
  }
  const int64_t tiles = split_tiles(p);
  const int64_t holding = std::min({ceil_div(tiles, held_tiles + 1), resident, kResidentMaxBlocksPerRow});
  const int64_t group = std::clamp<int64_t>(resident / holding, 1, p.rows);
  int64_t per_row = std::min({resident / group, tiles, kResidentMaxBlocksPerRow});
  const int64_t slice = ceil_div(tiles, per_row);
  per_row = ceil_div(tiles, slice);  // no empty slice
  g.shape = {p.rows, tiles, slice, static_cast<int>(per_row), static_cast<int>(group), static_cast<int>(held_tiles)};
  plan.workspace_bytes = resident_workspace_bytes(p);
}

bool takes_split(const Problem& p, const DeviceFacts*) { return takes_rows(p); }

void plan_split(const Problem& p, const DeviceFacts*, Plan& plan) {
  const int64_t tiles = split_tiles(p);
  plan.geometry_as<SplitShape>() = {p.rows, tiles, split_chunk_tiles(tiles), split_chunks(p), split_apply_tiles(p)};
  plan.workspace_bytes = split_workspace_bytes(p);
}

void split_resident_limits(c10::ScalarType dtype, bool backward, const DeviceFacts& device, Limits& out) {
  out.emplace_back("split_resident",
                   split_resident_capacity(c10::elementSize(dtype), dtype == c10::ScalarType::Double, backward,
                                           device.shared_bytes_per_block(kResidentBlocksPerSM), device.sms));
}

void split_limits(c10::ScalarType dtype, bool backward, const DeviceFacts&, Limits& out) {
  out.emplace_back("split_tile", split_tile(dtype == c10::ScalarType::Double, backward));
}

}  // namespace
}  // namespace softmax_ext::cuda

namespace softmax_ext {

// The resident kernel's blocks count their arrival at a row with an atomic
// increment (red.add on a per-row counter) and wait for the count: the
// counters only order the partial sums, which every block then folds in
// slice order, so the result does not depend on which block arrives first.
extern const Family kCudaSplitResident = {
    "cuda.split_resident", c10::DeviceType::CUDA, /*deterministic=*/true, /*uses_atomics=*/true,
    /*relayout_helps=*/false, cuda::takes_split_resident, cuda::plan_split_resident, nullptr, cuda::split_resident_forward,
    cuda::split_resident_backward, cuda::split_resident_limits};
extern const Family kCudaSplit = {"cuda.split", c10::DeviceType::CUDA, /*deterministic=*/true,
                                  /*uses_atomics=*/false, /*relayout_helps=*/false, cuda::takes_split, cuda::plan_split, nullptr,
                                  cuda::split_forward, cuda::split_backward, cuda::split_limits};

}  // namespace softmax_ext
