// Tuning constants of the CPU kernels, with where each comes from.
#pragma once

#include <algorithm>
#include <cstdint>

namespace softmax_ext::cpu {

// Work per parallel task, in "simple ops" (torch's at::internal::GRAIN_SIZE).
constexpr int64_t kGrainSize = 32768;
// Rough ops per element of a softmax row: *, +, - count 1, exp and log 4
// (torch's SoftMaxKernel.cpp uses the same 16).
constexpr int64_t kOpsPerElement = 16;

// Rows per task for the row kernels: GRAIN_SIZE / (16 * row length), as torch.
inline int64_t row_grain(int64_t axis_size) {
  return std::max<int64_t>(1, kGrainSize / (kOpsPerElement * axis_size));
}

// 16-bit log_softmax rows of up to this many elements are taken a vector's
// count at a time (row_kernel.h, log_softmax_short_rows): their logs as one
// vector; a group's rows stay in L1 for the output pass. Measured on a
// 2-core AMD EPYC (AVX-512), one thread, 4M elements, row at a time /
// grouped: bf16 rows of 16 7.58 / 6.99 ms, 32 5.13 / 4.32, 48 6.93 / 5.39,
// 100 4.39 / 3.95, 128 3.38 / 2.83, 256 2.91 / 2.47. float32 rows: no
// steady gain (rows of 16: 1.02-1.31x in two runs, 0.80x torch's either
// way in cpu_parity; 100: 0.98-1.05x) and a loss from 128 (0.72-0.86x):
// they keep forward_row.
constexpr int64_t kGroupedLogSoftmaxMax = 256;

// Forward softmax of a 16-bit output keeps exp(x - max) of a row in a float
// scratch row between passes 2 and 3 (rounding it to the output type first
// would round twice). Longer rows recompute exp in pass 3 instead: they do not
// stay in cache anyway, and the scratch would not be small.
constexpr int64_t kRowScratchMaxBytes = 1 << 20;

// Inner kernel: a task reduces an (axis x chunk) tile of the input, chunk
// inner positions side by side. Sized so the tile of the three passes stays
// in L2 (torch uses 128 KiB for its non-last-dim kernels).
constexpr int64_t kInnerTileBytes = 128 << 10;
// Inner kernel: tiles whose rows (chunk positions of acc_t) are this wide or
// wider are read a row at a time (see inner_kernel.h). Measured on a 2-core
// AMD EPYC (AVX2), one thread, against the column walk: (64, 64, 2048) dim 1
// (rows of 2 KiB) 1.18-1.46x faster, (2048, 16, 256) (1 KiB) 1.14-1.49x;
// (32, 1024, 512) (rows of 128 B) 0.90-0.93x, (128, 128, 64) (256 B)
// 0.75-0.87x slower.
constexpr int64_t kRowsMinBytes = 512;

// Strided kernel: consecutive rows gathered together per task, so rows that
// share cache lines and pages (a small stride between them, e.g. a sliced or
// transposed input) load each line once per group instead of once per row.
// Capped so the gathered tiles (one per input operand) stay in L2; 256 KiB
// measured best for sliced forward and mixed-layout backward inputs.
constexpr int64_t kStridedMaxRows = 16;
constexpr int64_t kStridedTileBytes = 256 << 10;

}  // namespace softmax_ext::cpu
