// Host side of the row views (fragment.cuh): where rows start relative to
// the 16-byte grid, from the Problem's strides and base offsets. Plain C++.
#pragma once

#include "cuda/core/budget.h"
#include "plan/problem.h"

#include <cstdint>

namespace softmax_ext::cuda {

// True when every row of operand `slot` starts on a 16-byte boundary, so the
// fragment views of all rows have shift 0.
inline bool rows_aligned(const Problem& p, Operand slot, int64_t element_bytes) {
  if (!p.base_aligned(slot, kVectorBytes)) return false;
  for (int d = 0; d < p.batch_rank; ++d)
    if (p.batch_stride[slot][d] * element_bytes % kVectorBytes != 0) return false;
  return true;
}

// View positions a row may need beyond its length: the largest shift of a
// row that does not start on a 16-byte boundary.
inline int64_t view_slack(const Problem& p, Operand slot, int64_t element_bytes) {
  return rows_aligned(p, slot, element_bytes) ? 0 : pack_size(element_bytes) - 1;
}

}  // namespace softmax_ext::cuda
