// limits(): the thresholds select() applies to a tensor's device and dtype,
// for softmax_ext.plan_limits() and the threshold tests. Axis lengths up to
// each value go to that family.

#include "ops/ops.h"
#include "plan/problem.h"

#ifdef SOFTMAX_EXT_WITH_CUDA
#include "cuda/config.h"
#include "cuda/launch.h"
#endif

#include <c10/util/Exception.h>

namespace softmax_ext {

std::tuple<std::vector<std::string>, std::vector<int64_t>> limits(const at::Tensor& like, bool backward) {
  TORCH_CHECK_NOT_IMPLEMENTED(is_supported_dtype(like.scalar_type()), "softmax_ext.plan_limits: dtype ",
                              like.scalar_type(), " is not supported; ", kAcceptedDtypes);
  if (!like.is_cuda()) return {};
#ifdef SOFTMAX_EXT_WITH_CUDA
  const bool dbl = like.scalar_type() == c10::ScalarType::Double;
  const int clusters = cuda::max_cluster_size(like.device().index());
  const int64_t bytes = c10::elementSize(like.scalar_type());
  const int device = like.device().index();
  const int64_t shared = cuda::shared_bytes_per_block(device, cuda::kResidentBlocksPerSM);
  return {{"warp", "block", "cluster", "strided", "max_cluster_size", "strided_min_inner", "split_tile",
           "split_resident", "row_tile"},
          {cuda::warp_capacity(dbl, backward), cuda::block_capacity(dbl, backward, clusters > 1),
           clusters > 1 ? cuda::cluster_capacity(like.scalar_type(), dbl, backward, clusters) : 0,
           cuda::strided_reach(dbl, backward, bytes, clusters), clusters,
           cuda::kStridedMinInner, cuda::split_tile(dbl, backward),
           cuda::split_resident_capacity(bytes, dbl, backward, shared, cuda::sm_count(device)),
           cuda::row_tile_capacity(like.scalar_type(), backward)}};
#else
  return {};
#endif
}

}  // namespace softmax_ext
