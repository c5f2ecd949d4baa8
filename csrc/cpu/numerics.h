// Elementwise math of the kernels on at::vec::Vectorized<acc_t>.
//
// vmax propagates NaN (std::max / fmax would drop it): a NaN anywhere in a
// row must make the row's max NaN, and then every output of the row NaN.
#pragma once

#ifndef CPU_CAPABILITY
#error "include from a per-ISA TU (kernels_*.cpp) that defines CPU_CAPABILITY"
#endif

#include <ATen/cpu/vec/vec.h>

#include <type_traits>

namespace softmax_ext::cpu::CPU_CAPABILITY {

template <typename T>
using Vec = at::vec::Vectorized<T>;

// Accumulator for an output dtype: double for double, float otherwise.
template <typename out_t>
using acc_type_t = std::conditional_t<std::is_same_v<out_t, double>, double, float>;

template <typename T>
inline Vec<T> vmax(const Vec<T>& a, const Vec<T>& b) {
  return at::vec::maximum(a, b);
}

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
// exp of float lanes within about 1 ulp (Sleef's exp, which torch calls, is
// 1 ulp), inline: Sleef's is an out-of-line call after which no vector
// register survives, and in a softmax row the exp is most of the work.
//   x = q ln2 + r with q = round(x log2 e) and |r| <= ln2 / 2, ln2 split in
//   two (Cody and Waite: the first part has 9 significant bits, so q times
//   it is exact for |q| <= 2^15);
//   e^r by its Taylor polynomial of degree 7 in Horner form (truncation
//   below 1e-8 relative);
//   2^q as two powers of two, each a normal float, so that a result in the
//   subnormal range is rounded once.
// x is first clamped to [-87.33, 89] (e^-87.33 is about the smallest
// normal float), so that no lane's arithmetic makes a subnormal or
// underflows to 0: with x clamped to [-104, 89] instead, float rows with
// lanes of -inf (masked attention scores, the lanes past a short row) took
// about twice as long on an AMD EPYC with AVX-512 (a (174762, 32) softmax
// with 8 lanes of -inf a row: 10.0 ms against 5.1-5.6 with them at -50; the
// README's CPU section). Lanes below -87.33 are 0 where x <= -104 (-inf
// included); only where a lane lies between the two (a subnormal result)
// is the vector computed again over [-104, 89] for those lanes, the slow
// way, so every result has the same bits as before. NaN lanes are put back
// at the end.
C10_ALWAYS_INLINE Vec<float> exp_f32_clamped(const Vec<float>& x, float low) {
  using V = Vec<float>;
  // (the plain max / min instructions: a NaN lane becomes `low` here and is
  // put back by exp_f32, so at::vec's NaN-propagating forms are not needed)
#if defined(CPU_CAPABILITY_AVX512)
  const V xc = _mm512_min_ps(_mm512_max_ps(x, V(low)), V(89.f));
#else
  const V xc = _mm256_min_ps(_mm256_max_ps(x, V(low)), V(89.f));
#endif
  const V q = (xc * V(1.44269504088896341f)).round();
  V r = at::vec::fmadd(q, V(-0.693359375f), xc);
  r = at::vec::fmadd(q, V(2.12194440e-4f), r);
  V p(1.f / 5040.f);
  p = at::vec::fmadd(p, r, V(1.f / 720.f));
  p = at::vec::fmadd(p, r, V(1.f / 120.f));
  p = at::vec::fmadd(p, r, V(1.f / 24.f));
  p = at::vec::fmadd(p, r, V(1.f / 6.f));
  p = at::vec::fmadd(p, r, V(0.5f));
  p = at::vec::fmadd(p, r, V(1.f));
  p = at::vec::fmadd(p, r, V(1.f));
  using I = Vec<int32_t>;
  const I qi = at::vec::convert_to_int_of_same_size(q);
  const I q1 = qi >> I(1), q2 = qi - q1;
  const V s1 = at::vec::cast<float>((q1 + I(127)) << I(23));
  const V s2 = at::vec::cast<float>((q2 + I(127)) << I(23));
  return (p * s1) * s2;
}

C10_ALWAYS_INLINE Vec<float> exp_f32(const Vec<float>& x) {
  using V = Vec<float>;
  constexpr float kNormal = -87.33f, kZero = -104.f;
  V e = exp_f32_clamped(x, kNormal);
  // lanes whose result is 0 or subnormal (low), those of them subnormal (sub)
#if defined(CPU_CAPABILITY_AVX512)
  const __mmask16 low = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kNormal), _CMP_LT_OQ);
  if (C10_UNLIKELY(low != 0)) {
    const __mmask16 sub = low & _mm512_cmp_ps_mask(x, _mm512_set1_ps(kZero), _CMP_GT_OQ);
    e = _mm512_mask_mov_ps(e, low, sub != 0 ? exp_f32_clamped(x, kZero) : V(0.f));
  }
#else
  const __m256 low = _mm256_cmp_ps(x, _mm256_set1_ps(kNormal), _CMP_LT_OQ);
  if (C10_UNLIKELY(_mm256_movemask_ps(low) != 0)) {
    const __m256 sub = _mm256_and_ps(low, _mm256_cmp_ps(x, _mm256_set1_ps(kZero), _CMP_GT_OQ));
    e = _mm256_blendv_ps(e, _mm256_movemask_ps(sub) != 0 ? exp_f32_clamped(x, kZero) : V(0.f), low);
  }
#endif
  return V::blendv(e, x, x.isnan());
}
#endif

// Whether vexp / exp_shifted of T lanes are inline code (no call).
template <typename T>
inline constexpr bool kInlineExp =
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
    std::is_same_v<T, float>;
#else
    false;
#endif

// exp at the accuracy of torch's (1 ulp): the inline exp_f32 for float lanes
// on x86, Sleef's otherwise.
template <typename T>
C10_ALWAYS_INLINE Vec<T> vexp(const Vec<T>& x) {
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<T, float>) return exp_f32(x);
#endif
  return x.exp();
}

// exp(x - max), whose argument is <= 0 or NaN. kFast (used when the output
// is 16-bit) takes ATen's polynomial exp_u20, faster still: its error (tens
// of float ulps, more only where the result is below 1e-37 and adds nothing
// to the sum) vanishes in rounding to 8 or 11 bits. Float and double outputs
// take vexp (1 ulp), like torch. exp_u20 turns NaN into inf, so NaN lanes
// are put back.
template <bool kFast, typename T>
C10_ALWAYS_INLINE Vec<T> exp_shifted(const Vec<T>& x) {
  if constexpr (kFast) {
    return Vec<T>::blendv(x.exp_u20(), x, x.isnan());
  } else {
    return vexp(x);
  }
}

template <typename T>
inline Vec<T> vlog(const Vec<T>& x) {
  return x.log();
}

}  // namespace softmax_ext::cpu::CPU_CAPABILITY
