// select(), can_implement() and workspace_size(): which family runs a
// problem (the first of the registry that plans it), and whether its plan
// can run on the concrete buffers.

#include "plan/family.h"
#include "plan/plan.h"

#include <string>

namespace softmax_ext {
namespace {

std::string kernel_name(const Family& family, const Problem& p) {
  std::string name = family.name;
  if (p.is_backward()) name += "_backward";
  name += '.';
  name += dtype_tag(p.in_dtype);
  if (p.out_dtype != p.in_dtype) {
    name += '_';
    name += dtype_tag(p.out_dtype);
  }
  return name;
}

// The first family of the device that plans p.
bool plan_with_registry(const Problem& p, const DeviceFacts* device, Plan& plan) {
  for (const Family* family : families()) {
    if (family->device != p.device_type) continue;
    if (!family->takes(p, device)) continue;
    plan = Plan{};
    plan.problem = p;
    if (family->plan != nullptr && p.numel() > 0) family->plan(p, device, plan);
    plan.family = family;
    plan.kernel = kernel_name(*family, p);
    plan.accumulator = p.acc_dtype();
    plan.deterministic = family->deterministic;
    plan.uses_atomics = family->uses_atomics;
    return true;
  }
  return false;
}

}  // namespace

Status select(const Problem& p, Plan& plan) {
  for (c10::ScalarType t : {p.in_dtype, p.out_dtype})
    if (!is_supported_dtype(t))
      return Status::unsupported(std::string("dtype ") + c10::toString(t) +
                                 " is not supported; " + kAcceptedDtypes);
  if (p.is_backward() && p.in_dtype != p.out_dtype)
    return Status::invalid("grad_output, output and grad_input must share one dtype");
  if (p.rank() > kMaxRank)
    return Status::unsupported("effective rank above " + std::to_string(kMaxRank));

  const DeviceFacts* device = nullptr;
  switch (p.device_type) {
    case c10::DeviceType::CPU:
      break;
    case c10::DeviceType::CUDA:
#ifdef SOFTMAX_EXT_WITH_CUDA
      device = &cuda::device_facts(p.device_index);
      break;
#else
      return Status::unsupported(
          "this build of softmax_ext has no CUDA kernels (it was built without a CUDA toolkit)");
#endif
    default:
      return Status::unsupported(std::string("device ") + c10::DeviceTypeName(p.device_type) +
                                 " is not supported; accepted: cpu, cuda");
  }
  if (!plan_with_registry(p, device, plan))
    return Status::unsupported("no kernel family takes " + p.to_string());
  // A backward whose grad_output's layout leaves it to a family that reads
  // a strided axis uncoalesced runs on grad_output copied into grad_input's
  // layout where another family then takes it: the copy (one more read and
  // write of grad_output, through shared-memory tiles) costs less.
  if (p.is_backward() && plan.family->relayout_helps) {
    const Problem relaid = with_in0_as_out(p);
    bool differs = relaid.axis_stride[kIn0] != p.axis_stride[kIn0] || relaid.batch_rank != p.batch_rank;
    for (int d = 0; d < p.batch_rank && !differs; ++d) differs = p.batch_stride[kIn0][d] != p.batch_stride[kOut][d];
    Plan same;
    if (differs && plan_with_registry(relaid, device, same) && same.family != plan.family) {
      plan = same;
      plan.relayout_in0 = true;
    }
  }
  return Status::success();
}

Status can_implement(const Plan& plan, const Buffers& b) {
  if (plan.problem.numel() == 0) return Status::success();
  if (b.in0 == nullptr || b.out == nullptr || (plan.problem.is_backward() && b.in1 == nullptr))
    return Status::invalid("a tensor with elements has no data pointer");
  if (plan.family == nullptr) return Status::invalid("the plan names no kernel family");
  const Problem& p = plan.problem;
  const void* const bases[kNumOperands] = {b.in0, b.in1, b.out};
  for (int k = 0; k < kNumOperands; ++k) {
    if (k == kIn1 && !p.is_backward()) continue;
    if (static_cast<int>(reinterpret_cast<uintptr_t>(bases[k]) % kBaseAlign) != p.base_offset[k])
      return Status::invalid("operand " + std::to_string(k) + " sits " +
                             std::to_string(reinterpret_cast<uintptr_t>(bases[k]) % kBaseAlign) +
                             " bytes off the " + std::to_string(kBaseAlign) + "-byte grid, the plan assumed " +
                             std::to_string(p.base_offset[k]));
  }
  return plan.family->can_implement != nullptr ? plan.family->can_implement(plan, b) : Status::success();
}

int64_t workspace_size(const Plan& plan) { return plan.workspace_bytes; }

}  // namespace softmax_ext
