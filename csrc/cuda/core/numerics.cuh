// Numerics every CUDA kernel shares: the accumulator type, conversion
// between the four dtypes, the NaN-propagating max, exp and log (accurate,
// or the hardware approximation where 16-bit outputs cannot tell).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda/std/limits>

#include <type_traits>

namespace softmax_ext::cuda {

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

// Double-precision accumulation (f64 output) halves the per-thread budget.
template <typename out_t>
inline constexpr bool is_double_acc_v = std::is_same_v<acc_type<out_t>, double>;

}  // namespace softmax_ext::cuda
