// softmax_matmul forward where d2 is cut into parts (Args::parts): each
// part's CTAs wrote its normalised output out_c, the log of its row sum
// log_l_c and its row max m_c; the whole row's are
//   M = max_c m_c,  w_c = exp(m_c - M + log_l_c),  lse = M + log(sum_c w_c),
//   out = sum_c w_c out_c / sum_c w_c,
// summed in part order (deterministic). m_c and log_l_c are kept apart
// because a rounded m_c + log_l_c of a large row max (x * 30: ~120, an
// ulp of 8e-6) would weigh the parts with that relative error. A part whose
// columns of a row are all -inf (m_c = -inf, out_c = 0 / 0) weighs 0 and is
// left out; a row -inf everywhere gives lse = -inf and NaN, as the uncut
// kernels do; a NaN reaches both.
#include "cuda/families/softmax_matmul/cuda_launch.h"

#include <c10/core/ScalarType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>

#include "cuda/core/numerics.cuh"

namespace softmax_ext::smm::cuda {
namespace {

using softmax_ext::cuda::convert;

constexpr int kThreads = 128;
constexpr int kMaxParts = 1024;  // the weights of a row, in shared memory (plan.cpp cuts d2 into at most 256)

// One block per row (b, i) of out, a grid-stride loop over rows.
template <typename T>
__global__ void __launch_bounds__(kThreads) combine_parts_kernel(const T* part, const float* log_l, const float* mx,
                                                                  T* out, float* lse, int64_t rows, int64_t d1,
                                                                  int64_t d3, int parts) {
  __shared__ float w[kMaxParts];
  __shared__ float inv_total;
  constexpr float kInf = __builtin_huge_valf();
  const float kNaN = __int_as_float(0x7fffffff);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t b = row / d1, i = row % d1;
    // part c of row (b, i): batch entry b * parts + c of the parts' results
    auto at = [&](int c) { return (b * parts + c) * d1 + i; };
    if (threadIdx.x == 0) {
      float M = -kInf;
      bool nan = false;
      for (int c = 0; c < parts; ++c) {
        const float mc = mx[at(c)], lc = log_l[at(c)];
        nan |= mc != mc || lc != lc;
        M = fmaxf(M, mc);
      }
      float s = 0.f;
      for (int c = 0; c < parts; ++c) {
        const float wc = nan || M == -kInf ? kNaN : expf(mx[at(c)] - M + log_l[at(c)]);
        w[c] = wc;
        s += wc;
      }
      inv_total = 1.f / s;
      lse[row] = nan ? kNaN : (M == -kInf ? -kInf : M + logf(s));
    }
    __syncthreads();
    const float inv = inv_total;
    for (int64_t col = threadIdx.x; col < d3; col += kThreads) {
      float acc = 0.f;
      for (int c = 0; c < parts; ++c) {
        const float wc = w[c];
        if (wc != 0.f) acc += wc * convert<float>(part[at(c) * d3 + col]);
      }
      out[row * d3 + col] = convert<T>(acc * inv);
    }
    __syncthreads();  // w and inv_total are rewritten for the next row
  }
}

template <typename T>
void launch(const void* part, const float* log_l, const float* mx, void* out, float* lse, int64_t batch, int64_t d1,
            int64_t d3, int64_t parts) {
  const int64_t rows = batch * d1;
  const int blocks = static_cast<int>(std::min<int64_t>(rows, 65536));
  combine_parts_kernel<T><<<blocks, kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      static_cast<const T*>(part), log_l, mx, static_cast<T*>(out), lse, rows, d1, d3, static_cast<int>(parts));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void combine_parts(const void* part, const float* log_l, const float* max, void* out, float* lse, int64_t batch,
                   int64_t d1, int64_t d3, int64_t parts, int dtype) {
  switch (static_cast<c10::ScalarType>(dtype)) {
    case c10::ScalarType::BFloat16: return launch<c10::BFloat16>(part, log_l, max, out, lse, batch, d1, d3, parts);
    case c10::ScalarType::Half: return launch<c10::Half>(part, log_l, max, out, lse, batch, d1, d3, parts);
    default: return launch<float>(part, log_l, max, out, lse, batch, d1, d3, parts);
  }
}

}  // namespace softmax_ext::smm::cuda
