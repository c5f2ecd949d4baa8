// run(): hands a selected plan to its kernel family (CPU or CUDA launcher).

#include "plan/plan.h"

#include "cpu/softmax_cpu.h"
#ifdef SOFTMAX_EXT_WITH_CUDA
#include "cuda/launch.h"
#endif

#include <c10/util/Exception.h>

namespace softmax_ext {

void run(const Plan& plan, const Buffers& buffers, void* workspace) {
  const Problem& p = plan.problem;
  if (p.numel() == 0) return;
  [[maybe_unused]] const bool bw = p.is_backward();  // read by the CUDA cases only
  switch (plan.family) {
    case KernelFamily::kCpuLastDim: return cpu::run_lastdim(p, buffers);
    case KernelFamily::kCpuInner: return cpu::run_inner(p, buffers);
    case KernelFamily::kCpuStrided: return cpu::run_strided(p, buffers);
#ifdef SOFTMAX_EXT_WITH_CUDA
    case KernelFamily::kCudaReference:
      return bw ? cuda::reference_backward(p, buffers) : cuda::reference_forward(p, buffers);
    case KernelFamily::kCudaWarp:
      return bw ? cuda::warp_backward(p, buffers) : cuda::warp_forward(p, buffers);
    case KernelFamily::kCudaRowTile:
      return bw ? cuda::row_tile_backward(p, buffers) : cuda::row_tile_forward(p, buffers);
    case KernelFamily::kCudaBlock:
      return bw ? cuda::block_backward(p, buffers, 1) : cuda::block_forward(p, buffers, 1);
    case KernelFamily::kCudaCluster: {
      const int max_cluster = cuda::max_cluster_size(p.device_index);
      return bw ? cuda::block_backward(p, buffers, max_cluster)
                : cuda::block_forward(p, buffers, max_cluster);
    }
    case KernelFamily::kCudaSplit:
    case KernelFamily::kCudaSplitResident: {
      const bool resident = plan.family == KernelFamily::kCudaSplitResident;
      return bw ? cuda::split_backward(p, buffers, workspace, resident)
                : cuda::split_forward(p, buffers, workspace, resident);
    }
    case KernelFamily::kCudaStridedSplit:
      return bw ? cuda::strided_split_backward(p, buffers, workspace)
                : cuda::strided_split_forward(p, buffers, workspace);
    case KernelFamily::kCudaStrided: {
      const int max_cluster = cuda::max_cluster_size(p.device_index);
      return bw ? cuda::strided_backward(p, buffers, max_cluster)
                : cuda::strided_forward(p, buffers, max_cluster);
    }
#else
    default:
      break;
#endif
  }
  TORCH_INTERNAL_ASSERT(false, "softmax_ext: plan names kernel ", plan.kernel,
                        " which this build does not contain");
}

}  // namespace softmax_ext
