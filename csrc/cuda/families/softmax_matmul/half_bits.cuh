// Raw<T>: the bits of 16-bit (bf16 / f16) values as the tensor-core
// kernels hold them, two to a 32-bit register: unpack a pair to float2,
// pack two floats (round to nearest even), one value's bits, -inf's bits;
// to_tf32: a float's TF32 bits (rounded to nearest, ties away from zero).
// Shared by the mma.sync kernel (kernel.cuh) and the Hopper kernels
// (sm90_common.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace softmax_ext::smm::cuda {

__device__ __forceinline__ uint32_t to_tf32(float f) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(f));
  return r;
}

template <typename T> struct Raw;
template <> struct Raw<__nv_bfloat16> {
  static constexpr uint32_t kNegInf = 0xFF80u;
  static __device__ __forceinline__ float2 to2(uint32_t u) {
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xFFFF0000u));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ uint16_t bits(float f) {
    __nv_bfloat16 h = __float2bfloat16_rn(f);
    return *reinterpret_cast<uint16_t*>(&h);
  }
};
template <> struct Raw<__half> {
  static constexpr uint32_t kNegInf = 0xFC00u;
  static __device__ __forceinline__ float2 to2(uint32_t u) {
    __half2 h = *reinterpret_cast<__half2*>(&u);
    return __half22float2(h);
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ uint16_t bits(float f) {
    __half h = __float2half_rn(f);
    return *reinterpret_cast<uint16_t*>(&h);
  }
};

}  // namespace softmax_ext::smm::cuda
