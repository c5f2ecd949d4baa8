// Staging through shared memory with cp.async: the copy primitives, the
// next row of the cluster family, and the held tiles of the resident split
// family.
//
// Row staging (the cluster family): while a block reduces and stores row
// r from its registers, the fragment it will hold of row r + step is already
// on its way into shared memory (cp.async, 16 bytes per copy, no register
// waits on it), so the memory system does not idle through the cluster's
// reductions and exchanges. The next row's registers are then filled from
// shared memory.
//
// Thread t's pack k of operand f sits in slot (f * kPacks + k) * blockDim.x
// + t: each thread reads back only what it copied, so cp.async.wait_group
// alone orders its copies before its reads, with no block barrier. Only
// full, aligned packs are staged; the few at a row's ends (or off
// alignment) are read from global memory when the row is taken up.
#pragma once

#include "cuda/core/fragment.cuh"
#include "cuda/core/row_indexer.cuh"

#include <cstdint>
#include <type_traits>

namespace softmax_ext::cuda {

__device__ __forceinline__ void cp_async_16(uint32_t shared, const void* global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared), "l"(global) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
// kBytes (4, 8 or 16) from global to shared memory, zero-filled past the
// first `valid` bytes (0: nothing is read, all zeros).
template <int kBytes>
__device__ __forceinline__ void cp_async_zfill(uint32_t shared, const void* global, int valid) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(shared), "l"(global), "r"(valid) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(shared), "l"(global), "n"(kBytes), "r"(valid)
                 : "memory");
  }
}
// Waits until at most kPending of this thread's committed groups are in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ uint4 load_shared_16(uint32_t shared) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(shared)
               : "memory");
  return v;
}

// Dynamic shared memory of a block staging kFrags fragments of kPacks packs.
constexpr int64_t stage_bytes(int frags, int packs, int threads) {
  return int64_t{frags} * packs * threads * kVectorBytes;
}

template <int kFrags, int kPacks>
struct RowStage {
  static_assert(kFrags * kPacks <= 32, "one bit per pack");
  static constexpr uint32_t kAll = kFrags * kPacks == 32 ? ~0u : (1u << (kFrags * kPacks)) - 1;
  uint32_t base;    // shared address of this thread's slot of pack 0 of operand 0
  uint32_t staged;  // bit f * kPacks + k: pack k of operand f is being copied

  __device__ __forceinline__ explicit RowStage(void* shared)
      : base(static_cast<uint32_t>(__cvta_generic_to_shared(shared)) + threadIdx.x * kVectorBytes),
        staged(0) {}

  __device__ __forceinline__ static uint32_t offset(int f, int k) {
    return static_cast<uint32_t>(f * kPacks + k) * blockDim.x * kVectorBytes;
  }

  // Starts the copies of the full packs (full_pack, fragment.cuh) of the
  // fragments at `first` of the kFrags rows (one view: the rows share their
  // offsets).
  template <typename T, typename Index>
  __device__ __forceinline__ void issue(const T* const (&rows)[kFrags], const RowView& view, Index first,
                                        Index stride) {
    constexpr int P = kPack<T>;
    bool whole = true;
#pragma unroll
    for (int f = 0; f < kFrags; ++f) whole = whole && whole_fragment<T, kPacks, P>(rows[f], view, first, stride);
    if (whole) {  // the common case: no per-pack test
      staged = kAll;
#pragma unroll
      for (int f = 0; f < kFrags; ++f)
#pragma unroll
        for (int k = 0; k < kPacks; ++k)
          cp_async_16(base + offset(f, k), rows[f] + (first - view.shift) + k * stride);
    } else {
      staged = 0;
#pragma unroll
      for (int f = 0; f < kFrags; ++f)
#pragma unroll
        for (int k = 0; k < kPacks; ++k) {
          const Index j0 = first + k * stride - view.shift;
          if (full_pack<T, P>(rows[f], view, j0)) {
            cp_async_16(base + offset(f, k), rows[f] + j0);
            staged |= 1u << (f * kPacks + k);
          }
        }
    }
    cp_async_commit();
  }

  // Starts staging row `row` of the operands at bases[f] (RowIndexer slots
  // 0..kFrags-1 of `layout`), the view taken from operand 0.
  template <typename T, int N, typename Index>
  __device__ __forceinline__ void issue_row(const RowIndexer<N>& layout, int64_t row, const T* const (&bases)[kFrags],
                                            int64_t capacity, Index first, Index stride) {
    static_assert(N >= kFrags, "the layout indexes every staged operand");
    int64_t offset[N];
    layout.row_offsets(row, offset);
    const T* rows[kFrags];
#pragma unroll
    for (int f = 0; f < kFrags; ++f) rows[f] = bases[f] + offset[f];
    issue(rows, make_view(rows[0], layout.axis_size, capacity), first, stride);
  }

  __device__ __forceinline__ void wait() const { cp_async_wait_all(); }
  __device__ __forceinline__ bool has(int f, int k) const { return (staged >> (f * kPacks + k)) & 1u; }
  __device__ __forceinline__ bool all() const { return staged == kAll; }
  // After wait(): the 16 bytes of pack k of operand f.
  __device__ __forceinline__ uint4 pack(int f, int k) const { return load_shared_16(base + offset(f, k)); }
};

// Tiles of a row held in shared memory through a kernel's two passes over
// them (the resident split kernels, families/split/resident_kernels.cuh): tile h's pack k of
// operand f sits in slot ((h * kFrags + f) * kPacks + k) * blockDim.x + t of
// thread t, which alone reads it back, so cp.async.wait_group orders it with
// no block barrier. A tile is held only when whole (whole_fragment,
// fragment.cuh) in every operand; the others are read from global memory
// both times.
template <int kFrags, int kPacks>
struct HeldTiles {
  static constexpr int64_t kTileBytes = int64_t{kFrags} * kPacks * kVectorBytes;  // per thread
  uint32_t base;      // shared address of this thread's slot of tile 0
  uint32_t held = 0;  // bit h: tile h is (being) copied

  __device__ __forceinline__ explicit HeldTiles(void* shared)
      : base(static_cast<uint32_t>(__cvta_generic_to_shared(shared)) + threadIdx.x * kVectorBytes) {}

  __device__ __forceinline__ uint32_t slot(int h, int f, int k) const {
    return base + static_cast<uint32_t>((h * kFrags + f) * kPacks + k) * blockDim.x * kVectorBytes;
  }
  __device__ __forceinline__ bool has(int h) const { return (held >> h) & 1u; }

  // Starts copying tile h, at `first` of the kFrags rows (one view), if it
  // is whole.
  template <typename T, typename Index>
  __device__ __forceinline__ void issue(int h, const T* const (&rows)[kFrags], const RowView& view, Index first,
                                        Index stride) {
    constexpr int P = kPack<T>;
    bool whole = true;
#pragma unroll
    for (int f = 0; f < kFrags; ++f) whole = whole && whole_fragment<T, kPacks, P>(rows[f], view, first, stride);
    if (!whole) return;
    held |= 1u << h;
#pragma unroll
    for (int f = 0; f < kFrags; ++f)
#pragma unroll
      for (int k = 0; k < kPacks; ++k) cp_async_16(slot(h, f, k), rows[f] + (first - view.shift) + k * stride);
  }

  // After wait: operand f of held tile h as accumulator values (load_as<out_t>).
  template <typename out_t, typename T, typename acc_t>
  __device__ __forceinline__ void read(int h, int f, acc_t (&v)[kPacks][kPack<T>]) const {
    constexpr int P = kPack<T>;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      Pack<T, P> p;
      p.raw[0] = load_shared_16(slot(h, f, k));
#pragma unroll
      for (int e = 0; e < P; ++e) v[k][e] = load_as<out_t>(p.v[e]);
    }
  }
};

// The stage of a kernel that may not stage: nothing at all when kStaged is false.
struct NoStage {
  __device__ __forceinline__ explicit NoStage(void*) {}
};
template <bool kStaged, int kFrags, int kPacks>
using StageOf = std::conditional_t<kStaged, RowStage<kFrags, kPacks>, NoStage>;

}  // namespace softmax_ext::cuda
