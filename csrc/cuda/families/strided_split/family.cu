// The strided split family's registry entry (plan/registry.cpp) and the
// geometry select() computes for it (policy.h).

#include "cuda/core/columns.h"
#include "cuda/families/strided_split/policy.h"
#include "plan/family.h"

namespace softmax_ext::cuda {
namespace {

// Axes past the strided family's reach (the registry asks it first), with
// an inner run: 16-byte accesses where aligned, the widest tile.
bool takes_strided_split(const Problem& p, const DeviceFacts*) {
  return has_fast_kernels(p.in_dtype, p.out_dtype) && !p.axis_contiguous() && p.inner_size() >= kStridedMinInner;
}

void plan_strided_split(const Problem& p, const DeviceFacts*, Plan& plan) {
  StridedSplitGeometry& g = plan.geometry_as<StridedSplitGeometry>();
  g.pack = strided_pack(p, pack_size(c10::elementSize(p.in_dtype)));
  g.columns = static_cast<int>(strided_widest_tile(p, g.pack) / g.pack);
  const int64_t inner = p.inner_size();
  const int64_t tiles = p.rows / inner * ceil_div(inner, int64_t{g.columns} * g.pack);
  const int64_t chunks = strided_split_chunks(p);
  g.shape = {kStridedSplitChunk, chunks, chunks * tiles};
  plan.workspace_bytes = strided_split_workspace_bytes(p);
}

}  // namespace
}  // namespace softmax_ext::cuda

namespace softmax_ext {

extern const Family kCudaStridedSplit = {
    "cuda.strided_split", c10::DeviceType::CUDA, /*deterministic=*/true, /*uses_atomics=*/false,
    /*relayout_helps=*/false, cuda::takes_strided_split, cuda::plan_strided_split, nullptr,
    cuda::strided_split_forward, cuda::strided_split_backward, nullptr};

}  // namespace softmax_ext
