// softmax_matmul forward for Hopper (sm_90a), float32: TF32 wgmma (TF32
// allowed) or the 3xTF32 split (float32-accurate), two kernels.
//
// wgmma takes TF32 operands only K-major, and V (d2, d3) is N-major for
// out = P . V. The default, the V^T kernel (smm_wgmma_f32_vt_kernel, further
// down), computes out^T = V^T . P^T instead: P^T as the B operand is P's own
// row-major layout (written to shared memory by the softmax), and V^T as the
// A operand comes from registers, read straight from V's row-major tile; x
// and V arrive by TMA. It needs both tensor maps; where either cannot be made
// (an expanded batch, dims of 2^31 or more, a driver without the encoder),
// or with SOFTMAX_EXT_SMM_F32_TRANSPOSE=1 (A/B runs), the transposing kernel
// (smm_wgmma_f32_kernel, next) runs. Measurements: docs/tuning/softmax_matmul.md.
//
// The transposing kernel: each V tile goes global -> shared (cp.async,
// row-major "staging", 3 stages) -> shared in the K-major 128-byte-swizzled
// layout (a transposing pass by all threads: 4 scalar loads, one 16-byte
// store; the TF32 rounding of V, and for 3xTF32 its big / small split, ride
// along), double-buffered. The x tile is staged beside V (cp.async, 128-byte
// swizzled rows); each thread reads its two rows' 8 contiguous columns of the
// 32-column tile (two 16-byte loads); the k order inside the tile is permuted
// so that those 8 columns are exactly the thread's A-fragment elements of the
// four k8 steps (logical k = 8s + t is column 8t + 2s, k = 8s + t + 4 is
// column 8t + 2s + 1), and the transposing pass puts V's rows in the same
// order (chunk c of a K-major row holds V rows c, c + 8, c + 16, c + 24),
// which leaves P.V unchanged.
//
// Both: CTA = 2 warpgroups = 128 rows of d1 x BN columns of d3 (TF32: 256,
// the exponentials amortised over 512 flops each; 3xTF32: 128 with a second
// accumulator: each tile's three products are summed by the tensor cores
// into a zeroed accumulator and added to the running one with f32 adds, so
// the tensor cores' own accumulation covers one tile only). Online softmax
// with the lazy rescale of sm90.cu (3xTF32: expf instead of ex2.approx).
#include "cuda/families/softmax_matmul/cuda_launch.h"
#include "cuda/core/launch.cuh"
#include "cuda/families/softmax_matmul/sm90_common.cuh"
#include "cuda/families/softmax_matmul/tma.cuh"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

namespace softmax_ext::smm::cuda {
namespace sm90 {

constexpr int kF32Threads = 256;
constexpr int kF32Stages = 3;

template <int BN, bool SPLIT>
struct F32Cfg {
  static constexpr int kVStagingBytes = 32 * BN * 4;           // 32 rows of V x BN columns, row-major
  static constexpr int kStagingBytes = kVStagingBytes + 128 * 128;  // + x: 128 rows x 32 columns, swizzled
  static constexpr int kBBytes = BN * 128;                     // BN rows (d3) x 32 k, K-major swizzled
  static constexpr int kBufBytes = kBBytes * (SPLIT ? 2 : 1);  // big (+ small)
  static constexpr int kSmem = kF32Stages * kStagingBytes + 2 * kBufBytes + 1024;
};

#ifdef SMM_SM90A_DEVICE

// V rows k0..k0+31, columns n0..n0+BN-1 -> staging (row-major, zero fill).
template <int BN>
__device__ __forceinline__ void f32_load_v(uint32_t dst0, const float* vb, int64_t v_rs, int64_t k0, int64_t n0,
                                           int64_t d2, int64_t d3) {
  constexpr int kCpr = BN / 4;  // 16-byte chunks per row
#pragma unroll
  for (int i = 0; i < 32 * kCpr / kF32Threads; ++i) {
    const int id = threadIdx.x + i * kF32Threads;
    const int r = id / kCpr, c = id % kCpr;
    cp_async16_guarded(vb, v_rs, k0 + r, n0 + 4 * c, d2, d3, [&] { return dst0 + (r * BN + 4 * c) * 4; });
  }
}

// x rows row0..row0+127, columns k0..k0+31 -> staging (128-byte rows, chunk c
// at c ^ (r % 8), zero fill).
__device__ __forceinline__ void f32_load_x(uint32_t dst0, const float* xb, int64_t x_rs, int64_t row0, int64_t k0,
                                           int64_t d1, int64_t d2) {
#pragma unroll
  for (int i = 0; i < 128 * 8 / kF32Threads; ++i) {
    const int id = threadIdx.x + i * kF32Threads;
    const int r = id >> 3, c = id & 7;
    cp_async16_guarded(xb, x_rs, row0 + r, k0 + 4 * c, d1, d2, [&] { return dst0 + r * 128 + ((c ^ (r & 7)) << 4); });
  }
}

// staging -> K-major B buffer(s): row n, chunk c (at c ^ (n % 8)) = TF32 of
// V rows c, c + 8, c + 16, c + 24 (the permuted k order), column n.
template <int BN, bool SPLIT>
__device__ __forceinline__ void f32_transpose(uint32_t staging, uint32_t buf) {
  constexpr int kPer = BN * 8 / kF32Threads;  // chunks per thread (8 or 4)
  const int n = threadIdx.x % BN;
  const int c0 = (threadIdx.x / BN) * kPer;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int c = c0 + i;
    float v[4];
#pragma unroll
    for (int q = 0; q < 4; ++q)
      asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v[q]) : "r"(staging + ((c + 8 * q) * BN + n) * 4));
    uint32_t big[4], small[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      big[q] = to_tf32(v[q]);
      if constexpr (SPLIT) small[q] = to_tf32(v[q] - __uint_as_float(big[q]));
    }
    const uint32_t off = n * 128 + ((c ^ (n & 7)) << 4);
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(buf + off), "r"(big[0]), "r"(big[1]), "r"(big[2]),
                 "r"(big[3]));
    if constexpr (SPLIT)
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(buf + BN * 128 + off), "r"(small[0]),
                   "r"(small[1]), "r"(small[2]), "r"(small[3]));
  }
}

// This thread's x values from the staged tile: rows lr, lr + 8 of the tile,
// columns 8t..8t+7 (chunks 2t, 2t + 1); columns past d2 as -inf.
__device__ __forceinline__ void f32_read_x(float (&xr)[2][8], uint32_t xs, int lr, int t, int64_t col0, int64_t d2,
                                           bool tail) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = lr + 8 * h;
#pragma unroll
    for (int q = 0; q < 2; ++q)
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                   : "=f"(xr[h][4 * q]), "=f"(xr[h][4 * q + 1]), "=f"(xr[h][4 * q + 2]), "=f"(xr[h][4 * q + 3])
                   : "r"(xs + r * 128 + (((2 * t + q) ^ (r & 7)) << 4)));
  }
  if (tail) {
#pragma unroll
    for (int e = 0; e < 8; ++e)
      if (col0 + 8 * t + e >= d2) xr[0][e] = xr[1][e] = -__builtin_huge_valf();
  }
}

// Online softmax of this thread's 2 x 8 values -> A fragments of the 4 k8
// steps (big, and small for 3xTF32).
template <bool SPLIT>
__device__ __forceinline__ void f32_softmax(const float (&xr)[2][8], uint32_t (&pb)[4][4], uint32_t (&ps)[4][4],
                                            float (&m)[2], float (&l)[2], float (&scale)[2], bool& any_up) {
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kInf = __builtin_huge_valf();
  bool up = false;
  float p[2][8];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    up |= lazy_max<SPLIT>(xr[h], m[h], scale[h]);
    const float mu = m[h] == -kInf ? 0.f : m[h];
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if constexpr (SPLIT) p[h][e] = expf(xr[h][e] - mu);
      else p[h][e] = ex2(fmaf(xr[h][e], kLog2e, -mu * kLog2e));
      s += p[h][e];
    }
    l[h] = l[h] * scale[h] + s;
  }
  any_up = __any_sync(0xffffffffu, up);
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int o = 0; o < 2; ++o) {  // a0/a1: column 2s (k = 8s + t), a2/a3: 2s + 1 (k = 8s + t + 4)
        const float v = p[h][2 * s + o];
        const uint32_t b = to_tf32(v);
        pb[s][2 * o + h] = b;
        if constexpr (SPLIT) ps[s][2 * o + h] = to_tf32(v - __uint_as_float(b));
      }
}
#endif  // SMM_SM90A_DEVICE

template <int BN, bool SPLIT>
__global__ void __launch_bounds__(kF32Threads, 1) smm_wgmma_f32_kernel(Args a, int64_t batch0) {
#ifdef SMM_SM90A_DEVICE
  using C = F32Cfg<BN, SPLIT>;
  constexpr int kS = kF32Stages;
  const uint32_t smem = smem_base_1k();
  const uint32_t bufs = smem;                                  // 2 x kBufBytes, 1 KiB aligned
  const uint32_t staging = smem + 2 * C::kBufBytes;            // kS x kStagingBytes

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const CtaTile<BN> cta(a.d3, batch0);
  const DRange<32> dr(a, cta.b);
  // b: the batch entry of x and v; ob: of out and lse (b * parts + part)
  const int64_t b = dr.b, ob = cta.b, n0 = cta.nb * BN, row0 = cta.mb * 128;
  const int64_t row = row0 + 16 * warp + g;
  const float* xb = static_cast<const float*>(a.x) + b * a.x_batch_stride;
  const float* vb = static_cast<const float*>(a.v) + b * a.v_batch_stride;
  const int nk = dr.nk, k0 = dr.k0;
  const uint64_t desc_base = desc_kmajor();

  float acc[BN / 2];
  float tmp[SPLIT ? BN / 2 : 1];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
  float m[2] = {-__builtin_huge_valf(), -__builtin_huge_valf()}, l[2] = {0.f, 0.f}, scale[2];
  bool any_up = false;
  uint32_t pab[4][4], pas[4][4], pbb[4][4], pbs[4][4];
  const int lr = 16 * warp + g;  // this thread's first row in the tile
  auto load = [&](int kt) {
    const uint32_t st = staging + static_cast<uint32_t>(kt % kS) * C::kStagingBytes;
    f32_load_v<BN>(st, vb, a.v_row_stride, int64_t{k0 + kt} * 32, n0, a.d2, a.d3);
    f32_load_x(st + C::kVStagingBytes, xb, a.x_row_stride, row0, int64_t{k0 + kt} * 32, a.d1, a.d2);
  };
  auto softmax = [&](int kt, uint32_t (&pb)[4][4], uint32_t (&ps)[4][4]) {
    float xr[2][8];
    f32_read_x(xr, staging + static_cast<uint32_t>(kt % kS) * C::kStagingBytes + C::kVStagingBytes, lr, t,
               int64_t{k0 + kt} * 32, a.d2, dr.masked(kt));
    f32_softmax<SPLIT>(xr, pb, ps, m, l, scale, any_up);
  };

#pragma unroll
  for (int s = 0; s < kS - 1; ++s) {
    if (s < nk) load(s);
    cp_async_commit();
  }
  cp_async_wait<kS - 2>();
  __syncthreads();
  f32_transpose<BN, SPLIT>(staging, bufs);
  fence_proxy_async();
  softmax(0, pab, pas);
  __syncthreads();

  for (int kt = 0; kt < nk; ++kt) {
    const uint32_t buf = bufs + static_cast<uint32_t>(kt & 1) * C::kBufBytes;
    if constexpr (SPLIT) {
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) fence_reg(tmp[i]);
    } else {
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) fence_reg(acc[i]);
    }
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint64_t db = desc_base | ((buf + 32 * s) >> 4);
      if constexpr (SPLIT) {
        const uint64_t ds = desc_base | ((buf + BN * 128 + 32 * s) >> 4);
        wgmma_tf32<BN>(tmp, pas[s], db, s != 0);  // small x big (the first overwrites tmp)
        wgmma_tf32<BN>(tmp, pab[s], ds, 1);       // big x small
        wgmma_tf32<BN>(tmp, pab[s], db, 1);       // big x big
      } else {
        wgmma_tf32<BN>(acc, pab[s], db, 1);
      }
    }
    wgmma_commit();
    if (kt + 1 < nk) {
      cp_async_wait<kS - 3>();
      __syncthreads();  // staging of tile kt + 1 visible; buffer (kt + 1) & 1 free (wgmma kt - 1 done)
      const int kn = kt + kS - 1;
      if (kn < nk) load(kn);
      cp_async_commit();
      f32_transpose<BN, SPLIT>(staging + static_cast<uint32_t>((kt + 1) % kS) * C::kStagingBytes,
                               bufs + static_cast<uint32_t>((kt + 1) & 1) * C::kBufBytes);
      fence_proxy_async();
      softmax(kt + 1, pbb, pbs);
      __syncthreads();  // buffer (kt + 1) & 1 complete
    }
    wgmma_wait<0>();
    if constexpr (SPLIT) {
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) {
        fence_reg(tmp[i]);
        acc[i] += tmp[i];
      }
    } else {
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) fence_reg(acc[i]);
    }
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        fence_reg(pab[s][e]);
        if constexpr (SPLIT) fence_reg(pas[s][e]);
      }
    if (kt + 1 < nk) {
      if (any_up) rescale_rows(acc, scale);
#pragma unroll
      for (int s = 0; s < 4; ++s)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          pab[s][e] = pbb[s][e];
          if constexpr (SPLIT) pas[s][e] = pbs[s][e];
        }
    }
  }

  // Epilogue: l over the quad, out = acc / l, lse = m + log(l).
  float inv[2];
  finish_rows(a, ob, row, t, cta.nb, m, l, inv);
  store_output<float, BN>(a, ob, row, n0, t, inv, acc);
#else
  __trap();
#endif
}

// The V^T form (the default where the tensor maps can be made): out^T
// (BN x 128) = V^T (BN x d2) . P^T (d2 x 128). TF32 wgmma takes K-major
// shared-memory operands only; P^T as the B operand is P's own row-major
// layout, and V^T as the A operand comes from registers, read from V's
// row-major tile, so V needs no transposing pass. The M order of the
// product is permuted so that a thread's 2 * MI fragment rows are 2 * MI
// neighbouring columns of d3: one 8- or 16-byte shared load per row of V and
// k8 half step, one global store per output row. Thread (warpgroup wg, warp
// w, lane g, t) holds the product's rows 64 i + 16 w + g + 8 h (i < MI,
// h < 2) of its warpgroup: the d3 columns vcol + 2 i + h (VtColumns).
//
// Loads: x (128 rows x 32 columns) and V (32 rows x BN columns, as BN / 32
// panels of 32 columns) of a d2 tile by TMA (one thread issues, an mbarrier
// per stage completes), 3 stages, all in the 128-byte swizzled layout (16-
// byte chunk c of a 128-byte row r at c ^ (r % 8)). The softmax is split
// from the product's layout: thread pair (2 r, 2 r + 1) owns row r of the
// tile, each thread four 16-byte chunks of its 32 columns; P goes (TF32,
// with its small part for 3xTF32) into a 3-deep ring of K-major 128-byte-
// swizzled buffers, so a buffer is written only after every warpgroup has
// waited for the product that read it. When a row's lazy max moves, its
// scale goes through shared memory to the threads that hold its accumulator
// column. Shared memory is the kernel's busiest unit, so every per-thread
// access is free of bank conflicts: the threads of a quarter warp (16-byte
// accesses; a half warp for 8-byte ones) touch 8 different chunk positions,
// by the chunk order of the softmax's threads and the columns VtColumns
// gives each lane. The grid is persistent (as many CTAs as run at once, one
// an SM): a CTA walks its tiles with one pipeline, so the next tile's first
// stages load while a tile's last product and its output store run.

// The d3 columns of thread (wg, w, g) in the V^T kernel, relative to the
// CTA's first: 2 MI of them from vcol, in 32-column panel `panel` of the V
// tile, 16-byte chunk `chunk`, from byte `byte` of it. The t lanes of a g
// read four rows of V whose chunk positions differ in their two low bits
// (the swizzle XORs row % 8 = t + 4 o into the chunk), so the lanes g of one
// quarter warp (MI = 2: g = 2 k, 2 k + 1) or half warp (MI = 1: g = 4 k ..
// 4 k + 3) take chunks that differ in bit 2.
template <int MI>
struct VtColumns {
  static_assert(MI == 1 || MI == 2, "128 or 256 columns of d3");
  int panel, chunk, byte;
  __device__ __forceinline__ VtColumns(int wg, int w, int g) {
    if constexpr (MI == 2) {  // a chunk a thread: quarter warp k takes chunks k and k + 4
      panel = 4 * wg + w;
      chunk = (g >> 1) | ((g & 1) << 2);
      byte = 0;
    } else {  // half a chunk a thread: half warp k takes chunks {2 (w % 2) + k, + 4}
      panel = 2 * wg + (w >> 1);
      chunk = 2 * (w & 1) + 4 * ((g >> 1) & 1) + (g >> 2);
      byte = 8 * (g & 1);
    }
  }
  __device__ __forceinline__ int col() const { return 32 * panel + 4 * chunk + byte / 4; }
};

template <int MI, bool SPLIT>
struct VtCfg {
  static constexpr int BN = 128 * MI;
  static constexpr int kStages = 3;                 // load stages and P buffers
  static constexpr int kXBytes = 128 * 128;         // x: 128 rows x 32 columns
  static constexpr int kVBytes = 32 * BN * 4;       // V: BN / 32 panels of 32 rows x 32 columns
  static constexpr int kLoadBytes = kXBytes + kVBytes;
  static constexpr int kPBytes = 128 * 128;         // P (or its small part): 128 rows x 32 k, K-major
  static constexpr int kPStageBytes = kPBytes * (SPLIT ? 2 : 1);
  static constexpr int kPOffset = kStages * kLoadBytes;
  static constexpr int kBarOffset = kPOffset + kStages * kPStageBytes;
  static constexpr int kScaleOffset = kBarOffset + 8 * kStages;   // scale[2][128], then 1 / l[128]
  static constexpr int kSmem = kScaleOffset + 3 * 128 * 4 + 1024;
};

template <int MI, bool SPLIT>
__global__ void __launch_bounds__(kF32Threads, 1)
    smm_wgmma_f32_vt_kernel(Args a, const __grid_constant__ CUtensorMap tmx, const __grid_constant__ CUtensorMap tmv) {
#ifdef SMM_SM90A_DEVICE
  using C = VtCfg<MI, SPLIT>;
  constexpr int BN = C::BN;
  constexpr int kS = C::kStages;
  constexpr int kV = 2 * MI;  // d3 columns of a thread's fragment rows
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kInf = __builtin_huge_valf();
  extern __shared__ __align__(1024) char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t smem = (raw + 1023u) & ~1023u;
  float* scale_s = reinterpret_cast<float*>(smem_raw + (smem - raw) + C::kScaleOffset);
  float* inv_s = scale_s + 2 * 128;
  const uint32_t bars = smem + C::kBarOffset;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, w = warp & 3, g = lane >> 2, t = lane & 3;
  // The CTA's tiles (a persistent grid): T = blockIdx.x + i gridDim.x in CtaTile's order (column block
  // fastest, then row block, then batch entry), nk steps of d2 each; its steps G = i nk + kt run through
  // one pipeline, so the first stages of tile i + 1 load while tile i ends.
  const int64_t nblocks_n = (a.d3 + BN - 1) / BN, tiles_b = nblocks_n * ((a.d1 + 127) / 128);
  // (the batch entries of out and lse: b * parts + part where d2 is cut, DRange)
  const int64_t my_tiles = (tiles_b * a.batch * a.parts - blockIdx.x + gridDim.x - 1) / gridDim.x;
  const int nk = DRange<32>(a, 0).nk;  // the same for every tile
  const int steps = static_cast<int>(my_tiles) * nk;  // (far under 2^31: a step reads 16 KB of x)
  struct Tile {
    int b, nb, row0;
  };
  auto tile = [&](int64_t i) {  // (dims under 2^31: the tensor maps' coordinates are int)
    const int64_t T = blockIdx.x + i * gridDim.x, q = T % tiles_b;
    return Tile{static_cast<int>(T / tiles_b), static_cast<int>(q % nblocks_n), static_cast<int>(q / nblocks_n) * 128};
  };
  auto stage = [&](uint32_t G) { return smem + (G % kS) * C::kLoadBytes; };  // x, then V
  auto pbuf = [&](uint32_t G) { return smem + C::kPOffset + (G % kS) * C::kPStageBytes; };
  // Thread 0 issues the steps in order, G = 0, 1, ...: the next one's tile i, its step kt and coordinates.
  uint32_t iss_g = 0;
  int iss_kt = 0;
  int64_t iss_i = 0;
  Tile iss_u{};
  DRange<32> iss_r(a, 0);  // (its 64-bit divisions once a tile)
  auto issue = [&]() {
    if (iss_kt == 0) {
      iss_u = tile(iss_i);
      iss_r = DRange<32>(a, iss_u.b);
    }
    const int k = (iss_r.k0 + iss_kt) * 32, b = static_cast<int>(iss_r.b);
    const uint32_t bar = bars + 8 * (iss_g % kS);
    mbar_expect_tx(bar, C::kLoadBytes);
    tma_load_3d(stage(iss_g), &tmx, k, iss_u.row0, b, bar);
#pragma unroll
    for (int p = 0; p < BN / 32; ++p)
      tma_load_3d(stage(iss_g) + C::kXBytes + p * 4096, &tmv, iss_u.nb * BN + 32 * p, k, b, bar);
    ++iss_g;
    if (++iss_kt == nk) {
      iss_kt = 0;
      ++iss_i;
    }
  };

  // The softmax: row sr of the tile, chunks 2 (q ^ qx) + hh (q < 4) of its 32 columns; the order qx
  // puts the 8 threads of a quarter warp (rows sr .. sr + 3) on 8 different chunk positions.
  const int sr = tid >> 1, hh = tid & 1, qx = 2 * (sr & 1);
  float m, l;
  DRange<32> cur(a, 0);  // the d2 range of the tile being computed
  auto softmax = [&](uint32_t G, int kt) {
    float xr[16];
#pragma unroll
    for (int q = 0; q < 4; ++q)
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                   : "=f"(xr[4 * q]), "=f"(xr[4 * q + 1]), "=f"(xr[4 * q + 2]), "=f"(xr[4 * q + 3])
                   : "r"(stage(G) + sr * 128 + (((2 * (q ^ qx) + hh) ^ (sr & 7)) << 4)));
    if (cur.masked(kt)) {  // columns past d2 (zero-filled) count as -inf
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (int64_t{cur.k0 + kt} * 32 + 4 * (2 * (q ^ qx) + hh) + e >= a.d2) xr[4 * q + e] = -kInf;
    }
    float scale;
    const bool moved = lazy_max<SPLIT, 16, 2>(xr, m, scale);
    if (hh == 0) scale_s[(G & 1) * 128 + sr] = scale;
    const float mu = m == -kInf ? 0.f : m;
    float sum = 0.f;  // the tile's part first: l adds one term a tile
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      uint32_t big[4], small[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // a NaN P makes the row's l NaN
        const float p = SPLIT ? expf(xr[4 * q + e] - mu) : ex2(fmaf(xr[4 * q + e], kLog2e, -mu * kLog2e));
        sum += p;
        big[e] = to_tf32_rn(p);
        if constexpr (SPLIT) small[e] = __float_as_uint(p - __uint_as_float(big[e]));  // truncated by wgmma
      }
      const uint32_t off = pbuf(G) + sr * 128 + (((2 * (q ^ qx) + hh) ^ (sr & 7)) << 4);
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(off), "r"(big[0]), "r"(big[1]), "r"(big[2]),
                   "r"(big[3]));
      if constexpr (SPLIT)
        asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(off + C::kPBytes), "r"(small[0]),
                     "r"(small[1]), "r"(small[2]), "r"(small[3]));
    }
    l = l * scale + sum;
    return moved;
  };

  // A fragments of tile kt: a[2 o + h] = V[8 s + t + 4 o][vcol + 2 i + h]: TF32, V rounded by
  // cvt.rna (to_tf32_rn could lose a NaN of V); 3xTF32: the big part by to_tf32_rn (a NaN's small part
  // stays NaN) and the small part as it is, truncated by wgmma.
  const VtColumns<MI> cols(wg, w, g);
  const uint32_t v_lane = C::kXBytes + cols.panel * 4096 + cols.byte;  // + row r's 128 bytes, chunk position
  const uint32_t v_chunk[2] = {static_cast<uint32_t>((cols.chunk ^ t) << 4),          // rows 8 s + t
                               static_cast<uint32_t>((cols.chunk ^ (t + 4)) << 4)};  // rows 8 s + t + 4
  using Frags = uint32_t[4][MI][4];
  using SmallFrags = uint32_t[SPLIT ? 4 : 1][MI][4];
  auto read_v = [&](uint32_t G, Frags& va, SmallFrags& vs) {
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
      for (int o = 0; o < 2; ++o) {
        const uint32_t addr = stage(G) + v_lane + (8 * s + t + 4 * o) * 128 + v_chunk[o];
        float f[kV];
        if constexpr (kV == 4)
          asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                       : "=f"(f[0]), "=f"(f[1]), "=f"(f[2]), "=f"(f[3])
                       : "r"(addr));
        else
          asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(f[0]), "=f"(f[1]) : "r"(addr));
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if constexpr (SPLIT) {
              const uint32_t big = to_tf32_rn(f[2 * i + h]);
              va[s][i][2 * o + h] = big;
              vs[s][i][2 * o + h] = __float_as_uint(f[2 * i + h] - __uint_as_float(big));
            } else {
              va[s][i][2 * o + h] = to_tf32(f[2 * i + h]);
            }
          }
      }
  };

  float acc[MI][64];
  float tmp[SPLIT ? MI : 1][SPLIT ? 64 : 1];

  init_stage_barriers<kS>(bars);
  if (tid == 0)
    for (int G = 0; G < kS && G < steps; ++G) issue();

  // One d2 step G (tile step kt): the product of step G from fragments `va` / `vs`, the
  // softmax of step G + 1 beside it; TF32 reads step G + 1's fragments
  // into the other register set before waiting for the product, so the
  // next product is issued right after it (3xTF32 has no registers for a
  // second set and reads them after the wait).
  auto step = [&](uint32_t G, int kt, Frags& va, SmallFrags& vs, Frags& va_next, SmallFrags& vs_next) {
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int r = 0; r < 64; ++r) fence_reg(SPLIT ? tmp[i][r] : acc[i][r]);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint64_t db = desc_kmajor() | ((pbuf(G) + 32 * s) >> 4);
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        if constexpr (SPLIT) {
          const uint64_t ds = desc_kmajor() | ((pbuf(G) + C::kPBytes + 32 * s) >> 4);
          wgmma_rs_n128_tf32(tmp[i], vs[s][i], db, s != 0);  // small V x big P (the first overwrites tmp)
          wgmma_rs_n128_tf32(tmp[i], va[s][i], ds, 1);       // big V x small P
          wgmma_rs_n128_tf32(tmp[i], va[s][i], db, 1);       // big x big
        } else {
          wgmma_rs_n128_tf32(acc[i], va[s][i], db, 1);
        }
      }
    }
    wgmma_commit();
    bool up = false;
    if (kt + 1 < nk) {
      mbar_wait(bars + 8 * ((G + 1) % kS), ((G + 1) / kS) & 1);
      if constexpr (!SPLIT) read_v(G + 1, va_next, vs_next);
      up = softmax(G + 1, kt + 1);
      fence_proxy_async();
    }
    // P of step G + 1 and its scales visible; stage G % kS read by every thread
    const bool any_up = __syncthreads_or(up);
    if (tid == 0 && G + kS < static_cast<uint32_t>(steps)) issue();  // step G + kS
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int r = 0; r < 64; ++r) {
        if constexpr (SPLIT) {
          fence_reg(tmp[i][r]);
          acc[i][r] += tmp[i][r];
        } else {
          fence_reg(acc[i][r]);
        }
      }
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          fence_reg(va[s][i][e]);
          if constexpr (SPLIT) fence_reg(vs[s][i][e]);
        }
    if (SPLIT && kt + 1 < nk) read_v(G + 1, va_next, vs_next);
    if (any_up) {  // accumulator column n is row n of the tile: acc[i][4 j + 2 h + e], n = 8 j + 2 t + e
      const float* sc = scale_s + ((G + 1) & 1) * 128;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const float2 f = *reinterpret_cast<const float2*>(sc + 8 * j + 2 * t);
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            acc[i][4 * j + 2 * h] *= f.x;
            acc[i][4 * j + 2 * h + 1] *= f.y;
          }
      }
    }
  };

  for (int64_t i = 0; i < my_tiles; ++i) {
    const Tile u = tile(i);
    const int64_t b = u.b, n0 = int64_t{u.nb} * BN, row0 = u.row0;  // b: of out and lse
    cur = DRange<32>(a, b);
    const uint32_t G0 = static_cast<uint32_t>(i) * nk;
    m = -kInf;
    l = 0.f;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int r = 0; r < 64; ++r) acc[mi][r] = 0.f;
    mbar_wait(bars + 8 * (G0 % kS), (G0 / kS) & 1);
    softmax(G0, 0);  // (acc is zero: the tile's first scale is not applied)
    fence_proxy_async();
    __syncthreads();
    if constexpr (SPLIT) {  // one register set
      Frags va;
      SmallFrags vs;
      read_v(G0, va, vs);
      for (int kt = 0; kt < nk; ++kt) step(G0 + kt, kt, va, vs, va, vs);
    } else {  // two, alternating
      Frags va0, va1;
      SmallFrags vs0, vs1;
      read_v(G0, va0, vs0);
      for (int kt = 0; kt < nk; kt += 2) {
        step(G0 + kt, kt, va0, vs0, va1, vs1);
        if (kt + 1 < nk) step(G0 + kt + 1, kt + 1, va1, vs1, va0, vs0);
      }
    }

    // Epilogue: l over the pair, lse = m + log(l) (first column block), out = acc / l.
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    if (hh == 0) {
      inv_s[sr] = 1.f / l;
      if (u.nb == 0 && row0 + sr < a.d1) write_lse(a, b * a.d1 + row0 + sr, m, l);
    }
    __syncthreads();
    float* ob = static_cast<float*>(a.out) + b * a.d1 * a.d3;
    const int64_t vcol = n0 + cols.col();
    const bool vec_ok = vcol + kV <= a.d3 && a.d3 % kV == 0;
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int n = 8 * j + 2 * t + e;
        if (row0 + n >= a.d1) continue;
        const float iv = inv_s[n];
        float o[kV];
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int h = 0; h < 2; ++h) o[2 * mi + h] = acc[mi][4 * j + 2 * h + e] * iv;
        float* dst = ob + (row0 + n) * a.d3 + vcol;
        if (vec_ok) {
          if constexpr (kV == 4) *reinterpret_cast<float4*>(dst) = make_float4(o[0], o[1], o[2], o[3]);
          else *reinterpret_cast<float2*>(dst) = make_float2(o[0], o[1]);
        } else {
#pragma unroll
          for (int q = 0; q < kV; ++q)
            if (vcol + q < a.d3) dst[q] = o[q];
        }
      }
  }
#else
  __trap();
#endif
}

// The V^T kernel where both tensor maps can be made (x: boxes of 32 columns
// x 128 rows, V: 32 columns x 32 rows, 128-byte swizzle); false
// otherwise (the caller then takes the transposing kernel, by cp.async).
template <int MI, bool SPLIT>
bool launch_f32_vt(const Args& a) {
  using C = VtCfg<MI, SPLIT>;
  CUtensorMap tmx{}, tmv{};
  if (!map_3d<float>(&tmx, a.x, a.d2, a.d1, a.batch, a.x_row_stride, a.x_batch_stride, 32, 128) ||
      !map_3d<float>(&tmv, a.v, a.d3, a.d2, a.batch, a.v_row_stride, a.v_batch_stride, 32, 32))
    return false;
  const int64_t tiles = ((a.d3 + C::BN - 1) / C::BN) * ((a.d1 + 127) / 128) * a.batch * a.parts;
  softmax_ext::cuda::launch_row_blocks(&smm_wgmma_f32_vt_kernel<MI, SPLIT>, tiles,
                                       softmax_ext::cuda::BlockShape{kF32Threads, 1, C::kSmem, true}, a, tmx, tmv);
  return true;
}

template <int BN, bool SPLIT>
void launch_f32(const Args& a) {
  using C = F32Cfg<BN, SPLIT>;
  const int64_t blocks = ((a.d3 + BN - 1) / BN) * ((a.d1 + 127) / 128);
  softmax_ext::cuda::launch_batch_grid(&smm_wgmma_f32_kernel<BN, SPLIT>, blocks, a.batch * a.parts, kF32Threads, C::kSmem,
                                       c10::cuda::getCurrentCUDAStream(), a);
}

}  // namespace sm90

void launch_sm90_f32(const Args& a, int bn, bool split3) {
  // SOFTMAX_EXT_SMM_F32_TRANSPOSE=1: the kernels with V's transposing pass (A/B work).
  const char* env = std::getenv("SOFTMAX_EXT_SMM_F32_TRANSPOSE");
  if (env == nullptr || env[0] != '1') {
    const bool done = split3      ? sm90::launch_f32_vt<1, true>(a)
                      : bn == 128 ? sm90::launch_f32_vt<1, false>(a)
                                  : sm90::launch_f32_vt<2, false>(a);
    if (done) return;
  }
  if (split3) return sm90::launch_f32<128, true>(a);
  if (bn == 128) return sm90::launch_f32<128, false>(a);
  return sm90::launch_f32<256, false>(a);
}

}  // namespace softmax_ext::smm::cuda
