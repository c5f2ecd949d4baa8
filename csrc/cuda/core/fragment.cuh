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

#include "cuda/core/budget.h"
#include "cuda/core/numerics.cuh"
#include "cuda/core/reduce.cuh"
#include "cuda/core/vector_io.cuh"

#include <cuda_fp16.h>

#include <cstdint>

namespace softmax_ext::cuda {

struct RowView {
  int64_t n;   // row length
  int shift;   // view position of element 0
  bool vec;    // full packs may use vector accesses
};

// The view of a row of n elements at `row`, for a group holding `capacity`
// view positions: element 0 sits at view position `shift`, its offset from
// the `align`-byte boundary before it (a power of two, at least
// kVectorBytes), so that the group's accesses start on that boundary too.
// Where that shift would push the row's end past the capacity, the shift to
// the 16-byte boundary; where even that does (a row filling its group
// exactly but starting off a 16-byte boundary), the row is moved element by
// element.
template <typename in_t>
__device__ __forceinline__ RowView make_view(const in_t* row, int64_t n, int64_t capacity,
                                             int align = kVectorBytes) {
  const auto address = reinterpret_cast<uintptr_t>(row);
  const int wide = static_cast<int>((address & (align - 1)) / sizeof(in_t));
  if (n + wide <= capacity) return {n, wide, true};
  const int shift = static_cast<int>(address % kVectorBytes / sizeof(in_t));
  if (n + shift <= capacity) return {n, shift, true};
  return {n, 0, false};
}

// Whether every pack of the fragment is a full pack inside the row at a
// 16-byte boundary of `row` (pack k sits k * stride elements, a multiple of
// 16 bytes, after pack 0): the common case, moved with one vector access per
// pack and no per-pack branch. Decided for the warp as a whole: lanes taking
// both paths run them one after the other, which cost f32 forward rows
// that leave some lanes of a group a pack short up to half the bandwidth
// (docs/tuning/warp.md).
template <typename T, int kPacks, int P, typename Index>
__device__ __forceinline__ bool whole_fragment(const T* row, const RowView& view, Index first, Index stride) {
  const Index j0 = first - view.shift;
  const bool whole = view.vec && j0 >= 0 && j0 + (kPacks - 1) * stride + P <= static_cast<Index>(view.n) &&
                     pack_aligned<T, P>(row + j0);
  return __all_sync(__activemask(), whole);
}

// Whether the pack at row position j0 lies inside the row at a 16-byte
// boundary: moved with one vector access.
template <typename T, int P, typename Index>
__device__ __forceinline__ bool full_pack(const T* row, const RowView& view, Index j0) {
  return view.vec && j0 >= 0 && j0 + P <= static_cast<Index>(view.n) && pack_aligned<T, P>(row + j0);
}

// Loads the pack at row position j0 element by element as acc values
// (load_as<out_t>); positions outside the row get `fill`.
template <typename out_t, typename in_t, int P, typename acc_t, typename Index>
__device__ __forceinline__ void load_pack_elements(const in_t* __restrict__ row, const RowView& view, Index j0,
                                                   acc_t (&v)[P], acc_t fill) {
  const Index n = static_cast<Index>(view.n);
#pragma unroll
  for (int e = 0; e < P; ++e) {
    const Index j = j0 + e;
    v[e] = (j >= 0 && j < n) ? load_as<out_t>(row[j]) : fill;
  }
}

// Loads kFrags fragments at the same positions of kFrags rows (the rows a
// warp group holds at once, the backward's dy and y) into acc values, as
// load_as<out_t> (the `dtype=` cast first); positions outside the row get
// `fill`. Full aligned packs are vector accesses, the rest element by
// element (a row end, a row shorter than its group, a row off a 16-byte
// boundary); when every pack is whole, with no per-pack branch. Either way
// every load of every fragment is issued before any value is converted: a
// conversion right after each load would wait for it, leaving one load per
// thread in flight (docs/tuning/warp.md).
template <typename out_t, int kFrags, typename in_t, int kPacks, int P, typename acc_t, typename Index>
__device__ __forceinline__ void load_fragments(const in_t* const (&rows)[kFrags], const RowView (&views)[kFrags],
                                               Index first, Index stride,
                                               acc_t (&v)[kFrags][kPacks][P], acc_t fill) {
  bool whole = true;
#pragma unroll
  for (int f = 0; f < kFrags; ++f) whole = whole && whole_fragment<in_t, kPacks, P>(rows[f], views[f], first, stride);
  Pack<in_t, P> packs[kFrags][kPacks];
  if (whole) {
#pragma unroll
    for (int f = 0; f < kFrags; ++f)
#pragma unroll
      for (int k = 0; k < kPacks; ++k) packs[f][k].load(rows[f] + (first - views[f].shift) + k * stride);
  } else {
    const in_t fill_value(fill);
#pragma unroll
    for (int f = 0; f < kFrags; ++f)
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const Index j0 = first + k * stride - views[f].shift;
        if (full_pack<in_t, P>(rows[f], views[f], j0)) {
          packs[f][k].load(rows[f] + j0);
        } else {
          const Index n = static_cast<Index>(views[f].n);
#pragma unroll
          for (int e = 0; e < P; ++e) {
            const Index j = j0 + e;
            packs[f][k].v[e] = fill_value;
            if (j >= 0 && j < n) packs[f][k].v[e] = rows[f][j];
          }
        }
      }
  }
#pragma unroll
  for (int f = 0; f < kFrags; ++f)
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
#pragma unroll
      for (int e = 0; e < P; ++e) v[f][k][e] = load_as<out_t>(packs[f][k].v[e]);
}

// One fragment of one row. Index is the type of the view positions: int
// where rows are shorter than 2^31 (registers are the warp/block/cluster
// kernels' limit), int64_t for the split family.
template <typename out_t, typename in_t, int kPacks, int P, typename acc_t, typename Index>
__device__ __forceinline__ void load_fragment(const in_t* __restrict__ row, const RowView& view,
                                              Index first, Index stride,
                                              acc_t (&v)[kPacks][P], acc_t fill) {
  const in_t* const rows[1] = {row};
  const RowView views[1] = {view};
  load_fragments<out_t>(rows, views, first, stride, reinterpret_cast<acc_t(&)[1][kPacks][P]>(v), fill);
}

// The backward's dy and y (padding 0), loads of both issued first.
template <typename scalar_t, int kPacks, int P, typename acc_t, typename Index>
__device__ __forceinline__ void load_fragment_pair(const scalar_t* __restrict__ a, const scalar_t* __restrict__ b,
                                                   const RowView& view, Index first, Index stride,
                                                   acc_t (&va)[kPacks][P], acc_t (&vb)[kPacks][P]) {
  const scalar_t* const rows[2] = {a, b};
  const RowView views[2] = {view, view};
  acc_t v[2][kPacks][P];
  load_fragments<scalar_t>(rows, views, first, stride, v, acc_t(0));
#pragma unroll
  for (int k = 0; k < kPacks; ++k)
#pragma unroll
    for (int e = 0; e < P; ++e) {
      va[k][e] = v[0][k][e];
      vb[k][e] = v[1][k][e];
    }
}

// Stores value(k, e) (an acc value) for every row position of the fragment.
template <typename out_t, int kPacks, int P, typename Index, typename Value>
__device__ __forceinline__ void store_fragment(out_t* __restrict__ row, const RowView& view,
                                               Index first, Index stride, Value&& value) {
  if (whole_fragment<out_t, kPacks, P>(row, view, first, stride)) {
    out_t* base = row + (first - view.shift);
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      Pack<out_t, P> p;
#pragma unroll
      for (int e = 0; e < P; ++e) p.v[e] = convert<out_t>(value(k, e));
      p.store(base + k * stride);
    }
    return;
  }
  const Index n = static_cast<Index>(view.n);
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const Index j0 = first + k * stride - view.shift;
    // full_pack's test, spelled out: through the call ptxas spills 8 bytes
    // in the f32 block kernels (ptxas -v, sm_90).
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

// The register fragment of the block and cluster families: kPacks packs per
// thread (the layout above), element (k, e) read as an accumulator value by
// at<kPass>(k, e). Unpacked: accumulator values, widened at load (as
// load_as<out_t>); kPass only matters to packed fragments (below).
template <typename in_t, typename out_t, int kPacks, bool kPacked>
struct Fragment {
  static constexpr int P = kPack<in_t>;
  using acc_t = acc_type<out_t>;
  acc_t v[kPacks][P];

  template <int kPass = 0>
  __device__ __forceinline__ acc_t at(int k, int e) const { return v[k][e]; }
  __device__ __forceinline__ acc_t max() const { return fragment_max(v); }
  // sum(exp(v - max)); with kKeepExp the fragment keeps the exps in place of
  // v (fragment_exp_sum).
  template <bool kKeepExp, typename Exp>
  __device__ __forceinline__ acc_t exp_sum(acc_t max) {
    return fragment_exp_sum<kKeepExp, Exp>(v, max);
  }

  template <typename Index>
  __device__ __forceinline__ void load(const in_t* __restrict__ row, const RowView& view, Index first,
                                       Index stride, acc_t fill) {
    load_fragment<out_t>(row, view, first, stride, v, fill);
  }
  // After a RowStage's wait (staging.cuh): operand f's staged packs from
  // shared memory, the others (at the row's ends, or off alignment) from
  // `row` element by element, as load().
  template <typename Stage, typename Index>
  __device__ __forceinline__ void load_staged(const Stage& stage, int f, const in_t* __restrict__ row,
                                              const RowView& view, Index first, Index stride, acc_t fill) {
    static_assert(Pack<in_t, P>::kChunks == 1, "a staged pack is one 16-byte slot");
    const bool all = stage.all();
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      if (all || stage.has(f, k)) {
        Pack<in_t, P> p;
        p.raw[0] = stage.pack(f, k);
#pragma unroll
        for (int e = 0; e < P; ++e) v[k][e] = load_as<out_t>(p.v[e]);
      } else {
        load_pack_elements<out_t>(row, view, first + k * stride - view.shift, v[k], fill);
      }
    }
  }
  // The backward's dy and y: every load of both issued before either is widened.
  template <typename Index>
  __device__ __forceinline__ static void load_pair(Fragment& a, Fragment& b, const in_t* __restrict__ a_row,
                                                   const in_t* __restrict__ b_row, const RowView& view,
                                                   Index first, Index stride) {
    load_fragment_pair(a_row, b_row, view, first, stride, a.v, b.v);
  }
};

// Packed: f16/bf16 rows stay as they are in memory, two elements per 32-bit
// register, and are widened where the maths reads them: a thread holds twice
// as many elements in the same registers (families/block/policy.h, keeps_packed).
// (Arrays of 16-bit values would take a register each.) Widening is exact,
// and the fast kernels read f16/bf16 as f16/bf16 or f32, so at(k, e) equals
// load_as<out_t> of the element. The max is taken on the packed pairs, so
// the statistics widen the fragment once.
template <typename in_t, typename out_t, int kPacks>
struct Fragment<in_t, out_t, kPacks, true> {
  static_assert(is_reduced_float_v<in_t>, "only 16-bit rows are packed");
  static constexpr int P = kPack<in_t>;
  static constexpr int kWords = P / 2;
  uint32_t w[kPacks][kWords];

  template <int kPass>
  __device__ __forceinline__ float at(int k, int e) const { return widen_half<in_t, kPass>(w[k][e / 2], e); }

  __device__ __forceinline__ float max() const {
    uint32_t m = w[0][0];
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
#pragma unroll
      for (int i = 0; i < kWords; ++i) m = max2<in_t>(m, w[k][i]);
    return NanMax{}(widen_half<in_t, 0>(m, 0), widen_half<in_t, 0>(m, 1));
  }
  // sum(exp(x - max)), as fragment_exp_sum; nothing is kept (no room).
  template <bool kKeepExp, typename Exp>
  __device__ __forceinline__ float exp_sum(float max) const {
    static_assert(!kKeepExp, "a packed fragment has no room for its exps");
    float sum = 0;
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
#pragma unroll
      for (int e = 0; e < P; ++e) sum += Exp::exp(at<0>(k, e) - max);
    return max == neg_infinity<float>() ? 0.0f : sum;
  }

  template <typename Index>
  __device__ __forceinline__ void load(const in_t* __restrict__ row, const RowView& view, Index first,
                                       Index stride, float fill) {
    if (whole_fragment<in_t, kPacks, P>(row, view, first, stride)) {
      const in_t* p = row + (first - view.shift);
#pragma unroll
      for (int k = 0; k < kPacks; ++k) set_pack(k, *reinterpret_cast<const uint4*>(p + k * stride));
      return;
    }
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const Index j0 = first + k * stride - view.shift;
      if (full_pack<in_t, P>(row, view, j0)) set_pack(k, *reinterpret_cast<const uint4*>(row + j0));
      else load_pack_elements(k, row, view, j0, fill);
    }
  }
  // As the unpacked fragment's load_staged.
  template <typename Stage, typename Index>
  __device__ __forceinline__ void load_staged(const Stage& stage, int f, const in_t* __restrict__ row,
                                              const RowView& view, Index first, Index stride, float fill) {
    const bool all = stage.all();
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      if (all || stage.has(f, k)) set_pack(k, stage.pack(f, k));
      else load_pack_elements(k, row, view, first + k * stride - view.shift, fill);
    }
  }
  __device__ __forceinline__ void set_pack(int k, const uint4& r) {
    w[k][0] = r.x;
    w[k][1] = r.y;
    w[k][2] = r.z;
    w[k][3] = r.w;
  }
  // Pack k from row position j0, element by element; `fill` outside the row.
  template <typename Index>
  __device__ __forceinline__ void load_pack_elements(int k, const in_t* __restrict__ row, const RowView& view,
                                                     Index j0, float fill) {
    const uint32_t fill_bits = in_t(fill).x;
    const Index n = static_cast<Index>(view.n);
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      const Index j = j0 + 2 * i;
      const uint32_t lo = j >= 0 && j < n ? row[j].x : fill_bits;
      const uint32_t hi = j + 1 >= 0 && j + 1 < n ? row[j + 1].x : fill_bits;
      w[k][i] = lo | hi << 16;
    }
  }
  // No conversion follows a load here, so nothing stalls between them.
  template <typename Index>
  __device__ __forceinline__ static void load_pair(Fragment& a, Fragment& b, const in_t* __restrict__ a_row,
                                                   const in_t* __restrict__ b_row, const RowView& view,
                                                   Index first, Index stride) {
    a.load(a_row, view, first, stride, 0.0f);
    b.load(b_row, view, first, stride, 0.0f);
  }
};
static_assert(kPack<c10::BFloat16> == 8 && sizeof(uint4) == kVectorBytes, "a packed pack is one uint4");

}  // namespace softmax_ext::cuda
