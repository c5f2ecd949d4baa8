// softmax_matmul's plan, after the plan design of the softmax ops (plan/plan.h):
//
//   describe()        x (..., d1, d2), v (..., d2, d3) -> Descriptor (batch, sizes,
//                     strides of the flattened 3-d views, dtype, device, TF32, arch)
//   select()          Descriptor -> Plan (kernel, tile, accumulator, math mode), or
//                     Unsupported (NotImplementedError) / InvalidProblem (ValueError)
//   can_implement()   the concrete pointers and strides against the plan's tile
//   workspace_size()  scratch bytes (the fused backward's f32 buffers; the
//                     results of the forward's parts of d2)
//   run               ops.cpp: the tensor-core kernel (cuda_launch.h) or the
//                     blocked ATen loop (blocked.h)
//
// Kept apart from csrc/plan/ so that the softmax families are untouched.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

namespace softmax_ext::smm {

enum class Code : uint8_t { kSuccess, kUnsupported, kInvalidProblem };

struct Status {
  Code code = Code::kSuccess;
  std::string message;
  bool ok() const { return code == Code::kSuccess; }
};

// The problem after flattening the leading dims into one batch dim.
struct Descriptor {
  int64_t batch = 1, d1 = 0, d2 = 0, d3 = 0;
  int64_t x_strides[3] = {0, 0, 1};  // batch, row (d1), column (d2)
  int64_t v_strides[3] = {0, 0, 1};  // batch, row (d2), column (d3)
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::DeviceType device = c10::DeviceType::CPU;
  bool allow_tf32 = false;  // torch.backends.cuda.matmul.allow_tf32 at the call
  int arch = 0;             // compute capability * 10 (CUDA), 0 on CPU
  int sms = 0;              // multiprocessors (CUDA), 0 on CPU
  bool aligned16 = false;   // x's and v's data pointers 16-byte aligned
};

enum class Kernel : uint8_t {
  kBlocked,     // ATen matmuls on blocks of d2, online max/sum (CPU; CUDA float64)
  kCudaMma,     // mma.sync tensor cores, one CTA per (batch, 64 rows, BN columns)
  kCudaWgmma,   // Hopper wgmma (sm_90a), 16-bit: one CTA per (batch, 128 rows, BN columns)
  kCudaRows,    // few rows of d1 on CUDA cores: one CTA per (batch, 1-16 rows, BN columns)
};

// Whether this build carries the sm_90a (wgmma) kernels: setup.py defines
// SOFTMAX_EXT_SM90A when the arch list has 9.0a.
bool wgmma_built();

enum class Math : uint8_t {
  kExactF32,    // float32-accurate (CUDA: 3xTF32 split on tensor cores)
  kTF32,        // TF32 tensor cores, f32 accumulation
  kHalfF32Acc,  // f16 / bf16 operands, f32 accumulation
  kF64,         // float64 throughout
  kF32,         // float32 throughout: ATen matmuls (CPU), FMAs (the CUDA rows kernel)
};

const char* math_name(Math m);

struct Plan {
  Kernel kernel = Kernel::kBlocked;
  Math math = Math::kF32;
  std::string name;  // stable, e.g. "cuda.mma_sync.bf16.64x128x64"
  int bm = 0, bn = 0, bk = 0;  // rows of d1, columns of d3, columns of d2 per step
  // The Hopper or rows forward with too few CTAs to fill the GPU (small
  // batch x d1 x d3, long d2): d2 cut into `parts` parts of part_cols
  // columns, a CTA each, then merged (cuda_launch.h combine_parts; the
  // parts' results are the plan's workspace).
  int parts = 1;
  int64_t part_cols = 0;
  c10::ScalarType accumulator = c10::ScalarType::Float;
  bool deterministic = true;
  int64_t workspace_bytes = 0;
};

// Blocked (ATen) loop: columns of d2 per step, bounded so that the
// (batch, d1, block) temporaries stay near `budget` elements.
int64_t blocked_columns(int64_t rows, int64_t d2, bool cuda, bool backward);

Status select(const Descriptor& d, bool backward, Plan* plan);
// Pointers are those of the (flattened) x and v the kernel would read.
Status can_implement(const Plan& plan, const Descriptor& d, const void* x, const void* v);
int64_t workspace_size(const Plan& plan, const Descriptor& d);

// The fused backward's workspace, f32: offsets in floats, each a multiple of
// 4 (16-byte aligned, as tensor maps need); -1 where the plan has no such
// part. delta: D = rowsum(dO * O), (batch, d1); float32 also lse_p (batch,
// d1p) and go_t, dO transposed (batch, d3, d1p), with d1p = d1 rounded up
// to 4, and v_hi (batch, d2, d3), V rounded to TF32 (3xTF32: its big part);
// 3xTF32 then v_lo (batch, d2, d3) and go_t_lo (batch, d3, d1p).
struct BackwardWorkspace {
  int64_t d1p = 0;
  int64_t delta = 0, lse_p = -1, go_t = -1, v_hi = -1, v_lo = -1, go_t_lo = -1;
  int64_t floats = 0;  // the whole
};
BackwardWorkspace backward_workspace(const Plan& plan, const Descriptor& d);

}  // namespace softmax_ext::smm
