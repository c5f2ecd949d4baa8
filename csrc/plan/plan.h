// The plan dispatcher, after the Rust "plan" design:
//
//   describe()       tensors' shape/strides/dtypes -> Problem (coalesced)
//   select()         Problem -> Plan, or Unsupported / InvalidProblem
//   can_implement()  checks the concrete buffers against the plan
//   workspace_size() bytes of scratch the plan needs (the split families' partials)
//   run()            launches the plan (CUDA: on the current stream)
//
// Every op goes through these steps in this order (ops/ops.cpp). select(),
// workspace_size() and run() ask the family registry (plan/registry.cpp).
// Nothing here touches at::Tensor, so the kernels stay plain C++/CUDA.
#pragma once

#include "plan/problem.h"

#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>
#include <type_traits>

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

struct Family;  // plan/family.h: one kernel family of the registry

// A family's launch geometry, computed once by select() and carried in the
// Plan: bytes that only the family that planned reads, as its own
// trivially copyable type (geometry_as<T>()).
constexpr int kGeometryBytes = 96;

struct Plan {
  Problem problem;
  const Family* family = nullptr;
  std::string kernel;  // stable name, e.g. "cpu.lastdim.f32"
  c10::ScalarType accumulator = c10::ScalarType::Float;
  bool deterministic = true;  // same inputs -> bit-identical outputs
  bool uses_atomics = false;  // some kernel of the family issues atomic operations
  int64_t workspace_bytes = 0;
  // Backward: grad_output is first copied into grad_input's layout (the
  // problem describes it so), where the layout it has would leave the
  // problem to a slow family.
  bool relayout_in0 = false;
  alignas(8) unsigned char geometry[kGeometryBytes] = {};

  template <typename T>
  T& geometry_as() {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= kGeometryBytes && alignof(T) <= 8);
    return *reinterpret_cast<T*>(geometry);
  }
  template <typename T>
  const T& geometry_as() const {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= kGeometryBytes && alignof(T) <= 8);
    return *reinterpret_cast<const T*>(geometry);
  }
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
// `bases` holds each operand's data pointer (nullptr: a new allocation, as
// aligned as the caching allocator's); only their offsets from the
// kBaseAlign grid are kept. Fails with kUnsupported when the coalesced rank
// exceeds kMaxRank.
Status describe(Kind kind, Direction direction, c10::DeviceType device,
                c10::ScalarType in_dtype, c10::ScalarType out_dtype,
                c10::IntArrayRef sizes, const c10::IntArrayRef (&strides)[kNumOperands],
                const void* const (&bases)[kNumOperands], int64_t axis, Problem& problem);

Status select(const Problem& problem, Plan& plan);
Status can_implement(const Plan& plan, const Buffers& buffers);
int64_t workspace_size(const Plan& plan);
// `workspace` must hold workspace_size(plan) bytes on the problem's device.
void run(const Plan& plan, const Buffers& buffers, void* workspace);

}  // namespace softmax_ext
