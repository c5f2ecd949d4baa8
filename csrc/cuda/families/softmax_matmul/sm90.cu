// softmax_matmul forward for Hopper (sm_90a): wgmma.mma_async with P from
// registers, bf16 and f16. Hand-written PTX (wgmma_ops.cuh) rather than CuTe:
// no CUTLASS build dependency and one small translation unit.
//
// Why not the mma.sync kernel (kernel.cuh) on Hopper: with no QK^T product to
// share it, every exponential of the online softmax is amortised only over
// the BN columns of d3 that one CTA multiplies it with. At BN = 128 the
// MUFU work (one ex2 per element of x, 16/clk/SM) takes as long as the
// tensor-core work, and mma.sync reaches only ~2/3 of wgmma's rate. Here:
//   * BN = 256 columns of d3 per warpgroup (f32 accumulators: 128 registers
//     per thread), so each exponential feeds 512 flops;
//   * wgmma is asynchronous: the softmax of tile k+1 (ldmatrix, row max, ex2,
//     pack) runs on the CUDA cores while the tensor cores multiply tile k;
//   * the running max is moved (and the accumulator rescaled) only when a
//     row's max grows by more than 2^8 (FlashAttention-4's lazy rescale):
//     P = exp(x - m) then stays <= 256, exact in the final out = acc / l
//     because l is summed against the same m.
//
// CTA = 2 warpgroups (256 threads) = 128 rows of d1 (64 per warpgroup) x BN
// columns of d3, one batch entry; loop over d2 (or one part of it, where the
// plan cuts d2: cta.cuh's DRange, combine.cu) in tiles of 64 columns. Each
// stage of the 4-deep pipeline (TMA: one thread issues the tile's boxes, an
// mbarrier per stage completes; cp.async by every thread where the driver
// makes no tensor map) holds the x tile (128 x 64, 16 KiB)
// and the V tile (64 x BN), both in the 128-byte-swizzled layout (16-byte
// chunk c of a 128-byte row r stored at c ^ (r % 8)): x is read with
// ldmatrix into the wgmma A-fragment layout, V by wgmma through a matrix
// descriptor (N-major, SWIZZLE_128B: 64 columns x 64 rows of d2 per 8 KiB
// block; LBO = 8 KiB between the 64-column blocks, SBO = 1 KiB between groups
// of 8 rows). Tails: rows of x past d1 and rows of V past d2 / columns past
// d3 are zero-filled (TMA's out-of-bounds fill, or cp.async's); columns of x past d2 are set to -inf in
// registers. The output tile goes through the freed stages (64-column
// swizzled panels) and out by TMA where the output's tensor map can be made
// (d3 a multiple of 8), else by each thread's 4-byte column pairs. Where
// the tiles outnumber the CTAs, a persistent form of the kernel walks them
// (smm_wgmma_persistent_kernel below). The plan
// takes this kernel only for 16-byte aligned rows (strides multiple of 8
// elements, aligned base pointers).
#include "cuda/families/softmax_matmul/cuda_launch.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include "cuda/core/launch.cuh"
#include "cuda/families/softmax_matmul/sm90_common.cuh"
#include "cuda/families/softmax_matmul/tma.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

namespace softmax_ext::smm::cuda {
namespace sm90 {

constexpr int kBM = 128;     // rows of d1 per CTA (2 warpgroups x 64)
constexpr int kBK = 64;      // columns of d2 per tile (128-byte rows)
constexpr int kStages = 4;
constexpr int kThreads = 256;
constexpr int kXBytes = kBM * kBK * 2;

template <int BN>
struct Cfg {
  static constexpr int kVBytes = kBK * BN * 2;
  static constexpr int kStageBytes = kVBytes + kXBytes;  // V first: 1 KiB aligned
  static constexpr int kBarOffset = kStages * kStageBytes;  // TMA: one mbarrier per stage
  static constexpr int kSmem = kStages * kStageBytes + 8 * kStages + 1024;  // + the mbarriers
  static constexpr int kAcc = BN / 2;  // f32 accumulators per thread
};

#ifdef SMM_SM90A_DEVICE
// The x tile (kBM x 64) and the V tile (64 x BN) of d2 tile `kt` into one stage.
template <typename T, int BN>
__device__ __forceinline__ void load_tile(uint32_t stage, const T* xb, int64_t x_rs, const T* vb, int64_t v_rs,
                                          int64_t row0, int64_t n0, int64_t k0, int64_t d1, int64_t d2,
                                          int64_t d3) {
  // V: 64 rows x BN/8 chunks; x: kBM rows x 8 chunks.
  load_swizzled_tile<T, kBK, BN / 8, kThreads>(stage, vb, v_rs, k0, n0, d2, d3);
  load_swizzled_tile<T, kBM, 8, kThreads>(stage + Cfg<BN>::kVBytes, xb, x_rs, row0, k0, d1, d2);
}

// Online softmax of one x tile for this thread's two rows (g, g + 8 of its
// warp's 16): P (packed to T, the wgmma A fragments of the tile's four k16
// steps) into p; m, l updated; scale / any_up: the accumulator's rescale.
template <typename T>
__device__ __forceinline__ void softmax_tile(uint32_t (&p)[4][4], uint32_t x_addr, int lane_r7, int lane_hi,
                                             float (&m)[2], float (&l)[2], float (&scale)[2], bool& any_up,
                                             int64_t col0, int64_t d2, bool tail) {
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kInf = __builtin_huge_valf();
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) ldmatrix_x4(p[kb], x_addr + (((2 * kb + lane_hi) ^ lane_r7) << 4));
  float f[2][16];
#pragma unroll
  for (int kb = 0; kb < 4; ++kb)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float2 lo = unpack<T>(p[kb][h]), hi = unpack<T>(p[kb][2 + h]);
      f[h][4 * kb] = lo.x;
      f[h][4 * kb + 1] = lo.y;
      f[h][4 * kb + 2] = hi.x;
      f[h][4 * kb + 3] = hi.y;
    }
  if (tail) {  // columns past d2 (their x was zero-filled) count as -inf
#pragma unroll
    for (int kb = 0; kb < 4; ++kb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t col = col0 + 16 * kb + (e & 1) + 8 * (e >> 1);
        if (col >= d2) f[0][4 * kb + e] = f[1][4 * kb + e] = -kInf;
      }
  }
  bool up = false;
  float neg[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    up |= lazy_max<false>(f[h], m[h], scale[h]);
    neg[h] = m[h] == -kInf ? 0.f : -m[h] * kLog2e;
  }
  any_up = __any_sync(0xffffffffu, up);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      f[h][e] = ex2(fmaf(f[h][e], kLog2e, neg[h]));
      s += f[h][e];
    }
    l[h] = l[h] * scale[h] + s;
  }
#pragma unroll
  for (int kb = 0; kb < 4; ++kb)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      p[kb][h] = pack<T>(f[h][4 * kb], f[h][4 * kb + 1]);
      p[kb][2 + h] = pack<T>(f[h][4 * kb + 2], f[h][4 * kb + 3]);
    }
}

// The products of one d2 tile, issued (asynchronous): acc += P (pa, the A
// fragments of its four k16 blocks) times the V tile of `stage` (N-major,
// descriptor base desc_base).
template <typename T, int BN>
__device__ __forceinline__ void issue_products(float (&acc)[BN / 2], uint32_t (&pa)[4][4], uint64_t desc_base,
                                               uint32_t stage) {
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) fence_reg(acc[i]);
  wgmma_fence();
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) wgmma_rs<T, BN>(acc, pa[kb], desc_base | ((stage + kb * 2048) >> 4));
  wgmma_commit();
}

// Waits for them; where a tile follows (next), rescales acc by the scale of
// its rows' moved maxima (any_up) and makes its P (pb) the A operand.
template <int BN>
__device__ __forceinline__ void finish_products(float (&acc)[BN / 2], uint32_t (&pa)[4][4], const uint32_t (&pb)[4][4],
                                                bool next, bool any_up, const float (&scale)[2]) {
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) fence_reg(acc[i]);
#pragma unroll
  for (int kb = 0; kb < 4; ++kb)
#pragma unroll
    for (int e = 0; e < 4; ++e) fence_reg(pa[kb][e]);
  if (next) {
    if (any_up) rescale_rows(acc, scale);
#pragma unroll
    for (int kb = 0; kb < 4; ++kb)
#pragma unroll
      for (int e = 0; e < 4; ++e) pa[kb][e] = pb[kb][e];
  }
}
#endif  // SMM_SM90A_DEVICE

#ifdef SMM_SM90A_DEVICE
// The tile `kt` by TMA (one thread): V as BN / 64 boxes of 64 x 64, x as one
// box of 64 columns x 128 rows, 128-byte swizzled, zero fill past the edges.
template <int BN>
__device__ __forceinline__ void tma_tile(uint32_t stage, uint32_t bar, const CUtensorMap* tmx,
                                         const CUtensorMap* tmv, int n0, int row0, int k0, int b) {
  mbar_expect_tx(bar, Cfg<BN>::kStageBytes);
#pragma unroll
  for (int j = 0; j < BN / 64; ++j) tma_load_3d(stage + j * (kBK * 128), tmv, n0 + 64 * j, k0, b, bar);
  tma_load_3d(stage + Cfg<BN>::kVBytes, tmx, k0, row0, b, bar);
}
#endif

#ifdef SMM_SM90A_DEVICE
// The TMA kernels' staged output: out = acc * inv of this thread's rows in
// the NP 64-column panels from panel P0 of the tile into NP panels at `base`
// (128 rows of 128 bytes each, 16-byte chunk c of row r at c ^ (r % 8)),
// which TMA then stores.
template <typename T, int BN, int P0 = 0, int NP = BN / 64>
__device__ __forceinline__ void write_out_panels(uint32_t base, int warp, int g, int t, const float (&inv)[2],
                                                 const float (&acc)[BN / 2]) {
#pragma unroll
  for (int j = 8 * P0; j < 8 * (P0 + NP); ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 16 * warp + g + 8 * h;  // r % 8 == g
      const uint32_t d = pack<T>(acc[4 * j + 2 * h] * inv[h], acc[4 * j + 2 * h + 1] * inv[h]);
      asm volatile("st.shared.b32 [%0], %1;" ::"r"(base + (j / 8 - P0) * (kBM * 128) + r * 128 +
                                                   (((j % 8) ^ g) << 4) + 4 * t),
                   "r"(d)
                   : "memory");
    }
}
#endif

// LOAD (tma.cuh): kCpAsync: cp.async by every thread (where no tensor map
// can be made); kTma: TMA (tensor maps tmx, tmv; one thread issues, an
// mbarrier per stage completes), a stage refilled after a block-wide
// barrier. (Per-stage "empty" mbarriers in place of that barrier measured no
// faster.)

template <typename T, int BN, int LOAD>
__global__ void __launch_bounds__(kThreads, 1)
    smm_wgmma_kernel(Args a, int64_t batch0, const __grid_constant__ CUtensorMap tmx,
                     const __grid_constant__ CUtensorMap tmv, const __grid_constant__ CUtensorMap tmo,
                     bool out_staged) {
#ifdef SMM_SM90A_DEVICE
  using C = Cfg<BN>;
  const uint32_t smem = smem_base_1k();

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  constexpr bool TMA = LOAD == kTma;
  const CtaTile<BN> cta(a.d3, batch0);
  const DRange<kBK> dr(a, cta.b);
  // b: the batch entry of x and v; ob: of out and lse (b * parts + part)
  const int64_t b = dr.b, ob = cta.b, n0 = cta.nb * BN, row0 = cta.mb * kBM;
  const T* xb = static_cast<const T*>(a.x) + b * a.x_batch_stride;
  const T* vb = static_cast<const T*>(a.v) + b * a.v_batch_stride;
  const int nk = dr.nk, k0 = dr.k0;

  // ldmatrix row of this lane in the x tile (warp w: rows 16w..16w+15).
  const int lr = 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);
  const int lane_r7 = lr & 7, lane_hi = lane >> 4;
  const uint32_t x_lane = C::kVBytes + lr * 128;

  // Matrix descriptor of the V tile: N-major, LBO 8 KiB, SBO 1 KiB.
  const uint64_t desc_base = desc_nmajor(kBK * 128);

  float acc[C::kAcc];
#pragma unroll
  for (int i = 0; i < C::kAcc; ++i) acc[i] = 0.f;
  float m[2] = {-__builtin_huge_valf(), -__builtin_huge_valf()}, l[2] = {0.f, 0.f}, scale[2];
  uint32_t pa[4][4], pb[4][4];
  bool any_up = false;

  const uint32_t bars = smem + C::kBarOffset;
  if constexpr (TMA) {
    init_stage_barriers<kStages>(bars);
    if (tid == 0) {
      for (int s = 0; s < kStages - 1 && s < nk; ++s)
        tma_tile<BN>(smem + s * C::kStageBytes, bars + 8 * s, &tmx, &tmv, static_cast<int>(n0),
                     static_cast<int>(row0), (k0 + s) * kBK, static_cast<int>(b));
    }
    mbar_wait(bars, 0);
  } else {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < nk)
        load_tile<T, BN>(smem + s * C::kStageBytes, xb, a.x_row_stride, vb, a.v_row_stride, row0, n0,
                         int64_t{k0 + s} * kBK, a.d1, a.d2, a.d3);
      cp_async_commit();
    }
    cp_async_wait<kStages - 2>();
    fence_proxy_async();
    __syncthreads();
  }
  softmax_tile<T>(pa, smem + x_lane, lane_r7, lane_hi, m, l, scale, any_up, int64_t{k0} * kBK + 2 * t, a.d2,
                  dr.masked(0));

  for (int kt = 0; kt < nk; ++kt) {
    const uint32_t stage = smem + static_cast<uint32_t>(kt % kStages) * C::kStageBytes;
    issue_products<T, BN>(acc, pa, desc_base, stage);
    if (kt + 1 < nk) {
      const int kn = kt + kStages - 1;
      if constexpr (TMA) {
        // every warp done with tile kt - 1 (its wgmma waited at the end of
        // the last iteration): its stage is refilled now
        __syncthreads();
        if (tid == 0 && kn < nk)
          tma_tile<BN>(smem + static_cast<uint32_t>(kn % kStages) * C::kStageBytes, bars + 8 * (kn % kStages),
                       &tmx, &tmv, static_cast<int>(n0), static_cast<int>(row0), (k0 + kn) * kBK, static_cast<int>(b));
        mbar_wait(bars + 8 * ((kt + 1) % kStages), ((kt + 1) / kStages) & 1);
      } else {
        cp_async_wait<kStages - 3>();
        fence_proxy_async();
        __syncthreads();  // tile kt + 1 visible; every warpgroup done with tile kt - 1
        if (kn < nk)
          load_tile<T, BN>(smem + static_cast<uint32_t>(kn % kStages) * C::kStageBytes, xb, a.x_row_stride, vb,
                           a.v_row_stride, row0, n0, int64_t{k0 + kn} * kBK, a.d1, a.d2, a.d3);
        cp_async_commit();
      }
      const uint32_t next = smem + static_cast<uint32_t>((kt + 1) % kStages) * C::kStageBytes;
      softmax_tile<T>(pb, next + x_lane, lane_r7, lane_hi, m, l, scale, any_up, int64_t{k0 + kt + 1} * kBK + 2 * t,
                      a.d2, dr.masked(kt + 1));
    }
    finish_products<BN>(acc, pa, pb, kt + 1 < nk, any_up, scale);
  }

  // Epilogue: l over the quad, out = acc / l, lse = m + log(l).
  float inv[2];
  const int64_t r0 = row0 + 16 * warp + g;
  finish_rows(a, ob, r0, t, cta.nb, m, l, inv);
  if constexpr (TMA) {
    if (out_staged) {
      // The tile through shared memory (the stages are free: every load was
      // waited for, every product too), in 64-column panels of 128-byte
      // swizzled rows, then stored by TMA (clipped at d1 and d3), a box per
      // panel: 16-byte transactions instead of each thread's 4-byte pairs.
      __syncthreads();  // every warp past its last read of the stages
      write_out_panels<T, BN>(smem, warp, g, t, inv, acc);
      store_panels<BN / 64, 64>(&tmo, [&](int q) { return smem + q * (kBM * 128); }, n0, a.d3, row0, ob);
      return;
    }
  }
  store_output<T, BN>(a, ob, r0, n0, t, inv, acc);
#else
  __trap();  // built without sm_90a: the plan never selects this kernel then
#endif
}

// The persistent form of the kernel above (TMA loads, 128 or 256 columns,
// where the tiles outnumber the CTAs that run at once: launch): as many
// CTAs as run at once (one an SM), each walking the tiles T = blockIdx.x +
// i gridDim.x in CtaTile's order through one pipeline whose steps G = i nk
// + kt run on across its tiles, so the next tile's first stages load while
// a tile's last products, its epilogue and its output store run. The output
// goes through a buffer of its own (OUT_BUF; the stages hold the next tile's
// loads) of two 64-column panels (BN = 256: two rounds, so that four stages
// still fit), stored by TMA without waiting (the store reads the
// buffer while the CTA goes on; the next round waits for that read), or
// straight from registers where the output's tensor map cannot be made.
template <int BN, bool OUT_BUF>
struct PCfg {
  static_assert(BN == 128 || BN == 256, "the persistent kernel: 128 or 256 columns");
  static constexpr int kOutPanels = OUT_BUF ? 2 : 0;  // panels of 128 rows x 128 bytes
  static constexpr int kOutOffset = kStages * Cfg<BN>::kStageBytes;     // 1 KiB multiples
  static constexpr int kBarOffset = kOutOffset + kOutPanels * kBM * 128;
  static constexpr int kSmem = kBarOffset + 8 * kStages + 1024;
};

template <typename T, int BN, bool OUT_BUF>
__global__ void __launch_bounds__(kThreads, 1)
    smm_wgmma_persistent_kernel(Args a, const __grid_constant__ CUtensorMap tmx,
                                const __grid_constant__ CUtensorMap tmv, const __grid_constant__ CUtensorMap tmo) {
#ifdef SMM_SM90A_DEVICE
  using C = PCfg<BN, OUT_BUF>;
  constexpr int kS = kStages;
  constexpr float kInf = __builtin_huge_valf();
  const uint32_t smem = smem_base_1k();
  const uint32_t bars = smem + C::kBarOffset;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;

  // (the batch entries of out and lse: b * parts + part where d2 is cut, DRange)
  const int64_t nblocks_n = (a.d3 + BN - 1) / BN, tiles_b = nblocks_n * ((a.d1 + kBM - 1) / kBM);
  const int64_t my_tiles = (tiles_b * a.batch * a.parts - blockIdx.x + gridDim.x - 1) / gridDim.x;
  const int nk = DRange<kBK>(a, 0).nk;  // the same for every tile
  const uint32_t steps = static_cast<uint32_t>(my_tiles * nk);  // (a step reads 16 KiB of x)
  struct Tile {
    int64_t vb;  // batch entry of out and lse
    int nb, row0;
  };
  auto tile = [&](int64_t i) {  // (dims under 2^31: the tensor maps' coordinates are int)
    const int64_t w = blockIdx.x + i * gridDim.x, q = w % tiles_b;
    return Tile{w / tiles_b, static_cast<int>(q % nblocks_n), static_cast<int>(q / nblocks_n) * kBM};
  };
  auto stage = [&](uint32_t G) { return smem + (G % kS) * Cfg<BN>::kStageBytes; };
  auto bar = [&](uint32_t G) { return bars + 8 * (G % kS); };
  // Thread 0 issues the steps in order: the next one's tile i, its step kt and coordinates.
  uint32_t iss_g = 0;
  int iss_kt = 0;
  int64_t iss_i = 0;
  Tile iss_u{};
  DRange<kBK> iss_r(a, 0);  // (its 64-bit divisions once a tile)
  auto issue = [&]() {
    if (iss_kt == 0) {
      iss_u = tile(iss_i);
      iss_r = DRange<kBK>(a, iss_u.vb);
    }
    tma_tile<BN>(stage(iss_g), bar(iss_g), &tmx, &tmv, iss_u.nb * BN, iss_u.row0, (iss_r.k0 + iss_kt) * kBK,
                 static_cast<int>(iss_r.b));
    ++iss_g;
    if (++iss_kt == nk) {
      iss_kt = 0;
      ++iss_i;
    }
  };

  const int lr = 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);  // ldmatrix row of this lane
  const int lane_r7 = lr & 7, lane_hi = lane >> 4;
  const uint32_t x_lane = Cfg<BN>::kVBytes + lr * 128;
  const uint64_t desc_base = desc_nmajor(kBK * 128);

  init_stage_barriers<kS>(bars);
  if (tid == 0)
    for (uint32_t G = 0; G + 1 < kS && G < steps; ++G) issue();

  float acc[Cfg<BN>::kAcc];
  uint32_t pa[4][4], pb[4][4];
  for (int64_t i = 0; i < my_tiles; ++i) {
    const Tile u = tile(i);
    const DRange<kBK> dr(a, u.vb);
    const uint32_t G0 = static_cast<uint32_t>(i) * nk;
#pragma unroll
    for (int e = 0; e < Cfg<BN>::kAcc; ++e) acc[e] = 0.f;
    float m[2] = {-kInf, -kInf}, l[2] = {0.f, 0.f}, scale[2];
    bool any_up = false;
    mbar_wait(bar(G0), (G0 / kS) & 1);
    softmax_tile<T>(pa, stage(G0) + x_lane, lane_r7, lane_hi, m, l, scale, any_up, int64_t{dr.k0} * kBK + 2 * t,
                    a.d2, dr.masked(0));
    for (int kt = 0; kt < nk; ++kt) {
      const uint32_t G = G0 + kt;
      issue_products<T, BN>(acc, pa, desc_base, stage(G));
      // every warp done with step G - 1 (its product waited at the end of
      // that step): its stage takes step G + kS - 1, of this tile or the next
      __syncthreads();
      if (tid == 0 && G + kS - 1 < steps) issue();
      if (kt + 1 < nk) {
        mbar_wait(bar(G + 1), ((G + 1) / kS) & 1);
        softmax_tile<T>(pb, stage(G + 1) + x_lane, lane_r7, lane_hi, m, l, scale, any_up,
                        int64_t{dr.k0 + kt + 1} * kBK + 2 * t, a.d2, dr.masked(kt + 1));
      }
      finish_products<BN>(acc, pa, pb, kt + 1 < nk, any_up, scale);
    }

    // Epilogue: l over the quad, out = acc / l, lse = m + log(l).
    float inv[2];
    const int64_t r0 = u.row0 + 16 * warp + g, n0 = int64_t{u.nb} * BN;
    finish_rows(a, u.vb, r0, t, u.nb, m, l, inv);
    if constexpr (OUT_BUF) {
      const uint32_t ob = smem + C::kOutOffset;
      constexpr int kNP = C::kOutPanels;
      auto round = [&](auto p0) {  // panels p0 .. p0 + kNP - 1 through the buffer
        constexpr int P0 = decltype(p0)::value;
        if (tid == 0) tma_store_wait_read();  // the last round's store has read the buffer
        __syncthreads();
        write_out_panels<T, BN, P0, kNP>(ob, warp, g, t, inv, acc);
        fence_proxy_async();
        __syncthreads();
        if (tid == 0) {
#pragma unroll
          for (int q = 0; q < kNP; ++q)
            if (n0 + 64 * (P0 + q) < a.d3)
              tma_store_3d(&tmo, ob + q * (kBM * 128), static_cast<int>(n0) + 64 * (P0 + q), u.row0,
                           static_cast<int>(u.vb));
          tma_store_commit();
        }
      };
      round(std::integral_constant<int, 0>{});
      if constexpr (BN / 64 > kNP) round(std::integral_constant<int, kNP>{});
    } else {
      store_output<T, BN>(a, u.vb, r0, n0, t, inv, acc);
    }
  }
  if (OUT_BUF && tid == 0) tma_store_wait_read();  // before the CTA's shared memory is released
#else
  __trap();  // built without sm_90a: the plan never selects this kernel then
#endif
}

// Tensor maps of x (d2, d1, batch) and V (d3, d2, batch), 16-bit, 128-byte
// swizzle, boxes of 64 columns x 128 (x) / 64 (V) rows. False where they
// cannot be made (map_3d; the caller then takes the cp.async kernel).
template <typename T>
bool make_maps(const Args& a, CUtensorMap* tmx, CUtensorMap* tmv) {
  return map_3d<T>(tmx, a.x, a.d2, a.d1, a.batch, a.x_row_stride, a.x_batch_stride, 64, kBM) &&
         map_3d<T>(tmv, a.v, a.d3, a.d2, a.batch, a.v_row_stride, a.v_batch_stride, 64, kBK);
}

template <typename T, int BN>
void launch(const Args& a) {
  using C = Cfg<BN>;
  // TMA where the driver makes the tensor maps; SOFTMAX_EXT_SMM_CPASYNC=1: cp.async (A/B work).
  const char* cp_env = std::getenv("SOFTMAX_EXT_SMM_CPASYNC");
  CUtensorMap tmx{}, tmv{}, tmo{};
  const bool tma = !(cp_env != nullptr && cp_env[0] == '1') && make_maps<T>(a, &tmx, &tmv);
  // The output stored by TMA where its map can be made (d3 a multiple of 8);
  // SOFTMAX_EXT_SMM_OUT_STAGED=0: each thread's 4-byte stores (A/B work).
  const char* out_env = std::getenv("SOFTMAX_EXT_SMM_OUT_STAGED");
  const bool out_staged = tma && !(out_env != nullptr && out_env[0] == '0') && a.d3 % 8 == 0 &&
                          map_3d<T>(&tmo, a.out, a.d3, a.d1, a.batch * a.parts, a.d3, a.d1 * a.d3, 64, kBM);
  // SOFTMAX_EXT_SMM_PERSISTENT=0: the TMA kernel with a CTA per tile (A/B work).
  const char* per_env = std::getenv("SOFTMAX_EXT_SMM_PERSISTENT");
  // 128 and 256 columns (a CTA an SM either way), and only where the CTAs
  // that run at once are fewer than the tiles: with a tile a CTA the
  // persistent kernel has nothing to overlap and its epilogue (the output in
  // rounds through its own buffer) costs more. 64 columns keep two CTAs of
  // the kernel below an SM.
  if constexpr (BN >= 128) {
    static_assert(PCfg<BN, true>::kSmem <= 227 * 1024, "the persistent kernel's shared memory");
    auto* persistent =
        out_staged ? &smm_wgmma_persistent_kernel<T, BN, true> : &smm_wgmma_persistent_kernel<T, BN, false>;
    const int64_t p_smem = out_staged ? PCfg<BN, true>::kSmem : PCfg<BN, false>::kSmem;
    const int64_t tiles = ((a.d3 + BN - 1) / BN) * ((a.d1 + kBM - 1) / kBM) * a.batch * a.parts;
    if (tma && !(per_env != nullptr && per_env[0] == '0') &&
        tiles > softmax_ext::cuda::resident_blocks(persistent, kThreads, p_smem)) {
      softmax_ext::cuda::launch_row_blocks(persistent, tiles, softmax_ext::cuda::BlockShape{kThreads, 1, p_smem, true},
                                           a, tmx, tmv, tmo);
      return;
    }
  }
  auto* kernel = tma ? &smm_wgmma_kernel<T, BN, kTma> : &smm_wgmma_kernel<T, BN, kCpAsync>;
  const int64_t blocks = ((a.d3 + BN - 1) / BN) * ((a.d1 + kBM - 1) / kBM);
  softmax_ext::cuda::launch_batch_grid(kernel, blocks, a.batch * a.parts, kThreads, C::kSmem,
                                       c10::cuda::getCurrentCUDAStream(), a, tmx, tmv, tmo, out_staged);
}

template <typename T>
void launch_bn(const Args& a, int bn) {
  if (bn == 64) return launch<T, 64>(a);
  if (bn == 128) return launch<T, 128>(a);
  return launch<T, 256>(a);
}

}  // namespace sm90

void launch_sm90_bf16(const Args& a, int bn) { sm90::launch_bn<__nv_bfloat16>(a, bn); }
void launch_sm90_f16(const Args& a, int bn) { sm90::launch_bn<__half>(a, bn); }

}  // namespace softmax_ext::smm::cuda
