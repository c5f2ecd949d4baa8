// Where each row starts in each operand: the Problem's layout as a kernel
// parameter.
#pragma once

#include "plan/problem.h"

#include <c10/util/Exception.h>

#include <array>
#include <cstdint>
#include <type_traits>

namespace softmax_ext::cuda {

// n / d and n % d for non-negative n, d > 0. 64-bit division is a long
// software sequence on the GPU; almost every real problem fits 32 bits.
__device__ __forceinline__ int64_t divmod(int64_t n, int64_t d, int64_t& rem) {
  int64_t q;
  if (((n | d) >> 32) == 0) {
    q = static_cast<uint32_t>(n) / static_cast<uint32_t>(d);
  } else {
    q = n / d;
  }
  rem = n - q * d;
  return q;
}

// Where each row starts in N operands, and how each operand walks the axis.
// A POD copy of the Problem's layout, passed to kernels by value (kernel
// parameter space, no device allocation). Local slot k corresponds to the
// Problem operand slot given to make_row_indexer. All offsets are int64 and
// in elements: strides may be 0 (expanded inputs) or span more than 2^31.
//
// Must match the CPU side: row r is decomposed row-major over batch_size (last
// batch dim fastest); its first element in operand k is at
// sum_d idx[d] * batch_stride[k][d], element j at that + j * axis_stride[k].
template <int N>
struct RowIndexer {
  int64_t rows;
  int64_t axis_size;
  int64_t axis_stride[N];
  int batch_rank;
  int64_t batch_size[kMaxBatchRank];  // outermost first
  int64_t batch_stride[N][kMaxBatchRank];

  __device__ __forceinline__ void row_offsets(int64_t row, int64_t (&offset)[N]) const {
    if (batch_rank == 1) {  // the common case after coalescing: one row stride
#pragma unroll
      for (int k = 0; k < N; ++k) offset[k] = row * batch_stride[k][0];
      return;
    }
#pragma unroll
    for (int k = 0; k < N; ++k) offset[k] = 0;
    // Fully unrolled with compile-time indices so the arrays stay in
    // parameter space; the outermost index needs no division (row < size[0]).
#pragma unroll
    for (int d = kMaxBatchRank - 1; d > 0; --d) {
      if (d < batch_rank) {
        int64_t idx;
        row = divmod(row, batch_size[d], idx);
#pragma unroll
        for (int k = 0; k < N; ++k) offset[k] += idx * batch_stride[k][d];
      }
    }
    if (batch_rank > 0) {
#pragma unroll
      for (int k = 0; k < N; ++k) offset[k] += row * batch_stride[k][0];
    }
  }
};

// Host: copies the layout of the given Problem operand slots, in that order.
template <int N>
inline RowIndexer<N> make_row_indexer(const Problem& problem,
                                      const std::array<Operand, N>& slots) {
  static_assert(std::is_trivially_copyable_v<RowIndexer<N>>);
  TORCH_INTERNAL_ASSERT(problem.batch_rank >= 0 && problem.batch_rank <= kMaxBatchRank,
                        "softmax_ext: batch_rank ", problem.batch_rank, " out of range");
  RowIndexer<N> r{};
  r.rows = problem.rows;
  r.axis_size = problem.axis_size;
  r.batch_rank = problem.batch_rank;
  for (int d = 0; d < problem.batch_rank; ++d) r.batch_size[d] = problem.batch_size[d];
  for (int k = 0; k < N; ++k) {
    r.axis_stride[k] = problem.axis_stride[slots[k]];
    for (int d = 0; d < problem.batch_rank; ++d) {
      r.batch_stride[k][d] = problem.batch_stride[slots[k]][d];
    }
  }
  return r;
}

}  // namespace softmax_ext::cuda
