// The tensor-core forward of softmax_matmul: FlashAttention-2's inner loop with
// the scores given. Hand-written mma.sync PTX (sm_80+, so the default arch
// list builds it; no CUTLASS build dependency and one small template per
// dtype instead of CuTe's compile times).
//
// One CTA = 8 warps = 128 rows of d1 (4 warps / 64 rows kept for A/B) and BN
// (64, 128 or 256) columns of d3, of one batch entry; large tiles keep the
// L2 traffic per flop down (every CTA reads its x rows and V columns); the grid's fastest index walks the d3 blocks of one row block,
// so the CTAs that read the same x rows run together and x comes from L2.
// Loop over d2 in tiles of BK columns (64 for 16-bit, 32 for f32):
//   * x tile: straight from global memory into registers (prefetched one tile
//     ahead), each warp its 16 rows. The k order inside a 32-column span is
//     permuted so that lane (g, t) of the mma A fragment holds the 8
//     contiguous columns 8t..8t+7 (one 16-byte load per row for 16-bit); V's
//     rows are read in the same permuted order, which leaves P·V unchanged.
//   * running row max m and partial sums l in f32 (quad shuffles), P =
//     exp(x - m) packed to bf16/f16 (or TF32) as the A operand; the f32
//     accumulator is rescaled by exp(m_old - m_new).
//   * V tile: cp.async into shared memory, double-buffered, XOR-swizzled so
//     that ldmatrix.trans (16-bit) or 32-bit loads (TF32) are conflict free.
//   * mma.sync m16n8k16 (f16/bf16) or m16n8k8 (TF32); float32-accurate mode:
//     3xTF32 (big/small split of P and V, three products).
// Epilogue: out = acc / l in x's dtype, lse = m + log(l) (f32, natural log).
// Tails of d1, d2, d3 are masked (x columns past d2 read as -inf, V rows past
// d2 and columns past d3 as 0); rows that are not 16-byte aligned take
// element loads instead of vector ones.
#pragma once

#include "cuda/families/softmax_matmul/cuda_launch.h"
#include "cuda/core/launch.cuh"
#include "cuda/families/softmax_matmul/cta.cuh"
#include "cuda/families/softmax_matmul/epilogue.cuh"
#include "cuda/families/softmax_matmul/half_bits.cuh"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace softmax_ext::smm::cuda {


enum Mode : int { kHalfMode = 0, kTF32Mode = 1, kSplit3Mode = 2 };

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <typename T>
__device__ __forceinline__ void mma16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&d)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
               : "r"(addr));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

template <typename T, int BN, int MODE, int WARPS>
struct Config {
  static constexpr int kThreads = 32 * WARPS;
  static constexpr int kBM = 16 * WARPS;           // 16 rows of d1 per warp
  static constexpr bool k16 = MODE == kHalfMode;
  static constexpr int kSpans = k16 ? 2 : 1;       // 32-column spans per tile
  static constexpr int kBK = 32 * kSpans;          // columns of d2 per tile
  static constexpr int kWords = k16 ? 4 : 8;       // 32-bit words per (row, span) per thread
  static constexpr int kVec = 16 / sizeof(T);      // elements per 16-byte chunk
  static constexpr int kChunksPerRow = BN / kVec;  // of a V tile row
  static constexpr int kChunks = kBK * kChunksPerRow;
  static constexpr int kNT = BN / 8;               // mma n-tiles
  static constexpr int kStageBytes = kBK * BN * sizeof(T);
};

// XOR swizzle of the 16-byte chunk index of V tile row r (see the header).
template <int MODE>
__device__ __forceinline__ int swizzle(int r) {
  if constexpr (MODE == kHalfMode) return ((r >> 3) & 3) | ((r & 1) << 2);
  else return ((r >> 3) & 3) << 1;
}

template <typename T, int BN, int MODE, int WARPS>
__device__ __forceinline__ void load_v(char* smem, const T* vb, int64_t v_rs, int64_t k0, int64_t n0,
                                       int64_t d2, int64_t d3, bool vec_ok) {
  using C = Config<T, BN, MODE, WARPS>;
  constexpr int kThreads = C::kThreads;
  static_assert(C::kChunks % kThreads == 0, "V tile chunks per thread");
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
#pragma unroll
  for (int i = 0; i < C::kChunks / kThreads; ++i) {
    const int id = threadIdx.x + i * kThreads;
    const int r = id / C::kChunksPerRow, c = id % C::kChunksPerRow;
    const int cs = c ^ swizzle<MODE>(r);
    const uint32_t dst = base + (r * C::kChunksPerRow + cs) * 16;
    const int64_t k = k0 + r, n = n0 + int64_t(c) * C::kVec;
    const T* src = vb + k * v_rs + n;
    if (k < d2 && vec_ok && n + C::kVec <= d3) {
      cp_async16(dst, src);
    } else {
      using R = std::conditional_t<sizeof(T) == 4, uint32_t, uint16_t>;  // the raw bits
      R vals[C::kVec];
#pragma unroll
      for (int e = 0; e < C::kVec; ++e) vals[e] = (k < d2 && n + e < d3) ? reinterpret_cast<const R*>(src)[e] : R(0);
      *reinterpret_cast<uint4*>(smem + (r * C::kChunksPerRow + cs) * 16) = *reinterpret_cast<uint4*>(vals);
    }
  }
}

// x words of this thread for one tile: rows (g, g+8) x spans x kWords.
template <typename T, int BN, int MODE, int WARPS>
__device__ __forceinline__ void load_x(uint32_t (&xr)[2][Config<T, BN, MODE, WARPS>::kSpans][Config<T, BN, MODE, WARPS>::kWords],
                                       const T* xb, int64_t x_rs, int64_t row0, int64_t d1, int64_t col0,
                                       int64_t d2, bool vec_ok, int t) {
  using C = Config<T, BN, MODE, WARPS>;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = row0 + 8 * h;
#pragma unroll
    for (int sp = 0; sp < C::kSpans; ++sp) {
      const int64_t col = col0 + 32 * sp + 8 * t;
      uint32_t* w = xr[h][sp];
      if (row >= d1) {
#pragma unroll
        for (int e = 0; e < C::kWords; ++e) w[e] = 0;
        continue;
      }
      const T* src = xb + row * x_rs + col;
      if (vec_ok && col + 8 <= d2) {
#pragma unroll
        for (int q = 0; q < C::kWords / 4; ++q) {
          const uint4 u = __ldg(reinterpret_cast<const uint4*>(src) + q);
          w[4 * q] = u.x; w[4 * q + 1] = u.y; w[4 * q + 2] = u.z; w[4 * q + 3] = u.w;
        }
      } else if constexpr (std::is_same_v<T, float>) {
#pragma unroll
        for (int e = 0; e < 8; ++e) w[e] = col + e < d2 ? __float_as_uint(src[e]) : 0xFF800000u;
      } else {
        const uint16_t* s16 = reinterpret_cast<const uint16_t*>(src);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const uint32_t lo = col + 2 * e < d2 ? s16[2 * e] : Raw<T>::kNegInf;
          const uint32_t hi = col + 2 * e + 1 < d2 ? s16[2 * e + 1] : Raw<T>::kNegInf;
          w[e] = lo | (hi << 16);
        }
      }
    }
  }
}

template <typename T, int BN, int MODE, int WARPS>
__device__ __forceinline__ void store_out(const Args& a, const float (&acc)[BN / 8][4], const float (&inv)[2],
                                          int64_t b, int64_t n0, int64_t row0, int t) {
  using C = Config<T, BN, MODE, WARPS>;
  T* ob = static_cast<T*>(a.out) + b * a.d1 * a.d3;
  const bool pair_ok = (a.d3 % 2) == 0;
#pragma unroll
  for (int j = 0; j < C::kNT; ++j) {
    const int64_t col = n0 + 8 * j + 2 * t;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row0 + 8 * h;
      if (row >= a.d1 || col >= a.d3) continue;
      const float o0 = acc[j][2 * h] * inv[h], o1 = acc[j][2 * h + 1] * inv[h];
      T* dst = ob + row * a.d3 + col;
      if constexpr (std::is_same_v<T, float>) {
        store_pair(dst, o0, o1, pair_ok, col + 1 < a.d3);
      } else if (pair_ok) {
        *reinterpret_cast<uint32_t*>(dst) = Raw<T>::pack(o0, o1);
      } else {
        reinterpret_cast<uint16_t*>(dst)[0] = Raw<T>::bits(o0);
        if (col + 1 < a.d3) reinterpret_cast<uint16_t*>(dst)[1] = Raw<T>::bits(o1);
      }
    }
  }
}

template <typename T, int BN, int MODE, int WARPS>
__global__ void __launch_bounds__(32 * WARPS, WARPS == 4 ? 2 : 1)
    smm_forward_kernel(Args a, int64_t batch0, bool x_vec, bool v_vec) {
  using C = Config<T, BN, MODE, WARPS>;
  constexpr int kBM = C::kBM;
  extern __shared__ __align__(128) char smem[];
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kInf = __builtin_huge_valf();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const CtaTile<BN> cta(a.d3, batch0);
  const int64_t b = cta.b, n0 = cta.nb * BN;
  const int64_t row0 = cta.mb * kBM + warp * 16 + g;
  const T* xb = static_cast<const T*>(a.x) + b * a.x_batch_stride;
  const T* vb = static_cast<const T*>(a.v) + b * a.v_batch_stride;

  float acc[C::kNT][4];
#pragma unroll
  for (int j = 0; j < C::kNT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  float m[2] = {-kInf, -kInf}, l[2] = {0.f, 0.f};
  uint32_t xr[2][C::kSpans][C::kWords];

  const int64_t nk = (a.d2 + C::kBK - 1) / C::kBK;
  load_v<T, BN, MODE, WARPS>(smem, vb, a.v_row_stride, 0, n0, a.d2, a.d3, v_vec);
  cp_async_commit();
  load_x<T, BN, MODE, WARPS>(xr, xb, a.x_row_stride, row0, a.d1, 0, a.d2, x_vec, t);

  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  for (int64_t kt = 0; kt < nk; ++kt) {
    const int stage = kt & 1;
    if (kt + 1 < nk) {
      load_v<T, BN, MODE, WARPS>(smem + (stage ^ 1) * C::kStageBytes, vb, a.v_row_stride, (kt + 1) * C::kBK, n0, a.d2,
                          a.d3, v_vec);
    }
    cp_async_commit();

    // x of this tile as floats, then prefetch the next tile's x.
    float s[2][C::kSpans][8];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int sp = 0; sp < C::kSpans; ++sp) {
        if constexpr (C::k16) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float2 f = Raw<T>::to2(xr[h][sp][e]);
            s[h][sp][2 * e] = f.x;
            s[h][sp][2 * e + 1] = f.y;
          }
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) s[h][sp][e] = __uint_as_float(xr[h][sp][e]);
        }
      }
    if (kt + 1 < nk) {
      load_x<T, BN, MODE, WARPS>(xr, xb, a.x_row_stride, row0, a.d1, (kt + 1) * C::kBK, a.d2, x_vec, t);
    }

    // Online softmax: new max, rescale, P = exp(x - m).
    float m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -kInf;
#pragma unroll
      for (int sp = 0; sp < C::kSpans; ++sp)
#pragma unroll
        for (int e = 0; e < 8; ++e) mx = fmaxf(mx, s[h][sp][e]);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[h], mx);
      m_use[h] = m_new == -kInf ? 0.f : m_new;
      const float scale = MODE == kSplit3Mode ? expf(m[h] - m_use[h]) : fast_exp2((m[h] - m_use[h]) * kLog2e);
      m[h] = m_new;
      l[h] *= scale;
#pragma unroll
      for (int j = 0; j < C::kNT; ++j) {
        acc[j][2 * h] *= scale;
        acc[j][2 * h + 1] *= scale;
      }
#pragma unroll
      for (int sp = 0; sp < C::kSpans; ++sp)
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float p = MODE == kSplit3Mode ? expf(s[h][sp][e] - m_use[h])
                                              : fast_exp2((s[h][sp][e] - m_use[h]) * kLog2e);
          s[h][sp][e] = p;
          l[h] += p;
        }
    }

    cp_async_wait<1>();
    __syncthreads();
    const char* vs = smem + stage * C::kStageBytes;
    const uint32_t vs_addr = smem_base + stage * C::kStageBytes;

#pragma unroll
    for (int sp = 0; sp < C::kSpans; ++sp) {
      if constexpr (C::k16) {
#pragma unroll
        for (int st = 0; st < 2; ++st) {
          uint32_t af[4];
          af[0] = Raw<T>::pack(s[0][sp][4 * st], s[0][sp][4 * st + 1]);
          af[1] = Raw<T>::pack(s[1][sp][4 * st], s[1][sp][4 * st + 1]);
          af[2] = Raw<T>::pack(s[0][sp][4 * st + 2], s[0][sp][4 * st + 3]);
          af[3] = Raw<T>::pack(s[1][sp][4 * st + 2], s[1][sp][4 * st + 3]);
          // ldmatrix.x4.trans: lane -> matrix q (b0/b1 of n-tiles j, j+1), row i.
          const int q = lane >> 3, i = lane & 7;
          const int r = 32 * sp + 8 * (i >> 1) + 4 * st + 2 * (q & 1) + (i & 1);
          const int sw = swizzle<MODE>(r);
#pragma unroll
          for (int j = 0; j < C::kNT; j += 2) {
            const int c = j + (q >> 1);
            uint32_t bf[4];
            ldmatrix_x4_trans(bf, vs_addr + (r * C::kChunksPerRow + (c ^ sw)) * 16);
            mma16<T>(acc[j], af, bf[0], bf[1]);
            mma16<T>(acc[j + 1], af, bf[2], bf[3]);
          }
        }
      } else {
        const float* vf = reinterpret_cast<const float*>(vs);
        // 3xTF32: the tile's products go to a zeroed accumulator first and
        // are added to acc with IEEE f32 adds, so the tensor cores' own
        // accumulation (not round-to-nearest) covers only one tile.
        float tmp[MODE == kSplit3Mode ? C::kNT : 1][4];
        if constexpr (MODE == kSplit3Mode) {
#pragma unroll
          for (int j = 0; j < C::kNT; ++j) tmp[j][0] = tmp[j][1] = tmp[j][2] = tmp[j][3] = 0.f;
        }
#pragma unroll
        for (int st = 0; st < 4; ++st) {
          const float p00 = s[0][sp][2 * st], p10 = s[1][sp][2 * st];
          const float p01 = s[0][sp][2 * st + 1], p11 = s[1][sp][2 * st + 1];
          uint32_t ab[4] = {to_tf32(p00), to_tf32(p10), to_tf32(p01), to_tf32(p11)};
          uint32_t as[4];
          if constexpr (MODE == kSplit3Mode) {
            as[0] = to_tf32(p00 - __uint_as_float(ab[0]));
            as[1] = to_tf32(p10 - __uint_as_float(ab[1]));
            as[2] = to_tf32(p01 - __uint_as_float(ab[2]));
            as[3] = to_tf32(p11 - __uint_as_float(ab[3]));
          }
          const int r0 = 8 * t + 2 * st;
          const int sw = swizzle<MODE>(r0);  // same for r0 + 1
#pragma unroll
          for (int j = 0; j < C::kNT; ++j) {
            const int n = 8 * j + g;
            const int w = ((n >> 2) ^ sw) * 4 + (n & 3);
            const float v0 = vf[r0 * BN + w], v1 = vf[(r0 + 1) * BN + w];
            if constexpr (MODE == kSplit3Mode) {
              const uint32_t b0 = to_tf32(v0), b1 = to_tf32(v1);
              const uint32_t c0 = to_tf32(v0 - __uint_as_float(b0)), c1 = to_tf32(v1 - __uint_as_float(b1));
              mma_tf32(tmp[j], as, b0, b1);
              mma_tf32(tmp[j], ab, c0, c1);
              mma_tf32(tmp[j], ab, b0, b1);
            } else {
              mma_tf32(acc[j], ab, __float_as_uint(v0), __float_as_uint(v1));
            }
          }
        }
        if constexpr (MODE == kSplit3Mode) {
#pragma unroll
          for (int j = 0; j < C::kNT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[j][e] += tmp[j][e];
        }
      }
    }
    __syncthreads();
  }

  // Epilogue: row sums over the quad, out = acc / l, lse = m + log(l).
  float inv[2];
  finish_rows(a, b, row0, t, cta.nb, m, l, inv);
  store_out<T, BN, MODE, WARPS>(a, acc, inv, b, n0, row0, t);
}

template <typename T, int BN, int MODE, int WARPS>
void launch(const Args& a) {
  using C = Config<T, BN, MODE, WARPS>;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  constexpr int smem = 2 * C::kStageBytes;
  const int64_t es = sizeof(T);
  const bool x_vec = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && (a.x_row_stride * es) % 16 == 0 &&
                     (a.x_batch_stride * es) % 16 == 0;
  const bool v_vec = reinterpret_cast<uintptr_t>(a.v) % 16 == 0 && (a.v_row_stride * es) % 16 == 0 &&
                     (a.v_batch_stride * es) % 16 == 0;
  const int64_t blocks = ((a.d3 + BN - 1) / BN) * ((a.d1 + C::kBM - 1) / C::kBM);
  softmax_ext::cuda::launch_batch_grid(&smm_forward_kernel<T, BN, MODE, WARPS>, blocks, a.batch, C::kThreads, smem,
                                       stream, a, x_vec, v_vec);
}

// The tiles the plan uses (plan.cpp): (warps, BN) = (1, 64), (2, 64),
// (4, 128), (8, 64), (8, 128), (8, 256); 3xTF32 not with 256 (its extra
// accumulator). (One or two warps with 128 columns spill: the V tile's
// copies, unrolled over fewer threads.)
template <typename T, int MODE>
void launch_tile(const Args& a, int warps, int bn) {
  if (warps == 1) return launch<T, 64, MODE, 1>(a);
  if (warps == 2) return launch<T, 64, MODE, 2>(a);
  if (warps == 4) return launch<T, 128, MODE, 4>(a);
  if (bn == 64) return launch<T, 64, MODE, 8>(a);
  if (MODE != kSplit3Mode && bn == 256) return launch<T, (MODE == kSplit3Mode ? 128 : 256), MODE, 8>(a);
  return launch<T, 128, MODE, 8>(a);
}

}  // namespace softmax_ext::smm::cuda
