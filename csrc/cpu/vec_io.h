// Moving data between memory dtypes and the accumulator's vectors.
//
// The vector loops step in blocks of kBlock<acc_t> = two Vectorized<acc_t>
// (for float: exactly one Vectorized<Half> / Vectorized<BFloat16>, so 16-bit
// data converts in whole registers). A block is read as the pair (a, b).
//
// Io<mem_t, val_t, acc_t> reads mem_t elements *as if cast to val_t first*
// (the forward `dtype=` semantics: x of in_t treated as out_t) into acc_t,
// and writes acc_t back as mem_t. A partial block (len < kBlock) goes through
// a small stack buffer; lanes past len read as `pad`, chosen by the caller so
// they cannot change a reduction (-inf for max and exp-sum, 0 for sums).
#pragma once

#ifndef CPU_CAPABILITY
#error "include from a per-ISA TU (kernels_*.cpp) that defines CPU_CAPABILITY"
#endif

#include "cpu/numerics.h"

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <type_traits>

namespace softmax_ext::cpu::CPU_CAPABILITY {

template <typename acc_t>
inline constexpr int64_t kBlock = 2 * Vec<acc_t>::size();

template <typename T>
inline constexpr bool kIs16Bit = std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>;

static_assert(Vec<c10::Half>::size() == kBlock<float> &&
                  Vec<c10::BFloat16>::size() == kBlock<float>,
              "a block of float must be one 16-bit vector");

// One element of mem_t, read as val_t, widened to acc_t (torch's casts).
template <typename val_t, typename acc_t, typename mem_t>
inline acc_t load_as(mem_t v) {
  return static_cast<acc_t>(static_cast<val_t>(v));
}

template <typename mem_t, typename val_t, typename acc_t>
struct Io {
  using V = Vec<acc_t>;
  static constexpr int64_t kW = V::size();
  static constexpr int64_t kB = kBlock<acc_t>;

  // Fast paths; everything else converts element by element.
  static constexpr bool kPlain = std::is_same_v<mem_t, acc_t> && std::is_same_v<val_t, acc_t>;
  // 16-bit data widened to float (val_t is the data's own type or float,
  // both exact from 16 bits).
  static constexpr bool kWiden = kIs16Bit<mem_t> && std::is_same_v<acc_t, float> &&
                                 (std::is_same_v<val_t, mem_t> || std::is_same_v<val_t, float>);
  // float data treated as a 16-bit type: round through it in registers.
  static constexpr bool kRound = std::is_same_v<mem_t, float> && std::is_same_v<acc_t, float> &&
                                 kIs16Bit<val_t>;

  // The full-block paths are forced inline: called out of line (GCC's choice
  // once the partial path is counted in), a block would come back through
  // the stack, and the next instruction would stall on that store (measured:
  // a quarter of a cache-resident softmax row). Partial blocks go out of line.
  C10_ALWAYS_INLINE static void load(const mem_t* p, int64_t len, acc_t pad, V& a, V& b) {
    if (C10_LIKELY(len == kB)) {
      if constexpr (kPlain) {
        a = V::loadu(p);
        b = V::loadu(p + kW);
        return;
      } else if constexpr (kWiden) {
        at::vec::load_to_float(p, a, b);
        return;
      } else if constexpr (kRound) {
        a = V::loadu(p);
        b = V::loadu(p + kW);
        std::tie(a, b) = at::vec::convert_to_float<val_t>(at::vec::convert_from_float<val_t>(a, b));
        return;
      }
    }
    load_partial(p, len, pad, a, b);
  }

#if defined(CPU_CAPABILITY_AVX2)
  // AVX2 float rows: masked loads and stores, lanes past the row set to pad
  // (short rows are mostly partial blocks).
  static constexpr bool kMasked = kPlain && std::is_same_v<acc_t, float>;
  static __m256i lanes_below(int64_t count) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::clamp<int64_t>(count, 0, kW))),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V masked_load(const float* p, int64_t count, float pad) {
    const __m256i m = lanes_below(count);
    return _mm256_blendv_ps(_mm256_set1_ps(pad), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
  }
  // A row of n <= kW elements as one vector, lanes past it `pad` (inline:
  // the short-row path of row_kernel.h).
  static V load_vector(const float* p, int64_t n, float pad) { return n == kW ? V::loadu(p) : masked_load(p, n, pad); }
  static void store_vector(float* p, int64_t n, const V& v) {
    if (n == kW) v.store(p);
    else _mm256_maskstore_ps(p, lanes_below(n), v);
  }
#else
  static constexpr bool kMasked = false;
#endif

  C10_NOINLINE static void load_partial(const mem_t* p, int64_t len, acc_t pad, V& a, V& b) {
#if defined(CPU_CAPABILITY_AVX2)
    if constexpr (kMasked) {
      a = masked_load(p, len, pad);
      b = len > kW ? masked_load(p + kW, len - kW, pad) : V(pad);
      return;
    }
#endif
    alignas(64) acc_t buf[kB];
    for (int64_t i = 0; i < kB; ++i) buf[i] = pad;
    for (int64_t i = 0; i < std::min(len, kB); ++i) buf[i] = load_as<val_t, acc_t>(p[i]);
    a = V::loadu(buf);
    b = V::loadu(buf + kW);
  }

  C10_ALWAYS_INLINE static void store(mem_t* p, int64_t len, const V& a, const V& b) {
    if (C10_LIKELY(len == kB)) {
      if constexpr (std::is_same_v<mem_t, acc_t>) {
        a.store(p);
        b.store(p + kW);
        return;
      } else if constexpr (kIs16Bit<mem_t> && std::is_same_v<acc_t, float>) {
        at::vec::convert_from_float<mem_t>(a, b).store(p);
        return;
      }
    }
    store_partial(p, len, a, b);
  }

  C10_NOINLINE static void store_partial(mem_t* p, int64_t len, const V& a, const V& b) {
#if defined(CPU_CAPABILITY_AVX2)
    if constexpr (kMasked) {
      _mm256_maskstore_ps(p, lanes_below(len), a);
      if (len > kW) _mm256_maskstore_ps(p + kW, lanes_below(len - kW), b);
      return;
    }
#endif
    alignas(64) acc_t buf[kB];
    a.store(buf);
    b.store(buf + kW);
    for (int64_t i = 0; i < std::min(len, kB); ++i) p[i] = static_cast<mem_t>(buf[i]);
  }
};

// Calls body(j, len) over [0, n) in blocks of B: full ones, then one partial.
template <int64_t B, typename Body>
inline void for_blocks(int64_t n, const Body& body) {
  int64_t j = 0;
  for (; j + B <= n; j += B) body(j, B);
  if (j < n) body(j, n - j);
}

}  // namespace softmax_ext::cpu::CPU_CAPABILITY
