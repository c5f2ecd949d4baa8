// CUDA kernels of the sharded-axis steps (rows.h). Rows are contiguous; a
// group of threads takes a row: a warp (rows up to kWarpRowMax elements, 8
// rows per 256-thread block) or the whole 256-thread block. Each thread
// walks the row in 16-byte packs (fragment.cuh's Pack), kUnroll packs
// loaded before any is used, so every thread keeps 64 bytes in flight; the
// statistics accumulate in float (double for double) and meet in the fixed
// order of reduce.cuh's warp and block reductions: no atomics, bit-identical
// reruns. Rows that are not 16-byte aligned (a base pointer off alignment,
// or a row length that is not a multiple of the pack) are walked element by
// element.
//
// The numerics are those of the package's single-device kernels
// (common.cuh): NaN-propagating max, the forward epilogues built from the
// (max, sum) of the whole row, the fast exp for 16-bit types.

#include "cuda/core/dispatch.cuh"
#include "cuda/core/epilogues.cuh"
#include "cuda/core/grid.h"
#include "cuda/core/numerics.cuh"
#include "cuda/core/reduce.cuh"
#include "cuda/core/vector_io.cuh"
#include "distributed/rows.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

namespace softmax_ext::distributed {
namespace {

using cuda::acc_type;
using cuda::convert;
using cuda::exp_policy_t;
using cuda::MaxSum;
using cuda::neg_infinity;
using cuda::Pack;

constexpr int kUnroll = 4;

// The rows of one group: a warp or the block.
template <int kGroup>
struct Group {
  static constexpr int kPerBlock = kRowsBlock / kGroup;
  __device__ __forceinline__ static int lane() { return threadIdx.x % kGroup; }
  __device__ __forceinline__ static int64_t first_row() {
    return static_cast<int64_t>(blockIdx.x) * kPerBlock + threadIdx.x / kGroup;
  }
  __device__ __forceinline__ static int64_t row_step() { return static_cast<int64_t>(gridDim.x) * kPerBlock; }

  // Every thread of the group gets the group's result.
  template <typename T, typename Op>
  __device__ __forceinline__ static T all_reduce(T value, Op op, T identity) {
    if constexpr (kGroup == cuda::kWarpSize) {
      return cuda::warp_all_reduce(value, op);
    } else {
      __shared__ T scratch[cuda::kWarpSize];
      return cuda::block_all_reduce(value, op, identity, scratch);
    }
  }
};

// Walks a row of n elements in packs of P: calls f(packs, valid) with
// kUnroll packs per thread per step; packs past the row end are not loaded
// and valid[u] is false (with P > 1 the row length is a multiple of P, so a
// pack is whole or absent).
template <int kGroup, int P, typename T, int kOps, typename F>
__device__ __forceinline__ void walk_row(const T* const (&rows)[kOps], int64_t n, F&& f) {
  const int64_t step = static_cast<int64_t>(kGroup) * P;
  for (int64_t base = static_cast<int64_t>(Group<kGroup>::lane()) * P; base < n; base += step * kUnroll) {
    Pack<T, P> packs[kOps][kUnroll];
    bool valid[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = base + u * step;
      valid[u] = j < n;
#pragma unroll
      for (int o = 0; o < kOps; ++o)
        if (valid[u]) packs[o][u].load(rows[o] + j);
    }
    f(packs, valid, base, step);
  }
}

// Walks the rows like walk_row and writes out[j] = f(packs, u, e) for every
// j < n, element e of pack u of the step that holds j.
template <int kGroup, int P, typename T, int kOps, typename F>
__device__ __forceinline__ void map_row(const T* const (&rows)[kOps], T* out, int64_t n, F&& f) {
  walk_row<kGroup, P>(rows, n, [&](const Pack<T, P>(&packs)[kOps][kUnroll], const bool(&valid)[kUnroll],
                                   int64_t base, int64_t step) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (!valid[u]) continue;
      Pack<T, P> o;
#pragma unroll
      for (int e = 0; e < P; ++e) o.v[e] = convert<T>(f(packs, u, e));
      o.store(out + base + u * step);
    }
  });
}

template <typename T, int kGroup, int P>
__global__ void __launch_bounds__(kRowsBlock) stats_kernel(const T* __restrict__ x, acc_type<T>* __restrict__ stats,
                                                          int64_t rows, int64_t n) {
  using A = acc_type<T>;
  using Exp = exp_policy_t<T>;
  for (int64_t r = Group<kGroup>::first_row(); r < rows; r += Group<kGroup>::row_step()) {
    const T* const ops[1] = {x + r * n};
    A m = neg_infinity<A>();
    A s = 0;
    walk_row<kGroup, P>(ops, n, [&](const Pack<T, P>(&packs)[1][kUnroll], const bool(&valid)[kUnroll], int64_t,
                                    int64_t) {
      A v[kUnroll][P];
      A cm = neg_infinity<A>();
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int e = 0; e < P; ++e) {
          v[u][e] = valid[u] ? convert<A>(packs[0][u].v[e]) : neg_infinity<A>();
          cm = cuda::NanMax{}(cm, v[u][e]);
        }
      const A nm = cuda::NanMax{}(m, cm);
      if (!(nm == m)) {  // a new max (or NaN): rescale what was summed
        s = m == neg_infinity<A>() ? A(0) : s * cuda::acc_exp(m - nm);
        m = nm;
      }
      if (m != neg_infinity<A>()) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
#pragma unroll
          for (int e = 0; e < P; ++e) s += Exp::exp(v[u][e] - m);
      }
    });
    const MaxSum<A> all = Group<kGroup>::all_reduce(MaxSum<A>{m, s}, cuda::CombineMaxSum{}, cuda::empty_stats<A>());
    if (Group<kGroup>::lane() == 0) {
      stats[2 * r] = all.max;
      stats[2 * r + 1] = all.sum;
    }
  }
}

template <typename T, int kGroup, int P, bool kLog>
__global__ void __launch_bounds__(kRowsBlock) normalize_kernel(const T* __restrict__ x,
                                                              const acc_type<T>* __restrict__ stats,
                                                              T* __restrict__ y, int64_t rows, int64_t n) {
  using A = acc_type<T>;
  using Epilogue = std::conditional_t<kLog, cuda::LogSoftmaxForwardEpilogue<A, exp_policy_t<T>>,
                                      cuda::SoftmaxForwardEpilogue<A, exp_policy_t<T>>>;
  for (int64_t r = Group<kGroup>::first_row(); r < rows; r += Group<kGroup>::row_step()) {
    const Epilogue epilogue(stats[2 * r], stats[2 * r + 1]);
    const T* const ops[1] = {x + r * n};
    map_row<kGroup, P>(ops, y + r * n, n, [&](const Pack<T, P>(&packs)[1][kUnroll], int u, int e) {
      return epilogue(convert<A>(packs[0][u].v[e]));
    });
  }
}

template <typename T, int kGroup, int P, bool kLog>
__global__ void __launch_bounds__(kRowsBlock) backward_stats_kernel(const T* __restrict__ dy, const T* __restrict__ y,
                                                                   acc_type<T>* __restrict__ stats, int64_t rows,
                                                                   int64_t n) {
  using A = acc_type<T>;
  for (int64_t r = Group<kGroup>::first_row(); r < rows; r += Group<kGroup>::row_step()) {
    A s = 0;
    auto body = [&](const auto& packs, const bool(&valid)[kUnroll], int64_t, int64_t) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int e = 0; e < P; ++e) {
          A t;
          if constexpr (kLog) t = convert<A>(packs[0][u].v[e]);
          else t = convert<A>(packs[0][u].v[e]) * convert<A>(packs[1][u].v[e]);
          s += valid[u] ? t : A(0);
        }
    };
    if constexpr (kLog) {  // sum(dy) does not read y
      const T* const ops[1] = {dy + r * n};
      walk_row<kGroup, P>(ops, n, body);
    } else {
      const T* const ops[2] = {dy + r * n, y + r * n};
      walk_row<kGroup, P>(ops, n, body);
    }
    const A all = Group<kGroup>::all_reduce(s, cuda::Sum{}, A(0));
    if (Group<kGroup>::lane() == 0) stats[r] = all;
  }
}

template <typename T, int kGroup, int P, bool kLog>
__global__ void __launch_bounds__(kRowsBlock) backward_apply_kernel(const T* __restrict__ dy, const T* __restrict__ y,
                                                                   const acc_type<T>* __restrict__ stats,
                                                                   T* __restrict__ dx, int64_t rows, int64_t n) {
  using A = acc_type<T>;
  using Epilogue = std::conditional_t<kLog, cuda::LogSoftmaxBackwardEpilogue<A, exp_policy_t<T>>,
                                      cuda::SoftmaxBackwardEpilogue<A>>;
  for (int64_t r = Group<kGroup>::first_row(); r < rows; r += Group<kGroup>::row_step()) {
    const Epilogue epilogue(stats[r]);
    const T* const ops[2] = {dy + r * n, y + r * n};
    map_row<kGroup, P>(ops, dx + r * n, n, [&](const Pack<T, P>(&packs)[2][kUnroll], int u, int e) {
      return epilogue(convert<A>(packs[0][u].v[e]), convert<A>(packs[1][u].v[e]));
    });
  }
}

bool aligned(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % cuda::kVectorBytes == 0; }

template <typename T, int kGroup, int P>
void launch(const RowsPlan& plan, const RowsBuffers& b) {
  const RowsProblem& p = plan.problem;
  using A = acc_type<T>;
  constexpr int kPerBlock = Group<kGroup>::kPerBlock;
  const unsigned grid = cuda::grid_for_rows((p.rows + kPerBlock - 1) / kPerBlock);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const T* a = static_cast<const T*>(b.a);
  const T* bb = static_cast<const T*>(b.b);
  A* stats = static_cast<A*>(b.stats);
  T* out = static_cast<T*>(b.out);
  const bool log = p.kind == Kind::LogSoftmax;
  cuda::dispatch_bool(log, [&](auto log_tag) {
    constexpr bool kLog = decltype(log_tag)::value;
    switch (p.step) {
      case Step::Stats:
        stats_kernel<T, kGroup, P><<<grid, kRowsBlock, 0, stream>>>(a, stats, p.rows, p.n);
        break;
      case Step::Normalize:
        normalize_kernel<T, kGroup, P, kLog><<<grid, kRowsBlock, 0, stream>>>(a, stats, out, p.rows, p.n);
        break;
      case Step::BackStats:
        backward_stats_kernel<T, kGroup, P, kLog><<<grid, kRowsBlock, 0, stream>>>(a, bb, stats, p.rows, p.n);
        break;
      case Step::BackApply:
        backward_apply_kernel<T, kGroup, P, kLog><<<grid, kRowsBlock, 0, stream>>>(a, bb, stats, out, p.rows, p.n);
        break;
    }
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void run_cuda(const RowsPlan& plan, const RowsBuffers& b) {
  const RowsProblem& p = plan.problem;
  cuda::dispatch_floating_type(p.dtype, "softmax_ext.distributed", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int P = cuda::kPack<T>;
    const bool vec = p.n % P == 0 && aligned(b.a) && aligned(b.b) && aligned(b.out);
    const bool warp = plan.layout == RowsLayout::kWarpPerRow;
    if (vec) {
      if (warp) launch<T, cuda::kWarpSize, P>(plan, b);
      else launch<T, kRowsBlock, P>(plan, b);
    } else {
      if (warp) launch<T, cuda::kWarpSize, 1>(plan, b);
      else launch<T, kRowsBlock, 1>(plan, b);
    }
  });
}

}  // namespace softmax_ext::distributed
