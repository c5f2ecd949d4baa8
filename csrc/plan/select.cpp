// select(), can_implement() and workspace_size(): which kernel runs a
// problem, and whether it can run on the concrete buffers.

#include "plan/plan.h"

#include <string>

namespace softmax_ext {
namespace {

std::string kernel_name(KernelFamily family, const Problem& p) {
  std::string name = kernel_family_name(family, p.direction);
  name += '.';
  name += dtype_tag(p.in_dtype);
  if (p.out_dtype != p.in_dtype) {
    name += '_';
    name += dtype_tag(p.out_dtype);
  }
  return name;
}

KernelFamily select_cpu(const Problem& p) {
  if (p.axis_contiguous()) return KernelFamily::kCpuLastDim;
  if (p.inner_size() > 1) return KernelFamily::kCpuInner;
  return KernelFamily::kCpuStrided;
}

}  // namespace

const char* kernel_family_name(KernelFamily f, Direction d) {
  const bool bw = d == Direction::Backward;
  switch (f) {
    case KernelFamily::kCpuLastDim: return bw ? "cpu.lastdim_backward" : "cpu.lastdim";
    case KernelFamily::kCpuInner: return bw ? "cpu.inner_backward" : "cpu.inner";
    case KernelFamily::kCpuStrided: return bw ? "cpu.strided_backward" : "cpu.strided";
    case KernelFamily::kCudaReference: return bw ? "cuda.reference_backward" : "cuda.reference";
  }
  return "unknown";
}

Status select(const Problem& p, Plan& plan) {
  for (c10::ScalarType t : {p.in_dtype, p.out_dtype})
    if (!is_supported_dtype(t))
      return Status::unsupported(std::string("dtype ") + c10::toString(t) +
                                 " is not supported; " + kAcceptedDtypes);
  if (p.is_backward() && p.in_dtype != p.out_dtype)
    return Status::invalid("grad_output, output and grad_input must share one dtype");
  if (p.rank() > kMaxRank)
    return Status::unsupported("effective rank above " + std::to_string(kMaxRank));

  plan = Plan{};
  plan.problem = p;
  plan.accumulator = p.acc_dtype();
  switch (p.device_type) {
    case c10::DeviceType::CPU:
      plan.family = select_cpu(p);
      break;
    case c10::DeviceType::CUDA:
#ifdef SOFTMAX_EXT_WITH_CUDA
      plan.family = KernelFamily::kCudaReference;
      break;
#else
      return Status::unsupported(
          "this build of softmax_ext has no CUDA kernels (it was built without a CUDA toolkit)");
#endif
    default:
      return Status::unsupported(std::string("device ") + c10::DeviceTypeName(p.device_type) +
                                 " is not supported; accepted: cpu, cuda");
  }
  plan.kernel = kernel_name(plan.family, p);
  plan.deterministic = true;
  plan.uses_atomics = false;
  plan.workspace_bytes = workspace_size(plan);
  return Status::success();
}

Status can_implement(const Plan& plan, const Buffers& b) {
  if (plan.problem.numel() == 0) return Status::success();
  if (b.in0 == nullptr || b.out == nullptr || (plan.problem.is_backward() && b.in1 == nullptr))
    return Status::invalid("a tensor with elements has no data pointer");
  return Status::success();
}

int64_t workspace_size(const Plan& /*plan*/) {
  // No kernel family needs scratch memory yet; multi-block reductions will.
  return 0;
}

}  // namespace softmax_ext
