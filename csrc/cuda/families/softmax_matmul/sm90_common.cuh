// Device helpers of the sm_90a softmax_matmul kernels (sm90.cu, sm90_f32.cu:
// forward, sm90_backward*: dX and dV): cp.async with zero fill, ldmatrix,
// the wgmma fences and waits, ex2, 16-bit pack/unpack, the forward's lazy
// running max, accumulator rescale and output store, and the wgmma wrappers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/families/softmax_matmul/cta.cuh"
#include "cuda/families/softmax_matmul/epilogue.cuh"
#include "cuda/families/softmax_matmul/half_bits.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SMM_SM90A_DEVICE 1
#include "cuda/families/softmax_matmul/wgmma_ops.cuh"
#endif

namespace softmax_ext::smm::cuda::sm90 {

#ifdef SMM_SM90A_DEVICE
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes));
}
// One 16-byte chunk of a row-major T matrix in global memory at g (row stride
// ld) -- row `row`, columns col.. -- into shared memory at dst() by cp.async;
// its part past cols_end, and all of it past rows_end, read as zeros
// (cp.async's zero fill; a chunk that copies nothing is given g to read).
// dst() is called after the bounds test, so the caller chooses where the
// address is computed: before the test (load_swizzled_tile computes it first)
// or after it (the lambda does the arithmetic); ptxas schedules the two
// orders differently.
template <typename T, typename Dst>
__device__ __forceinline__ void cp_async16_guarded(const T* g, int64_t ld, int64_t row, int64_t col, int64_t rows_end,
                                                   int64_t cols_end, Dst dst) {
  constexpr int kElems = 16 / sizeof(T);  // elements per chunk
  int bytes = 0;
  const T* src = g;
  if (row < rows_end && col < cols_end) {
    bytes = cols_end - col >= kElems ? 16 : static_cast<int>(cols_end - col) * static_cast<int>(sizeof(T));
    src = g + row * ld + col;
  }
  cp_async16(dst(), src, bytes);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
__device__ __forceinline__ void fence_reg(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_reg(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&d)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
               : "r"(addr));
}
// TF32 of f rounded to nearest, ties away from zero, in two integer
// instructions (cvt.rna.tf32.f32 is three: it also tests for inf / NaN).
// Equal to cvt.rna for finite values and infinities; a NaN whose 10 top
// mantissa bits are all set turns into a signed zero, so the V^T kernel
// uses it only where a NaN also reaches the row's sum (P) or is carried by
// the small part (3xTF32). wgmma reads a TF32 operand's top 19 bits and
// ignores the other 13, so a small part passed as it is counts as truncated
// (docs/tuning/softmax_matmul.md: 9-10 % off the 3xTF32 forward, error
// against float64 unchanged).
__device__ __forceinline__ uint32_t to_tf32_rn(float f) { return (__float_as_uint(f) + 0x1000u) & 0xffffe000u; }

// The backward's 3xTF32 split of a float32 operand (and its TF32 rounding):
// the big part by cvt.rna (a NaN stays a NaN), the small part v - big
// rounded to nearest, both as TF32 bit patterns.
struct Tf32Split {
  uint32_t big, small;
};
__device__ __forceinline__ Tf32Split split_tf32(float v) {
  const uint32_t big = to_tf32(v);
  return {big, to_tf32_rn(v - __uint_as_float(big))};
}

// The CTA's dynamic shared memory as a shared-window address rounded up to
// 1 KiB, the alignment of the 128-byte-swizzled tiles (each kernel asks for
// 1 KiB more than its layout takes).
__device__ __forceinline__ uint32_t smem_base_1k() {
  extern __shared__ __align__(1024) char smem_raw[];
  return (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;
}

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <typename T>
__device__ __forceinline__ float2 unpack(uint32_t u) {
  return Raw<T>::to2(u);
}
template <typename T>
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  return Raw<T>::pack(lo, hi);
}

// The running max m of one of this thread's rows, moved lazily: x holds the
// thread's values of the row's tile, the other kLanes - 1 lanes of its group
// (a quad, or a pair) the rest. m moves to the
// tile's max only when that exceeds m by more than 8 / log2(e) (P = exp(x - m)
// then stays below 2^8), from -inf to any finite or +inf max; a NaN never
// moves it (the NaN reaches l and the output through P). scale = exp(m_old -
// m_new), 1 where m stays; with kExpf by expf, else by ex2. Returns whether
// m moved.
template <bool kExpf, int N, int kLanes = 4>
__device__ __forceinline__ bool lazy_max(const float (&x)[N], float& m, float& scale) {
  static_assert(kLanes == 2 || kLanes == 4, "a lane pair or quad");
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kLazy = 8.0f / kLog2e;
  float mx = x[0];
#pragma unroll
  for (int e = 1; e < N; ++e) mx = fmaxf(mx, x[e]);
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  if constexpr (kLanes == 4) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const bool move = mx > m + kLazy;
  if constexpr (kExpf) scale = move ? expf(m - mx) : 1.f;
  else scale = move ? ex2((m - mx) * kLog2e) : 1.f;
  if (move) m = mx;
  return move;
}

// acc *= scale of a warp's rows r0, r0 + 8 (the wgmma accumulator layout:
// row r0 + 8 h at acc[4 j + 2 h] and acc[4 j + 2 h + 1]), when the running
// max of either row moved.
template <int N>
__device__ __forceinline__ void rescale_rows(float (&acc)[N], const float (&scale)[2]) {
#pragma unroll
  for (int j = 0; j < N / 4; ++j) {
    acc[4 * j] *= scale[0];
    acc[4 * j + 1] *= scale[0];
    acc[4 * j + 2] *= scale[1];
    acc[4 * j + 3] *= scale[1];
  }
}

// out = acc * inv of a warp's rows r0, r0 + 8 (the wgmma accumulator
// layout: columns n0 + 8 j + 2 t and + 1 at acc[4 j + 2 h], acc[4 j + 2 h + 1]),
// d1 and d3 tails masked; a column pair in one store where d3 is even.
template <typename T, int BN, typename Args>
__device__ __forceinline__ void store_output(const Args& a, int64_t b, int64_t r0, int64_t n0, int t,
                                             const float (&inv)[2], const float (&acc)[BN / 2]) {
  T* ob = static_cast<T*>(a.out) + b * a.d1 * a.d3;
  const bool pair_ok = (a.d3 % 2) == 0;
  for_each_column_pair<BN>(r0, n0, t, a.d1, a.d3, [&](int64_t row, int64_t col, int j, int h) {
    const float o0 = acc[4 * j + 2 * h] * inv[h], o1 = acc[4 * j + 2 * h + 1] * inv[h];
    T* dst = ob + row * a.d3 + col;
    if constexpr (std::is_same_v<T, float>) {
      store_pair(dst, o0, o1, pair_ok, col + 1 < a.d3);
    } else if (pair_ok) {
      *reinterpret_cast<uint32_t*>(dst) = pack<T>(o0, o1);
    } else {
      const uint32_t w = pack<T>(o0, o1);
      reinterpret_cast<uint16_t*>(dst)[0] = static_cast<uint16_t>(w & 0xFFFFu);
      if (col + 1 < a.d3) reinterpret_cast<uint16_t*>(dst)[1] = static_cast<uint16_t>(w >> 16);
    }
  });
}

// D (64 x BN, f32) = A (64 x 8, TF32 in registers) * B (8 x BN, K-major in
// shared memory) + (scale_d ? D : 0); BN 128 or 256.
template <int BN>
__device__ __forceinline__ void wgmma_tf32(float (&d)[BN / 2], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
  static_assert(BN == 128 || BN == 256, "TF32: 128 or 256 columns");
  if constexpr (BN == 256) wgmma_rs_n256_tf32(d, a, desc, scale_d);
  else wgmma_rs_n128_tf32(d, a, desc, scale_d);
}

// D (64 x BN, f32) += A (64 x 16, registers) * B (16 x BN, shared memory;
// TB = 1: N-major, 0: K-major).
// T = float: TF32, m64nNk8 (A 64 x 8 in the same 4 registers), B K-major
// only (TB = 0), N 128 or 256.
template <typename T, int BN, int TB = 1>
__device__ __forceinline__ void wgmma_rs(float (&d)[BN / 2], const uint32_t (&a)[4], uint64_t desc) {
  constexpr bool kB = std::is_same_v<T, __nv_bfloat16>;
  if constexpr (std::is_same_v<T, float>) {
    static_assert(TB == 0, "TF32: B K-major");
    wgmma_tf32<BN>(d, a, desc, 1);
  } else {
#define SMM_WGMMA_CASE(N)                                                     \
  if constexpr (BN == N) {                                                    \
    if constexpr (kB && TB == 1) wgmma_rs_n##N##_bf16_t1(d, a, desc);         \
    else if constexpr (kB) wgmma_rs_n##N##_bf16_t0(d, a, desc);               \
    else if constexpr (TB == 1) wgmma_rs_n##N##_f16_t1(d, a, desc);           \
    else wgmma_rs_n##N##_f16_t0(d, a, desc);                                  \
  }
    SMM_WGMMA_CASE(64)
    SMM_WGMMA_CASE(128)
    SMM_WGMMA_CASE(256)
#undef SMM_WGMMA_CASE
  }
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&d)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
               : "r"(addr));
}

// Matrix descriptors, SWIZZLE_128B (tiles of 128-byte rows, 16-byte chunk c
// of row r stored at c ^ (r % 8), 1 KiB aligned):
//   N-major B (rows of K, N contiguous; 64-column blocks of `block_bytes`):
//     LBO = block_bytes (between 64-column blocks), SBO = 1 KiB (8 rows of K);
//   K-major B (rows of N, K contiguous, 64 K per row): SBO = 1 KiB (8 rows
//     of N), LBO unused (1).
__device__ __forceinline__ uint64_t desc_nmajor(uint32_t block_bytes) {
  return (uint64_t{1} << 62) | (uint64_t{block_bytes >> 4} << 16) | (uint64_t{1024 >> 4} << 32);
}
__device__ __forceinline__ uint64_t desc_kmajor() {
  return (uint64_t{1} << 62) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32);
}
// A tile of ROWS rows x CHUNKS 16-byte chunks (16 / sizeof(T) elements each) of a
// row-major matrix in global memory -- rows row0.., columns col0.., row
// stride ld; rows past rows_end and columns past cols_end read as zeros --
// into shared memory at `base` by THREADS threads with cp.async: panels of
// 128 bytes, each ROWS rows of 128 bytes, a row's chunks XOR-swizzled by
// the row (the 128-byte swizzle that ldmatrix and the wgmma descriptors read).
template <typename T, int ROWS, int CHUNKS, int THREADS>
__device__ __forceinline__ void load_swizzled_tile(uint32_t base, const T* g, int64_t ld, int64_t row0,
                                                   int64_t col0, int64_t rows_end, int64_t cols_end) {
  static_assert(ROWS * CHUNKS % THREADS == 0, "every thread loads the same number of chunks");
#pragma unroll
  for (int i = 0; i < ROWS * CHUNKS / THREADS; ++i) {
    const uint32_t id = threadIdx.x + i * THREADS;  // unsigned: / and % are shifts and masks
    const uint32_t r = id / CHUNKS, c = id % CHUNKS;
    const uint32_t dst = base + (c >> 3) * (ROWS * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
    cp_async16_guarded(g, ld, row0 + r, col0 + (16 / sizeof(T)) * c, rows_end, cols_end, [dst] { return dst; });
  }
}

#endif  // SMM_SM90A_DEVICE

}  // namespace softmax_ext::smm::cuda::sm90
