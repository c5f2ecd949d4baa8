// The workspace of the split families (split, strided split): a partial
// per row (or column) and chunk, padded to a vector, then one combined value
// per row (column), in accumulator type: (max, sum) pairs forward, sums
// backward. Plain C++.
#pragma once

#include "cuda/core/budget.h"
#include "plan/problem.h"

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace softmax_ext::cuda {

inline int64_t split_value_bytes(const Problem& p) {
  const int64_t acc = p.out_dtype == c10::ScalarType::Double ? 8 : 4;
  return p.is_backward() ? acc : 2 * acc;
}
// `chunks` partials per row, padded to a vector: where the combined values start.
inline int64_t partials_bytes(const Problem& p, int64_t chunks) {
  return ceil_div(p.rows * chunks * split_value_bytes(p), kVectorBytes) * kVectorBytes;
}
inline int64_t workspace_bytes(const Problem& p, int64_t chunks) {
  return partials_bytes(p, chunks) + p.rows * split_value_bytes(p);
}

}  // namespace softmax_ext::cuda
