// select(), can_implement() and workspace_size(): which kernel runs a
// problem, and whether it can run on the concrete buffers.

#include "plan/plan.h"

#ifdef SOFTMAX_EXT_WITH_CUDA
#include "cuda/config.h"
#include "cuda/launch.h"
#endif

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

#ifdef SOFTMAX_EXT_WITH_CUDA
// Contiguous rows by length: warp (f32, bf16 and f16 rows one after another
// that are not a power of two: the row tile, backward; forward only f32 rows
// that fill their lane group), block, cluster (sm_90+), then split (resident
// where the GPU's blocks hold a row on chip). A strided axis with an inner
// run goes to the strided family while a block or cluster holds it (up to
// strided_reach), then to the strided split family.
// The capacities are config.h's; other dtype= pairs and layouts run on the
// reference kernel.
KernelFamily select_cuda(const Problem& p) {
  if (!cuda::has_fast_kernels(p.in_dtype, p.out_dtype)) return KernelFamily::kCudaReference;
  const bool dbl = p.acc_dtype() == c10::ScalarType::Double;
  const bool bw = p.is_backward();
  const int max_cluster = cuda::max_cluster_size(p.device_index);
  const int64_t n = p.axis_size;
  const int64_t bytes = c10::elementSize(p.in_dtype);
  if (p.axis_contiguous()) {
    if (cuda::row_tile_takes(p)) return KernelFamily::kCudaRowTile;
    if (n <= cuda::warp_capacity(dbl, bw)) return KernelFamily::kCudaWarp;
    if (n <= cuda::block_capacity(dbl, bw, max_cluster > 1)) return KernelFamily::kCudaBlock;
    if (max_cluster > 1 && n <= cuda::cluster_capacity(p.in_dtype, dbl, bw, max_cluster))
      return KernelFamily::kCudaCluster;
    return cuda::split_resident(p, cuda::shared_bytes_per_block(p.device_index, cuda::kResidentBlocksPerSM),
                                cuda::sm_count(p.device_index))
               ? KernelFamily::kCudaSplitResident
               : KernelFamily::kCudaSplit;
  }
  if (p.inner_size() >= cuda::kStridedMinInner)
    return n <= cuda::strided_reach(dbl, bw, bytes, max_cluster) ? KernelFamily::kCudaStrided
                                                                   : KernelFamily::kCudaStridedSplit;
  return KernelFamily::kCudaReference;
}
#endif

}  // namespace

const char* kernel_family_name(KernelFamily f, Direction d) {
  const bool bw = d == Direction::Backward;
  switch (f) {
    case KernelFamily::kCpuLastDim: return bw ? "cpu.lastdim_backward" : "cpu.lastdim";
    case KernelFamily::kCpuInner: return bw ? "cpu.inner_backward" : "cpu.inner";
    case KernelFamily::kCpuStrided: return bw ? "cpu.strided_backward" : "cpu.strided";
    case KernelFamily::kCudaReference: return bw ? "cuda.reference_backward" : "cuda.reference";
    case KernelFamily::kCudaWarp: return bw ? "cuda.warp_backward" : "cuda.warp";
    case KernelFamily::kCudaRowTile: return bw ? "cuda.row_tile_backward" : "cuda.row_tile";
    case KernelFamily::kCudaBlock: return bw ? "cuda.block_backward" : "cuda.block";
    case KernelFamily::kCudaCluster: return bw ? "cuda.cluster_backward" : "cuda.cluster";
    case KernelFamily::kCudaSplit: return bw ? "cuda.split_backward" : "cuda.split";
    case KernelFamily::kCudaSplitResident: return bw ? "cuda.split_resident_backward" : "cuda.split_resident";
    case KernelFamily::kCudaStrided: return bw ? "cuda.strided_backward" : "cuda.strided";
    case KernelFamily::kCudaStridedSplit: return bw ? "cuda.strided_split_backward" : "cuda.strided_split";
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
      plan.family = select_cuda(p);
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

int64_t workspace_size(const Plan& plan) {
#ifdef SOFTMAX_EXT_WITH_CUDA
  if (plan.family == KernelFamily::kCudaSplit) return cuda::split_workspace_bytes(plan.problem);
  if (plan.family == KernelFamily::kCudaSplitResident) return cuda::resident_workspace_bytes(plan.problem);
  if (plan.family == KernelFamily::kCudaStridedSplit) return cuda::strided_split_workspace_bytes(plan.problem);
#endif
  (void)plan;
  return 0;
}

}  // namespace softmax_ext
