// Grid sizes. Row loops are grid-stride, so any grid covers the rows:
// grid_for_rows caps the grid at kMaxGridBlocks blocks (many waves on any
// current GPU, each block walking several rows where there are more);
// grid_for_each gives a block per item up to gridDim.x's limit. Plain C++.
#pragma once

#include "cuda/core/budget.h"

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstdint>

namespace softmax_ext::cuda {

constexpr int64_t kMaxGridBlocks = 65535;
constexpr int64_t kMaxGridX = 2147483647;

inline unsigned int grid_for_rows(int64_t rows) {
  return static_cast<unsigned int>(std::clamp<int64_t>(rows, 1, kMaxGridBlocks));
}
inline unsigned int grid_for_each(int64_t items) {
  return static_cast<unsigned int>(std::clamp<int64_t>(items, 1, kMaxGridX));
}

// The warp and block families: a block per pass over their rows, except
// 16-bit rows (but backward rows whose length is a power of two), which walk
// several passes on kMaxGridBlocks blocks (docs/tuning/block.md, "Grids").
constexpr bool grid_walks_rows(c10::ScalarType in, int64_t axis_size, bool backward) {
  return is_16bit_float(in) && (!backward || !is_pow2(axis_size));
}

}  // namespace softmax_ext::cuda
