// Facts about the CUDA build, for softmax_ext.build_info().

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

namespace softmax_ext::cuda {

std::string runtime_version() {
  return std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
}

// nvcc defines __CUDA_ARCH_LIST__ (e.g. 800,900) in every compilation pass;
// reported as compute capabilities times ten (80, 90), like TORCH_CUDA_ARCH_LIST.
std::vector<int64_t> compiled_archs() {
  std::vector<int64_t> archs;
#ifdef __CUDA_ARCH_LIST__
  for (int arch : {__CUDA_ARCH_LIST__}) archs.push_back(arch / 10);
#endif
  return archs;
}

}  // namespace softmax_ext::cuda
