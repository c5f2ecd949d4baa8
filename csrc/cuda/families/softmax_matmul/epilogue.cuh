// The end of a softmax_matmul kernel, shared by the sm_80 (kernel.cuh) and
// sm_90a (sm90.cu, sm90_f32.cu, sm90_backward*) kernels. A lane of a warp's
// 16 rows holds rows r0 and r0 + 8 (h = 0, 1): their running max m, its
// quad's part of the row sum l, and pairs of neighbouring output columns.
#pragma once

#include <cstdint>

namespace softmax_ext::smm::cuda {

// Row i's log-sum-exp from its running max m and sum l: m + log(l); where
// d2 is cut into parts (a.part_max set), log(l) and m apart, so that the
// merge weighs the parts by exp(m_c - max m + log l_c) with no rounding of
// a large m + log(l).
template <typename Args>
__device__ __forceinline__ void write_lse(const Args& a, int64_t i, float m, float l) {
  if (a.part_max != nullptr) {
    a.lse[i] = logf(l);
    a.part_max[i] = m;
  } else {
    a.lse[i] = m + logf(l);
  }
}

// Completes the row sums over the lane quad, gives 1 / l in inv, and writes
// the lse (write_lse) of the rows inside d1, once per row (lane t = 0 of the
// quad, in the first block of d3 columns, nb = 0).
template <typename Args>
__device__ __forceinline__ void finish_rows(const Args& a, int64_t b, int64_t r0, int t, int64_t nb,
                                            const float (&m)[2], float (&l)[2], float (&inv)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    inv[h] = 1.f / l[h];
    const int64_t row = r0 + 8 * h;
    if (t == 0 && nb == 0 && row < a.d1) write_lse(a, b * a.d1 + row, m[h], l[h]);
  }
}

// Calls f(row, col, j, h) for this lane's column pairs (col, col + 1) of the
// accumulator tile, col = n0 + 8 j + 2 t (j < BN / 8), row = r0 + 8 h, those
// at or past (rows, cols) left out.
template <int BN, typename F>
__device__ __forceinline__ void for_each_column_pair(int64_t r0, int64_t n0, int t, int64_t rows, int64_t cols,
                                                     F&& f) {
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int64_t col = n0 + 8 * j + 2 * t;
    if (col >= cols) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = r0 + 8 * h;
      if (row >= rows) continue;
      f(row, col, j, h);
    }
  }
}

// o0, o1 into dst[0], dst[1] (dst[1] only where `second`): one 8-byte store
// where pair_ok (the row length even, dst 8-byte aligned).
__device__ __forceinline__ void store_pair(float* dst, float o0, float o1, bool pair_ok, bool second) {
  if (pair_ok) {
    *reinterpret_cast<float2*>(dst) = make_float2(o0, o1);
  } else {
    dst[0] = o0;
    if (second) dst[1] = o1;
  }
}

}  // namespace softmax_ext::smm::cuda
