// softmax_matmul forward for few rows of d1 (plan.cpp: kernel "cuda.rows"):
// CUDA-core FMAs, no tensor cores. With d1 of 1-16 a tensor-core tile of
// 128 (Hopper) or 64 (mma.sync) rows computes mostly rows that do not
// exist, while the work that counts is one pass over V with a few FMAs per
// element of V: memory-bound on CUDA cores.
//
// A CTA (256 threads) computes R rows (1, 2, 4, 8, 16) of d1 and BN = G x C
// columns of d3 of one batch entry, over all of d2 or over one part of it
// (Args::parts; combine.cu merges the parts). Thread t owns C neighbouring
// columns (one vector of V: 16 bytes, fewer where R x C would pass 32
// float32 accumulators) of column group g = t % G, and the rows of d2 of
// slice s = t / G. d2 is walked in chunks of KC = 256 columns:
//   * each warp takes rows r = warp, warp + 8: the row's chunk of x (loaded
//     a chunk ahead into registers), its max (NaN-propagating), the running
//     max m moved, P = exp(x - m) into shared memory (P[k][r]) and its sum
//     into the running sum l, the accumulators' rescale exp(m_old - m) beside;
//   * every thread rescales its accumulators and adds P[k][r] * V[k][cols]
//     over the chunk's rows of its slice, in groups of 4 rows.
// V streams through shared memory by cp.async, kStages groups ahead (across
// the ends of chunks too): thread t's vectors sit in slots of their own
// and only t reads them back, so cp.async.wait_group orders the copies
// before the reads with no barrier (cuda/core/staging.cuh's habit); rows
// past the part, d2 or d3 are zero-filled, and rows that are not whole
// vectors (strides, offsets, the tail of d3) are copied by the thread itself.
// At the end the slices are summed in a fixed order (shuffles inside a
// warp, then the warps' partials in turn; deterministic) and out = acc / l,
// lse = m + log(l) are written (a part: its normalised output, log(l) and
// m, as the Hopper kernels write them). Rows of x past d1 and columns past
// the part or d2 read as -inf.
#include "cuda/families/softmax_matmul/cuda_launch.h"

#include <c10/core/ScalarType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>

#include "cuda/core/launch.cuh"
#include "cuda/core/numerics.cuh"
#include "cuda/core/staging.cuh"

namespace softmax_ext::smm::cuda {
namespace {

using softmax_ext::cuda::convert;
using softmax_ext::cuda::cp_async_commit;
using softmax_ext::cuda::cp_async_wait;
using softmax_ext::cuda::cp_async_wait_all;
using softmax_ext::cuda::cp_async_zfill;
using softmax_ext::cuda::NanMax;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 256;  // KC: columns of d2 per step
constexpr int kGroup = 4;    // rows of V per cp.async group
constexpr int kStages = 4;   // groups in flight

template <typename T, int R>
constexpr int columns_per_thread() {
  return rows_columns_per_thread(R, static_cast<int>(sizeof(T)));
}

template <typename T, int C>
struct alignas(sizeof(T) * C) Vec {
  T e[C];
};

// The kernel's dynamic shared memory: kStages groups of V vectors, reused
// after the loop for the warps' partial sums.
template <typename T, int R>
constexpr int64_t shared_bytes() {
  constexpr int64_t vbytes = columns_per_thread<T, R>() * static_cast<int64_t>(sizeof(T));
  constexpr int64_t stages = int64_t{kStages} * kGroup * kThreads * vbytes;
  constexpr int64_t partial = int64_t{kWarps} * R * 64 * columns_per_thread<T, R>() * 4;
  return stages > partial ? stages : partial;
}

template <typename T, int R>
__global__ void __launch_bounds__(kThreads, 2) rows_kernel(Args a, int G, bool vec_ok) {
  constexpr int C = columns_per_thread<T, R>();
  constexpr int kBytes = C * static_cast<int>(sizeof(T));
  constexpr float kInf = __builtin_huge_valf();
  __shared__ float P[kChunk * R];  // P[k][r]
  __shared__ float row_max[R], row_sum[R], rescale[R];
  extern __shared__ __align__(16) unsigned char dyn[];
  using V = Vec<T, C>;
  V* stage = reinterpret_cast<V*>(dyn);  // [kStages][kGroup][kThreads]
  float* partial = reinterpret_cast<float*>(dyn);  // after the loop: [warp turn][r][column of the CTA]

  const T* x = static_cast<const T*>(a.x);
  const T* v = static_cast<const T*>(a.v);
  const int S = kThreads / G;  // slices of the chunk's rows
  const int BN = G * C;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int g = t % G, s = t / G;
  const int rows_per_slice = kChunk / S;
  const int groups = (rows_per_slice + kGroup - 1) / kGroup;  // per chunk
  const int64_t row_blocks = (a.d1 + R - 1) / R, col_blocks = (a.d3 + BN - 1) / BN;
  const int64_t tiles = a.batch * a.parts * col_blocks * row_blocks;
  softmax_ext::cuda::allow_dependents();  // the merge of d2's parts (combine.cu) may be scheduled

  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    // row blocks fastest: the CTAs that read the same rows of V run together
    const int64_t rb = tile % row_blocks;
    int64_t rest = tile / row_blocks;
    const int64_t nb = rest % col_blocks;
    rest /= col_blocks;
    const int64_t part = rest % a.parts, b = rest / a.parts;
    const int64_t row0 = rb * R, col = nb * BN + static_cast<int64_t>(g) * C;
    const int64_t k_begin = a.parts > 1 ? part * a.part_cols : 0;
    const int64_t k_end = a.parts > 1 ? std::min(a.d2, k_begin + a.part_cols) : a.d2;
    const T* xb = x + b * a.x_batch_stride;
    const T* vb = v + b * a.v_batch_stride + col;
    const bool vec = vec_ok && col + C <= a.d3;  // whole vectors of V for this thread's columns
    const int64_t chunks = (k_end - k_begin + kChunk - 1) / kChunk;
    const int64_t total = chunks * groups;

    float acc[R][C];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int c = 0; c < C; ++c) acc[r][c] = 0.f;
    if (t < R) {
      row_max[t] = -kInf;
      row_sum[t] = 0.f;
    }

    constexpr int kRowsPerWarp = (R + kWarps - 1) / kWarps;
    constexpr int kPerLane = kChunk / 32;
    float xv[kRowsPerWarp][kPerLane];
    auto load_x = [&](int64_t k0) {
#pragma unroll
      for (int j = 0; j < kRowsPerWarp; ++j) {
        const int64_t row = row0 + warp + kWarps * j;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
          const int64_t k = k0 + lane + 32 * i;
          xv[j][i] = (warp + kWarps * j < R && row < a.d1 && k < k_end)
                         ? convert<float>(xb[row * a.x_row_stride + k])
                         : -kInf;
        }
      }
    };
    const int kk0 = s * rows_per_slice;
    // group gi of chunk ci: rows kk0 + gi * kGroup + u of the chunk
    auto issue = [&](int64_t gidx) {
      if (gidx < total) {
        const int64_t ci = gidx / groups;
        const int gi = static_cast<int>(gidx % groups);
        V* slot = stage + (gidx % kStages) * kGroup * kThreads + t;
#pragma unroll
        for (int u = 0; u < kGroup; ++u) {
          const int64_t k = k_begin + ci * kChunk + kk0 + gi * kGroup + u;
          const bool in = gi * kGroup + u < rows_per_slice && k < k_end;
          const T* src = vb + k * a.v_row_stride;
          if (vec) {
            cp_async_zfill<kBytes>(static_cast<uint32_t>(__cvta_generic_to_shared(slot + u * kThreads)), in ? src : vb,
                             in ? kBytes : 0);
          } else {
            V w;
#pragma unroll
            for (int c = 0; c < C; ++c) w.e[c] = (in && col + c < a.d3) ? src[c] : T(0.f);
            slot[u * kThreads] = w;
          }
        }
      }
      cp_async_commit();
    };

#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) issue(i);
    load_x(k_begin);
    for (int64_t gidx = 0; gidx < total; ++gidx) {
      const int gi = static_cast<int>(gidx % groups);
      if (gi == 0) {
        const int64_t k0 = k_begin + (gidx / groups) * kChunk;
        __syncthreads();  // the previous chunk's P read; row_max set
#pragma unroll
        for (int j = 0; j < kRowsPerWarp; ++j) {
          const int r = warp + kWarps * j;
          if (r >= R) break;
          float cm = -kInf;
#pragma unroll
          for (int i = 0; i < kPerLane; ++i) cm = NanMax()(cm, xv[j][i]);
#pragma unroll
          for (int off = 16; off > 0; off /= 2) cm = NanMax()(cm, __shfl_xor_sync(0xffffffffu, cm, off));
          const float m_old = row_max[r];
          const float m_new = NanMax()(m_old, cm);
          const float m_use = m_new == -kInf ? 0.f : m_new;  // a row -inf so far: P = 0, not NaN
          float sum = 0.f;
#pragma unroll
          for (int i = 0; i < kPerLane; ++i) {
            const float p = expf(xv[j][i] - m_use);
            P[(lane + 32 * i) * R + r] = p;
            sum += p;
          }
#pragma unroll
          for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
          if (lane == 0) {
            const float scale = expf(m_old - m_use);  // 0 while the row was -inf
            rescale[r] = scale;
            row_sum[r] = row_sum[r] * scale + sum;
            row_max[r] = m_new;
          }
        }
        if (k0 + kChunk < k_end) load_x(k0 + kChunk);
        __syncthreads();
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float scale = rescale[r];
#pragma unroll
          for (int c = 0; c < C; ++c) acc[r][c] *= scale;
        }
      }
      cp_async_wait<kStages - 2>();  // this thread's copies of group gidx have landed
      issue(gidx + kStages - 1);     // into the slot of group gidx - 1, read by this thread already
      const V* slot = stage + (gidx % kStages) * kGroup * kThreads + t;
#pragma unroll
      for (int u = 0; u < kGroup; ++u) {
        if (gi * kGroup + u >= rows_per_slice) break;
        const V w = slot[u * kThreads];
        const float* p = P + (kk0 + gi * kGroup + u) * R;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float pr = p[r];
#pragma unroll
          for (int c = 0; c < C; ++c) acc[r][c] = fmaf(pr, convert<float>(w.e[c]), acc[r][c]);
        }
      }
    }
    cp_async_wait_all();
    __syncthreads();  // every thread done with the stages: `partial` takes their place

    // The slices' sum: inside a warp over the lanes of the same column
    // group, then the warps' (or slices') partials in a fixed order.
    if (G < 32) {
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < C; ++c)
          for (int off = G; off < 32; off *= 2) acc[r][c] += __shfl_xor_sync(0xffffffffu, acc[r][c], off);
    }
    const int turns = G < 32 ? kWarps : S;
    const int turn = G < 32 ? warp : s;
    if (G >= 32 || lane < G) {
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < C; ++c) partial[(turn * R + r) * BN + g * C + c] = acc[r][c];
    }
    __syncthreads();

    const int64_t out_b = a.parts > 1 ? b * a.parts + part : b;
    T* out = static_cast<T*>(a.out) + out_b * a.d1 * a.d3;
    for (int e = t; e < R * BN; e += kThreads) {
      const int r = e / BN;
      const int64_t row = row0 + r, cc = nb * BN + e % BN;
      if (row >= a.d1 || cc >= a.d3) continue;
      float sum = 0.f;
      for (int q = 0; q < turns; ++q) sum += partial[q * R * BN + e];
      out[row * a.d3 + cc] = convert<T>(sum / row_sum[r]);
    }
    if (t < R && nb == 0 && row0 + t < a.d1) {
      const int64_t i = out_b * a.d1 + row0 + t;
      if (a.part_max != nullptr) {
        a.lse[i] = logf(row_sum[t]);
        a.part_max[i] = row_max[t];
      } else {
        a.lse[i] = row_max[t] + logf(row_sum[t]);
      }
    }
    __syncthreads();  // partial, row_max and row_sum are rewritten by the next tile
  }
}

template <typename T, int R>
void launch(const Args& a, int groups) {
  constexpr int C = columns_per_thread<T, R>();
  const int64_t bn = int64_t{groups} * C;
  const int64_t tiles = a.batch * a.parts * ((a.d3 + bn - 1) / bn) * ((a.d1 + R - 1) / R);
  // V read as vectors: rows (and batch entries) whole vectors apart, V aligned
  const int64_t vbytes = int64_t{C} * static_cast<int64_t>(sizeof(T));
  const bool vec_ok = a.v_row_stride % C == 0 && (a.batch <= 1 || a.v_batch_stride % C == 0) &&
                      reinterpret_cast<uintptr_t>(a.v) % vbytes == 0;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, int64_t{1} << 20));
  constexpr int64_t smem = shared_bytes<T, R>();
  if (smem > softmax_ext::cuda::kDefaultSharedBytes) softmax_ext::cuda::allow_dynamic_shared(rows_kernel<T, R>, smem);
  softmax_ext::cuda::launch_kernel(rows_kernel<T, R>, grid, kThreads, smem, a, groups, vec_ok);
}

template <typename T>
void launch_rows_of(const Args& a, int rows, int groups) {
  switch (rows) {
    case 1: return launch<T, 1>(a, groups);
    case 2: return launch<T, 2>(a, groups);
    case 4: return launch<T, 4>(a, groups);
    case 8: return launch<T, 8>(a, groups);
    default: return launch<T, 16>(a, groups);
  }
}

}  // namespace

void launch_rows(const Args& a, int rows, int groups, int dtype) {
  switch (static_cast<c10::ScalarType>(dtype)) {
    case c10::ScalarType::BFloat16: return launch_rows_of<c10::BFloat16>(a, rows, groups);
    case c10::ScalarType::Half: return launch_rows_of<c10::Half>(a, rows, groups);
    default: return launch_rows_of<float>(a, rows, groups);
  }
}

}  // namespace softmax_ext::smm::cuda
