// Vector IO: 16-byte packs of elements moved as one load or store, and
// 16-bit values kept packed two to a register (widened where the maths
// reads them).
#pragma once

#include "cuda/core/budget.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <type_traits>

namespace softmax_ext::cuda {

template <typename T>
inline constexpr int kPack = kVectorBytes / static_cast<int>(sizeof(T));

// The unsigned integer (vector) type of a given byte size: a pack moves
// through it, so the compiler emits one LDG/STG of the pack's width even for
// element types with constructors (c10::Half, c10::BFloat16), which would
// otherwise be copied element by element.
template <int kBytes>
struct RawBits;
template <>
struct RawBits<2> { using type = unsigned short; };
template <>
struct RawBits<4> { using type = unsigned int; };
template <>
struct RawBits<8> { using type = uint2; };
template <>
struct RawBits<16> { using type = uint4; };

template <typename T, int P>
struct Pack {
  static constexpr int kBytes = static_cast<int>(sizeof(T)) * P;
  static constexpr int kChunk = kBytes < kVectorBytes ? kBytes : kVectorBytes;
  static constexpr int kChunks = kBytes / kChunk;
  using Raw = typename RawBits<kChunk>::type;
  union {
    Raw raw[kChunks];
    T v[P];
  };
  __device__ __forceinline__ Pack() {}
  __device__ __forceinline__ void load(const T* p) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) raw[i] = reinterpret_cast<const Raw*>(p)[i];
  }
  // To global memory. 16- and 8-byte chunks go out as explicit vector
  // stores: through the union the compiler may split them into one store
  // per element (it did in the strided and split kernels: four times the
  // store instructions, and partial-sector writes the L2 has to merge).
  __device__ __forceinline__ void store(T* p) const {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      if constexpr (kChunk == 16) {
        asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(reinterpret_cast<Raw*>(p) + i),
                     "r"(raw[i].x), "r"(raw[i].y), "r"(raw[i].z), "r"(raw[i].w)
                     : "memory");
      } else if constexpr (kChunk == 8) {
        asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(reinterpret_cast<Raw*>(p) + i), "r"(raw[i].x),
                     "r"(raw[i].y)
                     : "memory");
      } else {
        reinterpret_cast<Raw*>(p)[i] = raw[i];
      }
    }
  }
};

template <typename T, int P>
__device__ __forceinline__ bool pack_aligned(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % Pack<T, P>::kChunk == 0;
}

// Widens half `e % 2` of a word of two f16/bf16 values to float. Each pass
// over a packed fragment (kPass 0: the reduction, 1: the output) widens with
// instructions of its own: ptxas merges identical instructions on the same
// register even in volatile asm, and would otherwise keep the first pass's
// widened values, twice the fragment's registers, for the second (spilling
// 16-160 bytes per thread). prmt selectors zero the other half.
template <typename in_t, int kPass>
__device__ __forceinline__ float widen_half(uint32_t word, int e) {
  static_assert(kPass == 0 || kPass == 1, "a packed fragment is read in two passes");
  float out;
  if constexpr (std::is_same_v<in_t, c10::BFloat16>) {
    if constexpr (kPass == 0) {
      if (e % 2) asm volatile("and.b32 %0, %1, 0xffff0000;" : "=f"(out) : "r"(word));
      else asm volatile("shl.b32 %0, %1, 16;" : "=f"(out) : "r"(word));
    } else {
      if (e % 2) asm volatile("prmt.b32 %0, %1, 0, 0x3244;" : "=f"(out) : "r"(word));
      else asm volatile("prmt.b32 %0, %1, 0, 0x1044;" : "=f"(out) : "r"(word));
    }
  } else {
    if constexpr (kPass == 0) {
      if (e % 2) asm volatile("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, hi; }" : "=f"(out) : "r"(word));
      else asm volatile("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, lo; }" : "=f"(out) : "r"(word));
    } else {
      if (e % 2) asm volatile("{ .reg .b32 t; .reg .b16 lo, hi; prmt.b32 t, %1, 0, 0x4432; mov.b32 {lo, hi}, t; cvt.f32.f16 %0, lo; }" : "=f"(out) : "r"(word));
      else asm volatile("{ .reg .b32 t; .reg .b16 lo, hi; prmt.b32 t, %1, 0, 0x4410; mov.b32 {lo, hi}, t; cvt.f32.f16 %0, lo; }" : "=f"(out) : "r"(word));
    }
  }
  return out;
}

// The NaN-propagating max of the two 16-bit pairs in a and b, pairwise
// (sm_80+, as the whole build: setup.py).
template <typename in_t>
__device__ __forceinline__ uint32_t max2(uint32_t a, uint32_t b) {
  uint32_t r;
  if constexpr (std::is_same_v<in_t, c10::BFloat16>) {
    asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  } else {
    asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  }
  return r;
}

}  // namespace softmax_ext::cuda
