// Where a row starts in each operand (problem.h's convention: row r is r
// decomposed over the batch sizes, last batch dimension fastest; offset =
// sum over d of idx[d] * batch_stride[k][d], in elements).
#pragma once

#ifndef CPU_CAPABILITY
#error "include from a per-ISA TU (kernels_*.cpp) that defines CPU_CAPABILITY"
#endif

#include "plan/problem.h"

#include <cstdint>

namespace softmax_ext::cpu::CPU_CAPABILITY {

// Walks rows in order from `row`, over the first `dims` batch dimensions
// (all of them for row kernels; all but the innermost for the inner kernel,
// whose innermost dimension is the vectorised one). One division per
// dimension to start, then an odometer step per row.
class RowCursor {
 public:
  RowCursor(const Problem& p, int dims, int64_t row) : p_(p), dims_(dims) {
    for (int k = 0; k < kNumOperands; ++k) offset_[k] = 0;
    for (int d = dims - 1; d >= 0; --d) {
      idx_[d] = row % p.batch_size[d];
      row /= p.batch_size[d];
      for (int k = 0; k < kNumOperands; ++k) offset_[k] += idx_[d] * p.batch_stride[k][d];
    }
  }

  int64_t operator[](int k) const { return offset_[k]; }

  void next() {
    for (int d = dims_ - 1; d >= 0; --d) {
      for (int k = 0; k < kNumOperands; ++k) offset_[k] += p_.batch_stride[k][d];
      if (++idx_[d] < p_.batch_size[d]) return;
      for (int k = 0; k < kNumOperands; ++k) offset_[k] -= idx_[d] * p_.batch_stride[k][d];
      idx_[d] = 0;
    }
  }

 private:
  const Problem& p_;
  int dims_;
  int64_t idx_[kMaxBatchRank] = {};
  int64_t offset_[kNumOperands];
};

}  // namespace softmax_ext::cpu::CPU_CAPABILITY
