// The plan dispatcher, after the Rust "plan" design:
//
//   describe()       tensors' shape/strides/dtypes -> Problem (coalesced)
//   select()         Problem -> Plan, or Unsupported / InvalidProblem
//   can_implement()  checks the concrete buffers against the plan
//   workspace_size() bytes of scratch the plan needs (the split family's partials)
//   run()            launches the plan (CUDA: on the current stream)
//
// Every op goes through these steps in this order (ops/ops.cpp). Nothing here
// touches at::Tensor except describe(), so the kernels stay plain C++/CUDA.
#pragma once

#include "plan/problem.h"

#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>

namespace softmax_ext {

enum class StatusCode : uint8_t {
  kSuccess,
  kUnsupported,     // a valid problem this build has no kernel for -> NotImplementedError
  kInvalidProblem,  // the arguments disagree with each other -> ValueError
};

struct Status {
  StatusCode code = StatusCode::kSuccess;
  std::string message;

  bool ok() const { return code == StatusCode::kSuccess; }
  static Status success() { return {}; }
  static Status unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
  static Status invalid(std::string m) { return {StatusCode::kInvalidProblem, std::move(m)}; }
};

// Every kernel the dispatcher can pick. The stable, user-visible name is
// kernel_family_name() + "." + dtype tag(s), e.g. "cuda.reference.f32".
enum class KernelFamily : uint8_t {
  kCpuLastDim,     // axis contiguous: one row at a time, Vectorized SIMD
  kCpuInner,       // axis strided, contiguous inner run: SIMD across the inner dim
  kCpuStrided,     // anything else: scalar gather along the axis
  kCudaReference,  // one block per row, any strides, block reductions
  kCudaWarp,       // contiguous short rows in a warp (or 1..16 lanes) of registers
  kCudaRowTile,    // backward, short rows one after another: flat tiles through shared memory
  kCudaBlock,      // contiguous rows in one block's registers
  kCudaCluster,    // contiguous rows in a thread-block cluster's registers (sm_90+)
  kCudaSplit,      // contiguous rows of any length: tiles, workspace, three kernels
  kCudaSplitResident,  // split rows of which a group fits in L2: one cooperative kernel
  kCudaStrided,    // strided axis with a contiguous inner run: column tiles
  kCudaStridedSplit,  // strided axis of any length, inner run: chunks, workspace, three kernels
};

const char* kernel_family_name(KernelFamily f, Direction d);

struct Plan {
  Problem problem;
  KernelFamily family = KernelFamily::kCpuStrided;
  std::string kernel;  // stable name, e.g. "cpu.lastdim.f32"
  c10::ScalarType accumulator = c10::ScalarType::Float;
  bool deterministic = true;  // same inputs -> bit-identical outputs
  bool uses_atomics = false;
  int64_t workspace_bytes = 0;
};

// Raw pointers of one call, in the operand slots of problem.h.
struct Buffers {
  const void* in0 = nullptr;  // x (forward) or grad_output (backward)
  const void* in1 = nullptr;  // output (backward only)
  void* out = nullptr;        // y (forward) or grad_input (backward)
};

// Builds the coalesced descriptor. `strides` holds one stride list per
// operand slot (unused slots may be empty); all share `sizes`. `axis` is
// already wrapped to [0, sizes.size()) (0-dim tensors arrive as sizes {1}).
// Fails with kUnsupported when the coalesced rank exceeds kMaxRank.
Status describe(Kind kind, Direction direction, c10::DeviceType device,
                c10::ScalarType in_dtype, c10::ScalarType out_dtype,
                c10::IntArrayRef sizes, const c10::IntArrayRef (&strides)[kNumOperands],
                int64_t axis, Problem& problem);

Status select(const Problem& problem, Plan& plan);
Status can_implement(const Plan& plan, const Buffers& buffers);
int64_t workspace_size(const Plan& plan);
// `workspace` must hold workspace_size(plan) bytes on the problem's device.
void run(const Plan& plan, const Buffers& buffers, void* workspace);

}  // namespace softmax_ext
