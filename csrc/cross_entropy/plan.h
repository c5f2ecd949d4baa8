// The fused cross-entropy on the plan design (see plan/plan.h):
//
//   describe_ce()       logits (N, C) with unit class stride -> CeProblem
//   select_ce()         CeProblem -> CePlan (kernel name, launch shape)
//   can_implement_ce()  checks the concrete buffers against the plan
//   workspace_size_ce() bytes of scratch (the per-row losses of mean / sum)
//   run_ce_*()          launches (CUDA: on the current stream, no sync)
//
// The op layer (ops.cpp) flattens (N, C, d...) logits to rows of C classes
// before it gets here, so every kernel sees rows x classes with unit class
// stride and any row stride.
//
// Per row i with target t (w = weight or ones, W = sum(w), eps = smoothing),
// its max m_i and ls_i = log sum_c exp(x_ic - m_i) (the log-sum-exp is
// m_i + ls_i, never formed: its rounding at a large m_i would enter every
// term below, where x - m is exact):
//   loss_i = (1 - eps) * w_t * ((m_i - x_t) + ls_i) + eps / C * sum_c w_c ((m_i - x_ic) + ls_i)
//   (torch's cross_entropy_loss_label_smoothing; 0 for ignored rows)
//   dx_ic  = s_i * [(1 - eps) * w_t * (p_ic - [c == t]) + eps / C * (W * p_ic - w_c)]
//   with p_ic = exp((x_ic - m_i) - ls_i) and s_i = grad_loss (none: per row;
//   sum: the scalar; mean: the scalar / total_weight), 0 for ignored rows.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

namespace softmax_ext::ce {

enum class Reduction : uint8_t { None, Mean, Sum };

struct CeProblem {
  c10::DeviceType device_type = c10::DeviceType::CPU;
  int device_index = -1;
  c10::ScalarType dtype = c10::ScalarType::Float;          // logits (and loss, gradient)
  c10::ScalarType target_dtype = c10::ScalarType::Long;    // int64 or int32
  int64_t rows = 0;        // N (after flattening)
  int64_t classes = 0;     // C
  int64_t row_stride = 0;       // of the logits, in elements
  int64_t grad_row_stride = 0;  // of the gradient (the logits' own when in place)
  // The (N, C, d...) layout read as it is (rows = N * inner positions;
  // ce_reads_layout): position p of sample n at n * row_stride + p, its
  // classes class_stride apart (grad_class_stride in the gradient). Plain
  // rows: inner 1, class strides 1.
  int64_t inner = 1;
  int64_t class_stride = 1;
  int64_t grad_class_stride = 1;
  Reduction reduction = Reduction::Mean;
  bool has_weight = false;
  double smoothing = 0.0;
  int64_t ignore_index = -100;
  bool acc_loss = false;   // the loss in acc_dtype() (16-bit logits: float32) instead of dtype
  // The fused forward (mean / sum): also writes the gradient for
  // grad_loss = 1 into CeBuffers::grad (row stride grad_row_stride), so the
  // backward only scales it by grad_loss.
  bool fused_grad = false;

  c10::ScalarType acc_dtype() const {
    return dtype == c10::ScalarType::Double ? c10::ScalarType::Double : c10::ScalarType::Float;
  }
  std::string to_string() const;
};

// The most shared memory the fused forward stages a row in: what a block
// may have on sm_90 (227 KB), less the kernel's static reduction scratch.
constexpr int64_t kMaxStageBytes = 227 * 1024 - 2048;
// The longest CUDA rows the fused forward takes (softmax_ext/_cross_entropy.py
// reads it as _C._CE_MAX_FUSED_ROW_BYTES): past it the gradient pass's
// second read of the row comes from memory, not L2.
constexpr int64_t kMaxFusedRowBytes = 208 * 1024;
// Many rows: above kOneBlockRows the sums over rows (the targets' total
// weight, the losses of mean / sum) first run in slices of rows, a block
// each (ce_reduce_parts of them, workspace), then one block sums the slices.
constexpr int64_t kOneBlockRows = 16384;
constexpr int64_t kRowsPerPart = 4096;
constexpr int64_t kMaxReduceParts = 1024;
inline int64_t ce_reduce_parts(int64_t rows) {
  if (rows <= kOneBlockRows) return 0;
  const int64_t parts = (rows + kRowsPerPart - 1) / kRowsPerPart;
  return parts < kMaxReduceParts ? parts : kMaxReduceParts;
}

// CPU rows of fewer classes than this go a vector lane a row
// (cpu.ce_short_rows, cpu_kernels.h).
constexpr int64_t kShortRowClasses = 16;

// The most blocks a row is split over (the portable cluster size).
constexpr int kMaxRowSplit = 8;
// The pieces one block folds a row in as a cluster would (block_parts).
constexpr int kMaxBlockParts = 2;

enum class CeFamily : uint8_t {
  kCpuRows,   // at::parallel_for over rows, Vectorized max / exp-sum / gradient
  kCudaRows,  // a block per row, 16-byte vector loads, one pass (online max / sum)
};

struct CePlan {
  CeProblem problem;
  CeFamily family = CeFamily::kCpuRows;
  std::string kernel;      // stable name, e.g. "cuda.ce_block_per_row.bf16"
  int threads = 0;         // CUDA: threads per block
  int64_t stage_bytes = 0; // CUDA fused forward: bytes of each row kept in shared memory
  // CUDA: blocks that share each row, `chunk` classes each (the forward: a
  // thread-block cluster exchanging the row's statistics; the backward:
  // independent blocks); 1: a block a row.
  int row_split = 1;
  int64_t chunk = 0;
  // CUDA plain forward of 16-bit rows, 1 or kMaxBlockParts: one block a row folds
  // the row's `chunk`-class pieces as the fused forward's cluster of that
  // many blocks does (the same row statistics bits), without the cluster: it keeps
  // eight loads in flight a thread, where the fused forward's cluster
  // blocks, which stage their rows, keep four.
  int block_parts = 1;
  // CUDA short rows: lanes of a warp a row (a power of two, 1-32; 1 for the
  // (N, C, d...) layout, a thread a position), kernels in lanes.cuh; 0: the
  // block (cluster) a row kernels above.
  int lanes = 0;
  // CUDA forward (plan/family.h, cuda::overlap_launches): each kernel after
  // the first starts before the kernel ahead of it ends and waits on the
  // device for what it needs (programmatic dependent launch).
  bool overlap = false;
  int64_t workspace_bytes = 0;
};

// Raw pointers of one call. Forward: logits, target, weight (acc dtype or
// null), weight_sum (W, float64, 0-dim, or null when no smoothing with a
// weight) -> loss (none: N values of the logits' dtype; mean/sum: one),
// row_stats (N x 2, acc dtype: m_i, ls_i above; 0, 0 for ignored rows),
// total_weight (one, acc dtype).
// The fused forward also writes grad. Backward additionally reads grad_loss
// (acc dtype; N values for none, one otherwise), row_stats and total_weight, and
// writes grad (row stride as logits;
// may be the logits themselves).
struct CeBuffers {
  const void* logits = nullptr;
  const void* target = nullptr;
  const void* weight = nullptr;
  const void* weight_sum = nullptr;
  void* loss = nullptr;
  void* row_stats = nullptr;
  void* total_weight = nullptr;
  const void* grad_loss = nullptr;
  void* grad = nullptr;
  void* grad_one = nullptr;  // backward, mean / sum: grad_one_flag() of the device
};

// Whether the kernels read (N, C, D) logits as they are instead of through
// a copy to rows of C classes (ops.cpp): CUDA, enough positions N * D to
// keep the memory busy with a thread each (lanes.cuh); CPU, D of at least
// a vector pair of positions (cpu_kernels.h). SOFTMAX_EXT_CE_LAYOUT=0|1
// overrides the choice (A/B runs).
bool ce_reads_layout(c10::DeviceType device, int64_t positions, int64_t inner);

// Whether the CUDA lanes kernels read the rows in 16-byte packs (where the
// logits' base is 16-byte aligned too): plain rows of contiguous classes,
// rows of whole 16-byte chunks. SOFTMAX_EXT_CE_PACKED=0: never (A/B runs).
bool ce_packed_rows(const CeProblem& p);

CePlan select_ce(const CeProblem& problem, bool backward);
// Empty string when the buffers fit the plan, else what is wrong.
std::string can_implement_ce(const CePlan& plan, const CeBuffers& buffers, bool backward);
int64_t workspace_size_ce(const CePlan& plan, bool backward);
void run_ce_forward(const CePlan& plan, const CeBuffers& buffers, void* workspace);
void run_ce_backward(const CePlan& plan, const CeBuffers& buffers);

// Whether the latest mean / sum backward on a device type had grad_loss 1,
// the case the fused forward is for (a gradient of another value costs it a
// pass more than the two-op path). The backward kernels write it as they
// read grad_loss: no host synchronisation; the host reads the value of a
// step or so ago. 1 until a backward says otherwise. On CUDA a pinned int
// mapped into the devices, allocated by the first CUDA backward.
bool grad_was_one(bool cuda);
void set_grad_was_one(bool cuda, bool value);
int* grad_one_flag(bool cuda);

// Device kernels (cpu_kernels.cpp / cuda_kernels.cu). The CPU forward
// reports the first out-of-range target through `bad_target` (its value)
// and returns false, writing nothing useful.
bool cpu_forward(const CePlan& plan, const CeBuffers& buffers, void* workspace, int64_t& bad_target);
bool cpu_backward(const CePlan& plan, const CeBuffers& buffers, int64_t& bad_target);
#ifdef SOFTMAX_EXT_WITH_CUDA
void cuda_forward(const CePlan& plan, const CeBuffers& buffers, void* workspace);
void cuda_backward(const CePlan& plan, const CeBuffers& buffers);
// grad (n contiguous, 16-byte aligned elements of dtype) *= *grad_loss (one
// value of loss_type, on the device: float, double, half or bfloat16),
// skipped on the device when it is 1.
void cuda_grad_scale(c10::ScalarType dtype, int device, void* grad, int64_t n, const void* grad_loss,
                     c10::ScalarType loss_type);
int* cuda_grad_one_flag();
#endif

}  // namespace softmax_ext::ce
