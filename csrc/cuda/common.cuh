// Device code shared by every CUDA kernel family: numerics (accumulator type,
// dtype conversion, NaN-propagating max, exp/log), the softmax/log_softmax
// epilogues, the row-offset calculator, deterministic block reductions, the
// grid cap and the host-side dtype dispatch.
//
// Everything here is header-only (templates and inline functions), so each
// kernel family's .cu includes it and instantiates only what it uses.
#pragma once

#include "cuda/config.h"
#include "plan/problem.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <cub/block/block_reduce.cuh>
#include <cuda/std/limits>

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

namespace softmax_ext::cuda {

//////////////////////////////////////////////////////////////////////////////
// Numerics
//////////////////////////////////////////////////////////////////////////////

// The accumulator: float for the 16-bit types and float, double for double.
template <typename T>
struct AccType {
  using type = float;
};
template <>
struct AccType<double> {
  using type = double;
};
template <typename T>
using acc_type = typename AccType<T>::type;

template <typename T>
inline constexpr bool is_reduced_float_v =
    std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>;

// Value conversion between the four supported types. The 16-bit types go
// through float, which is exact on the way in and rounds once (to nearest
// even) on the way out; double -> half therefore rounds twice, exactly as
// torch's own casts do.
template <typename To, typename From>
__host__ __device__ __forceinline__ To convert(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (is_reduced_float_v<From>) {
    return convert<To>(static_cast<float>(x));
  } else if constexpr (is_reduced_float_v<To>) {
    return To(static_cast<float>(x));
  } else {
    return static_cast<To>(x);
  }
}

// One input element as the computation sees it: read as in_t, treated as if
// cast to the output dtype first (the `dtype=` argument), then widened to the
// accumulator. The intermediate rounding to out_t is what makes the result
// match torch's softmax(x.to(dtype)).
template <typename out_t, typename in_t>
__device__ __forceinline__ acc_type<out_t> load_as(in_t x) {
  return convert<acc_type<out_t>>(convert<out_t>(x));
}

// Full-precision exp/log (the build never uses fast-math), so values track
// torch's kernels.
__device__ __forceinline__ float acc_exp(float x) { return ::expf(x); }
__device__ __forceinline__ double acc_exp(double x) { return ::exp(x); }
__device__ __forceinline__ float acc_log(float x) { return ::logf(x); }
__device__ __forceinline__ double acc_log(double x) { return ::log(x); }

// Which exp the forward kernels and the log_softmax backward use (exp(y) of a
// 16-bit y: the same argument). Outputs in f16/bf16 keep 8-11 bits, so
// the hardware exp2 approximation (__expf: ~2 ulp of float) cannot change
// them beyond the one rounding to the output type, and it lifts the
// 16-bit-output kernels off the compute limit (twice the elements per byte
// of f32). f32 and f64 outputs use the accurate exp.
struct AccurateExp {
  template <typename acc_t>
  __device__ static __forceinline__ acc_t exp(acc_t x) { return acc_exp(x); }
};
struct FastExp {
  __device__ static __forceinline__ float exp(float x) { return __expf(x); }
  __device__ static __forceinline__ double exp(double x) { return acc_exp(x); }
};

template <typename T>
__host__ __device__ __forceinline__ T neg_infinity() {
  return -::cuda::std::numeric_limits<T>::infinity();
}

// max that returns NaN when either operand is NaN, in either position, so a
// NaN anywhere in a row survives any reduction order (fmaxf would drop it).
// Every later step then turns the whole row into NaN, as torch does.
// On sm_80+ floats take the one-instruction max.NaN (FMNMX.NAN).
struct NanMax {
  template <typename T>
  __host__ __device__ __forceinline__ T operator()(T a, T b) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (std::is_same_v<T, float>) {
      float r;
      asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
      return r;
    }
#endif
    return (a != a || a > b) ? a : b;
  }
};

struct Sum {
  template <typename T>
  __host__ __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};

//////////////////////////////////////////////////////////////////////////////
// Epilogues: softmax and log_softmax share every kernel body; the kernel takes
// the epilogue as a template template parameter, Epilogue<acc_t>.
//////////////////////////////////////////////////////////////////////////////

// Forward: built once per row from the row max and sum(exp(x - max)), then
// applied to every element. Edge cases fall out of x - max: a NaN max (NaN in
// the row), -inf - -inf (all -inf row) and inf - inf (+inf in the row) all
// give NaN sums, hence NaN rows. Subtracting the max first keeps inputs near
// the float limits from overflowing.
// One division per row: elements are scaled by 1 / sum (within an ulp of a
// per-element division, and no division subroutine in the register-bound
// kernels).
//
// operator()(x) computes the output from x (reference, split and strided
// kernels, and packed rows, which take each exp twice). The warp, block and
// cluster kernels take each exp once: they keep `kept` = exp(x - local_max)
// in place of x when kKeepsExp (softmax), where local_max is the max over
// the values the thread (or its lane group) saw, and finish with
// finish(kept, scale_from(local_max)); log_softmax keeps x itself.
template <typename acc_t, typename ExpPolicy = AccurateExp>
struct SoftmaxForwardEpilogue {
  using Exp = ExpPolicy;
  static constexpr bool kKeepsExp = true;
  acc_t max;
  acc_t inv_sum;
  SoftmaxForwardEpilogue() = default;
  __device__ __forceinline__ SoftmaxForwardEpilogue(acc_t row_max, acc_t row_sum)
      : max(row_max), inv_sum(acc_t(1) / row_sum) {}
  __device__ __forceinline__ acc_t operator()(acc_t x) const {
    return Exp::exp(x - max) * inv_sum;
  }
  // exp(local_max - max) / sum; 1 / sum when local_max is the row max. A
  // NaN or all -inf row gives NaN, as operator() would.
  __device__ __forceinline__ acc_t scale_from(acc_t local_max) const {
    return Exp::exp(local_max - max) * inv_sum;
  }
  __device__ __forceinline__ acc_t finish(acc_t kept, acc_t scale) const { return kept * scale; }
};

template <typename acc_t, typename ExpPolicy = AccurateExp>
struct LogSoftmaxForwardEpilogue {
  using Exp = ExpPolicy;
  static constexpr bool kKeepsExp = false;
  acc_t max;
  acc_t log_sum;
  LogSoftmaxForwardEpilogue() = default;
  __device__ __forceinline__ LogSoftmaxForwardEpilogue(acc_t row_max, acc_t row_sum)
      : max(row_max), log_sum(acc_log(row_sum)) {}
  // (x - max) first: no rounding of max + log(sum) for large max, and no
  // overflow when max is near the float limit.
  __device__ __forceinline__ acc_t operator()(acc_t x) const {
    return (x - max) - log_sum;
  }
  __device__ __forceinline__ acc_t scale_from(acc_t) const { return acc_t(0); }
  __device__ __forceinline__ acc_t finish(acc_t x, acc_t) const { return (*this)(x); }
};

// Backward: the row sums reduce_term(dy, y); the epilogue, built from that
// sum, gives dx. kReduceReadsY lets a kernel skip loading y in the reduction
// pass when the term does not use it.
template <typename acc_t>
struct SoftmaxBackwardEpilogue {
  static constexpr bool kReduceReadsY = true;
  __device__ static __forceinline__ acc_t reduce_term(acc_t dy, acc_t y) { return dy * y; }

  acc_t sum;  // sum(dy * y)
  SoftmaxBackwardEpilogue() = default;
  __device__ __forceinline__ explicit SoftmaxBackwardEpilogue(acc_t row_sum) : sum(row_sum) {}
  __device__ __forceinline__ acc_t operator()(acc_t dy, acc_t y) const {
    return y * (dy - sum);
  }
};

template <typename acc_t, typename ExpPolicy = AccurateExp>
struct LogSoftmaxBackwardEpilogue {
  static constexpr bool kReduceReadsY = false;
  __device__ static __forceinline__ acc_t reduce_term(acc_t dy, acc_t) { return dy; }

  acc_t sum;  // sum(dy)
  LogSoftmaxBackwardEpilogue() = default;
  __device__ __forceinline__ explicit LogSoftmaxBackwardEpilogue(acc_t row_sum)
      : sum(row_sum) {}
  __device__ __forceinline__ acc_t operator()(acc_t dy, acc_t y) const {
    return dy - ExpPolicy::exp(y) * sum;
  }
};

template <typename out_t>
using exp_policy_t = std::conditional_t<is_reduced_float_v<out_t>, FastExp, AccurateExp>;

// The epilogues of one kind, so host code can pick them with one switch:
// dispatch_kind(kind, [&](auto e) { kernel<decltype(e)::template Forward, ...> }).
// ForwardFor<out_t>::type is the forward epilogue with out_t's exp policy,
// BackwardFor<scalar_t>::type the backward one with scalar_t's.
struct SoftmaxEpilogues {
  template <typename acc_t>
  using Forward = SoftmaxForwardEpilogue<acc_t>;
  template <typename out_t>
  struct ForwardFor {
    template <typename acc_t>
    using type = SoftmaxForwardEpilogue<acc_t, exp_policy_t<out_t>>;
  };
  template <typename scalar_t>
  struct BackwardFor {
    template <typename acc_t>
    using type = SoftmaxBackwardEpilogue<acc_t>;
  };
};
struct LogSoftmaxEpilogues {
  template <typename acc_t>
  using Forward = LogSoftmaxForwardEpilogue<acc_t>;
  template <typename out_t>
  struct ForwardFor {
    template <typename acc_t>
    using type = LogSoftmaxForwardEpilogue<acc_t, exp_policy_t<out_t>>;
  };
  template <typename scalar_t>
  struct BackwardFor {
    template <typename acc_t>
    using type = LogSoftmaxBackwardEpilogue<acc_t, exp_policy_t<scalar_t>>;
  };
};

template <typename F>
void dispatch_kind(Kind kind, F&& f) {
  if (kind == Kind::LogSoftmax) {
    f(LogSoftmaxEpilogues{});
  } else {
    f(SoftmaxEpilogues{});
  }
}

//////////////////////////////////////////////////////////////////////////////
// Row offsets
//////////////////////////////////////////////////////////////////////////////

// n / d and n % d for non-negative n, d > 0. 64-bit division is a long
// software sequence on the GPU; almost every real problem fits 32 bits.
__device__ __forceinline__ int64_t divmod(int64_t n, int64_t d, int64_t& rem) {
  int64_t q;
  if (((n | d) >> 32) == 0) {
    q = static_cast<uint32_t>(n) / static_cast<uint32_t>(d);
  } else {
    q = n / d;
  }
  rem = n - q * d;
  return q;
}

// Where each row starts in N operands, and how each operand walks the axis.
// A POD copy of the Problem's layout, passed to kernels by value (kernel
// parameter space, no device allocation). Local slot k corresponds to the
// Problem operand slot given to make_row_indexer. All offsets are int64 and
// in elements: strides may be 0 (expanded inputs) or span more than 2^31.
//
// Must match the CPU side: row r is decomposed row-major over batch_size (last
// batch dim fastest); its first element in operand k is at
// sum_d idx[d] * batch_stride[k][d], element j at that + j * axis_stride[k].
template <int N>
struct RowIndexer {
  int64_t rows;
  int64_t axis_size;
  int64_t axis_stride[N];
  int batch_rank;
  int64_t batch_size[kMaxBatchRank];  // outermost first
  int64_t batch_stride[N][kMaxBatchRank];

  __device__ __forceinline__ void row_offsets(int64_t row, int64_t (&offset)[N]) const {
    if (batch_rank == 1) {  // the common case after coalescing: one row stride
#pragma unroll
      for (int k = 0; k < N; ++k) offset[k] = row * batch_stride[k][0];
      return;
    }
#pragma unroll
    for (int k = 0; k < N; ++k) offset[k] = 0;
    // Fully unrolled with compile-time indices so the arrays stay in
    // parameter space; the outermost index needs no division (row < size[0]).
#pragma unroll
    for (int d = kMaxBatchRank - 1; d > 0; --d) {
      if (d < batch_rank) {
        int64_t idx;
        row = divmod(row, batch_size[d], idx);
#pragma unroll
        for (int k = 0; k < N; ++k) offset[k] += idx * batch_stride[k][d];
      }
    }
    if (batch_rank > 0) {
#pragma unroll
      for (int k = 0; k < N; ++k) offset[k] += row * batch_stride[k][0];
    }
  }
};

// Host: copies the layout of the given Problem operand slots, in that order.
template <int N>
inline RowIndexer<N> make_row_indexer(const Problem& problem,
                                      const std::array<Operand, N>& slots) {
  static_assert(std::is_trivially_copyable_v<RowIndexer<N>>);
  TORCH_INTERNAL_ASSERT(problem.batch_rank >= 0 && problem.batch_rank <= kMaxBatchRank,
                        "softmax_ext: batch_rank ", problem.batch_rank, " out of range");
  RowIndexer<N> r{};
  r.rows = problem.rows;
  r.axis_size = problem.axis_size;
  r.batch_rank = problem.batch_rank;
  for (int d = 0; d < problem.batch_rank; ++d) r.batch_size[d] = problem.batch_size[d];
  for (int k = 0; k < N; ++k) {
    r.axis_stride[k] = problem.axis_stride[slots[k]];
    for (int d = 0; d < problem.batch_rank; ++d) {
      r.batch_stride[k][d] = problem.batch_stride[slots[k]][d];
    }
  }
  return r;
}

//////////////////////////////////////////////////////////////////////////////
// Block reductions
//////////////////////////////////////////////////////////////////////////////

// Reduces `value` over the block and returns the result to every thread.
// cub::BlockReduce combines in a fixed order for a given block size, so the
// result is bit-reproducible (no atomics). Must be called by all kBlock threads
// of a 1-D block of exactly kBlock threads. The trailing barrier lets the same
// shared storage be reused by the next call.
template <int kBlock, typename T, typename Op>
__device__ __forceinline__ T block_all_reduce(T value, Op op) {
  using BlockReduce = cub::BlockReduce<T, kBlock>;
  __shared__ typename BlockReduce::TempStorage temp;
  __shared__ T result;
  const T r = BlockReduce(temp).Reduce(value, op);
  if (threadIdx.x == 0) result = r;
  __syncthreads();
  const T all = result;
  __syncthreads();
  return all;
}

//////////////////////////////////////////////////////////////////////////////
// Host helpers: grid size and dtype dispatch
//////////////////////////////////////////////////////////////////////////////

// Row loops are grid-stride, so any grid covers the rows. grid_for_rows: at
// most kMaxGridBlocks blocks, many waves on any current GPU, each block
// walking several rows where there are more. grid_for_each: a block per item
// up to gridDim.x's limit (config.h, grid_walks_rows, says which families
// take which).
constexpr int64_t kMaxGridBlocks = 65535;
constexpr int64_t kMaxGridX = 2147483647;

inline unsigned int grid_for_rows(int64_t rows) {
  return static_cast<unsigned int>(std::clamp<int64_t>(rows, 1, kMaxGridBlocks));
}
inline unsigned int grid_for_each(int64_t items) {
  return static_cast<unsigned int>(std::clamp<int64_t>(items, 1, kMaxGridX));
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) for the C++ type of a supported dtype. select() has
// already rejected anything else; the check keeps a bad call from launching.
template <typename F>
void dispatch_floating_type(c10::ScalarType dtype, const char* where, F&& f) {
  switch (dtype) {
    case c10::ScalarType::Float:
      f(TypeTag<float>{});
      return;
    case c10::ScalarType::Double:
      f(TypeTag<double>{});
      return;
    case c10::ScalarType::Half:
      f(TypeTag<c10::Half>{});
      return;
    case c10::ScalarType::BFloat16:
      f(TypeTag<c10::BFloat16>{});
      return;
    default:
      TORCH_CHECK_NOT_IMPLEMENTED(false, where, ": dtype ", dtype,
                                  " is not supported; supported dtypes are float32, "
                                  "float64, float16 and bfloat16");
  }
}

// Calls f(TypeTag<in_t>{}, TypeTag<out_t>{}) for the (input, output) dtype
// pairs the fast families are compiled for (has_fast_kernels in config.h).
template <typename F>
void dispatch_fast_pair(c10::ScalarType in, c10::ScalarType out, const char* where, F&& f) {
  TORCH_INTERNAL_ASSERT(has_fast_kernels(in, out), where, ": no fast kernel for ", in, " -> ", out);
  if (in == out) {
    dispatch_floating_type(in, where, [&](auto tag) { f(tag, tag); });
  } else if (in == c10::ScalarType::Half) {
    f(TypeTag<c10::Half>{}, TypeTag<float>{});
  } else {
    f(TypeTag<c10::BFloat16>{}, TypeTag<float>{});
  }
}

// True when every row of operand `slot` starts on a 16-byte boundary, so the
// fragment views (fragment.cuh) of all rows have shift 0.
inline bool rows_aligned(const Problem& p, Operand slot, const void* base, int64_t element_bytes) {
  if (reinterpret_cast<uintptr_t>(base) % kVectorBytes != 0) return false;
  for (int d = 0; d < p.batch_rank; ++d)
    if (p.batch_stride[slot][d] * element_bytes % kVectorBytes != 0) return false;
  return true;
}

// View positions a row may need beyond its length: the largest shift of a
// row that does not start on a 16-byte boundary.
inline int64_t view_slack(const Problem& p, Operand slot, const void* base, int64_t element_bytes) {
  return rows_aligned(p, slot, base, element_bytes) ? 0 : pack_size(element_bytes) - 1;
}

inline int64_t next_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}
// The largest power of two not above v (v >= 1).
inline int64_t prev_pow2(int64_t v) { return next_pow2(v + 1) / 2; }

// Calls f(std::true_type{}) or f(std::false_type{}): a runtime flag as a
// template argument.
template <typename F>
void dispatch_bool(bool flag, F&& f) {
  if (flag) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

// Calls f(std::integral_constant<int, K>{}) for the compiled fragment size
// K in {1, 2, 4, 8, 16} (K <= kMax) equal to `packs`.
template <int kMax, typename F>
void dispatch_packs(int packs, F&& f) {
  auto one = [&](auto k) {
    if constexpr (decltype(k)::value <= kMax) {
      if (packs == decltype(k)::value) {
        f(k);
        return true;
      }
    }
    return false;
  };
  const bool done = one(std::integral_constant<int, 1>{}) || one(std::integral_constant<int, 2>{}) ||
                    one(std::integral_constant<int, 4>{}) || one(std::integral_constant<int, 8>{}) ||
                    one(std::integral_constant<int, 16>{});
  TORCH_INTERNAL_ASSERT(done, "softmax_ext: no kernel for ", packs, " packs per thread");
}

// Double-precision accumulation (f64 output) halves the per-thread budget.
template <typename out_t>
inline constexpr bool is_double_acc_v = std::is_same_v<acc_type<out_t>, double>;

}  // namespace softmax_ext::cuda
