// The per-rank steps of a softmax whose axis is sharded over ranks
// (softmax_ext.distributed): a problem descriptor, the kernel choice and the
// kernel entry points, shared by the op bodies (row_ops.cpp), the CPU kernels
// (rows_cpu.cpp) and the CUDA kernels (rows_cuda.cu).
//
// Every step sees its operands as `rows` contiguous rows of `n` elements
// (row_ops.cpp permutes the batch dimensions into the operands' memory
// order, so dense inputs whose axis has unit stride are read in place), and
// the per-row statistics as a contiguous (rows, 2) or (rows) array in the
// accumulator type (float, double for double inputs):
//
//   Stats        x            -> (max, sum(exp(x - max)))  of the row slice
//   Normalize    x, (M, S)    -> softmax: exp(x - M) / S; log_softmax: x - M - log(S)
//   BackStats    dy, y        -> softmax: sum(y * dy);     log_softmax: sum(dy)
//   BackApply    dy, y, s     -> softmax: y * (dy - s);    log_softmax: dy - exp(y) * s
//
// The descriptor follows the plan design of csrc/plan: select() picks a
// kernel (and names it) from the descriptor alone, can_implement() checks
// the buffers, run() launches.
#pragma once

#include "plan/problem.h"

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

namespace softmax_ext::distributed {

enum class Step : uint8_t { Stats, Normalize, BackStats, BackApply };

struct RowsProblem {
  Step step = Step::Stats;
  Kind kind = Kind::Softmax;
  c10::DeviceType device_type = c10::DeviceType::CPU;
  c10::ScalarType dtype = c10::ScalarType::Float;  // of x (dy and y for the backward steps)
  int64_t rows = 0;
  int64_t n = 0;  // row length: the local shard's part of the axis

  c10::ScalarType acc_dtype() const {
    return dtype == c10::ScalarType::Double ? c10::ScalarType::Double : c10::ScalarType::Float;
  }
};

// How the CUDA kernels spread a row: a warp per row (8 rows per 256-thread
// block) up to kWarpRowMax elements, a 256-thread block per row beyond.
enum class RowsLayout : uint8_t { kCpu, kWarpPerRow, kBlockPerRow };
constexpr int64_t kWarpRowMax = 2048;
constexpr int kRowsBlock = 256;

struct RowsPlan {
  RowsProblem problem;
  RowsLayout layout = RowsLayout::kCpu;
  std::string kernel;  // stable name, e.g. "cuda.rows.stats.block_per_row.bf16"
};

// The operands: a (and b) the inputs (x; or dy and y), stats the
// statistics (read by Normalize / BackApply, written by Stats / BackStats),
// out the output of Normalize / BackApply. On CPU, a softmax Normalize with
// stats null runs the softmax family's row kernel (cpu/row_kernel.h), which
// also writes each row's statistics to stats_out: one pass over x, an exp
// an element (distributed::softmax_with_stats; its sums have the row
// kernel's exp, ATen's fast one for 16-bit rows).
struct RowsBuffers {
  const void* a = nullptr;
  const void* b = nullptr;
  void* stats = nullptr;
  void* out = nullptr;
  void* stats_out = nullptr;
};

const char* step_name(Step step);
RowsPlan select(const RowsProblem& problem);
void run(const RowsPlan& plan, const RowsBuffers& buffers);

// Kernel entry points (one per device).
void run_cpu(const RowsPlan& plan, const RowsBuffers& buffers);
#ifdef SOFTMAX_EXT_WITH_CUDA
void run_cuda(const RowsPlan& plan, const RowsBuffers& buffers);
#endif

}  // namespace softmax_ext::distributed
