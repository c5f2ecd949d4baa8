// softmax_matmul forward where d2 is cut into parts (Args::parts): each
// part's CTAs wrote its normalised output out_c, the log of its row sum
// log_l_c and its row max m_c; the whole row's are
//   M = max_c m_c,  w_c = exp(m_c - M + log_l_c),  lse = M + log(sum_c w_c),
//   out = sum_c w_c out_c / sum_c w_c,
// summed in a fixed order (deterministic). m_c and log_l_c are kept apart
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

#include "cuda/core/launch.cuh"
#include "cuda/core/numerics.cuh"

namespace softmax_ext::smm::cuda {
namespace {

using softmax_ext::cuda::convert;
using softmax_ext::cuda::launch_after_prior;
using softmax_ext::cuda::wait_for_prior;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPerLane = 4;               // columns of d3 per lane
constexpr int kCols = 32 * kPerLane;      // columns per block
constexpr int kMaxParts = 256;            // plan.cpp cuts d2 into at most 256

// One block per (row (b, i) of out, block of kCols columns), a grid-stride
// loop over them. Warp 0 weighs the parts (lane j: parts j, j + 32, ...;
// then a shuffle tree: a fixed order); warp w sums parts w, w + 8, ... of
// the block's columns, and the warps' sums are added in warp order.
template <typename T>
__global__ void __launch_bounds__(kThreads) combine_parts_kernel(const T* part, const float* log_l, const float* mx,
                                                                  T* out, float* lse, int64_t rows, int64_t d1,
                                                                  int64_t d3, int parts) {
  __shared__ float w[kMaxParts];
  __shared__ float sums[kWarps][kCols];
  __shared__ float inv_total;
  wait_for_prior();  // the parts' results (launched after the forward: combine_parts)
  constexpr float kInf = __builtin_huge_valf();
  const float kNaN = __int_as_float(0x7fffffff);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t col_blocks = (d3 + kCols - 1) / kCols;
  for (int64_t blk = blockIdx.x; blk < rows * col_blocks; blk += gridDim.x) {
    const int64_t row = blk / col_blocks, cb = blk % col_blocks;
    const int64_t b = row / d1, i = row % d1;
    // part c of row (b, i): batch entry b * parts + c of the parts' results
    auto at = [&](int c) { return (b * parts + c) * d1 + i; };
    if (warp == 0) {
      float M = -kInf;
      bool nan = false;
      for (int c = lane; c < parts; c += 32) {
        const float mc = mx[at(c)], lc = log_l[at(c)];
        nan |= mc != mc || lc != lc;
        M = fmaxf(M, mc);
      }
      for (int off = 16; off > 0; off /= 2) {
        M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
        nan |= __shfl_xor_sync(0xffffffffu, static_cast<int>(nan), off) != 0;
      }
      float s = 0.f;
      for (int c = lane; c < parts; c += 32) {
        const float wc = nan || M == -kInf ? kNaN : expf(mx[at(c)] - M + log_l[at(c)]);
        w[c] = wc;
        s += wc;
      }
      for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
      if (lane == 0) {
        inv_total = 1.f / s;
        if (cb == 0) lse[row] = nan ? kNaN : (M == -kInf ? -kInf : M + logf(s));
      }
    }
    __syncthreads();
    float acc[kPerLane] = {};
    const int64_t col0 = cb * kCols + lane * kPerLane;
    for (int c = warp; c < parts; c += kWarps) {
      const float wc = w[c];
      if (wc == 0.f) continue;  // a part -inf across the row
      const T* src = part + at(c) * d3 + col0;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j)
        if (col0 + j < d3) acc[j] += wc * convert<float>(src[j]);
    }
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) sums[warp][lane * kPerLane + j] = acc[j];
    __syncthreads();
    if (threadIdx.x < kCols && cb * kCols + threadIdx.x < d3) {
      float total = 0.f;
#pragma unroll
      for (int q = 0; q < kWarps; ++q) total += sums[q][threadIdx.x];
      out[row * d3 + cb * kCols + threadIdx.x] = convert<T>(total * inv_total);
    }
    __syncthreads();  // w, sums and inv_total are rewritten for the next block
  }
}

template <typename T>
void launch(const void* part, const float* log_l, const float* mx, void* out, float* lse, int64_t batch, int64_t d1,
            int64_t d3, int64_t parts, bool after_prior) {
  const int64_t rows = batch * d1;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(rows * ((d3 + kCols - 1) / kCols), 65536));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  auto* const o = static_cast<T*>(out);
  const auto* const p = static_cast<const T*>(part);
  const int n = static_cast<int>(parts);
  launch_after_prior(after_prior, combine_parts_kernel<T>, blocks, kThreads, stream, p, log_l, mx, o, lse, rows, d1,
                     d3, n);
}

}  // namespace

void combine_parts(const void* part, const float* log_l, const float* max, void* out, float* lse, int64_t batch,
                   int64_t d1, int64_t d3, int64_t parts, int dtype, bool after_prior) {
  switch (static_cast<c10::ScalarType>(dtype)) {
    case c10::ScalarType::BFloat16:
      return launch<c10::BFloat16>(part, log_l, max, out, lse, batch, d1, d3, parts, after_prior);
    case c10::ScalarType::Half: return launch<c10::Half>(part, log_l, max, out, lse, batch, d1, d3, parts, after_prior);
    default: return launch<float>(part, log_l, max, out, lse, batch, d1, d3, parts, after_prior);
  }
}

}  // namespace softmax_ext::smm::cuda
