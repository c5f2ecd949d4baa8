// softmax_matmul backward for Hopper (sm_90a), float32: TF32, or 3xTF32
// where TF32 is not allowed: the dV kernel (dO transposed as the K-major B
// operand), the split of B operands for 3xTF32 and the launcher (D, dX and
// dV; sm90_backward.cuh has the overview and the dX kernel).
#include "cuda/families/softmax_matmul/sm90_backward.cuh"
#include "cuda/core/launch.cuh"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

namespace softmax_ext::smm::cuda {
namespace sm90 {

// ---------------------------------------------------------------------------
// dV, TF32: CTA = 128 rows of d2 x BN columns of d3; K = d1 in tiles of 32.
// A stage: dO^T (BN rows of d3 x 32 columns of d1, K-major, the B operand),
// x (32 rows of d1 x 128 columns of d2 as 4 panels of 32 columns), the 32
// rows' lse; SPLIT (3xTF32): then dO^T's small part, as dO^T.
constexpr int kDvTf32Stages = 4;

template <int BN, bool SPLIT = false>
struct DvTf32Cfg {
  static constexpr int kOBytes = BN * 128;
  static constexpr int kPanelBytes = 32 * 128;
  static constexpr int kXBytes = 4 * kPanelBytes;
  static constexpr int kLBytes = 1024;  // 128 bytes used
  static constexpr int kLoOffset = SPLIT ? kOBytes + kXBytes + kLBytes : 0;
  static constexpr int kStageBytes = kOBytes + kXBytes + kLBytes + (SPLIT ? kOBytes : 0);  // multiples of 1 KiB
  static constexpr int kTxBytes = kOBytes * (SPLIT ? 2 : 1) + kXBytes + 32 * 4;           // TMA bytes a stage
  static constexpr int kBarOffset = kDvTf32Stages * kStageBytes;
  static constexpr int kSmem = kBarOffset + 8 * kDvTf32Stages + 1024;
};

#ifdef SMM_SM90A_DEVICE
// A stage by TMA (one thread): dO^T as one box of 32 columns x BN rows, x as
// four boxes of 32 columns x 32 rows, the lse of the 32 rows as one box;
// SPLIT: dO^T's small part (tmol) as dO^T.
template <int BN, bool SPLIT>
__device__ __forceinline__ void dv_tf32_tma(uint32_t stage, uint32_t bar, const CUtensorMap* tmo,
                                            const CUtensorMap* tmx, const CUtensorMap* tml, const CUtensorMap* tmol,
                                            int m0, int n0, int k0, int b) {
  using C = DvTf32Cfg<BN, SPLIT>;
  mbar_expect_tx(bar, C::kTxBytes);
  tma_load_3d(stage, tmo, k0, n0, b, bar);
  if constexpr (SPLIT) tma_load_3d(stage + C::kLoOffset, tmol, k0, n0, b, bar);
#pragma unroll
  for (int p = 0; p < 4; ++p) tma_load_3d(stage + C::kOBytes + p * C::kPanelBytes, tmx, m0 + 32 * p, k0, b, bar);
  tma_load_2d(stage + C::kOBytes + C::kXBytes, tml, k0, b, bar);
}
#endif

// tmo: dO^T (box 32 x BN), tmx: x (box 32 x 32), tml: lse (box 32); SPLIT
// (3xTF32): tmol, dO^T's small part (unused otherwise), P = expf(x - lse)
// split into big and small parts.
template <int BN, bool SPLIT = false>
__global__ void __launch_bounds__(kThreads, 1)
    smm_bwd_dv_tf32_kernel(BwdArgs a, int64_t batch0, const __grid_constant__ CUtensorMap tmo,
                           const __grid_constant__ CUtensorMap tmx, const __grid_constant__ CUtensorMap tml,
                           const __grid_constant__ CUtensorMap tmol) {
#ifdef SMM_SM90A_DEVICE
  using C = DvTf32Cfg<BN, SPLIT>;
  const uint32_t smem = smem_base_1k();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const CtaTile<BN> cta(a.d3, batch0);
  const int64_t b = cta.b, n0 = cta.nb * BN, m0 = cta.mb * 128;
  const int nk = static_cast<int>((a.d1 + 31) / 32);

  // A fragment element 2 o + h of k8 block kb: row m = 16 warp + g + 8 h of
  // the tile's 128 rows of d2, column k = 8 kb + t + 4 o of the stage's 32
  // rows of d1; x[k][m] is word m % 4 of 16-byte chunk ((m % 32) / 4) ^ (k % 8)
  // of row k of panel m / 32 (k % 8 = t + 4 o).
  uint32_t x_off[2], x_chunk[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int m = 16 * warp + g + 8 * h;
    x_off[h] = C::kOBytes + (m >> 5) * C::kPanelBytes + (m & 3) * 4;
    x_chunk[h] = (m >> 2) & 7;
  }
  constexpr uint32_t kLseOff = C::kOBytes + C::kXBytes;

  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;

  auto p_of = [&](uint32_t (&f)[SPLIT ? 8 : 4][4], uint32_t stage) {
    constexpr float kLog2e = 1.4426950408889634f;
#pragma unroll
    for (int kb = 0; kb < 4; ++kb)
#pragma unroll
      for (int o = 0; o < 2; ++o) {
        const int k = 8 * kb + t + 4 * o;
        float l;
        asm volatile("ld.shared.f32 %0, [%1];" : "=f"(l) : "r"(stage + kLseOff + 4 * k));
        const float q = -l * kLog2e;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float xv;
          asm volatile("ld.shared.f32 %0, [%1];"
                       : "=f"(xv)
                       : "r"(stage + x_off[h] + k * 128 + ((x_chunk[h] ^ static_cast<uint32_t>(t + 4 * o)) << 4)));
          put_tf32<SPLIT>(f, kb, 2 * o + h, SPLIT ? expf(xv - l) : ex2(fmaf(xv, kLog2e, q)));
        }
      }
  };

  wgmma_mainloop<float, BN, 0, kDvTf32Stages, C::kStageBytes, 32, kTma, C::kLoOffset>(
      acc, smem, smem + C::kBarOffset, nk, desc_kmajor(),
      [&](uint32_t stage, int k, uint32_t bar) {
        dv_tf32_tma<BN, SPLIT>(stage, bar, &tmo, &tmx, &tml, &tmol, static_cast<int>(m0), static_cast<int>(n0),
                               32 * k, static_cast<int>(b));
      },
      p_of);

  // Epilogue: dV rows m0 + 16 warp + g (+ 8), contiguous (batch, d2, d3).
  float* dvb = static_cast<float*>(a.dv) + b * a.d2 * a.d3;
  for_each_column_pair<BN>(m0 + 16 * warp + g, n0, t, a.d2, a.d3, [&](int64_t row, int64_t col, int j, int h) {
    *reinterpret_cast<float2*>(dvb + row * a.d3 + col) = make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
  });
#else
  __trap();
#endif
}

// Each value of src (batch, rows, cols; row and batch strides; cols a
// multiple of 4, 16-byte aligned rows) split for 3xTF32 into hi and lo,
// contiguous (hi may be src itself where src is contiguous): hi rounded to
// TF32 by cvt.rna (a NaN stays a NaN), lo the rest rounded to nearest TF32.
// lo null: hi only (TF32: the operand wgmma would otherwise truncate).
__global__ void smm_tf32_split_kernel(const float* src, float* hi, float* lo, int64_t rows, int64_t cols,
                                      int64_t row_stride, int64_t batch_stride, int64_t n4) {
#ifdef SMM_SM90A_DEVICE
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n4; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t e = 4 * i, c = e % cols, r = (e / cols) % rows, b = e / (cols * rows);
    const float4 v = *reinterpret_cast<const float4*>(src + b * batch_stride + r * row_stride + c);
    const float vs[4] = {v.x, v.y, v.z, v.w};
    float h[4], l[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const Tf32Split p = split_tf32(vs[q]);
      h[q] = __uint_as_float(p.big);
      l[q] = __uint_as_float(p.small);
    }
    *reinterpret_cast<float4*>(hi + e) = make_float4(h[0], h[1], h[2], h[3]);
    if (lo != nullptr) *reinterpret_cast<float4*>(lo + e) = make_float4(l[0], l[1], l[2], l[3]);
  }
#else
  __trap();
#endif
}

void tf32_split(const float* src, float* hi, float* lo, int64_t batch, int64_t rows, int64_t cols,
                int64_t row_stride, int64_t batch_stride, cudaStream_t stream) {
  const int64_t n4 = batch * rows * cols / 4;
  if (n4 == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n4 + 255) / 256, 8192));
  smm_tf32_split_kernel<<<blocks, 256, 0, stream>>>(src, hi, lo, rows, cols, row_stride, batch_stride, n4);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// dO (batch, d1, d3), contiguous, transposed into go_t (batch, d3, d1p)
// through 32 x 32 tiles of shared memory (reads and writes coalesced), its
// columns d1..d1p zero; each value as it is (ROUND 0), rounded to TF32 by
// cvt.rna (1), or split as tf32_split splits (2: the small parts into lo).
template <int ROUND>
__global__ void __launch_bounds__(256) smm_go_transpose_kernel(const float* go, float* hi, float* lo, int64_t batch,
                                                               int64_t d1, int64_t d3, int64_t d1p) {
#ifdef SMM_SM90A_DEVICE
  __shared__ float tile[32][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c0 = int64_t{blockIdx.x} * 32;  // columns of d3: rows of go_t
  for (int64_t b = blockIdx.z; b < batch; b += gridDim.z) {
    for (int64_t r0 = int64_t{blockIdx.y} * 32; r0 < d1p; r0 += int64_t{gridDim.y} * 32) {  // rows of d1
      __syncthreads();  // (the tile of the previous step read)
      for (int i = ty; i < 32; i += 8) {
        const int64_t r = r0 + i, c = c0 + tx;
        tile[i][tx] = r < d1 && c < d3 ? go[(b * d1 + r) * d3 + c] : 0.f;
      }
      __syncthreads();
      for (int i = ty; i < 32; i += 8) {
        const int64_t c = c0 + i, r = r0 + tx;
        if (c >= d3 || r >= d1p) continue;
        const float v = tile[tx][i];
        const int64_t at = (b * d3 + c) * d1p + r;
        if constexpr (ROUND == 0) {
          hi[at] = v;
        } else {
          const Tf32Split p = split_tf32(v);
          hi[at] = __uint_as_float(p.big);
          if constexpr (ROUND == 2) lo[at] = __uint_as_float(p.small);
        }
      }
    }
  }
#else
  __trap();
#endif
}

void go_transpose(const BwdArgs& a, int round, cudaStream_t stream) {
  if (a.batch == 0 || a.d3 == 0 || a.d1p == 0) return;
  const dim3 block(32, 8);
  const dim3 grid(static_cast<unsigned>((a.d3 + 31) / 32), static_cast<unsigned>(std::min<int64_t>((a.d1p + 31) / 32, 65535)),
                  static_cast<unsigned>(std::min<int64_t>(a.batch, 65535)));
  const float* go = static_cast<const float*>(a.go);
  if (round == 2) smm_go_transpose_kernel<2><<<grid, block, 0, stream>>>(go, a.go_t, a.go_t_lo, a.batch, a.d1, a.d3, a.d1p);
  else if (round == 1) smm_go_transpose_kernel<1><<<grid, block, 0, stream>>>(go, a.go_t, nullptr, a.batch, a.d1, a.d3, a.d1p);
  else smm_go_transpose_kernel<0><<<grid, block, 0, stream>>>(go, a.go_t, nullptr, a.batch, a.d1, a.d3, a.d1p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// float32: every tensor map first (false, nothing launched, where one cannot
// be made: the caller takes the blocked backward), then dO transposed into
// a.go_t, D, dX (128 columns of d2) and dV (TF32: bn_dv columns of d3, 128
// or 256; 3xTF32: 128). TF32: V rounded to TF32 into a.v_hi (tf32_split
// without lo) and dO^T rounded as it is transposed, so that neither B
// operand is truncated by wgmma (a truncated operand's bias does not cancel
// in dP - D: dX's error was 3-6x the naive TF32 version's,
// docs/softmax_matmul.md); SOFTMAX_EXT_SMM_TF32_ROUNDED=0 leaves both as
// they are (A/B work). dX in three stages, two CTAs per SM. 3xTF32
// (split3): V and dO^T split (tf32_split: V into a.v_hi and a.v_lo; dO^T
// as it is transposed, into a.go_t and a.go_t_lo), dX in four stages, one
// CTA per SM.
bool backward_f32(const BwdArgs& a, int bn_dv, bool split3) {
  const char* round_env = std::getenv("SOFTMAX_EXT_SMM_TF32_ROUNDED");
  const bool rounded = !split3 && !(round_env != nullptr && round_env[0] == '0');
  const int bn = (split3 || bn_dv == 128) ? 128 : 256;
  const char* dx_env = std::getenv("SOFTMAX_EXT_SMM_DX_BN");
  const int dx_bn = !split3 && dx_env != nullptr && dx_env[0] == '2' ? 256 : 128;
  CUtensorMap tmv{}, tmo{}, tmvl{}, dmo{}, dmx{}, dml{}, dmol{};
  const bool tmv_ok = split3 || rounded ? map_3d<float>(&tmv, a.v_hi, a.d3, a.d2, a.batch, a.d3, a.d2 * a.d3, 32, dx_bn)
                             : map_3d<float>(&tmv, a.v, a.d3, a.d2, a.batch, a.v_row_stride, a.v_batch_stride, 32, dx_bn);
  if (!tmv_ok ||
      !map_3d<float>(&tmo, a.go, a.d3, a.d1, a.batch, a.d3, a.d1 * a.d3, 32, 128) ||
      !map_3d<float>(&dmo, a.go_t, a.d1, a.d3, a.batch, a.d1p, a.d3 * a.d1p, 32, bn) ||
      !map_3d<float>(&dmx, a.x, a.d2, a.d1, a.batch, a.x_row_stride, a.x_batch_stride, 32, 32) ||
      !map_lse(&dml, a.lse_p, a.d1, a.batch, a.d1p, 32))
    return false;
  if (split3 && (!map_3d<float>(&tmvl, a.v_lo, a.d3, a.d2, a.batch, a.d3, a.d2 * a.d3, 32, 128) ||
                 !map_3d<float>(&dmol, a.go_t_lo, a.d1, a.d3, a.batch, a.d1p, a.d3 * a.d1p, 32, bn)))
    return false;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  go_transpose(a, split3 ? 2 : rounded ? 1 : 0, stream);
  launch_delta<float>(a, stream);
  if (split3 || rounded) {
    tf32_split(static_cast<const float*>(a.v), a.v_hi, split3 ? a.v_lo : nullptr, a.batch, a.d2, a.d3,
               a.v_row_stride, a.v_batch_stride, stream);
  }
  // dX's epilogue through shared memory (the x tile by TMA into freed
  // stages, dX stored by TMA) where x's and dX's maps of 32 x 128 boxes can
  // be made; SOFTMAX_EXT_SMM_DX_STAGED=0: through global memory (A/B work).
  CUtensorMap tmx{}, tmd{};
  const char* staged_env = std::getenv("SOFTMAX_EXT_SMM_DX_STAGED");
  const bool staged = dx_bn == 128 && !(staged_env != nullptr && staged_env[0] == '0') &&
                      map_3d<float>(&tmx, a.x, a.d2, a.d1, a.batch, a.x_row_stride, a.x_batch_stride, 32, 128) &&
                      map_3d<float>(&tmd, a.dx, a.d2, a.d1, a.batch, a.d2, a.d1 * a.d2, 32, 128);
  auto dx = [&](auto bn_tag, auto split_tag, auto staged_tag) {
    constexpr int BN = decltype(bn_tag)::value;
    constexpr bool SPLIT = decltype(split_tag)::value, STAGED = decltype(staged_tag)::value;
    constexpr int S = SPLIT ? kDxSplitStages : kDxStages;
    const int64_t blocks = ((a.d2 + BN - 1) / BN) * ((a.d1 + 127) / 128);
    softmax_ext::cuda::launch_batch_grid(&smm_bwd_dx_kernel<float, BN, kTma, S, SPLIT, STAGED>, blocks, a.batch,
                                         kThreads, DxCfg<BN, S, SPLIT>::kSmem, stream, a, tmv, tmo, tmvl, tmx, tmd);
  };
  auto dx128 = [&](auto split_tag) {
    if (staged) dx(std::integral_constant<int, 128>{}, split_tag, std::true_type{});
    else dx(std::integral_constant<int, 128>{}, split_tag, std::false_type{});
  };
  if (split3) dx128(std::true_type{});
  else if (dx_bn == 256) dx(std::integral_constant<int, 256>{}, std::false_type{}, std::false_type{});
  else dx128(std::false_type{});
  auto dv = [&](auto bn_tag, auto split_tag) {
    constexpr int BN = decltype(bn_tag)::value;
    constexpr bool SPLIT = decltype(split_tag)::value;
    const int64_t blocks = ((a.d3 + BN - 1) / BN) * ((a.d2 + 127) / 128);
    softmax_ext::cuda::launch_batch_grid(&smm_bwd_dv_tf32_kernel<BN, SPLIT>, blocks, a.batch, kThreads,
                                         DvTf32Cfg<BN, SPLIT>::kSmem, stream, a, dmo, dmx, dml, dmol);
  };
  if (split3) dv(std::integral_constant<int, 128>{}, std::true_type{});
  else if (bn == 128) dv(std::integral_constant<int, 128>{}, std::false_type{});
  else dv(std::integral_constant<int, 256>{}, std::false_type{});
  return true;
}

}  // namespace sm90

bool backward_sm90_f32(const BwdArgs& a, int bn, bool split3) { return sm90::backward_f32(a, bn, split3); }

}  // namespace softmax_ext::smm::cuda
