// softmax_matmul backward for Hopper (sm_90a), bf16, f16 and float32 (TF32,
// or 3xTF32 where TF32 is not allowed): three kernels, deterministic (every
// output element has one owner, no atomics), no (d1, d2) intermediate beyond
// dX itself. This header: what both launchers share (D, the dX kernels, the
// pipelined main loop, the lse's tensor map); sm90_backward.cu: the 16-bit
// dV kernel and launcher; sm90_backward_f32.cu: the TF32 / 3xTF32 dV kernel,
// the split of B operands and the float32 launcher.
//
//   D  = rowsum(dO * O)              (f32, (batch, d1): one warp per row)
//   dX = P * (dO V^T - D)            smm_bwd_dx_ss_kernel: a GEMM over K = d3
//        P = exp(x - lse)            with the softmax-backward epilogue; CTA =
//                                    128 rows of d1 x 128 columns of d2, two
//                                    CTAs per SM; A = dO, B = V rows, both
//                                    K-major in shared memory (wgmma SS), one
//                                    stage's products in flight while the
//                                    next stage's are issued.
//   dV = P^T dO                      smm_bwd_dv_kernel: CTA = 128 rows of d2 x BN
//                                    columns of d3, loop over d1 in tiles of 64
//                                    (the forward kernel with the roles turned:
//                                    P^T from x by ldmatrix.trans, exp(x - lse)
//                                    in registers as the A operand while the
//                                    previous tile's wgmma runs, B = dO N-major).
//
// Both: 2 warpgroups, wgmma (sm90_common.cuh), a pipeline of stages in the
// 128-byte-swizzled layout filled by TMA (tma.cuh: one thread issues a
// stage's boxes, an mbarrier per stage completes, a block-wide barrier before
// a stage is refilled) where the tensor maps can be made; zero fill at the
// tails. The plan takes them for 16-byte aligned rows with d2 and d3
// multiples of 8 (plan.cpp).
//
// dX's 16-bit epilogue is staged: the CTA's x tile comes by TMA into the
// stage the K loop has finished with, while the last K tiles run; the
// epilogue computes dX in place there and TMA stores it (clipped at d1 and
// d2). Where a tensor map of x or dX cannot be made (or
// SOFTMAX_EXT_SMM_DX_SS=0 asks, or SOFTMAX_EXT_SMM_DX_BN=256), dX is
// smm_bwd_dx_kernel: dO's A fragments by ldmatrix into registers, loads by
// TMA or, where V's or dO's map cannot be made (SOFTMAX_EXT_SMM_CPASYNC=1
// forces it, as for the forward), by cp.async from every thread, the
// epilogue through global memory (4-byte loads of x, stores of dX); dV
// takes cp.async likewise.
//
// TF32 (T = float): the register-A dX kernel with K tiles of 32 columns (a
// stage's rows are 128 bytes either way; ldmatrix's 8 x 8 16-bit matrices
// are 8 x 4 f32, the TF32 A-fragment layout), dO rounded by cvt.rna in
// registers (V read as it is: wgmma uses its top 19 bits), the epilogue
// staged as the 16-bit one (the x tile's four panels in two stages the K
// loop is done with; through global memory where x's or dX's map cannot be
// made, or SOFTMAX_EXT_SMM_DX_STAGED=0). dV can not be the
// 16-bit kernel's: TF32 wgmma takes B only K-major, and dO (d1, d3) is
// N-major for P^T dO. smm_bwd_dv_tf32_kernel reads a copy of dO transposed
// to (batch, d3, d1) (ops.cpp makes it, a workspace of dO's size, as lse
// with rows padded to 16 bytes for TMA), K-major by TMA, and forms the A
// fragments of P^T from the x tile with 4-byte shared loads; exp(x - lse)
// rounded by cvt.rna (a NaN stays a NaN).
// 3xTF32 (float32-accurate): the register-A dX kernel and the TF32 dV kernel
// with each product as big x big + big x small + small x big, summed a stage
// at a time by the tensor cores and added to the accumulator in f32
// (wgmma_mainloop). The A operand (dO for dX, P for dV) is split in
// registers; the B operand's two parts come from workspaces split
// beforehand (tf32_split: V into big and small copies, dO^T into itself and
// a small copy), a second K-major tile a stage; P = expf(x - lse) in place
// of ex2.approx; dX in four stages of 48 KiB, one CTA per SM.
#pragma once

#include "cuda/families/softmax_matmul/cuda_launch.h"
#include "cuda/families/softmax_matmul/sm90_common.cuh"
#include "cuda/families/softmax_matmul/tma.cuh"

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <type_traits>

namespace softmax_ext::smm::cuda::sm90 {

constexpr int kThreads = 256;
// Columns of a K tile (one 128-byte row of a stage): 64 16-bit, 32 f32.
template <typename T>
constexpr int kKCols = 128 / static_cast<int>(sizeof(T));

// ---------------------------------------------------------------------------
// D = rowsum(dO * O), f32.
template <typename T>
__global__ void smm_bwd_delta_kernel(const T* go, const T* o, float* D, int64_t rows, int64_t d3) {
  const int64_t row = blockIdx.x * int64_t{8} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const T* g = go + row * d3;
  const T* p = o + row * d3;
  float s = 0.f;
  if constexpr (std::is_same_v<T, float>) {
    if (d3 % 4 == 0) {
      for (int64_t c = 4 * lane; c < d3; c += 128) {
        const float4 a = *reinterpret_cast<const float4*>(g + c), b = *reinterpret_cast<const float4*>(p + c);
        s = fmaf(a.x, b.x, s);
        s = fmaf(a.y, b.y, s);
        s = fmaf(a.z, b.z, s);
        s = fmaf(a.w, b.w, s);
      }
    } else {
      for (int64_t c = lane; c < d3; c += 32) s = fmaf(g[c], p[c], s);
    }
  } else if (d3 % 8 == 0) {
    for (int64_t c = 8 * lane; c < d3; c += 256) {
      const uint4 a = *reinterpret_cast<const uint4*>(g + c), b = *reinterpret_cast<const uint4*>(p + c);
      const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float2 fa, fb;
        if constexpr (std::is_same_v<T, __nv_bfloat16>) {
          fa = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&aw[e]));
          fb = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bw[e]));
        } else {
          fa = __half22float2(*reinterpret_cast<const __half2*>(&aw[e]));
          fb = __half22float2(*reinterpret_cast<const __half2*>(&bw[e]));
        }
        s = fmaf(fa.x, fb.x, s);
        s = fmaf(fa.y, fb.y, s);
      }
    }
  } else {
    for (int64_t c = lane; c < d3; c += 32) {
      float fa, fb;
      if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        fa = __bfloat162float(g[c]);
        fb = __bfloat162float(p[c]);
      } else {
        fa = __half2float(g[c]);
        fb = __half2float(p[c]);
      }
      s = fmaf(fa, fb, s);
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (lane == 0) D[row] = s;
}

// D = rowsum(dO * O) on `stream`: eight rows a block of 256 threads.
template <typename T>
void launch_delta(const BwdArgs& a, cudaStream_t stream) {
  const int64_t rows = a.batch * a.d1;
  smm_bwd_delta_kernel<T><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(
      static_cast<const T*>(a.go), static_cast<const T*>(a.out), a.delta, rows, a.d3);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------
// dX: CTA = 128 rows of d1 x BN columns of d2; K = d3 in tiles of kKCols.
constexpr int kDxStages = 3;        // two CTAs per SM (BN = 128)
constexpr int kDxSplitStages = 4;   // 3xTF32: stages of 48 KiB, one CTA per SM

// S pipeline stages, then their mbarriers and the x tile's (the staged
// epilogues: the tile, 128 rows of d1 x BN columns of d2 as panels of 128
// rows x 128 bytes, 128-byte swizzled, takes stages the K loop is done
// with: one in the 16-bit SS kernel, whose BN / 64 panels are kXBytes; two
// in the float32 register-A kernel, its four panels of 32 columns loaded
// in two parts, an mbarrier each; dX replaces it in place). SPLIT
// (3xTF32): a stage also holds V's small part after dO.
template <int BN, int S, bool SPLIT = false>
struct DxCfg {
  static constexpr int kVBytes = BN * 128;         // BN rows of V (d2) x kKCols columns (d3), K-major
  static constexpr int kOBytes = 128 * 128;        // 128 rows of dO x kKCols columns
  static constexpr int kLoOffset = SPLIT ? kVBytes + kOBytes : 0;  // SPLIT: V's small part, as V
  static constexpr int kStageBytes = kVBytes + kOBytes + (SPLIT ? kVBytes : 0);  // multiples of 1 KiB
  static constexpr int kTxBytes = kStageBytes;           // TMA bytes a stage
  static constexpr int kPanelBytes = 128 * 128;          // an x panel: 128 rows x 128 bytes
  static constexpr int kXBytes = BN / 64 * kPanelBytes;  // the 16-bit x tile
  static constexpr int kBarOffset = S * kStageBytes;     // TMA: one mbarrier per stage, then the x tile's
  static constexpr int kSmem = kBarOffset + 8 * (S + 2) + 1024;  // the x tile's: one (SS) or two
};

#ifdef SMM_SM90A_DEVICE
template <typename T, int BN>
__device__ __forceinline__ void dx_load(uint32_t stage, const BwdArgs& a, const T* vb, const T* gb, int64_t row0,
                                        int64_t n0, int64_t k0) {
  // V rows n0.., columns k0..k0 + kKCols - 1; dO rows row0.., the same columns
  load_swizzled_tile<T, BN, 8, kThreads>(stage, vb, a.v_row_stride, n0, k0, a.d2, a.d3);
  load_swizzled_tile<T, 128, 8, kThreads>(stage + DxCfg<BN, kDxStages>::kVBytes, gb, a.d3, row0, k0, a.d1, a.d3);
}

// The same by TMA (one thread): V as one box of kKCols columns x BN rows, dO
// as one box of kKCols columns x 128 rows; the layout dx_load writes.
// SPLIT: also V's small part (tmvl), a box like V's.
template <int BN, bool SPLIT = false>
__device__ __forceinline__ void dx_tma(uint32_t stage, uint32_t bar, const CUtensorMap* tmv, const CUtensorMap* tmo,
                                       const CUtensorMap* tmvl, int row0, int n0, int k0, int b) {
  using C = DxCfg<BN, kDxStages, SPLIT>;  // (the stage layout does not depend on the stage count)
  mbar_expect_tx(bar, C::kTxBytes);
  tma_load_3d(stage, tmv, k0, n0, b, bar);
  tma_load_3d(stage + C::kVBytes, tmo, k0, row0, b, bar);
  if constexpr (SPLIT) tma_load_3d(stage + C::kLoOffset, tmvl, k0, n0, b, bar);
}

// The staged epilogue's x tile by TMA (one thread): BN / 64 boxes of 64
// columns x 128 rows, one panel each, zero fill past d1 and d2.
template <int BN>
__device__ __forceinline__ void dx_x_tma(uint32_t xs, uint32_t bar, const CUtensorMap* tmx, int row0, int n0,
                                         int b) {
  using C = DxCfg<BN, kDxStages>;
  mbar_expect_tx(bar, C::kXBytes);
#pragma unroll
  for (int p = 0; p < BN / 64; ++p) tma_load_3d(xs + p * C::kPanelBytes, tmx, n0 + 64 * p, row0, b, bar);
}
#endif

#ifdef SMM_SM90A_DEVICE
// v into fragment register e of k block kb as TF32 (split_tf32's big part);
// SPLIT: also its small part into fragment 4 + kb.
template <bool SPLIT, int N>
__device__ __forceinline__ void put_tf32(uint32_t (&f)[N][4], int kb, int e, float v) {
  const Tf32Split p = split_tf32(v);
  f[kb][e] = p.big;
  if constexpr (SPLIT) f[4 + kb][e] = p.small;
}

// The pipelined main loop of the register-A backward kernels: kS stages,
// kS - 1 loads in flight, acc (64 x BN per warpgroup) += A (registers, 4
// fragments of 16 columns a stage) x B (the stage in shared memory) with
// wgmma, the next stage's A fragments read while the current wgmma runs.
//   LOAD (tma.cuh): kCpAsync: load(stage_address, k, bar) issues stage k's
//     cp.async copies (every thread; bar unused); kTma: thread 0 calls it to
//     issue stage k's boxes and the arrive.expect_tx on bar, the mbarrier of
//     the stage (at bars + 8 * (k % kS)), which every thread waits on with
//     the parity (k / kS) & 1; a block-wide barrier (every warp done with the
//     stage) precedes each refill;
//   fetch(frags, stage_address): the A fragments of a landed stage;
//   kDescStep: bytes between the B descriptors of the 4 fragments (TB: B's
//   major-ness, as wgmma_rs takes it).
// kLoOffset != 0: 3xTF32 (T = float). fetch fills 8 fragments, the 4 big
// parts then the 4 small ones; the stage holds B's big part (B rounded to
// TF32) and, kLoOffset bytes past it, B's small part.
// kExtra (TMA only): loads nk .. nk + kExtra - 1 after the K tiles, each
// into the stage load k would take (k % kS) once it is free, completing on
// an mbarrier of its own (bars + 8 (kS + k - nk)), which the caller waits
// on after the loop (the dX epilogue's x tile, landing while the last K
// tiles run).
// Each stage's small x big, big x small and big x big products are summed
// by the tensor cores into a zeroed tile accumulator, added to acc in f32,
// so that the tensor cores' own accumulation spans one stage only.
template <typename T, int BN, int TB, int kS, int kStageBytes, int kDescStep, int LOAD, int kLoOffset = 0,
          int kExtra = 0, typename LoadFn, typename Fetch>
__device__ __forceinline__ void wgmma_mainloop(float (&acc)[BN / 2], uint32_t smem, uint32_t bars, int nk,
                                               uint64_t desc_base, const LoadFn& load, const Fetch& fetch) {
  constexpr bool TMA = LOAD == kTma;
  static_assert(kExtra == 0 || (TMA && kExtra <= kS - 1), "extra loads: TMA, issued by the last iteration");
  // load k (thread 0): its stage and mbarrier
  const auto issue = [&](int k) {
    load(smem + static_cast<uint32_t>(k % kS) * kStageBytes, k, bars + 8 * (k < nk ? k % kS : kS + k - nk));
  };
  constexpr bool kSplit = kLoOffset != 0;
  static_assert(!kSplit || std::is_same_v<T, float>, "3xTF32 is float32 only");
  constexpr int kFrags = kSplit ? 8 : 4;
  uint32_t fa[kFrags][4], fb[kFrags][4];
  [[maybe_unused]] float tile[kSplit ? BN / 2 : 1];
  if constexpr (TMA) {
    init_stage_barriers<kS + kExtra>(bars);
    if (threadIdx.x == 0) {
      for (int s = 0; s < kS - 1 && s < nk + kExtra; ++s) issue(s);
    }
    mbar_wait(bars, 0);
  } else {
#pragma unroll
    for (int s = 0; s < kS - 1; ++s) {
      if (s < nk) load(smem + s * kStageBytes, s, 0u);
      cp_async_commit();
    }
    cp_async_wait<kS - 2>();
    fence_proxy_async();
    __syncthreads();
  }
  fetch(fa, smem);

  for (int kt = 0; kt < nk; ++kt) {
    const uint32_t stage = smem + static_cast<uint32_t>(kt % kS) * kStageBytes;
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) fence_reg(acc[i]);
    if constexpr (kSplit) {
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) fence_reg(tile[i]);
    }
    wgmma_fence();
    if constexpr (kSplit) {
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) {
        const uint64_t db = desc_base | ((stage + kb * kDescStep) >> 4);
        const uint64_t ds = desc_base | ((stage + kLoOffset + kb * kDescStep) >> 4);
        wgmma_tf32<BN>(tile, fa[4 + kb], db, kb != 0);  // small x big (the first overwrites the tile)
        wgmma_tf32<BN>(tile, fa[kb], ds, 1);            // big x small
        wgmma_tf32<BN>(tile, fa[kb], db, 1);            // big x big
      }
    } else {
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) wgmma_rs<T, BN, TB>(acc, fa[kb], desc_base | ((stage + kb * kDescStep) >> 4));
    }
    wgmma_commit();
    const int kn = kt + kS - 1;
    if (kt + 1 < nk) {
      if constexpr (TMA) {
        // every warp done with tile kt - 1 (its wgmma waited, its fragments
        // fetched in earlier iterations): its stage is refilled now
        __syncthreads();
        if (threadIdx.x == 0 && kn < nk + kExtra) issue(kn);
        mbar_wait(bars + 8 * ((kt + 1) % kS), ((kt + 1) / kS) & 1);
      } else {
        cp_async_wait<kS - 3>();
        fence_proxy_async();
        __syncthreads();
        if (kn < nk) load(smem + static_cast<uint32_t>(kn % kS) * kStageBytes, kn, 0u);
        cp_async_commit();
      }
      fetch(fb, smem + static_cast<uint32_t>((kt + 1) % kS) * kStageBytes);
    } else if constexpr (kExtra > 0) {  // the last K tile: the extra loads not yet issued
      __syncthreads();
      if (threadIdx.x == 0 && kn < nk + kExtra) issue(kn);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) fence_reg(acc[i]);
    if constexpr (kSplit) {
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) {
        fence_reg(tile[i]);
        acc[i] += tile[i];
      }
    }
#pragma unroll
    for (int kb = 0; kb < kFrags; ++kb)
#pragma unroll
      for (int e = 0; e < 4; ++e) fence_reg(fa[kb][e]);
    if (kt + 1 < nk) {
#pragma unroll
      for (int kb = 0; kb < kFrags; ++kb)
#pragma unroll
        for (int e = 0; e < 4; ++e) fa[kb][e] = fb[kb][e];
    }
  }
}
#endif

#ifdef SMM_SM90A_DEVICE
// dX's epilogue through shared memory: dX = P * (acc - D) of this thread's
// rows g, g + 8 of its warp's 16, P = exp(x - lse) (EXPF: expf, 3xTF32;
// else ex2.approx), with the CTA's x tile (128 rows x BN columns of d2) in
// panels of 128 rows x 128 bytes (kPanelCols = 128 / sizeof(T) columns),
// 128-byte swizzled, the panel p at shared address panel(p), landed once
// wait() returns; dX replaces x in place and TMA stores it by tmd. This
// thread's pair of columns c = 8j + 2t of tile row r = 16 warp + g + 8h is
// at byte o = (c % kPanelCols) sizeof(T) of its panel's row: 16-byte chunk
// o / 16, stored at chunk (o / 16) ^ (r % 8) (r % 8 = g); each element read
// and written by the same thread, so in place. Rows past d1: lse and D not
// read (their dX is computed from zeros and not stored: the TMA store clips
// at d1, as at d2).
template <typename T, int BN, bool EXPF, typename PanelAddr, typename Wait>
__device__ __forceinline__ void dx_epilogue_staged(const BwdArgs& a, const float (&acc)[BN / 2],
                                                   const PanelAddr& panel, const Wait& wait, const CUtensorMap* tmd,
                                                   int64_t b, int64_t row0, int64_t n0) {
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr int kPanelCols = 128 / static_cast<int>(sizeof(T));
  using Pair = std::conditional_t<std::is_same_v<T, float>, float2, uint32_t>;  // two values of x / dX
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  float lse[2], dd[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = row0 + 16 * warp + g + 8 * h;
    const bool in = row < a.d1;
    lse[h] = in ? a.lse[b * a.d1 + row] : 0.f;
    dd[h] = in ? a.delta[b * a.d1 + row] : 0.f;
  }
  // this thread's pair j of row half h
  const auto addr = [&](int h, int j) {
    const int c = 8 * j + 2 * t, o = (c % kPanelCols) * static_cast<int>(sizeof(T));
    return panel(c / kPanelCols) + (16 * warp + g + 8 * h) * 128 + (((o >> 4) ^ g) << 4) + (o & 15);
  };
  wait();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float nl = -lse[h] * kLog2e;
    Pair xw[BN / 8];
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      if constexpr (std::is_same_v<T, float>)
        asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(xw[j].x), "=f"(xw[j].y) : "r"(addr(h, j)));
      else
        asm volatile("ld.shared.b32 %0, [%1];" : "=r"(xw[j]) : "r"(addr(h, j)));
    }
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const float d0 = acc[4 * j + 2 * h] - dd[h], d1 = acc[4 * j + 2 * h + 1] - dd[h];
      if constexpr (std::is_same_v<T, float>) {
        const float p0 = EXPF ? expf(xw[j].x - lse[h]) : ex2(fmaf(xw[j].x, kLog2e, nl));
        const float p1 = EXPF ? expf(xw[j].y - lse[h]) : ex2(fmaf(xw[j].y, kLog2e, nl));
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr(h, j)), "f"(p0 * d0), "f"(p1 * d1) : "memory");
      } else {
        const float2 xv = unpack<T>(xw[j]);
        const float p0 = ex2(fmaf(xv.x, kLog2e, nl)), p1 = ex2(fmaf(xv.y, kLog2e, nl));
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr(h, j)), "r"(pack<T>(p0 * d0, p1 * d1)) : "memory");
      }
    }
  }
  // the tile stored by TMA, a box per panel (none for a panel wholly past d2)
  store_panels<BN / kPanelCols, kPanelCols>(tmd, panel, n0, a.d2, row0, b);
}

// dX's epilogue from registers to global memory: x read and dX written by 4-
// (16-bit) or 8-byte (f32) accesses, d1 and d2 tails masked (d2 even). EXPF:
// P = expf(x - lse) (3xTF32) in place of ex2.approx. x is loaded kBatch
// pairs at a time before their dX stores: x and dX could alias for all the
// compiler knows, so a load after a store waits for it, and one load per
// store made a chain of DRAM round trips a thread.
template <typename T, int BN, bool EXPF>
__device__ __forceinline__ void dx_epilogue_global(const BwdArgs& a, const float (&acc)[BN / 2], int64_t b,
                                                   int64_t row0, int64_t n0) {
  constexpr float kLog2e = 1.4426950408889634f;
  using Pair = std::conditional_t<std::is_same_v<T, float>, float2, uint32_t>;  // two values of x / dX
  constexpr int kBatch = std::is_same_v<T, float> ? 8 : 16;  // loads in flight (registers: 128 a thread at 2 CTAs an SM)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const T* xb = static_cast<const T*>(a.x) + b * a.x_batch_stride;
  T* dxb = static_cast<T*>(a.dx) + b * a.d1 * a.d2;
  const int64_t r0 = row0 + 16 * warp + g;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = r0 + 8 * h;
    if (row >= a.d1) continue;
    const float lse = a.lse[b * a.d1 + row], nl = -lse * kLog2e;
    const float dd = a.delta[b * a.d1 + row];
    const T* xr = xb + row * a.x_row_stride;
    T* dr = dxb + row * a.d2;
#pragma unroll
    for (int j0 = 0; j0 < BN / 8; j0 += kBatch) {
      Pair xs[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int64_t col = n0 + 8 * (j0 + j) + 2 * t;  // d2 is even (a multiple of 8)
        if (col < a.d2) xs[j] = *reinterpret_cast<const Pair*>(xr + col);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int64_t col = n0 + 8 * (j0 + j) + 2 * t;
        if (col >= a.d2) continue;
        const int c = 4 * (j0 + j) + 2 * h;
        const float d0 = acc[c] - dd, d1 = acc[c + 1] - dd;
        if constexpr (std::is_same_v<T, float>) {
          const float2 xv = xs[j];
          const float p0 = EXPF ? expf(xv.x - lse) : ex2(fmaf(xv.x, kLog2e, nl));
          const float p1 = EXPF ? expf(xv.y - lse) : ex2(fmaf(xv.y, kLog2e, nl));
          *reinterpret_cast<float2*>(dr + col) = make_float2(p0 * d0, p1 * d1);
        } else {
          const float2 xv = unpack<T>(xs[j]);
          const float p0 = ex2(fmaf(xv.x, kLog2e, nl)), p1 = ex2(fmaf(xv.y, kLog2e, nl));
          *reinterpret_cast<uint32_t*>(dr + col) = pack<T>(p0 * d0, p1 * d1);
        }
      }
    }
  }
}
#endif

// dX with dO's fragments in registers (ldmatrix): the kernel of float32 (dO
// rounded, or split, in registers), of cp.async loads and of 256 columns.
// LOAD: kTma with the tensor maps tmv (V, box kKCols x BN) and tmo (dO, box
// kKCols x 128); kCpAsync ignores them. S: pipeline stages. SPLIT (3xTF32,
// kTma only): dO split into big and small parts in registers, V's small
// part by tmvl (unused otherwise), P = expf(x - lse). STAGED (kTma, BN =
// 128): the epilogue through shared memory (dx_epilogue_staged): the x
// tile's 128-byte panels (tmx: boxes of kKCols columns x 128 rows) come by
// TMA as two loads after the K tiles (wgmma_mainloop's kExtra), each into a
// stage the loop is done with, and dX goes out by tmd; else the epilogue
// through global memory.
template <typename T, int BN, int LOAD, int S, bool SPLIT = false, bool STAGED = false>
__global__ void __launch_bounds__(kThreads, BN == 128 && !SPLIT ? 2 : 1)
    smm_bwd_dx_kernel(BwdArgs a, int64_t batch0, const __grid_constant__ CUtensorMap tmv,
                      const __grid_constant__ CUtensorMap tmo, const __grid_constant__ CUtensorMap tmvl,
                      const __grid_constant__ CUtensorMap tmx, const __grid_constant__ CUtensorMap tmd) {
  static_assert(!SPLIT || (std::is_same_v<T, float> && LOAD == kTma), "3xTF32: f32, TMA");
  static_assert(!STAGED || (LOAD == kTma && BN == 128), "the staged epilogue: TMA, 128 columns");
#ifdef SMM_SM90A_DEVICE
  using C = DxCfg<BN, S, SPLIT>;
  constexpr int kS = S;
  // STAGED: the x tile's panels, kPanels a stage, in loads nk and nk + 1
  constexpr int kPanels = BN / kKCols<T>, kPerStage = C::kStageBytes / C::kPanelBytes;
  constexpr int kExtra = STAGED ? (kPanels + kPerStage - 1) / kPerStage : 0;
  static_assert(kExtra <= 2, "the x tile in two loads");
  const uint32_t smem = smem_base_1k();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const CtaTile<BN> cta(a.d2, batch0);
  const int64_t b = cta.b, n0 = cta.nb * BN, row0 = cta.mb * 128;
  const T* vb = static_cast<const T*>(a.v) + b * a.v_batch_stride;
  const T* gb = static_cast<const T*>(a.go) + b * a.d1 * a.d3;
  constexpr int kK = kKCols<T>;
  const int nk = static_cast<int>((a.d3 + kK - 1) / kK);

  const int lr = 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);
  const int lane_r7 = lr & 7, lane_hi = lane >> 4;
  const uint32_t o_lane = C::kVBytes + lr * 128;
  const uint64_t desc_base = desc_kmajor();
  const uint32_t bars = smem + C::kBarOffset;

  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
  wgmma_mainloop<T, BN, 0, kS, C::kStageBytes, 32, LOAD, C::kLoOffset, kExtra>(
      acc, smem, bars, nk, desc_base,
      [&](uint32_t stage, int k, uint32_t bar) {
        if constexpr (LOAD == kTma) {
          if (STAGED && k >= nk) {  // panels kPerStage (k - nk) .. of the x tile
            const int p0 = kPerStage * (k - nk), np = min(kPerStage, kPanels - p0);
            mbar_expect_tx(bar, np * C::kPanelBytes);
            for (int p = 0; p < np; ++p)
              tma_load_3d(stage + p * C::kPanelBytes, &tmx, static_cast<int>(n0) + kK * (p0 + p),
                          static_cast<int>(row0), static_cast<int>(b), bar);
          } else {
            dx_tma<BN, SPLIT>(stage, bar, &tmv, &tmo, &tmvl, static_cast<int>(row0), static_cast<int>(n0), kK * k,
                              static_cast<int>(b));
          }
        } else {
          dx_load<T, BN>(stage, a, vb, gb, row0, n0, int64_t{k} * kK);
        }
      },
      [&](uint32_t (&f)[SPLIT ? 8 : 4][4], uint32_t stage) {
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) ldmatrix_x4(f[kb], stage + o_lane + (((2 * kb + lane_hi) ^ lane_r7) << 4));
        if constexpr (std::is_same_v<T, float>) {
#pragma unroll
          for (int kb = 0; kb < 4; ++kb)
#pragma unroll
            for (int e = 0; e < 4; ++e) put_tf32<SPLIT>(f, kb, e, __uint_as_float(f[kb][e]));
        }
      });
  // dX = exp(x - lse) * (dP - D), this thread's rows g, g + 8.
  if constexpr (STAGED) {
    dx_epilogue_staged<T, BN, SPLIT>(
        a, acc,
        [&](int p) {
          return smem + static_cast<uint32_t>((nk + p / kPerStage) % kS) * C::kStageBytes +
                 (p % kPerStage) * C::kPanelBytes;
        },
        [&] {
#pragma unroll
          for (int e = 0; e < kExtra; ++e) mbar_wait(bars + 8 * (kS + e), 0);
        },
        &tmd, b, row0, n0);
  } else {
    dx_epilogue_global<T, BN, SPLIT>(a, acc, b, row0, n0);
  }
#else
  __trap();
#endif
}

// dX, 16-bit, with both operands in shared memory (wgmma SS: dO K-major like
// V), 128 columns of d2, TMA only, S stages and wgmma.wait_group 1: a
// stage's products run while the next stage's are issued, and a stage is
// refilled once both warpgroups' products of it are done (a block-wide
// barrier). The loads are numbered 0..nk: load k < nk is K tile k into stage
// k % S, load nk the CTA's x tile into the stage that K tile nk would take,
// issued as soon as that stage is free, so the tile lands while the last S -
// 1 K tiles run and takes no room of its own; the epilogue through shared
// memory (dx_epilogue_staged). (TF32 keeps the register-A kernel: there dO
// is rounded to nearest in registers, where wgmma would truncate it in
// shared memory, which doubles dX's error where dP - D cancels.)
template <typename T, int S>
__global__ void __launch_bounds__(kThreads, 2)
    smm_bwd_dx_ss_kernel(BwdArgs a, int64_t batch0, const __grid_constant__ CUtensorMap tmv,
                         const __grid_constant__ CUtensorMap tmo, const __grid_constant__ CUtensorMap tmx,
                         const __grid_constant__ CUtensorMap tmd) {
  static_assert(sizeof(T) == 2, "16-bit");
#ifdef SMM_SM90A_DEVICE
  constexpr int BN = 128;
  using C = DxCfg<BN, S>;
  static_assert(C::kXBytes <= C::kStageBytes, "the x tile takes a stage");
  const uint32_t smem = smem_base_1k();
  const int tid = threadIdx.x, wg = tid >> 7;
  const CtaTile<BN> cta(a.d2, batch0);
  const int64_t b = cta.b, n0 = cta.nb * BN, row0 = cta.mb * 128;
  constexpr int kK = kKCols<T>;
  const int nk = static_cast<int>((a.d3 + kK - 1) / kK);
  const uint32_t bars = smem + C::kBarOffset, xbar = bars + 8 * S;
  init_stage_barriers<S + 1>(bars);  // the stages' and the x tile's
  // load s (thread 0)
  const auto issue = [&](int s) {
    const uint32_t stage = smem + static_cast<uint32_t>(s % S) * C::kStageBytes;
    if (s < nk) {
      dx_tma<BN>(stage, bars + 8 * (s % S), &tmv, &tmo, nullptr, static_cast<int>(row0), static_cast<int>(n0),
                 kK * s, static_cast<int>(b));
    } else {
      dx_x_tma<BN>(stage, xbar, &tmx, static_cast<int>(row0), static_cast<int>(n0), static_cast<int>(b));
    }
  };
  if (tid == 0) {
    for (int s = 0; s < S - 1 && s <= nk; ++s) issue(s);
  }

  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
  const uint64_t desc = desc_kmajor();
  const uint32_t a_off = C::kVBytes + wg * (64 * 128);  // this warpgroup's 64 rows of dO
  for (int kt = 0; kt < nk; ++kt) {
    const uint32_t stage = smem + static_cast<uint32_t>(kt % S) * C::kStageBytes;
    mbar_wait(bars + 8 * (kt % S), (kt / S) & 1);
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) fence_reg(acc[i]);
    wgmma_fence();
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      const uint64_t da = desc | ((stage + a_off + 32 * kb) >> 4), db = desc | ((stage + 32 * kb) >> 4);
      if constexpr (std::is_same_v<T, __nv_bfloat16>) wgmma_ss_n128_bf16(acc, da, db);
      else wgmma_ss_n128_f16(acc, da, db);
    }
    wgmma_commit();
    wgmma_wait<1>();  // this warpgroup's products of K tile kt - 1 done
    __syncthreads();  // both warpgroups': its stage is free
    if (tid == 0 && kt + S - 1 <= nk) issue(kt + S - 1);
  }
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) fence_reg(acc[i]);

  const uint32_t xs = smem + static_cast<uint32_t>(nk % S) * C::kStageBytes;
  dx_epilogue_staged<T, BN, false>(
      a, acc, [&](int p) { return xs + p * C::kPanelBytes; }, [&] { mbar_wait(xbar, 0); }, &tmd, b, row0, n0);
#else
  __trap();
#endif
}
// Which dX kernel: the SS kernel (smm_bwd_dx_ss_kernel) unless
// SOFTMAX_EXT_SMM_DX_SS=0 or SOFTMAX_EXT_SMM_DX_BN=256 ask for the register-A
// kernel (smm_bwd_dx_kernel; 256: with 256 columns, one CTA per SM).
inline bool dx_ss_wanted() {
  const char* ss = std::getenv("SOFTMAX_EXT_SMM_DX_SS");
  const char* bn = std::getenv("SOFTMAX_EXT_SMM_DX_BN");
  return !(ss != nullptr && ss[0] == '0') && !(bn != nullptr && bn[0] == '2');
}

// The lse tensor map: f32 (batch, d1), rows `stride` floats apart, as {d1,
// batch}, boxes of `box` x 1, no swizzle. False where it cannot be made
// (batch > 1 with stride * 4 not a multiple of 16, a tensor map's stride
// rule; the 16-bit dV kernel then takes cp.async).
inline bool map_lse(CUtensorMap* map, const float* lse, int64_t d1, int64_t batch, int64_t stride, int box_len) {
  constexpr int64_t kMax = int64_t{1} << 31;
  if (d1 >= kMax || batch >= kMax || (batch > 1 && (stride * 4) % 16 != 0)) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(d1), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>((stride * 4 + 15) / 16 * 16)};  // unread where batch == 1
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_len), 1};
  return encode_tiled(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, lse, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_NONE);
}

}  // namespace softmax_ext::smm::cuda::sm90
