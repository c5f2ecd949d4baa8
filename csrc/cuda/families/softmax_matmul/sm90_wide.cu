// softmax_matmul forward for Hopper (sm_90a), 16-bit, for d3 above 256: one
// CTA computes 64 rows of d1 x 512 columns of d3, and each probability is
// computed once for all 512 columns.
//
// The 128 x 256 kernel (sm90.cu) gives a warpgroup 64 rows x 256 columns and
// P in registers, so at d3 = 512 two CTAs compute the softmax of the same
// rows. Both the tensor-core work and the softmax draw on the GPU's power
// budget (the 128 x 256 kernel runs at the power cap at d2 = 8192, its
// softmax alone drawing ~95 % of it at full clock), so the duplicated
// exponentials cost time. Here the two warpgroups share rows: warpgroup w
// owns columns 256 w .. 256 w + 255 of the output and computes the softmax
// of the tile's columns 32 w .. 32 w + 31 (16 values a thread instead of
// 32); the tile's row max is exchanged through shared memory, and P is
// written by stmatrix over the x tile it was read from (each warpgroup reads
// and writes only its own half, so no other thread's x is overwritten), then
// both warpgroups multiply the whole 64 x 64 P tile (wgmma SS: A K-major from
// shared memory) with their own half of the V tile.
//
// Per iteration: [wgmma of tile k in flight] wait for tile k + 1 (TMA) ->
// ldmatrix, half-tile row max -> exchange (block barrier) -> lazy max
// update, ex2, row sums, pack, stmatrix over x, proxy fence -> wait for the
// products of tile k, rescale -> block barrier (P of k + 1 complete, stage
// of k free) -> thread 0 refills the stage of k with tile k + 3 -> wgmma of
// tile k + 1. Three stages of 72 KiB (V 64 x 512 as eight 64-column
// 128-byte-swizzled blocks, x 64 x 64). The output goes through the freed
// stages and out by TMA (d3 a multiple of 8), else by each thread's pairs.
#include "cuda/families/softmax_matmul/cuda_launch.h"

#include <c10/cuda/CUDAStream.h>
#include "cuda/core/launch.cuh"
#include "cuda/families/softmax_matmul/sm90_common.cuh"
#include "cuda/families/softmax_matmul/tma.cuh"

#include <cstdint>

namespace softmax_ext::smm::cuda {
namespace sm90 {
namespace wide {

constexpr int kBM = 64;    // rows of d1 per CTA
constexpr int kBN = 512;   // columns of d3 per CTA, 256 per warpgroup
constexpr int kBK = 64;    // columns of d2 per tile
constexpr int kStages = 3;
constexpr int kThreads = 256;
constexpr int kVBytes = kBK * kBN * 2;   // 64 KiB
constexpr int kXBytes = kBM * kBK * 2;   // 8 KiB
constexpr int kStageBytes = kVBytes + kXBytes;
constexpr int kRowOffset = kStages * kStageBytes;  // row max / row sum exchange: [2][kBM] floats
constexpr int kBarOffset = kRowOffset + 2 * kBM * 4;
constexpr int kSmem = kBarOffset + 8 * kStages + 1024;

#ifdef SMM_SM90A_DEVICE
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&d)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(d[0]), "r"(d[1]),
               "r"(d[2]), "r"(d[3])
               : "memory");
}

__device__ __forceinline__ void tma_tile(uint32_t stage, uint32_t bar, const CUtensorMap* tmx, const CUtensorMap* tmv,
                                         int n0, int row0, int k0, int b) {
  mbar_expect_tx(bar, kStageBytes);
#pragma unroll
  for (int j = 0; j < kBN / 64; ++j) tma_load_3d(stage + j * (kBK * 128), tmv, n0 + 64 * j, k0, b, bar);
  tma_load_3d(stage + kVBytes, tmx, k0, row0, b, bar);
}

// The softmax of this warpgroup's half of one x tile (columns 32 wg ..
// 32 wg + 31) for this thread's two rows (r, r + 8 of the CTA's 64): the
// row max of the whole tile through `rows` (the other warpgroup's half), m,
// l (this half's sum), scale and any_up updated, P written over x.
template <typename T>
__device__ __forceinline__ void softmax_half(uint32_t x_row, int c0, int r7, uint32_t rows, int wg, int r, int t, float (&m)[2],
                                             float (&l)[2], float (&scale)[2], bool& any_up, int64_t col0,
                                             int64_t d2, bool tail) {
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kInf = __builtin_huge_valf();
  uint32_t p[2][4];
#pragma unroll
  for (int j = 0; j < 2; ++j) ldmatrix_x4(p[j], x_row + (((c0 + 2 * j) ^ r7) << 4));
  float f[2][8];
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float2 lo = unpack<T>(p[j][h]), hi = unpack<T>(p[j][2 + h]);
      f[h][4 * j] = lo.x;
      f[h][4 * j + 1] = lo.y;
      f[h][4 * j + 2] = hi.x;
      f[h][4 * j + 3] = hi.y;
    }
  if (tail) {  // columns past d2 (zero-filled) count as -inf
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t col = col0 + 16 * j + (e & 1) + 8 * (e >> 1);
        if (col >= d2) f[0][4 * j + e] = f[1][4 * j + e] = -kInf;
      }
  }
  float mx[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = f[h][0];
#pragma unroll
    for (int e = 1; e < 8; ++e) mx[h] = fmaxf(mx[h], f[h][e]);
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
  }
  const uint32_t mine = rows + 4 * (wg * kBM + r), theirs = rows + 4 * ((1 - wg) * kBM + r);
  if (t == 0) {
    asm volatile("st.shared.f32 [%0], %1;" ::"r"(mine), "f"(mx[0]) : "memory");
    asm volatile("st.shared.f32 [%0], %1;" ::"r"(mine + 32), "f"(mx[1]) : "memory");
  }
  __syncthreads();
  bool up = false;
  float neg[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float other;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(other) : "r"(theirs + 32 * h) : "memory");
    // the same max in both warpgroups (fmaxf commutes), so the same moves
    up |= lazy_step<false>(fmaxf(mx[h], other), m[h], scale[h]);
    neg[h] = m[h] == -kInf ? 0.f : -m[h] * kLog2e;
  }
  any_up = __any_sync(0xffffffffu, up);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      f[h][e] = ex2(fmaf(f[h][e], kLog2e, neg[h]));
      s += f[h][e];
    }
    l[h] = l[h] * scale[h] + s;
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      p[j][h] = pack<T>(f[h][4 * j], f[h][4 * j + 1]);
      p[j][2 + h] = pack<T>(f[h][4 * j + 2], f[h][4 * j + 3]);
    }
    stmatrix_x4(x_row + (((c0 + 2 * j) ^ r7) << 4), p[j]);
  }
  fence_proxy_async();  // P visible to the wgmma (async proxy) after the next barrier
}

template <typename T>
__device__ __forceinline__ void wgmma_ss(float (&acc)[128], uint64_t da, uint64_t db) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) wgmma_ss_n256_bf16_t1(acc, da, db);
  else wgmma_ss_n256_f16_t1(acc, da, db);
}
#endif  // SMM_SM90A_DEVICE

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    smm_wide_kernel(Args a, int64_t batch0, const __grid_constant__ CUtensorMap tmx,
                    const __grid_constant__ CUtensorMap tmv, const __grid_constant__ CUtensorMap tmo,
                    bool out_staged) {
#ifdef SMM_SM90A_DEVICE
  const uint32_t smem = smem_base_1k();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wq = warp & 3;  // warpgroup, warp within it (16 rows each)
  const int g = lane >> 2, t = lane & 3;
  const CtaTile<kBN> cta(a.d3, batch0);
  const int64_t b = cta.b, n0 = cta.nb * kBN, row0 = cta.mb * kBM;
  const int nk = static_cast<int>((a.d2 + kBK - 1) / kBK);
  const int r = 16 * wq + g;  // this thread's rows: r, r + 8

  // ldmatrix / stmatrix row of this lane in the x tile, and its first
  // 16-byte chunk of the warpgroup's half (chunks 4 wg .. 4 wg + 3, two per
  // 16 columns; stored at chunk ^ (row % 8)).
  const int lr = 16 * wq + (lane & 7) + 8 * ((lane >> 3) & 1);
  const uint32_t x_row = kVBytes + lr * 128;
  const int c0 = 4 * wg + (lane >> 4), r7 = lr & 7;

  const uint64_t desc_b = desc_nmajor(kBK * 128);
  const uint64_t desc_a = desc_kmajor();
  const uint32_t v_half = wg * (kVBytes / 2);

  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  float m[2] = {-__builtin_huge_valf(), -__builtin_huge_valf()}, l[2] = {0.f, 0.f}, scale[2];
  bool any_up = false;

  const uint32_t bars = smem + kBarOffset, rows = smem + kRowOffset;
  init_stage_barriers<kStages>(bars);
  if (tid == 0)
    for (int s = 0; s < kStages && s < nk; ++s)
      tma_tile(smem + s * kStageBytes, bars + 8 * s, &tmx, &tmv, static_cast<int>(n0), static_cast<int>(row0),
               s * kBK, static_cast<int>(b));
  const int tail_from = a.d2 % kBK == 0 ? nk : nk - 1;
  mbar_wait(bars, 0);
  softmax_half<T>(smem + x_row, c0, r7, rows, wg, r, t, m, l, scale, any_up, 32 * wg + 2 * t, a.d2, tail_from == 0);
  __syncthreads();

  for (int kt = 0; kt < nk; ++kt) {
    const int s = kt % kStages;
    const uint32_t stage = smem + static_cast<uint32_t>(s) * kStageBytes;
#pragma unroll
    for (int i = 0; i < 128; ++i) fence_reg(acc[i]);
    wgmma_fence();
#pragma unroll
    for (int kb = 0; kb < 4; ++kb)
      wgmma_ss<T>(acc, desc_a | ((stage + kVBytes + 32 * kb) >> 4), desc_b | ((stage + v_half + kb * 2048) >> 4));
    wgmma_commit();
    const bool more = kt + 1 < nk;
    if (more) {
      const int s1 = (kt + 1) % kStages;
      mbar_wait(bars + 8 * s1, ((kt + 1) / kStages) & 1);
      softmax_half<T>(smem + static_cast<uint32_t>(s1) * kStageBytes + x_row, c0, r7, rows, wg, r, t, m, l, scale,
                      any_up, int64_t{kt + 1} * kBK + 32 * wg + 2 * t, a.d2, kt + 1 == tail_from);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 128; ++i) fence_reg(acc[i]);
    if (more) {
      if (any_up) rescale_rows(acc, scale);
      __syncthreads();  // P of tile kt + 1 complete; both warpgroups done with tile kt
      const int kn = kt + kStages;
      if (tid == 0 && kn < nk)
        tma_tile(stage, bars + 8 * s, &tmx, &tmv, static_cast<int>(n0), static_cast<int>(row0), kn * kBK,
                 static_cast<int>(b));
    }
  }

  // Epilogue: l over the quad, then over the two warpgroups (in the same
  // order in both, so both divide by the same l); out = acc / l, lse =
  // m + log(l).
  __syncthreads();  // every warpgroup past the row-max exchange of the last tile
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    if (t == 0) asm volatile("st.shared.f32 [%0], %1;" ::"r"(rows + 4 * (wg * kBM + r + 8 * h)), "f"(l[h]) : "memory");
  }
  __syncthreads();
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l0, l1;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(l0) : "r"(rows + 4 * (r + 8 * h)) : "memory");
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(l1) : "r"(rows + 4 * (kBM + r + 8 * h)) : "memory");
    const float lt = l0 + l1;
    inv[h] = 1.f / lt;
    const int64_t row = row0 + r + 8 * h;
    if (wg == 0 && t == 0 && cta.nb == 0 && row < a.d1) a.lse[b * a.d1 + row] = m[h] + logf(lt);
  }
  if (out_staged) {
    // 64-column panels of 128-byte swizzled rows (warpgroup wg: panels
    // 4 wg .. 4 wg + 3) over the stages, then out by TMA.
#pragma unroll
    for (int j = 0; j < 32; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int rr = r + 8 * h;  // rr % 8 == g
        const uint32_t d = pack<T>(acc[4 * j + 2 * h] * inv[h], acc[4 * j + 2 * h + 1] * inv[h]);
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(smem + (4 * wg + j / 8) * (kBM * 128) + rr * 128 +
                                                     (((j % 8) ^ g) << 4) + 4 * t),
                     "r"(d)
                     : "memory");
      }
    store_panels<kBN / 64>(&tmo, smem, kBM * 128, n0, a.d3, row0, b);
    return;
  }
  store_output<T, 256>(a, b, row0 + r, n0 + 256 * wg, t, inv, acc);
#else
  __trap();  // built without sm_90a: the plan never selects this kernel then
#endif
}

template <typename T>
bool launch(const Args& a) {
  CUtensorMap tmx{}, tmv{}, tmo{};
  if (!map_3d<T>(&tmx, a.x, a.d2, a.d1, a.batch, a.x_row_stride, a.x_batch_stride, 64, kBM) ||
      !map_3d<T>(&tmv, a.v, a.d3, a.d2, a.batch, a.v_row_stride, a.v_batch_stride, 64, kBK))
    return false;
  const bool out_staged = map_3d<T>(&tmo, a.out, a.d3, a.d1, a.batch, a.d3, a.d1 * a.d3, 64, kBM);
  const int64_t blocks = ((a.d3 + kBN - 1) / kBN) * ((a.d1 + kBM - 1) / kBM);
  softmax_ext::cuda::launch_batch_grid(&smm_wide_kernel<T>, blocks, a.batch, kThreads, kSmem,
                                       c10::cuda::getCurrentCUDAStream(), a, tmx, tmv, tmo, out_staged);
  return true;
}

}  // namespace wide
}  // namespace sm90

bool launch_sm90_wide_bf16(const Args& a) { return sm90::wide::launch<__nv_bfloat16>(a); }
bool launch_sm90_wide_f16(const Args& a) { return sm90::wide::launch<__half>(a); }

}  // namespace softmax_ext::smm::cuda
