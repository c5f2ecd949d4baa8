// Host interface of the tensor-core forward kernels (kernel.cuh; one
// translation unit per dtype: bf16.cu, f16.cu, f32.cu). Plain C++ types only,
// so ops.cpp needs no CUDA headers.
#pragma once

#include <cstdint>

namespace softmax_ext::smm::cuda {

struct Args {
  const void* x = nullptr;  // (batch, d1, d2), unit stride along d2
  const void* v = nullptr;  // (batch, d2, d3), unit stride along d3
  void* out = nullptr;      // (batch, d1, d3) contiguous, x's dtype
  float* lse = nullptr;     // (batch, d1) contiguous, natural log-sum-exp
  int64_t batch = 0, d1 = 0, d2 = 0, d3 = 0;
  int64_t x_batch_stride = 0, x_row_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0;
  // d2 cut into `parts` parts of part_cols columns (a multiple of 128), a
  // CTA each (the Hopper kernels, cta.cuh's DRange; the rows kernel, with
  // part_cols a multiple of 256): out, lse and
  // part_max then hold each part's output, log of its row sum and row max,
  // (batch * parts, d1, d3) and (batch * parts, d1), batch entry
  // b * parts + c, and combine_parts merges them.
  int64_t parts = 1, part_cols = 0;
  float* part_max = nullptr;
};

// out (batch, d1, d3) and lse (batch, d1) from the parts' outputs `part`,
// log row sums `log_l` and row maxima `max` (Args::parts): with M the
// largest max and w_c = exp(max_c - M + log_l_c), lse = M + log(sum w_c),
// out = sum w_c out_c / sum w_c in part order (combine.cu). dtype: the
// outputs' (at::ScalarType as int). after_prior (sm_90 on): launched to
// start before the forward that writes the parts ends (cuda/core/launch.cuh).
void combine_parts(const void* part, const float* log_l, const float* max, void* out, float* lse, int64_t batch,
                   int64_t d1, int64_t d3, int64_t parts, int dtype, bool after_prior);

// Few rows of d1 on CUDA cores (rows.cu): `rows` (1, 2, 4, 8, 16) rows of
// d1 and `groups` (4-64, a power of two) x rows_columns_per_thread columns
// of d3 per CTA; any row strides (unit column strides). dtype: x's
// (at::ScalarType as int; f16, bf16, f32).
void launch_rows(const Args& a, int rows, int groups, int dtype);
// Columns of d3 a thread of the rows kernel keeps: one 16-byte vector of
// elements of `elem_bytes`, fewer where rows x columns would pass 32
// accumulators.
constexpr int rows_columns_per_thread(int rows, int elem_bytes) {
  return (16 / elem_bytes) * rows <= 32 ? 16 / elem_bytes : 32 / rows;
}

// A CTA of `warps` warps (1, 2, 4 or 8; 16 rows of d1 each) and `bn` (64, 128,
// 256) columns of d3. Launch on the current stream.
void launch_bf16(const Args& a, int warps, int bn);
void launch_f16(const Args& a, int warps, int bn);
void launch_f32(const Args& a, int warps, int bn, bool split3);  // split3: 3xTF32 (float32-accurate)
// The backward's buffers: go / out / dx / dv contiguous (batch, ., .); delta
// is a (batch, d1) f32 workspace (rowsum(dO * O)).
struct BwdArgs {
  const void* x = nullptr;
  const void* v = nullptr;
  const void* go = nullptr;
  const void* out = nullptr;
  const float* lse = nullptr;
  float* delta = nullptr;
  void* dx = nullptr;
  void* dv = nullptr;
  int64_t batch = 0, d1 = 0, d2 = 0, d3 = 0;
  int64_t x_batch_stride = 0, x_row_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0;
  // f32 only: room for dO transposed, (batch, d3, d1p), written by the
  // kernels, and lse, (batch, d1p): rows of d1p = d1 rounded up to a
  // multiple of 4 floats (16 bytes, for TMA); room for V rounded to TF32
  // (batch, d2, d3); 3xTF32: that is V's big part, and room for its small
  // part and go_t's (go_t holds the big part).
  float* go_t = nullptr;
  const float* lse_p = nullptr;
  int64_t d1p = 0;
  float* v_hi = nullptr;
  float* v_lo = nullptr;
  float* go_t_lo = nullptr;
};

// Hopper (sm_90a, sm90.cu): wgmma with P from registers, 128 rows x `bn`
// (64, 128, 256) columns per CTA; rows 16-byte aligned (plan.cpp checks).
void launch_sm90_bf16(const Args& a, int bn);
void launch_sm90_f16(const Args& a, int bn);
// f32 (sm90_f32.cu): TF32 (bn 128 / 256) or 3xTF32 (split3, 128 columns).
void launch_sm90_f32(const Args& a, int bn, bool split3);
// Hopper backward (sm90_backward.cu, 16-bit): D, dX, dV kernels; `bn`: dV's columns of d3 per CTA.
void backward_sm90_bf16(const BwdArgs& a, int bn);
void backward_sm90_f16(const BwdArgs& a, int bn);
// f32 (sm90_backward_f32.cu): TF32, or 3xTF32 (split3, float32-accurate); also
// go_t, lse_p, v_hi (and v_lo, go_t_lo); false (nothing launched) where a
// tensor map cannot be made.
bool backward_sm90_f32(const BwdArgs& a, int bn, bool split3);

}  // namespace softmax_ext::smm::cuda
