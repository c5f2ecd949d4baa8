// select / can_implement / workspace_size / run of the fused cross-entropy
// (see cross_entropy/plan.h). One family per device: rows of vocabulary
// size are what this op is for, and one pass over each row (forward) or one
// read and one write (backward) is the memory floor on either device.

#include "cross_entropy/plan.h"

#include "plan/problem.h"

#include <c10/util/Exception.h>

#include <sstream>

namespace softmax_ext::ce {

namespace {
const char* reduction_name(Reduction r) {
  return r == Reduction::None ? "none" : r == Reduction::Mean ? "mean" : "sum";
}
}  // namespace

std::string CeProblem::to_string() const {
  std::ostringstream s;
  s << "cross_entropy(rows=" << rows << ", classes=" << classes << ", row_stride=" << row_stride
    << ", dtype=" << dtype << ", reduction=" << reduction_name(reduction) << ", weight=" << has_weight
    << ", smoothing=" << smoothing << ")";
  return s.str();
}

// CUDA: a block of 512 threads per row. Each thread keeps four 16-byte loads
// in flight (cuda_kernels.cu), so a block streams 32 KiB per step, and with
// four blocks per SM the rows of a vocabulary (32000..262144 classes, 64 KiB
// to 1 MiB) keep enough bytes in flight to cover HBM latency. Short rows
// (C < 4096) take 128 threads so a block is not mostly idle.
CePlan select_ce(const CeProblem& problem, bool backward) {
  CePlan plan;
  plan.problem = problem;
  const std::string tag = dtype_tag(problem.dtype);
  if (problem.device_type == c10::DeviceType::CUDA) {
    plan.family = CeFamily::kCudaRows;
    plan.threads = problem.classes >= 4096 ? 512 : 128;
    plan.kernel = std::string(backward ? "cuda.ce_block_per_row_backward." : "cuda.ce_block_per_row.") + tag;
  } else {
    plan.family = CeFamily::kCpuRows;
    plan.kernel = std::string(backward ? "cpu.ce_rows_backward." : "cpu.ce_rows.") + tag;
  }
  plan.workspace_bytes = workspace_size_ce(plan, backward);
  return plan;
}

// Forward mean / sum: per-row losses in the accumulator dtype, summed in a
// fixed order by one small kernel (deterministic, no atomics).
int64_t workspace_size_ce(const CePlan& plan, bool backward) {
  const CeProblem& p = plan.problem;
  if (backward || p.reduction == Reduction::None) return 0;
  return p.rows * static_cast<int64_t>(c10::elementSize(p.acc_dtype()));
}

std::string can_implement_ce(const CePlan& plan, const CeBuffers& b, bool backward) {
  const CeProblem& p = plan.problem;
  if (p.rows > 0 && p.classes > 0 && b.logits == nullptr) return "logits buffer is missing";
  if (p.rows > 0 && b.target == nullptr) return "target buffer is missing";
  if (p.has_weight && b.weight == nullptr) return "weight buffer is missing";
  if (p.has_weight && p.smoothing > 0 && b.weight_sum == nullptr) return "weight sum buffer is missing";
  if (p.row_stride < p.classes && p.rows > 1) return "rows overlap (row stride below the class count)";
  if (backward) {
    if (b.grad == nullptr || b.grad_loss == nullptr || b.lse == nullptr) return "backward buffers are missing";
    if (p.reduction == Reduction::Mean && b.total_weight == nullptr) return "total_weight buffer is missing";
  } else {
    if (b.loss == nullptr || b.lse == nullptr || b.total_weight == nullptr) return "forward outputs are missing";
  }
  return {};
}

void run_ce_forward(const CePlan& plan, const CeBuffers& buffers, void* workspace) {
  if (plan.family == CeFamily::kCudaRows) {
#ifdef SOFTMAX_EXT_WITH_CUDA
    return cuda_forward(plan, buffers, workspace);
#else
    TORCH_INTERNAL_ASSERT(false, "softmax_ext.cross_entropy: this build has no CUDA kernels");
#endif
  }
  int64_t bad = 0;
  TORCH_CHECK_INDEX(cpu_forward(plan, buffers, workspace, bad), "softmax_ext.cross_entropy: target ", bad,
                    " is out of bounds for ", plan.problem.classes, " classes (expected a class index in [0, ",
                    plan.problem.classes, ") or ignore_index=", plan.problem.ignore_index, ")");
}

void run_ce_backward(const CePlan& plan, const CeBuffers& buffers) {
  if (plan.family == CeFamily::kCudaRows) {
#ifdef SOFTMAX_EXT_WITH_CUDA
    return cuda_backward(plan, buffers);
#else
    TORCH_INTERNAL_ASSERT(false, "softmax_ext.cross_entropy: this build has no CUDA kernels");
#endif
  }
  int64_t bad = 0;
  TORCH_CHECK_INDEX(cpu_backward(plan, buffers, bad), "softmax_ext.cross_entropy backward: target ", bad,
                    " is out of bounds for ", plan.problem.classes, " classes");
}

}  // namespace softmax_ext::ce
