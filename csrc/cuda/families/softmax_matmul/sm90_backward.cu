// softmax_matmul backward for Hopper (sm_90a), bf16 and f16: the dV kernel
// and the launcher (D, dX and dV; sm90_backward.cuh has the overview and what
// the float32 launcher shares).
#include "cuda/families/softmax_matmul/sm90_backward.cuh"
#include "cuda/core/launch.cuh"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <cstdlib>

namespace softmax_ext::smm::cuda {
namespace sm90 {

// ---------------------------------------------------------------------------
// dV: CTA = 128 rows of d2 x BN columns of d3; K = d1 in tiles of 64.
constexpr int kDvStages = 4;

template <int BN>
struct DvCfg {
  static constexpr int kOBytes = 64 * BN * 2;     // dO: 64 rows (d1) x BN columns, N-major blocks of 8 KiB
  static constexpr int kXBytes = 64 * 128 * 2;    // x: 64 rows (d1) x 128 columns (d2): two 8 KiB halves
  static constexpr int kLBytes = 1024;            // lse of the 64 rows (256 bytes used)
  static constexpr int kStageBytes = kOBytes + kXBytes + kLBytes;  // multiples of 1 KiB
  static constexpr int kTxBytes = kOBytes + kXBytes + 64 * 4;         // TMA bytes a stage
  static constexpr int kBarOffset = kDvStages * kStageBytes;         // TMA: one mbarrier per stage
  static constexpr int kSmem = kDvStages * kStageBytes + 8 * kDvStages + 1024;
};

#ifdef SMM_SM90A_DEVICE
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(bytes));
}

template <typename T, int BN>
__device__ __forceinline__ void dv_load(uint32_t stage, const BwdArgs& a, const T* xb, const T* gb,
                                        const float* lb, int64_t m0, int64_t n0, int64_t k0) {
  const int tid = threadIdx.x;
  // dO rows k0.., columns n0..; x rows k0.., columns m0..m0+127
  load_swizzled_tile<T, 64, BN / 8, kThreads>(stage, gb, a.d3, k0, n0, a.d1, a.d3);
  load_swizzled_tile<T, 64, 16, kThreads>(stage + DvCfg<BN>::kOBytes, xb, a.x_row_stride, k0, m0, a.d1, a.d2);
  if (tid < 64) {
    const uint32_t dst = stage + DvCfg<BN>::kOBytes + DvCfg<BN>::kXBytes + tid * 4;
    const int64_t k = k0 + tid;
    cp_async4(dst, k < a.d1 ? lb + k : lb, k < a.d1 ? 4 : 0);
  }
}

// The same by TMA (one thread): dO as BN / 64 boxes of 64 columns x 64 rows
// (8 KiB blocks, N-major), x as two boxes of 64 columns x 64 rows (the two
// 64-column halves one after the other), the lse of the 64 rows as one box of
// 64 floats (rows past d1 zero-filled, as dv_load's).
template <int BN>
__device__ __forceinline__ void dv_tma(uint32_t stage, uint32_t bar, const CUtensorMap* tmo, const CUtensorMap* tmx,
                                       const CUtensorMap* tml, int m0, int n0, int k0, int b) {
  using C = DvCfg<BN>;
  mbar_expect_tx(bar, C::kTxBytes);
#pragma unroll
  for (int j = 0; j < BN / 64; ++j) tma_load_3d(stage + j * (64 * 128), tmo, n0 + 64 * j, k0, b, bar);
#pragma unroll
  for (int h = 0; h < 2; ++h) tma_load_3d(stage + C::kOBytes + h * (64 * 128), tmx, m0 + 64 * h, k0, b, bar);
  tma_load_2d(stage + C::kOBytes + C::kXBytes, tml, k0, b, bar);
}
#endif

// LOAD: kTma with the tensor maps tmo (dO, box 64 x 64), tmx (x, box 64 x
// 64) and tml (lse, box 64); kCpAsync ignores them.
template <typename T, int BN, int LOAD>
__global__ void __launch_bounds__(kThreads, 1)
    smm_bwd_dv_kernel(BwdArgs a, int64_t batch0, const __grid_constant__ CUtensorMap tmo,
                      const __grid_constant__ CUtensorMap tmx, const __grid_constant__ CUtensorMap tml) {
#ifdef SMM_SM90A_DEVICE
  using C = DvCfg<BN>;
  constexpr int kS = kDvStages;
  const uint32_t smem = smem_base_1k();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int wg = warp >> 2, w = warp & 3;
  const CtaTile<BN> cta(a.d3, batch0);
  const int64_t b = cta.b, n0 = cta.nb * BN, m0 = cta.mb * 128;
  const T* xb = static_cast<const T*>(a.x) + b * a.x_batch_stride;
  const T* gb = static_cast<const T*>(a.go) + b * a.d1 * a.d3;
  const float* lb = a.lse + b * a.d1;
  const int nk = static_cast<int>((a.d1 + 63) / 64);

  // ldmatrix.trans lanes: matrix q = lane / 8 (m offset 8 (q & 1), k offset
  // 8 (q >> 1)), row i = lane % 8 of it; this warp's 16 columns of its
  // warpgroup's 64-column half of the x tile (chunks 2w, 2w + 1).
  const int lane_q = lane >> 3, lane_i = lane & 7;
  const uint32_t xs_lane_off = C::kOBytes + wg * (64 * 128);
  const int chunk0 = 2 * w;
  const uint32_t ls_off = C::kOBytes + C::kXBytes + 2 * t * 4;
  const uint64_t desc_base = desc_nmajor(64 * 128);

  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;

  // dv_p with this warp's chunk: fold chunk0 into the lane's XOR below.
  auto p_of = [&](uint32_t (&p)[4][4], uint32_t stage) {
    constexpr float kLog2e = 1.4426950408889634f;
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      const int k = 16 * kb + 8 * (lane_q >> 1) + lane_i;
      ldmatrix_x4_trans(p[kb], stage + xs_lane_off + k * 128 + (((chunk0 + (lane_q & 1)) ^ lane_i) << 4));
    }
#pragma unroll
    for (int kb = 0; kb < 4; ++kb)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float l0, l1;
        asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];"
                     : "=f"(l0), "=f"(l1)
                     : "r"(stage + ls_off + (16 * kb + 8 * hf) * 4));
        const float q0 = -l0 * kLog2e, q1 = -l1 * kLog2e;
#pragma unroll
        for (int mh = 0; mh < 2; ++mh) {
          const float2 xv = unpack<T>(p[kb][2 * hf + mh]);
          p[kb][2 * hf + mh] = pack<T>(ex2(fmaf(xv.x, kLog2e, q0)), ex2(fmaf(xv.y, kLog2e, q1)));
        }
      }
  };

  wgmma_mainloop<T, BN, 1, kS, C::kStageBytes, 2048, LOAD>(
      acc, smem, smem + C::kBarOffset, nk, desc_base,
      [&](uint32_t stage, int k, uint32_t bar) {
        if constexpr (LOAD == kTma)
          dv_tma<BN>(stage, bar, &tmo, &tmx, &tml, static_cast<int>(m0), static_cast<int>(n0), 64 * k,
                     static_cast<int>(b));
        else
          dv_load<T, BN>(stage, a, xb, gb, lb, m0, n0, int64_t{k} * 64);
      },
      p_of);

  // Epilogue: dV rows m0 + 64 wg + 16 w + g (+ 8), contiguous (batch, d2, d3).
  T* dvb = static_cast<T*>(a.dv) + b * a.d2 * a.d3;
  const int64_t r0 = m0 + 64 * wg + 16 * w + g;
  for_each_column_pair<BN>(r0, n0, t, a.d2, a.d3, [&](int64_t row, int64_t col, int j, int h) {
    *reinterpret_cast<uint32_t*>(dvb + row * a.d3 + col) = pack<T>(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
  });
#else
  __trap();
#endif
}

template <typename T>
void backward(const BwdArgs& a, int bn_dv) {
  const auto stream = c10::cuda::getCurrentCUDAStream();
  launch_delta<T>(a, stream);
  // dX and dV each load by TMA where their tensor maps can be made (dO is
  // contiguous (batch, d1, d3)); SOFTMAX_EXT_SMM_CPASYNC=1: cp.async (A/B work).
  const char* cp_env = std::getenv("SOFTMAX_EXT_SMM_CPASYNC");
  const bool cp_only = cp_env != nullptr && cp_env[0] == '1';
  // dX: the SS kernel (128 columns of d2 per CTA, two CTAs per SM, the
  // epilogue through shared memory) where the maps of V, dO, x and dX can
  // all be made; the register-A kernel (128 columns, or 256 with
  // SOFTMAX_EXT_SMM_DX_BN=256) otherwise, by TMA where V's and dO's maps can
  // be made, by cp.async if not.
  CUtensorMap tmv{}, tmo{}, tmx{}, tmd{};
  const auto map_vo = [&](int bn) {
    return !cp_only && map_3d<T>(&tmv, a.v, a.d3, a.d2, a.batch, a.v_row_stride, a.v_batch_stride, 64, bn) &&
           map_3d<T>(&tmo, a.go, a.d3, a.d1, a.batch, a.d3, a.d1 * a.d3, 64, 128);
  };
  if (dx_ss_wanted() && map_vo(128) &&
      map_3d<T>(&tmx, a.x, a.d2, a.d1, a.batch, a.x_row_stride, a.x_batch_stride, 64, 128) &&
      map_3d<T>(&tmd, a.dx, a.d2, a.d1, a.batch, a.d2, a.d1 * a.d2, 64, 128)) {
    softmax_ext::cuda::launch_batch_grid(&smm_bwd_dx_ss_kernel<T, kDxStages>,
                                         ((a.d2 + 127) / 128) * ((a.d1 + 127) / 128), a.batch, kThreads,
                                         DxCfg<128, kDxStages>::kSmem, stream, a, tmv, tmo, tmx, tmd);
  } else {
    auto dx = [&](auto bn_tag) {
      constexpr int BN = decltype(bn_tag)::value;
      auto* kernel = map_vo(BN) ? &smm_bwd_dx_kernel<T, BN, kTma, kDxStages>
                                : &smm_bwd_dx_kernel<T, BN, kCpAsync, kDxStages>;
      const int64_t blocks = ((a.d2 + BN - 1) / BN) * ((a.d1 + 127) / 128);
      softmax_ext::cuda::launch_batch_grid(kernel, blocks, a.batch, kThreads, DxCfg<BN, kDxStages>::kSmem, stream,
                                           a, tmv, tmo, tmv, tmv, tmv);
    };
    const char* dx_env = std::getenv("SOFTMAX_EXT_SMM_DX_BN");
    if (dx_env != nullptr && dx_env[0] == '2') dx(std::integral_constant<int, 256>{});
    else dx(std::integral_constant<int, 128>{});
  }
  auto dv = [&](auto bn_tag) {
    constexpr int BN = decltype(bn_tag)::value;
    CUtensorMap tmo{}, tmx{}, tml{};
    const bool tma = !cp_only && map_3d<T>(&tmo, a.go, a.d3, a.d1, a.batch, a.d3, a.d1 * a.d3, 64, 64) &&
                     map_3d<T>(&tmx, a.x, a.d2, a.d1, a.batch, a.x_row_stride, a.x_batch_stride, 64, 64) &&
                     map_lse(&tml, a.lse, a.d1, a.batch, a.d1, 64);
    auto* kernel = tma ? &smm_bwd_dv_kernel<T, BN, kTma> : &smm_bwd_dv_kernel<T, BN, kCpAsync>;
    const int64_t blocks = ((a.d3 + BN - 1) / BN) * ((a.d2 + 127) / 128);
    softmax_ext::cuda::launch_batch_grid(kernel, blocks, a.batch, kThreads, DvCfg<BN>::kSmem, stream, a, tmo, tmx,
                                         tml);
  };
  if (bn_dv == 64) dv(std::integral_constant<int, 64>{});
  else if (bn_dv == 128) dv(std::integral_constant<int, 128>{});
  else dv(std::integral_constant<int, 256>{});
}

}  // namespace sm90

void backward_sm90_bf16(const BwdArgs& a, int bn) { sm90::backward<__nv_bfloat16>(a, bn); }
void backward_sm90_f16(const BwdArgs& a, int bn) { sm90::backward<__half>(a, bn); }

}  // namespace softmax_ext::smm::cuda
