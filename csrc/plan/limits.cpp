// limits(): the thresholds select() applies to a tensor's device and dtype,
// for softmax_ext.plan_limits() and the threshold tests: each family of the
// device adds its own (plan/family.h). Axis lengths up to each value go to
// that family.

#include "ops/ops.h"
#include "plan/family.h"
#include "plan/problem.h"

#include <c10/util/Exception.h>

namespace softmax_ext {

std::tuple<std::vector<std::string>, std::vector<int64_t>> limits(const at::Tensor& like, bool backward) {
  TORCH_CHECK_NOT_IMPLEMENTED(is_supported_dtype(like.scalar_type()), "softmax_ext.plan_limits: dtype ",
                              like.scalar_type(), " is not supported; ", kAcceptedDtypes);
  if (!like.is_cuda()) return {};
#ifdef SOFTMAX_EXT_WITH_CUDA
  const DeviceFacts& device = cuda::device_facts(like.device().index());
  Limits all;
  for (const Family* family : families())
    if (family->device == c10::DeviceType::CUDA && family->limits != nullptr)
      family->limits(like.scalar_type(), backward, device, all);
  std::tuple<std::vector<std::string>, std::vector<int64_t>> out;
  for (auto& [name, value] : all) {
    std::get<0>(out).push_back(name);
    std::get<1>(out).push_back(value);
  }
  return out;
#else
  (void)backward;
  return {};
#endif
}

}  // namespace softmax_ext
