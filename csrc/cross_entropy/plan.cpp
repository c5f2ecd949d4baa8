// select / can_implement / workspace_size / run of the fused cross-entropy
// (see cross_entropy/plan.h). One family per device: rows of vocabulary
// size are what this op is for, and one pass over each row (forward) or one
// read and one write (backward) is the memory floor on either device.

#include "cross_entropy/plan.h"

#include "plan/family.h"
#include "plan/problem.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <sstream>

namespace softmax_ext::ce {

namespace {
// The fused forward's geometry changes above rows of this many bytes.
constexpr int64_t kSmallFusedRow = 128 * 1024;

int64_t row_bytes(const CeProblem& p) { return p.classes * static_cast<int64_t>(c10::elementSize(p.dtype)); }

// Whether a forward sums its rows as the fused forward does: the fused
// forward itself, and the plain forward of every loss the fused forward
// could have computed (mean / sum, not float16, rows of at most
// kMaxFusedRowBytes). A differentiable call takes either by the last
// backward's incoming gradient; with one geometry (threads, blocks a row,
// the order each thread folds its loads in) both give the same row statistics bits,
// hence the same gradient bits.
bool fused_geometry(const CeProblem& p) {
  return p.fused_grad || (p.reduction != Reduction::None && p.dtype != c10::ScalarType::Half &&
                          row_bytes(p) <= kMaxFusedRowBytes);
}

const char* reduction_name(Reduction r) {
  return r == Reduction::None ? "none" : r == Reduction::Mean ? "mean" : "sum";
}
}  // namespace

std::string CeProblem::to_string() const {
  std::ostringstream s;
  s << "cross_entropy(rows=" << rows << ", classes=" << classes << ", row_stride=" << row_stride
    << ", dtype=" << dtype << ", reduction=" << reduction_name(reduction) << ", weight=" << has_weight
    << ", smoothing=" << smoothing << ")";
  return s.str();
}

// CUDA: a block per row (or two, cuda_row_split); each thread keeps four
// 16-byte loads in flight, eight in the plain 16-bit forward, folded in as
// two chunks of four (cuda/families/cross_entropy/kernels.cu). The forward
// block ends every row with a block reduction, during which it has no
// loads in flight: 16-bit forward rows take 128 threads, so more rows
// (blocks) share an SM and cover each other's reductions; f32 rows up to
// 128 KB take 256, wider rows 512. The backward has no reduction and takes
// 512. Rows under 4096 classes take 128 threads so a block is not mostly
// idle. (The measurements behind the choice: docs/cross_entropy.md.)
// SOFTMAX_EXT_CE_THREADS=128|256|512 overrides the choice (A/B runs).
// The fused forward (forward and gradient in one block per row), and the
// plain forward of the losses it could compute (fused_geometry), take for
// rows up to 128 KB 128 threads of 16-bit rows (rows over 32 KB: a cluster
// of two such blocks) and 256 of wider ones, and 512 above.
static int cuda_threads(const CeProblem& p, bool backward) {
  if (const char* env = std::getenv("SOFTMAX_EXT_CE_THREADS")) {
    const int v = std::atoi(env);
    if (v == 128 || v == 256 || v == 512) return v;
  }
  if (p.classes < 4096) return 128;
  if (backward) return 512;
  if (fused_geometry(p) && row_bytes(p) <= kSmallFusedRow) return c10::elementSize(p.dtype) == 2 ? 128 : 256;
  if (fused_geometry(p)) return 512;
  if (c10::elementSize(p.dtype) == 4 && row_bytes(p) <= kSmallFusedRow) return 256;
  return c10::elementSize(p.dtype) == 2 ? 128 : 512;
}

// The fused forward keeps the start of each row in shared memory for its
// gradient pass (the rest is read again, from L2 where it still is): 24 KB
// of 16-bit rows up to 128 KB, 100 KB of wider ones, 200 KB of rows above
// 128 KB (one block an SM). SOFTMAX_EXT_CE_STAGE_KB overrides the bytes
// per block (A/B runs).
static int64_t cuda_stage_bytes(const CeProblem& p, int64_t chunk) {
  int64_t budget = row_bytes(p) > kSmallFusedRow     ? 200 * 1024
                   : c10::elementSize(p.dtype) == 2 ? 24 * 1024
                                                    : 100 * 1024;
  if (const char* env = std::getenv("SOFTMAX_EXT_CE_STAGE_KB")) budget = std::atoi(env) * int64_t{1024};
  budget = std::clamp<int64_t>(budget, 0, kMaxStageBytes);
  const int64_t chunk_bytes = chunk * static_cast<int64_t>(c10::elementSize(p.dtype));
  return std::min((chunk_bytes + 15) / 16 * 16, budget / 16 * 16);
}

// Rows split over two blocks (CUDA, 16-bit logits). The forward's pair is
// a thread-block cluster (sm_90) that exchanges the row's statistics; the
// backward needs no exchange. (The measurements behind the choice:
// docs/cross_entropy.md, "Rows over two blocks".)
// - The fused forward, rows over 32 KB up to 128 KB (16k-64k classes):
//   a block stages 24 KB of its row for the gradient pass, so two blocks
//   a row read a quarter of a 64 KB row again (L2, or memory) instead of
//   five eighths.
// - The plain forward, rows over 128 KB (64k+ classes) where the rows fill
//   at most one wave of the 128-thread blocks (16 an SM): a block a row
//   leaves the grid's second, partial wave to a few long rows, each with
//   only its own loads in flight. (Shorter rows gain nothing from it.)
// SOFTMAX_EXT_CE_SPLIT=<blocks a row, 1-8> overrides the choice (A/B runs).
static int cuda_row_split(const CeProblem& p, bool backward) {
  if (c10::elementSize(p.dtype) != 2 && std::getenv("SOFTMAX_EXT_CE_SPLIT") == nullptr) return 1;
#ifdef SOFTMAX_EXT_WITH_CUDA
  const DeviceFacts& device = cuda::device_facts(p.device_index);
  const int most = backward ? kMaxRowSplit : std::min(device.max_cluster, kMaxRowSplit);
  if (const char* env = std::getenv("SOFTMAX_EXT_CE_SPLIT"))
    return p.dtype == c10::ScalarType::Double ? 1 : std::clamp(std::atoi(env), 1, most);
  if (backward || most < 2) return 1;
  const int64_t bytes = row_bytes(p);
  if (fused_geometry(p)) return bytes > 32 * 1024 && bytes <= kSmallFusedRow ? 2 : 1;
  return bytes > kSmallFusedRow && p.rows <= int64_t{16} * device.sms ? 2 : 1;
#else
  (void)backward;
  return 1;
#endif
}

bool ce_packed_rows(const CeProblem& p) {
  const char* env = std::getenv("SOFTMAX_EXT_CE_PACKED");
  if (env != nullptr && env[0] == '0') return false;
  return p.inner == 1 && p.class_stride == 1 && (p.row_stride * c10::elementSize(p.dtype)) % 16 == 0;
}

// Short rows (CUDA): lanes of a warp a row (cross_entropy/lanes.cuh), the
// classes of four 16-byte packs a lane, where a block a row would leave
// most of its threads idle; the (N, C, d...) layout read as it is, a thread
// a position (lanes 1).
// Rows of at most kMaxLaneClasses classes and kMaxLaneRowBytes (measured:
// bf16 rows of 2048 classes, 4 KB, are faster a block a row; f32 rows of
// 1000, 4 KB, on 32 lanes). SOFTMAX_EXT_CE_LANES=0 turns them off, =<1-32>
// forces that many lanes a plain row (A/B runs).
constexpr int64_t kMaxLaneRowBytes = 4096;
constexpr int64_t kMaxLaneClasses = 1024;
static int cuda_lanes(const CeProblem& p) {
  if (p.inner > 1) return 1;
  if (const char* env = std::getenv("SOFTMAX_EXT_CE_LANES")) {
    const int v = std::atoi(env);
    if (v == 0) return 0;
    if (v > 0 && v <= 32 && (v & (v - 1)) == 0) return v;
  }
  if (row_bytes(p) > kMaxLaneRowBytes || p.classes > kMaxLaneClasses) return 0;
  // four 16-byte packs' classes a lane, whatever the alignment: the lanes
  // (and so the order of the sums) do not depend on the layout
  const int64_t per_lane = 4 * (16 / static_cast<int64_t>(c10::elementSize(p.dtype)));
  int lanes = 1;
  while (lanes < 32 && lanes * per_lane < p.classes) lanes *= 2;
  return lanes;
}

// A thread a position keeps kLaneUnroll loads in flight: fewer positions
// than this leave the memory idle, and rows of C classes (a copy, then the
// lanes or block kernels) are faster.
// On CPU, D under 16 positions (an AVX2 pair of float32 vectors) would go
// mostly position by position.
constexpr int64_t kMinLayoutPositions = 65536;
constexpr int64_t kMinCpuLayoutInner = 16;
bool ce_reads_layout(c10::DeviceType device, int64_t positions, int64_t inner) {
  if (inner <= 1) return false;
  if (const char* env = std::getenv("SOFTMAX_EXT_CE_LAYOUT")) return env[0] == '1';
  if (device == c10::DeviceType::CUDA) return positions >= kMinLayoutPositions;
  return inner >= kMinCpuLayoutInner;
}

CePlan select_ce(const CeProblem& problem, bool backward) {
  CePlan plan;
  plan.problem = problem;
  std::string shape;
  if (problem.device_type == c10::DeviceType::CUDA) {
    plan.family = CeFamily::kCudaRows;
#ifdef SOFTMAX_EXT_WITH_CUDA
    plan.overlap = !backward && cuda::overlap_launches(cuda::device_facts(problem.device_index).arch);
#endif
    plan.lanes = cuda_lanes(problem);
    if (plan.lanes > 0) {
      plan.threads = 256;
      plan.chunk = problem.classes;
      // (the (N, C, d...) layout: a thread a position, as the CPU's name says)
      shape = problem.inner > 1 ? std::string("cuda.ce_positions") : "cuda.ce_lanes" + std::to_string(plan.lanes);
    } else {
      plan.threads = cuda_threads(problem, backward);
      plan.row_split = cuda_row_split(problem, backward);
      if (!backward && plan.row_split > 1) plan.threads = 128;  // the cluster kernel's block
      // chunks of whole 16-byte packs
      plan.chunk = (problem.classes + plan.row_split - 1) / plan.row_split;
      plan.chunk = (plan.chunk + 7) / 8 * 8;
      plan.row_split = static_cast<int>(std::max<int64_t>(1, (problem.classes + plan.chunk - 1) / plan.chunk));
      if (!backward && !problem.fused_grad && fused_geometry(problem) && plan.row_split == kMaxBlockParts &&
          c10::elementSize(problem.dtype) == 2) {
        plan.block_parts = plan.row_split;
        plan.row_split = 1;
      }
      if (!backward && problem.fused_grad) plan.stage_bytes = cuda_stage_bytes(problem, plan.chunk);
      shape = plan.row_split > 1 ? (backward ? "cuda.ce_split" : "cuda.ce_cluster") + std::to_string(plan.row_split)
                                 : std::string("cuda.ce_block_per_row");
    }
  } else {
    plan.family = CeFamily::kCpuRows;
    shape = problem.inner > 1                     ? "cpu.ce_positions"
            : problem.classes < kShortRowClasses ? "cpu.ce_short_rows"
                                                 : "cpu.ce_rows";
  }
  plan.kernel = shape + (backward ? "_backward." : problem.fused_grad ? "_fused_grad." : ".") +
                dtype_tag(problem.dtype);
  plan.workspace_bytes = workspace_size_ce(plan, backward);
  return plan;
}

// Forward mean / sum: per-row losses in the accumulator dtype, summed in a
// fixed order by one small kernel (deterministic, no atomics); past
// kOneBlockRows rows (CUDA) two sums a slice of rows first (any reduction:
// the total weight is summed for each).
int64_t workspace_size_ce(const CePlan& plan, bool backward) {
  const CeProblem& p = plan.problem;
  if (backward) return 0;
  const int64_t elem = static_cast<int64_t>(c10::elementSize(p.acc_dtype()));
  const int64_t parts = p.device_type == c10::DeviceType::CUDA ? ce_reduce_parts(p.rows) : 0;
  return ((p.reduction == Reduction::None ? 0 : p.rows) + 2 * parts) * elem;
}

std::string can_implement_ce(const CePlan& plan, const CeBuffers& b, bool backward) {
  const CeProblem& p = plan.problem;
  if (p.rows > 0 && p.classes > 0 && b.logits == nullptr) return "logits buffer is missing";
  if (p.rows > 0 && b.target == nullptr) return "target buffer is missing";
  if (p.has_weight && b.weight == nullptr) return "weight buffer is missing";
  if (p.has_weight && p.smoothing > 0 && b.weight_sum == nullptr) return "weight sum buffer is missing";
  if (p.row_stride < p.classes && p.rows > 1) return "rows overlap (row stride below the class count)";
  if (backward) {
    if (b.grad == nullptr || b.grad_loss == nullptr || b.row_stats == nullptr) return "backward buffers are missing";
    if (p.reduction == Reduction::Mean && b.total_weight == nullptr) return "total_weight buffer is missing";
  } else {
    if (b.loss == nullptr || b.row_stats == nullptr || b.total_weight == nullptr) return "forward outputs are missing";
    if (p.fused_grad && p.reduction == Reduction::None) return "the fused gradient needs reduction 'mean' or 'sum'";
    if (p.fused_grad && b.grad == nullptr) return "gradient buffer is missing";
  }
  return {};
}

void run_ce_forward(const CePlan& plan, const CeBuffers& buffers, void* workspace) {
  if (plan.family == CeFamily::kCudaRows) {
#ifdef SOFTMAX_EXT_WITH_CUDA
    return cuda_forward(plan, buffers, workspace);
#else
    TORCH_INTERNAL_ASSERT(false, "softmax_ext.cross_entropy: this build has no CUDA kernels");
#endif
  }
  int64_t bad = 0;
  TORCH_CHECK_INDEX(cpu_forward(plan, buffers, workspace, bad), "softmax_ext.cross_entropy: target ", bad,
                    " is out of bounds for ", plan.problem.classes, " classes (expected a class index in [0, ",
                    plan.problem.classes, ") or ignore_index=", plan.problem.ignore_index, ")");
}

void run_ce_backward(const CePlan& plan, const CeBuffers& buffers) {
  if (plan.family == CeFamily::kCudaRows) {
#ifdef SOFTMAX_EXT_WITH_CUDA
    return cuda_backward(plan, buffers);
#else
    TORCH_INTERNAL_ASSERT(false, "softmax_ext.cross_entropy: this build has no CUDA kernels");
#endif
  }
  int64_t bad = 0;
  TORCH_CHECK_INDEX(cpu_backward(plan, buffers, bad), "softmax_ext.cross_entropy backward: target ", bad,
                    " is out of bounds for ", plan.problem.classes, " classes");
}

namespace {
int cpu_grad_one = 1;
std::atomic<bool> cuda_flag_ready{false};
}  // namespace

int* grad_one_flag(bool cuda) {
#ifdef SOFTMAX_EXT_WITH_CUDA
  if (cuda) {
    int* flag = cuda_grad_one_flag();  // null while a graph is being captured
    if (flag != nullptr) cuda_flag_ready.store(true);
    return flag;
  }
#endif
  (void)cuda;
  return &cpu_grad_one;
}

bool grad_was_one(bool cuda) {
  if (cuda && !cuda_flag_ready.load()) return true;  // no CUDA backward yet
  const int* flag = grad_one_flag(cuda);
  return flag == nullptr || *static_cast<const volatile int*>(flag) != 0;
}

void set_grad_was_one(bool cuda, bool value) {
  if (int* flag = grad_one_flag(cuda)) *static_cast<volatile int*>(flag) = value ? 1 : 0;
}

}  // namespace softmax_ext::ce
