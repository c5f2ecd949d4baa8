// Register fragments of contiguous rows, moved with 16-byte vector accesses.
//
// A group of G threads (part of a warp, a block, or a cluster's blocks) holds
// a row in registers. Thread t keeps kPacks packs of P = 16 / sizeof(in_t)
// consecutive elements; pack k covers view positions
//     first + k * stride + [0, P),   first = base + t * P,   stride = G * P,
// so one warp instruction reads one contiguous, coalesced stretch.
//
// The view is the row shifted back to the previous 16-byte boundary of the
// input, so every full pack is an aligned vector access whatever the row's
// offset (sliced tensors, odd row lengths): element j sits at view position
// j + shift. Packs that straddle either end of the row are read and written
// element by element; a pack whose address in another operand is not aligned
// (another offset there) falls back the same way.
#pragma once

#include "cuda/common.cuh"
#include "cuda/config.h"

#include <cstdint>

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
  __device__ __forceinline__ void store(T* p) const {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) reinterpret_cast<Raw*>(p)[i] = raw[i];
  }
};

template <typename T, int P>
__device__ __forceinline__ bool pack_aligned(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % Pack<T, P>::kChunk == 0;
}

struct RowView {
  int64_t n;   // row length
  int shift;   // view position of element 0
  bool vec;    // full packs may use vector accesses
};

// The view of a row of n elements at `row`, for a group holding `capacity`
// view positions. When the shift would push the row's end past the capacity
// (a row filling its group exactly but starting off a 16-byte boundary), the
// row is moved element by element instead.
template <typename in_t>
__device__ __forceinline__ RowView make_view(const in_t* row, int64_t n, int64_t capacity) {
  const int shift =
      static_cast<int>(reinterpret_cast<uintptr_t>(row) % kVectorBytes / sizeof(in_t));
  if (n + shift <= capacity) return {n, shift, true};
  return {n, 0, false};
}

// Loads packs into acc values (as load_as<out_t>: the `dtype=` cast first);
// positions outside the row get `fill`. Index is the type of the view
// positions: int where rows are shorter than 2^31 (registers are the
// warp/block/cluster kernels' limit), int64_t for the split family.
template <typename out_t, typename in_t, int kPacks, int P, typename acc_t, typename Index>
__device__ __forceinline__ void load_fragment(const in_t* __restrict__ row, const RowView& view,
                                              Index first, Index stride,
                                              acc_t (&v)[kPacks][P], acc_t fill) {
  const Index n = static_cast<Index>(view.n);
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const Index j0 = first + k * stride - view.shift;
    if (view.vec && j0 >= 0 && j0 + P <= n && pack_aligned<in_t, P>(row + j0)) {
      Pack<in_t, P> p;
      p.load(row + j0);
#pragma unroll
      for (int e = 0; e < P; ++e) v[k][e] = load_as<out_t>(p.v[e]);
    } else {
#pragma unroll
      for (int e = 0; e < P; ++e) {
        const Index j = j0 + e;
        v[k][e] = (j >= 0 && j < n) ? load_as<out_t>(row[j]) : fill;
      }
    }
  }
}

// Stores value(k, e) (an acc value) for every row position of the fragment.
template <typename out_t, int kPacks, int P, typename Index, typename Value>
__device__ __forceinline__ void store_fragment(out_t* __restrict__ row, const RowView& view,
                                               Index first, Index stride, Value&& value) {
  const Index n = static_cast<Index>(view.n);
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const Index j0 = first + k * stride - view.shift;
    if (view.vec && j0 >= 0 && j0 + P <= n && pack_aligned<out_t, P>(row + j0)) {
      Pack<out_t, P> p;
#pragma unroll
      for (int e = 0; e < P; ++e) p.v[e] = convert<out_t>(value(k, e));
      p.store(row + j0);
    } else {
#pragma unroll
      for (int e = 0; e < P; ++e) {
        const Index j = j0 + e;
        if (j >= 0 && j < n) row[j] = convert<out_t>(value(k, e));
      }
    }
  }
}

}  // namespace softmax_ext::cuda
