// Facts about the CUDA build, for softmax_ext.build_info().

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

namespace softmax_ext::cuda {

std::string runtime_version() {
  return std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
}

// nvcc defines __CUDA_ARCH_LIST__ (e.g. 800,900) in every compilation pass.
std::vector<int64_t> compiled_archs() {
#ifdef __CUDA_ARCH_LIST__
  return {__CUDA_ARCH_LIST__};
#else
  return {};
#endif
}

}  // namespace softmax_ext::cuda
