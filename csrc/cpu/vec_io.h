// Moving data between memory dtypes and the accumulator's vectors.
//
// The vector loops step in blocks of kBlock<acc_t> = two Vectorized<acc_t>
// (for float: exactly one Vectorized<Half> / Vectorized<BFloat16>, so 16-bit
// data converts in whole registers). A block is read as the pair (a, b).
//
// Io<mem_t, val_t, acc_t> reads mem_t elements *as if cast to val_t first*
// (the forward `dtype=` semantics: x of in_t treated as out_t) into acc_t,
// and writes acc_t back as mem_t. A partial block (len < kBlock) is read and
// written with masked vector accesses where the ISA has them (x86 float
// rows; AVX-512 16-bit rows too), through a small stack buffer otherwise;
// lanes past len read as `pad`, chosen by the caller so they cannot change a
// reduction (-inf for max and exp-sum, 0 for sums).
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
  // a quarter of a cache-resident softmax row). Masked partial blocks are a
  // few instructions and inline too; the stack-buffer ones go out of line.
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
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
    if constexpr (kMasked || kMasked16) {  // a few instructions: inline
      load_masked(p, len, pad, a, b);
      return;
    }
#endif
    load_partial(p, len, pad, a, b);
  }

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
  // x86 float rows: masked loads and stores, lanes past the row set to pad
  // (short rows are mostly partial blocks). A masked-off lane is never
  // touched in memory.
  static constexpr bool kMasked = kPlain && std::is_same_v<acc_t, float>;
#if defined(CPU_CAPABILITY_AVX512)
  static __mmask16 lanes_below(int64_t count) {
    return static_cast<__mmask16>((1u << std::clamp<int64_t>(count, 0, kW)) - 1u);
  }
  static V masked_load(const float* p, int64_t count, float pad) {
    return _mm512_mask_loadu_ps(_mm512_set1_ps(pad), lanes_below(count), p);
  }
  static void masked_store(float* p, int64_t count, const V& v) { _mm512_mask_storeu_ps(p, lanes_below(count), v); }
#else
  static __m256i lanes_below(int64_t count) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::clamp<int64_t>(count, 0, kW))),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V masked_load(const float* p, int64_t count, float pad) {
    const __m256i m = lanes_below(count);
    return _mm256_blendv_ps(_mm256_set1_ps(pad), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
  }
  static void masked_store(float* p, int64_t count, const V& v) { _mm256_maskstore_ps(p, lanes_below(count), v); }
#endif
#else
  static constexpr bool kMasked = false;
#endif
#if defined(CPU_CAPABILITY_AVX512)
  // AVX-512 16-bit rows widened to float: a partial block is one masked
  // 16-bit load (or store) of up to 32 lanes.
  static constexpr bool kMasked16 = kWiden;
  static __mmask32 lanes16_below(int64_t count) {
    const int64_t c = std::clamp<int64_t>(count, 0, kB);
    return c == 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << c) - 1u);
  }
#else
  static constexpr bool kMasked16 = false;
#endif

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
  C10_ALWAYS_INLINE static void load_masked(const mem_t* p, int64_t len, acc_t pad, V& a, V& b) {
    if constexpr (kMasked) {
      a = masked_load(p, len, pad);
      b = len > kW ? masked_load(p + kW, len - kW, pad) : V(pad);
    }
#if defined(CPU_CAPABILITY_AVX512)
    if constexpr (kMasked16) {
      const __mmask32 m = lanes16_below(len);
      std::tie(a, b) = at::vec::convert_to_float<mem_t>(Vec<mem_t>(_mm512_maskz_loadu_epi16(m, p)));
      a = _mm512_mask_blend_ps(static_cast<__mmask16>(m), _mm512_set1_ps(pad), a);
      b = _mm512_mask_blend_ps(static_cast<__mmask16>(m >> 16), _mm512_set1_ps(pad), b);
    }
#endif
  }
#endif

  C10_NOINLINE static void load_partial(const mem_t* p, int64_t len, acc_t pad, V& a, V& b) {
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
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
    if constexpr (kMasked) {
      masked_store(p, len, a);
      if (len > kW) masked_store(p + kW, len - kW, b);
      return;
    }
#endif
#if defined(CPU_CAPABILITY_AVX512)
    if constexpr (kIs16Bit<mem_t> && std::is_same_v<acc_t, float>) {
      _mm512_mask_storeu_epi16(p, lanes16_below(len), at::vec::convert_from_float<mem_t>(a, b));
      return;
    }
#endif
    store_partial(p, len, a, b);
  }

  C10_NOINLINE static void store_partial(mem_t* p, int64_t len, const V& a, const V& b) {
    alignas(64) acc_t buf[kB];
    a.store(buf);
    b.store(buf + kW);
    for (int64_t i = 0; i < std::min(len, kB); ++i) p[i] = static_cast<mem_t>(buf[i]);
  }
};

// v with its lanes from `count` on (0 <= count <= V::size()) set to 0: one
// masked move or AND for x86 float (and AVX-512 double) lanes, where ATen's
// Vectorized::set(zero, v, count) is a switch over the count. The same bits.
template <typename V>
C10_ALWAYS_INLINE V zero_lanes_from(const V& v, int64_t count) {
  using T = typename V::value_type;
  const int c = static_cast<int>(std::clamp<int64_t>(count, 0, V::size()));
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<T, float>) return _mm512_maskz_mov_ps(static_cast<__mmask16>((1u << c) - 1u), v);
  if constexpr (std::is_same_v<T, double>) return _mm512_maskz_mov_pd(static_cast<__mmask8>((1u << c) - 1u), v);
#elif defined(CPU_CAPABILITY_AVX2)
  if constexpr (std::is_same_v<T, float>)
    return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(c),
                                                                    _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))));
#endif
  return V::set(V(T(0)), v, c);
}

// Calls body(j, len) over [0, n) in blocks of B: full ones, then one partial.
template <int64_t B, typename Body>
inline void for_blocks(int64_t n, const Body& body) {
  int64_t j = 0;
  for (; j + B <= n; j += B) body(j, B);
  if (j < n) body(j, n - j);
}

}  // namespace softmax_ext::cpu::CPU_CAPABILITY
