// What the cross-entropy's CUDA kernels share (kernels.cu: a block or a
// cluster a row; lanes.cuh: a few lanes a row): their arguments, the exp of
// the 16-bit rows, the loss and gradient of a row from its statistics.
#pragma once

#include "cuda/core/numerics.cuh"
#include "cuda/core/vector_io.cuh"

#include <c10/macros/Macros.h>

#include <cstdint>
#include <type_traits>

namespace softmax_ext::ce::dev {

using cuda::acc_type;

// The exp of the 16-bit kernels: the hardware exp2 of x * log2(e), like
// __expf, but with subnormal results flushed to zero (ex2.approx.ftz), which
// spares __expf's range fix-up (a compare and two multiplies an element).
// exp(x - max) below 2^-126 is nothing beside the row's largest term, 1,
// and a probability that small is zero to a 16-bit gradient's 8-11 bits
// but for bf16's subnormals, which torch's gradient may keep. float32 and
// float64 logits keep the accurate exp.
struct FtzExp {
  __device__ static __forceinline__ float exp(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x * 1.44269504088896340736f));
    return r;
  }
};
template <typename T>
using ce_exp_t = std::conditional_t<cuda::is_reduced_float_v<T>, FtzExp, cuda::AccurateExp>;

// The type of the smoothing's sum_c w_c x_c: float64 for float32 rows (the
// loss takes W m minus it, which cancels at a large m), the accumulator
// type otherwise (16-bit values carry less than the float32 rounding).
template <typename T>
using smooth_sum_t = std::conditional_t<std::is_same_v<T, float>, double, acc_type<T>>;

__device__ __forceinline__ int64_t load_target(const int64_t* t64, const int32_t* t32, int64_t row) {
  return t32 != nullptr ? static_cast<int64_t>(t32[row]) : t64[row];
}

// Where the lanes kernels find a row's classes: plain rows (inner = 1) at
// row * row_stride, class c at c * class_stride (1); or the (N, C, d...)
// layout read as it is, rows = N * inner positions, position p of sample n
// at n * row_stride + p and class c class_stride (= inner) further on.
struct RowLayout {
  int64_t inner = 1;
  int64_t class_stride = 1;
  int64_t grad_class_stride = 1;
  int lanes = 0;  // lanes a row (a power of two, 1-32); 0: not the lanes kernels
  // plain rows: every row of the logits starts on a 16-byte boundary with
  // its classes contiguous, so lanes read 16-byte packs (lanes.cuh); and so
  // does every row of the gradient (grad_packed: packs written too)
  bool packed = false;
  bool grad_packed = false;
};

__device__ __forceinline__ int64_t row_offset(int64_t row, int64_t row_stride, int64_t inner) {
  if (inner == 1) return row * row_stride;
  const int64_t n = row / inner;
  return n * row_stride + (row - n * inner);
}

template <typename T>
struct ForwardArgs {
  using acc_t = acc_type<T>;
  const T* logits;
  const int64_t* target64;
  const int32_t* target32;
  const acc_t* weight;        // null: all ones
  const double* weight_sum;   // W, with smoothing and a weight
  T* loss_none;               // reduction "none"
  acc_t* row_loss;            // mean / sum
  acc_t* row_stats;           // m, ls of each row
  T* grad;                    // fused: the gradient for grad_loss = 1
  const acc_t* total_weight;  // fused mean: the divisor (computed first)
  int64_t rows, classes, row_stride, grad_row_stride, ignore_index;
  int64_t stage_packs;  // fused: packs of each row kept in shared memory
  int64_t chunk;        // kCluster: the classes of each block of a row's cluster
  int cluster;          // kCluster: blocks a row (the launch's cluster size)
  acc_t eps, eps_c;
  RowLayout layout;     // the lanes kernels (lanes.cuh)
  // Many rows (ce_reduce_parts): the (total weight, loss sum) of each slice
  acc_t* partials = nullptr;
  int64_t parts = 0;
};

__device__ __forceinline__ float cuda_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double cuda_fma(double a, double b, double c) { return __fma_rn(a, b, c); }

template <typename acc_t>
struct GradCoefficients {
  acc_t ca;  // of p_c
  acc_t cc;  // of w_c
  acc_t cb;  // at c == t
};

// s: the row's scale (grad_loss, over total_weight for mean); wt = w_t;
// W = sum(w) (C without a weight).
template <typename acc_t>
__device__ __forceinline__ GradCoefficients<acc_t> grad_coefficients(acc_t s, acc_t wt, acc_t W, acc_t eps,
                                                                     acc_t eps_c) {
  // explicit fma: the same rounding wherever it is inlined (the fused
  // forward and the backward give the same bits)
  return {s * cuda_fma(eps_c, W, (1 - eps) * wt), s * eps_c, s * (1 - eps) * wt};
}

// W of the gradient coefficients: the weights' sum (given in float64 where
// smoothing needs it; without smoothing eps_c is 0 and W is not read), or C
// without weights.
template <typename acc_t>
__device__ __forceinline__ acc_t grad_weight_sum(bool weighted, const double* weight_sum, int64_t classes) {
  if (!weighted) return static_cast<acc_t>(classes);
  return weight_sum != nullptr ? static_cast<acc_t>(*weight_sum) : acc_t(0);
}

// dx_c of a class other than the target (the target's is this less cb).
template <typename T>
__device__ __forceinline__ acc_type<T> grad_other(const GradCoefficients<acc_type<T>>& k, acc_type<T> v,
                                                  acc_type<T> m, acc_type<T> ls, acc_type<T> w) {
  return cuda_fma(k.ca, ce_exp_t<T>::exp((v - m) - ls), -(k.cc * w));
}

// A row's loss from its statistics (m, ls), its target logit xt and, with
// smoothing, sx = sum_c w_c x_c (plan.h).
template <bool kSmooth, typename T>
__device__ __forceinline__ acc_type<T> row_loss_of(const ForwardArgs<T>& a, int64_t t, acc_type<T> m,
                                                   acc_type<T> ls, acc_type<T> xt, smooth_sum_t<T> sx) {
  using acc_t = acc_type<T>;
  using sx_t = smooth_sum_t<T>;
  const acc_t wt = a.weight != nullptr ? a.weight[t] : acc_t(1);
  acc_t loss = (1 - a.eps) * wt * ((m - xt) + ls);
  if constexpr (kSmooth) {
    const sx_t W = a.weight != nullptr ? static_cast<sx_t>(*a.weight_sum) : static_cast<sx_t>(a.classes);
    // sum_c w_c (lse - x_c) = W ls + (W m - sum_c w_c x_c), the latter in sx_t
    loss += a.eps_c * (static_cast<acc_t>(W) * ls + static_cast<acc_t>(W * sx_t(m) - sx));
  }
  return loss;
}

// A row's statistics and loss (an ignored row: zeros).
template <typename T>
__device__ __forceinline__ void store_row(const ForwardArgs<T>& a, int64_t row, acc_type<T> m, acc_type<T> ls,
                                          acc_type<T> loss) {
  a.row_stats[2 * row] = m;
  a.row_stats[2 * row + 1] = ls;
  if (a.loss_none != nullptr) a.loss_none[row] = cuda::convert<T>(loss);
  else a.row_loss[row] = loss;
}

template <typename T>
struct BackwardArgs {
  using acc_t = acc_type<T>;
  const T* logits;
  T* grad;
  const int64_t* target64;
  const int32_t* target32;
  const acc_t* weight;
  const double* weight_sum;
  const acc_t* grad_loss;
  const acc_t* row_stats;  // m, ls of each row
  const acc_t* total_weight;
  int* grad_one;  // mean / sum: set to whether grad_loss is 1 (grad_one_flag)
  int64_t rows, classes, row_stride, grad_row_stride, ignore_index;
  int64_t chunk;  // classes of each part of a row
  int64_t parts;  // blocks a row (each writes `chunk` classes)
  acc_t eps, eps_c;
  bool none, mean;
  RowLayout layout;  // the lanes kernels (lanes.cuh)
};

}  // namespace softmax_ext::ce::dev
