// CUDA kernels of the fused cross-entropy: a block per row of vocabulary
// size (or a cluster of blocks, below), streaming the row once with 16-byte
// vector loads (Pack, core/vector_io.cuh), four in flight per thread (eight
// in the plain forward of 16-bit rows, folded in four at a time). 16-bit
// rows are read a 32-bit word at a time (two values an instruction for the
// max, one widening a value) with an ftz exp2 (FtzExp).
//
// Forward: an online max / exp-sum per thread (the sum rescaled only when a
// pack raises the thread's max), then one block reduction of the (max, sum)
// pairs (core/reduce.cuh: fixed order, no atomics). Thread 0 reads x[target] (an
// L2 hit: the row was just read) and writes the row's loss and statistics,
// its max m and ls = log sum exp(x - m) (f32; f64 for f64; plan.h), kept
// apart so that x - m, exact, enters every later term instead of x - lse
// rounded at lse's magnitude. With label smoothing, float32 rows sum their
// sum_c w_c x_c in float64 (the smoothing loss W (m + ls) - that sum
// cancels at a large m). mean / sum: the per-row losses go to a workspace
// and one block of 1024 threads sums them, and the non-ignored targets'
// weights, in a fixed order: deterministic, and the divisor never leaves
// the device (no host synchronisation; CUDA-graph capture works).
//
// Backward: one read of the row and one write of the gradient (or over the
// logits, in place): s * [a * exp((x - m) - ls) - c * w_c] - [c == t] * s * b,
// computed in f32 before the one rounding, so the true class's p - 1 keeps
// its value for confident predictions. Ignored rows are written as zeros
// without reading the logits.
//
// The fused forward (kGrad) runs the forward's row loop, then, in the same
// block, the backward's row for an incoming gradient of 1, reading the
// row's start from shared memory (staged by the same threads in the first
// pass) and the rest again from global memory (L2); ce_grad_scale_kernel
// is its backward.
//
// Rows split (CePlan::row_split > 1): the forward's blocks of a row form a
// thread-block cluster and exchange their partial statistics through
// distributed shared memory (kCluster); the backward's parts of a row need
// no exchange and are independent blocks.
//
// Out-of-range targets are a device-side assert, as in torch's own CUDA
// nll_loss.

#include "cross_entropy/plan.h"
#include "cuda/families/cross_entropy/common.cuh"
#include "cuda/families/cross_entropy/lanes.cuh"
#include "cuda/core/cluster.cuh"
#include "cuda/core/dispatch.cuh"
#include "cuda/core/grid.h"
#include "cuda/core/launch.cuh"
#include "cuda/core/reduce.cuh"
#include "cuda/core/vector_io.cuh"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/macros/Macros.h>

#include <atomic>
#include <mutex>

namespace softmax_ext::ce {
namespace {

using namespace dev;
using cuda::acc_type;
using cuda::kPack;
using cuda::NanMax;
using cuda::Pack;

constexpr int kUnroll = 4;  // 16-byte loads in flight per thread

// Word-wise access to a 16-byte pack of 16-bit values: the NaN-propagating
// max of two pairs in one instruction, and a value of a pair widened to
// float (bf16: a shift or a mask).
template <typename T>
__device__ __forceinline__ uint32_t max2_nan(uint32_t a, uint32_t b) {
  uint32_t r;
  if constexpr (std::is_same_v<T, c10::BFloat16>) asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  else asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
template <typename T>
constexpr uint32_t kNegInfPair = std::is_same_v<T, c10::BFloat16> ? 0xff80ff80u : 0xfc00fc00u;
template <typename T, int kHigh>
__device__ __forceinline__ float pair_value(uint32_t w) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return __uint_as_float(kHigh ? (w & 0xffff0000u) : (w << 16));
  } else {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(kHigh ? w >> 16 : w & 0xffffu)));
  }
}
__device__ __forceinline__ uint32_t pack_word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
// Element e (unrolled: a constant) of a pack, widened to the accumulator.
template <typename T, int P>
__device__ __forceinline__ acc_type<T> pack_value(const Pack<T, P>& pk, int e) {
  if constexpr (cuda::is_reduced_float_v<T> && Pack<T, P>::kBytes == cuda::kVectorBytes) {
    const uint32_t w = pack_word(pk.raw[0], e / 2);
    return e % 2 ? pair_value<T, 1>(w) : pair_value<T, 0>(w);
  } else {
    return cuda::convert<acc_type<T>>(pk.v[e]);
  }
}

template <typename T>
struct Row {
  int head;        // elements before the first 16-byte boundary
  int64_t packs;   // whole packs after it
  int64_t body_end;
};

template <typename T>
__device__ __forceinline__ Row<T> split_row(const T* p, int64_t n) {
  constexpr int P = kPack<T>;
  const auto address = reinterpret_cast<uintptr_t>(p);
  int64_t head = static_cast<int64_t>((cuda::kVectorBytes - address % cuda::kVectorBytes) % cuda::kVectorBytes /
                                      sizeof(T));
  if (head > n) head = n;
  const int64_t packs = (n - head) / P;
  return {static_cast<int>(head), packs, head + packs * P};
}

// The online (max, sum) of one thread: a chunk of values at a time, so the
// running sum is rescaled at most once a chunk. The chunk's values are read
// twice (max, then exp) and converted each time, which costs less than
// holding them all in float32 registers.
// 16-bit packs are read word by word: the chunk's max two values an
// instruction, each value widened once, for its exp.
template <typename T>
struct Online {
  using acc_t = acc_type<T>;
  using Exp = ce_exp_t<T>;
  acc_t m = cuda::neg_infinity<acc_t>();
  acc_t s = 0;
  // The first `live` of the U packs pk (live = U for every full chunk).
  template <int U, int P>
  __device__ __forceinline__ void add(const Pack<T, P> (&pk)[U], int live = U) {
    constexpr bool kWords = cuda::is_reduced_float_v<T> && Pack<T, P>::kBytes == cuda::kVectorBytes;
    acc_t cm = m;
    if constexpr (kWords) {
      uint32_t w = kNegInfPair<T>;
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (u < live) {
#pragma unroll
          for (int i = 0; i < 4; ++i) w = max2_nan<T>(w, pack_word(pk[u].raw[0], i));
        }
      cm = NanMax{}(cm, NanMax{}(pair_value<T, 0>(w), pair_value<T, 1>(w)));
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (u < live) {
#pragma unroll
          for (int e = 0; e < P; ++e) cm = NanMax{}(cm, cuda::convert<acc_t>(pk[u].v[e]));
        }
    }
    if (cm != m) {  // a larger max (or NaN): rescale what is summed so far
      s = s * Exp::exp(m - cm);
      m = cm;
    }
    if (m == cuda::neg_infinity<acc_t>()) return;
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (u < live) {
        if constexpr (kWords) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const uint32_t w = pack_word(pk[u].raw[0], i);
            s += Exp::exp(pair_value<T, 0>(w) - m);
            s += Exp::exp(pair_value<T, 1>(w) - m);
          }
        } else {
#pragma unroll
          for (int e = 0; e < P; ++e) s += Exp::exp(cuda::convert<acc_t>(pk[u].v[e]) - m);
        }
      }
  }
};

template <typename T>
__device__ __forceinline__ void zero_row(T* g, int64_t n, int threads) {
  constexpr int P = kPack<T>;
  const Row<T> r = split_row(g, n);
  for (int64_t j = threadIdx.x; j < r.head; j += threads) g[j] = T(0.0f);
  for (int64_t j = r.body_end + threadIdx.x; j < n; j += threads) g[j] = T(0.0f);
  Pack<T, P> z;
#pragma unroll
  for (int e = 0; e < P; ++e) z.v[e] = T(0.0f);
  for (int64_t k = threadIdx.x; k < r.packs; k += threads) z.store(g + r.head + k * P);
}

// One row of the gradient from its statistics (m, ls): one read of x, one write of g
// (16-byte packs where the two rows sit alike against 16 bytes), computed
// in f32 before the one rounding, so the true class's p - 1 keeps its value
// for confident predictions. g may be x (in place): each element is read
// before it is written, by the same thread. The first `staged` packs of the
// row's body come from `stage` (shared memory, filled by the same thread
// in the fused forward) instead of global memory.
template <typename T, int kThreads, bool kWeighted>
__device__ __forceinline__ void write_grad_row(const T* x, T* g, int64_t classes, int64_t t,
                                               const acc_type<T>* weight, GradCoefficients<acc_type<T>> k,
                                               acc_type<T> m, acc_type<T> ls, const uint4* stage = nullptr,
                                               int64_t staged = 0) {
  using acc_t = acc_type<T>;
  constexpr int P = kPack<T>;
  // dx_j without the true class's term, which value() adds
  auto other = [&](acc_t v, int64_t j) { return grad_other<T>(k, v, m, ls, kWeighted ? weight[j] : acc_t(1)); };
  auto value = [&](acc_t v, int64_t j) {
    const acc_t d = other(v, j);
    return j == t ? d - k.cb : d;
  };
  const bool same_shift = (reinterpret_cast<uintptr_t>(x) - reinterpret_cast<uintptr_t>(g)) % cuda::kVectorBytes == 0;
  if (!same_shift) {  // the two rows sit differently against 16 bytes
    for (int64_t j = threadIdx.x; j < classes; j += kThreads) g[j] = cuda::convert<T>(value(cuda::convert<acc_t>(x[j]), j));
    return;
  }
  const Row<T> r = split_row(x, classes);
  {
    const int64_t tail = classes - r.body_end;
    int64_t j = -1;
    if (threadIdx.x < r.head) j = threadIdx.x;
    else if (threadIdx.x >= 32 && threadIdx.x - 32 < tail) j = r.body_end + threadIdx.x - 32;
    if (j >= 0) g[j] = cuda::convert<T>(value(cuda::convert<acc_t>(x[j]), j));
  }
  const T* xb = x + r.head;
  T* gb = g + r.head;
  for (int64_t k0 = threadIdx.x; k0 < r.packs; k0 += int64_t{kThreads} * kUnroll) {
    Pack<T, P> pk[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t kk = k0 + int64_t{u} * kThreads;
      if (kk < staged) pk[u].raw[0] = stage[kk];
      else if (kk < r.packs) pk[u].load(xb + kk * P);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t kk = k0 + int64_t{u} * kThreads;
      if (kk < r.packs) {
        const int64_t j0 = r.head + kk * P;
        // the true class's offset in this pack (a 32-bit compare an element)
        const int64_t off64 = t - j0;
        const int off = static_cast<uint64_t>(off64) < static_cast<uint64_t>(P) ? static_cast<int>(off64) : -1;
        Pack<T, P> out;
#pragma unroll
        for (int e = 0; e < P; ++e) {
          const acc_t d = other(pack_value(pk[u], e), j0 + e);
          out.v[e] = cuda::convert<T>(e == off ? d - k.cb : d);
        }
        out.store(gb + kk * P);
      }
    }
  }
}

// kGrad (the fused forward, mean / sum): after its statistics the block
// also writes the row's gradient for grad_loss = 1, reading the row a
// second time while it is still in L2; the backward then only scales it
// (ce_grad_scale_kernel). One read from memory and one write in all,
// against the unfused pair's two reads and one write.
//
// kCluster: a cluster of a.cluster blocks takes each row, block r the
// classes [r * a.chunk, (r + 1) * a.chunk); the blocks exchange their
// (max, sum) (and the smoothing sum) through distributed shared memory
// (cuda/core/cluster.cuh, fixed order), so each knows the row's statistics
// and writes its own classes' gradient, staged whole in its shared memory. A
// row then is a.cluster small units of work instead of one large one: few
// rows fill every SM evenly, and no block waits alone for a long row in
// the grid's last wave. Rank 0 writes the row's loss and statistics.
//
// Launch bounds (blocks an SM, the registers they leave a thread): the
// cluster kernels as measured (docs/cross_entropy.md); the plain forward's
// 512-thread block of 16-bit or float32 rows two (64 registers), its parts
// kernel 8 / 7 (64 / 71).
//
// kParts > 1 (the plain forward, not kCluster): one block folds a row as
// the fused forward's cluster of kParts blocks does (CePlan::block_parts).
template <typename T, int kThreads, bool kSmooth, bool kGrad, bool kCluster, int kParts = 1>
__global__ void __launch_bounds__(kThreads, kCluster ? (kGrad ? 7 : kSmooth ? 10 : 12)
                                   : kParts > 1 ? (kSmooth ? 7 : 8)
                                   : !kGrad && kThreads == 512 && sizeof(T) < 8 ? 2 : 1)
    ce_forward_kernel(ForwardArgs<T> a) {
  static_assert(kParts == 1 || (!kCluster && !kGrad), "a block folds a row in parts in the plain forward only");
  using acc_t = acc_type<T>;
  using sx_t = smooth_sum_t<T>;
  constexpr int P = kPack<T>;
  __shared__ cuda::MaxSum<acc_t> scratch_ms[cuda::kWarpSize];
  __shared__ sx_t scratch_s[cuda::kWarpSize];
  extern __shared__ uint4 stage[];  // kGrad: the row's first a.stage_packs packs
  // kCluster: the exchange of the blocks' partials
  __shared__ cuda::ClusterExchange<cuda::MaxSum<acc_t>> exchange;
  __shared__ cuda::ClusterExchange<sx_t> exchange_s;
  __shared__ cuda::MaxSum<acc_t> combined;
  __shared__ sx_t combined_s;
  // 16-byte loads in flight per thread: 8 for the 16-bit rows of the plain
  // forward (its registers hold them), else kUnroll
  constexpr int kU = !kGrad && !kCluster && cuda::is_reduced_float_v<T> ? 8 : kUnroll;
  const int cluster = kCluster ? a.cluster : 1;
  unsigned round = 0;
  if constexpr (kCluster) {
    cuda::cluster_exchange_init(exchange);
    if constexpr (kSmooth) cuda::cluster_exchange_init(exchange_s);
  }
  const unsigned rank = kCluster ? cuda::cluster_rank() : 0;
  // this block's classes of each row: [c0, c0 + n)
  const int64_t c0 = kCluster ? rank * a.chunk : 0;
  const int64_t n = kCluster ? max(int64_t{0}, min(a.chunk, a.classes - c0)) : a.classes;
  const acc_t* weight = a.weight != nullptr ? a.weight + c0 : nullptr;
  // The kernel that sums the row losses may be scheduled once every block
  // has started (cuda_forward).
  cuda::allow_dependents();
  // The gradient's row scale: 1 / total_weight (mean) or 1 (sum). For the
  // mean the kernel before this one computes total_weight, and this one may
  // start before it ends: read at the first gradient, after the wait.
  acc_t grad_scale = 1;
  bool scale_pending = kGrad && a.total_weight != nullptr;
  const cuda::ClusterRowLoop loop{cluster};
  for (int64_t row = loop.start(); row < a.rows; row += loop.step()) {
    const int64_t t = load_target(a.target64, a.target32, row);
    if (t == a.ignore_index) {
      if (threadIdx.x == 0 && rank == 0) store_row(a, row, acc_t(0), acc_t(0), acc_t(0));
      if constexpr (kGrad) zero_row(a.grad + row * a.grad_row_stride + c0, n, kThreads);
      continue;
    }
    CUDA_KERNEL_ASSERT(t >= 0 && t < a.classes);
    const T* x_row = a.logits + row * a.row_stride;
    const T* x = x_row + c0;
    // The target logit (rank 0's thread 0), loaded first so it lands while the row streams.
    const acc_t xt = threadIdx.x == 0 && rank == 0 ? cuda::convert<acc_t>(x_row[t]) : acc_t(0);
    // This block's classes; or (kParts > 1) the row in kParts pieces of
    // a.chunk classes, each folded as a block of the fused forward's
    // cluster of kParts blocks folds its own, then combined as that
    // cluster combines them (CePlan::block_parts): the same bits.
    cuda::MaxSum<acc_t> part_stats[kParts];
    sx_t part_sx[kParts] = {};
#pragma unroll
    for (int part = 0; part < kParts; ++part) {
      const T* xp = kParts == 1 ? x : x + part * a.chunk;
      const int64_t np = kParts == 1 ? n : max(int64_t{0}, min(a.chunk, a.classes - part * a.chunk));
      const acc_t* wp = kParts == 1 || weight == nullptr ? weight : weight + part * a.chunk;
      const Row<T> r = split_row(xp, np);
      Online<T> on;
      sx_t sxp = 0;
      auto smooth_term = [&](acc_t v, int64_t j) {
        if constexpr (kSmooth) sxp += wp != nullptr ? sx_t(wp[j]) * sx_t(v) : sx_t(v);
      };
      // Scalar head and tail (fewer than a pack each).
      {
        const int64_t tail = np - r.body_end;
        int64_t j = -1;
        if (threadIdx.x < r.head) j = threadIdx.x;
        else if (threadIdx.x >= 32 && threadIdx.x - 32 < tail) j = r.body_end + threadIdx.x - 32;
        if (j >= 0) {
          Pack<T, 1> one[1];
          one[0].v[0] = xp[j];
          on.add(one);
          smooth_term(cuda::convert<acc_t>(xp[j]), j);
        }
      }
      // The body: kU packs in flight per thread.
      const T* body = xp + r.head;
      for (int64_t k0 = threadIdx.x; k0 < r.packs; k0 += int64_t{kThreads} * kU) {
        // packs of this chunk in range (every one but in the row's last chunk)
        const int live = static_cast<int>(min(int64_t{kU}, (r.packs - k0 + kThreads - 1) / kThreads));
        Pack<T, P> pk[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u)
          if (u < live) pk[u].load(body + (k0 + int64_t{u} * kThreads) * P);
        if constexpr (kGrad) {  // kept for the gradient pass (each thread its own packs)
#pragma unroll
          for (int u = 0; u < kU; ++u) {
            const int64_t kk = k0 + int64_t{u} * kThreads;
            if (u < live && kk < a.stage_packs) stage[kk] = pk[u].raw[0];
          }
        }
        // folded in four packs at a time whatever kU is: the plain forward
        // then sums in the fused one's order (the same statistics bits, plan.cpp)
        on.add(*reinterpret_cast<const Pack<T, P>(*)[kUnroll]>(&pk[0]), min(live, kUnroll));
        if constexpr (kU > kUnroll) {
          static_assert(kU == 2 * kUnroll);
          if (live > kUnroll) on.add(*reinterpret_cast<const Pack<T, P>(*)[kUnroll]>(&pk[kUnroll]), live - kUnroll);
        }
        if constexpr (kSmooth) {
#pragma unroll
          for (int u = 0; u < kU; ++u)
            if (u < live) {
#pragma unroll
              for (int e = 0; e < P; ++e)
                smooth_term(pack_value(pk[u], e), r.head + (k0 + int64_t{u} * kThreads) * P + e);
            }
        }
      }
      part_stats[part] = cuda::block_all_reduce(cuda::MaxSum<acc_t>{on.m, on.s}, cuda::CombineMaxSum{},
                                                cuda::empty_stats<acc_t>(), scratch_ms);
      if constexpr (kSmooth) part_sx[part] = cuda::block_all_reduce(sxp, cuda::Sum{}, sx_t(0), scratch_s);
    }
    // The partials of the blocks (or pieces) of a row, folded by lane.
    auto fold_stats = [](cuda::MaxSum<acc_t> v) { return cuda::warp_all_reduce(v, cuda::CombineMaxSum{}); };
    auto fold_sum = [](sx_t v) { return cuda::warp_all_reduce(v, cuda::Sum{}); };
    cuda::MaxSum<acc_t> stats = part_stats[0];
    sx_t sx = part_sx[0];
    if constexpr (kParts > 1) {
      stats = cuda::fold_as_cluster(part_stats, cuda::empty_stats<acc_t>(), &combined, fold_stats);
      if constexpr (kSmooth) sx = cuda::fold_as_cluster(part_sx, sx_t(0), &combined_s, fold_sum);
    }
    if constexpr (kCluster) {
      stats = cuda::cluster_exchange(exchange, stats, cluster, round, cuda::empty_stats<acc_t>(), &combined,
                                     fold_stats);
      if constexpr (kSmooth)
        sx = cuda::cluster_exchange(exchange_s, sx, cluster, round, sx_t(0), &combined_s, fold_sum);
      ++round;
    }
    // The statistics the store and the gradient use alike: the backward op
    // reads the same values.
    const acc_t m = stats.max, ls = cuda::acc_log(stats.sum);
    if (threadIdx.x == 0 && rank == 0) store_row(a, row, m, ls, row_loss_of<kSmooth>(a, t, m, ls, xt, sx));
    if constexpr (kGrad) {
      if (scale_pending) {
        cuda::wait_for_prior();
        grad_scale = acc_t(1) / *a.total_weight;
        scale_pending = false;
      }
      T* g = a.grad + row * a.grad_row_stride + c0;
      if (a.weight != nullptr) {
        const acc_t W = grad_weight_sum<acc_t>(true, a.weight_sum, a.classes);
        write_grad_row<T, kThreads, true>(x, g, n, t - c0, weight,
                                          grad_coefficients(grad_scale, a.weight[t], W, a.eps, a.eps_c), m, ls,
                                          stage, a.stage_packs);
      } else {
        write_grad_row<T, kThreads, false>(
            x, g, n, t - c0, weight,
            grad_coefficients(grad_scale, acc_t(1), static_cast<acc_t>(a.classes), a.eps, a.eps_c), m, ls, stage,
            a.stage_packs);
      }
    }
  }
  // A block whose rows were all ignored still ends after the divisor's
  // kernel: this kernel's end then orders that one's too.
  if (scale_pending) cuda::wait_for_prior();
  if constexpr (kCluster) cuda::cluster_exchange_exit(round);
}

// One block: the non-ignored targets' total weight and (mean / sum: one of
// `loss` and `loss_acc` set) the sum of the per-row losses, each thread over
// a fixed stride of rows, then a fixed-order block reduction. Before the
// forward kernel (the fused mean's divisor) it lets the forward start at
// once; after it, it is launched after its prior (cuda_forward): the
// targets and weights, the call's inputs, are summed while the forward
// ends, the per-row losses (0 for an ignored row) only after its wait.
//
// Past kOneBlockRows rows (a.parts > 0) ce_partial_kernel sums a slice of
// rows a block first, the same way, and this kernel sums the slices.
template <typename T>
__device__ __forceinline__ acc_type<T> target_weights(const ForwardArgs<T>& a, int64_t r0, int64_t r1) {
  using acc_t = acc_type<T>;
  acc_t tw = 0;
  for (int64_t row = r0 + threadIdx.x; row < r1; row += blockDim.x) {
    const int64_t t = load_target(a.target64, a.target32, row);
    if (t != a.ignore_index) tw += a.weight != nullptr ? a.weight[t] : acc_t(1);
  }
  return tw;
}

template <typename T>
__global__ void __launch_bounds__(1024) ce_partial_kernel(ForwardArgs<T> a, bool losses) {
  using acc_t = acc_type<T>;
  cuda::allow_dependents();
  const int64_t per = (a.rows + gridDim.x - 1) / gridDim.x;
  const int64_t r0 = min(a.rows, per * blockIdx.x), r1 = min(a.rows, r0 + per);
  acc_t tw = target_weights(a, r0, r1), sum = 0;
  cuda::wait_for_prior();
  if (losses) {
    for (int64_t row = r0 + threadIdx.x; row < r1; row += 1024) sum += a.row_loss[row];
  }
  __shared__ acc_t scratch[cuda::kWarpSize];
  tw = cuda::block_all_reduce(tw, cuda::Sum{}, acc_t(0), scratch);
  sum = cuda::block_all_reduce(sum, cuda::Sum{}, acc_t(0), scratch);
  if (threadIdx.x == 0) {
    a.partials[2 * blockIdx.x] = tw;
    a.partials[2 * blockIdx.x + 1] = sum;
  }
}

template <typename T>
__global__ void __launch_bounds__(1024) ce_reduce_kernel(ForwardArgs<T> a, T* loss, acc_type<T>* loss_acc,
                                                         acc_type<T>* total_weight, bool mean) {
  using acc_t = acc_type<T>;
  cuda::allow_dependents();
  const bool reduce = loss != nullptr || loss_acc != nullptr;
  acc_t tw = 0, sum = 0;
  if (a.parts > 0) {
    cuda::wait_for_prior();
    for (int64_t i = threadIdx.x; i < a.parts; i += 1024) {
      tw += a.partials[2 * i];
      sum += a.partials[2 * i + 1];
    }
  } else {
    tw = target_weights(a, 0, a.rows);
    cuda::wait_for_prior();  // (the forward reads total_weight, written below)
    if (reduce) {
      for (int64_t row = threadIdx.x; row < a.rows; row += 1024) sum += a.row_loss[row];
    }
  }
  __shared__ acc_t scratch[cuda::kWarpSize];
  tw = cuda::block_all_reduce(tw, cuda::Sum{}, acc_t(0), scratch);
  sum = cuda::block_all_reduce(sum, cuda::Sum{}, acc_t(0), scratch);
  if (threadIdx.x == 0) {
    *total_weight = tw;
    const acc_t value = mean ? sum / tw : sum;
    if (loss_acc != nullptr) *loss_acc = value;
    else if (loss != nullptr) *loss = cuda::convert<T>(value);
  }
}

template <typename T, int kThreads, bool kWeighted>
__global__ void __launch_bounds__(kThreads) ce_backward_kernel(BackwardArgs<T> a) {
  using acc_t = acc_type<T>;
  acc_t scale = 0;
  if (!a.none) scale = a.mean ? a.grad_loss[0] / *a.total_weight : a.grad_loss[0];
  if (!a.none && a.grad_one != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *a.grad_one = a.grad_loss[0] == acc_t(1);
  const acc_t W = grad_weight_sum<acc_t>(kWeighted, a.weight_sum, a.classes);
  // units of work: part p of row i is unit i * parts + p, classes [p * chunk, (p + 1) * chunk)
  for (int64_t unit = blockIdx.x; unit < a.rows * a.parts; unit += gridDim.x) {
    const int64_t row = unit / a.parts;
    const int64_t c0 = (unit - row * a.parts) * a.chunk;
    const int64_t n = min(a.chunk, a.classes - c0);
    const int64_t t = load_target(a.target64, a.target32, row);
    T* g = a.grad + row * a.grad_row_stride + c0;
    if (t == a.ignore_index) {
      zero_row(g, n, kThreads);
      continue;
    }
    CUDA_KERNEL_ASSERT(t >= 0 && t < a.classes);
    const acc_t s = a.none ? a.grad_loss[row] : scale;
    const acc_t wt = kWeighted ? a.weight[t] : acc_t(1);
    write_grad_row<T, kThreads, kWeighted>(a.logits + row * a.row_stride + c0, g, n, t - c0,
                                           kWeighted ? a.weight + c0 : nullptr,
                                           grad_coefficients(s, wt, W, a.eps, a.eps_c), a.row_stats[2 * row],
                                           a.row_stats[2 * row + 1]);
  }
}

// The backward of the fused forward (its gradient was written for
// grad_loss = 1): grad *= grad_loss, in place. Every block reads grad_loss
// (in its own dtype: no cast before the launch) and returns at once when it
// is 1, the usual loss.backward(), so that step makes no pass over the
// gradient and the host never waits for the value.
template <typename acc_t>
__device__ __forceinline__ acc_t read_grad_loss(const void* p, c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Double: return static_cast<acc_t>(*static_cast<const double*>(p));
    case c10::ScalarType::Half: return static_cast<acc_t>(static_cast<float>(*static_cast<const c10::Half*>(p)));
    case c10::ScalarType::BFloat16:
      return static_cast<acc_t>(static_cast<float>(*static_cast<const c10::BFloat16*>(p)));
    default: return static_cast<acc_t>(*static_cast<const float*>(p));
  }
}

template <typename T>
__global__ void __launch_bounds__(256) ce_grad_scale_kernel(T* grad, int64_t n, const void* grad_loss,
                                                             c10::ScalarType loss_type, int* grad_one) {
  using acc_t = acc_type<T>;
  constexpr int P = kPack<T>;
  const acc_t s = read_grad_loss<acc_t>(grad_loss, loss_type);
  if (grad_one != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *grad_one = s == acc_t(1);
  if (s == acc_t(1)) return;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t packs = n / P;
  for (int64_t k = first; k < packs; k += step) {
    Pack<T, P> v;
    v.load(grad + k * P);
#pragma unroll
    for (int e = 0; e < P; ++e) v.v[e] = cuda::convert<T>(cuda::convert<acc_t>(v.v[e]) * s);
    v.store(grad + k * P);
  }
  for (int64_t j = packs * P + first; j < n; j += step) grad[j] = cuda::convert<T>(cuda::convert<acc_t>(grad[j]) * s);
}

template <typename F>
void dispatch_dtype(c10::ScalarType t, F&& f) {
  cuda::dispatch_floating_type(t, "softmax_ext.cross_entropy", [&](auto tag) { f(tag); });
}

template <typename F>
void dispatch_threads(int threads, F&& f) {
  if (threads == 512) f(std::integral_constant<int, 512>{});
  else if (threads == 256) f(std::integral_constant<int, 256>{});
  else f(std::integral_constant<int, 128>{});
}

// The members ForwardArgs and BackwardArgs share, from the problem and buffers.
template <typename T, typename Args>
void fill_row_args(Args& a, const CeProblem& p, const CeBuffers& b) {
  using acc_t = acc_type<T>;
  a.logits = static_cast<const T*>(b.logits);
  a.target64 = p.target_dtype == c10::ScalarType::Int ? nullptr : static_cast<const int64_t*>(b.target);
  a.target32 = p.target_dtype == c10::ScalarType::Int ? static_cast<const int32_t*>(b.target) : nullptr;
  a.weight = static_cast<const acc_t*>(b.weight);
  a.weight_sum = static_cast<const double*>(b.weight_sum);
  a.rows = p.rows;
  a.classes = p.classes;
  a.row_stride = p.row_stride;
  a.ignore_index = p.ignore_index;
  a.eps = static_cast<acc_t>(p.smoothing);
  a.eps_c = static_cast<acc_t>(p.smoothing) / static_cast<acc_t>(p.classes);
}

// The lanes kernels' layout: `packed` where the logits' rows start on
// 16-byte boundaries with contiguous classes, `grad_packed` where the
// gradient's do too (grad: null where none is written).
template <typename T>
RowLayout layout_of(const CePlan& plan, const T* logits, const T* grad, int64_t grad_row_stride) {
  const CeProblem& p = plan.problem;
  RowLayout l;
  l.inner = p.inner;
  l.class_stride = p.class_stride;
  l.grad_class_stride = p.grad_class_stride;
  l.lanes = plan.lanes;
  const auto rows_aligned = [](const T* base, int64_t row_stride) {
    return reinterpret_cast<uintptr_t>(base) % cuda::kVectorBytes == 0 &&
           (row_stride * static_cast<int64_t>(sizeof(T))) % cuda::kVectorBytes == 0;
  };
  // (ce_packed_rows has checked the logits' row stride)
  l.packed = ce_packed_rows(p) && reinterpret_cast<uintptr_t>(logits) % cuda::kVectorBytes == 0;
  l.grad_packed = l.packed && grad != nullptr && p.grad_class_stride == 1 && rows_aligned(grad, grad_row_stride);
  return l;
}

}  // namespace

void cuda_forward(const CePlan& plan, const CeBuffers& b, void* workspace) {
  const CeProblem& p = plan.problem;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(p.device_index);
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using acc_t = acc_type<T>;
    ForwardArgs<T> a;
    fill_row_args<T>(a, p, b);
    // Per-row losses: the workspace for mean / sum; for "none" the output,
    // written as T or (acc_loss) as acc_t.
    const bool none = p.reduction == Reduction::None;
    a.loss_none = none && !p.acc_loss ? static_cast<T*>(b.loss) : nullptr;
    a.row_loss = none ? (p.acc_loss ? static_cast<acc_t*>(b.loss) : nullptr) : static_cast<acc_t*>(workspace);
    a.row_stats = static_cast<acc_t*>(b.row_stats);
    a.grad = static_cast<T*>(b.grad);
    a.grad_row_stride = p.grad_row_stride;
    a.total_weight = nullptr;
    a.parts = ce_reduce_parts(p.rows);
    a.partials = static_cast<acc_t*>(workspace) + (none ? 0 : p.rows);
    if (p.fused_grad && p.reduction == Reduction::Mean) {
      // The mean's divisor first: the rows' gradients are scaled by it (the
      // forward, launched after it, reads it once its rows need it).
      if (a.parts > 0) {
        ce_partial_kernel<T><<<static_cast<unsigned>(a.parts), 1024, 0, stream>>>(a, false);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
      ce_reduce_kernel<T><<<1, 1024, 0, stream>>>(a, nullptr, nullptr, static_cast<acc_t*>(b.total_weight), true);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      a.total_weight = static_cast<const acc_t*>(b.total_weight);
    }
    const bool forward_after_prior = plan.overlap && a.total_weight != nullptr;
    a.stage_packs = plan.stage_bytes / cuda::kVectorBytes;
    a.cluster = plan.row_split;
    a.chunk = plan.chunk;
    auto launch = [&](auto kernel, int threads) {
      // Static and dynamic shared memory over 48 KB need the opt-in, set
      // once on each device (to the most any plan stages).
      if (plan.stage_bytes > 0) cuda::allow_dynamic_shared(kernel, kMaxStageBytes);
      // clusters walk the rows like blocks
      cuda::BlockShape shape{threads, plan.row_split, plan.stage_bytes};
      shape.after_prior = forward_after_prior;
      cuda::launch_row_blocks(kernel, p.rows, shape, a);
    };
    cuda::dispatch_bool(p.smoothing > 0, [&](auto smooth) {
      cuda::dispatch_bool(p.fused_grad, [&](auto grad) {
        constexpr bool kSmooth = decltype(smooth)::value, kGrad = decltype(grad)::value;
        if (plan.lanes > 0) {  // short rows (lanes.cuh)
          a.layout = layout_of<T>(plan, a.logits, kGrad ? a.grad : nullptr, a.grad_row_stride);
          return cuda::launch_after_prior(forward_after_prior, ce_lanes_forward_kernel<T, kSmooth, kGrad>,
                                          lanes_grid(p.rows, plan.lanes), kLaneThreads, stream, a);
        }
        if constexpr (!std::is_same_v<T, double>) {  // clusters of 128-thread blocks (select_ce)
          if (plan.row_split > 1) return launch(ce_forward_kernel<T, 128, kSmooth, kGrad, true>, 128);
        }
        if constexpr (cuda::is_reduced_float_v<T> && !kGrad) {  // a row in parts, 128 threads (select_ce)
          if (plan.block_parts > 1) {
            TORCH_INTERNAL_ASSERT(plan.block_parts == kMaxBlockParts && plan.threads == 128);
            return launch(ce_forward_kernel<T, 128, kSmooth, false, false, kMaxBlockParts>, 128);
          }
        }
        dispatch_threads(plan.threads, [&](auto threads) {
          constexpr int kThreads = decltype(threads)::value;
          launch(ce_forward_kernel<T, kThreads, kSmooth, kGrad, false>, kThreads);
        });
      });
    });
    T* loss = none || p.acc_loss ? nullptr : static_cast<T*>(b.loss);
    acc_t* loss_acc = !none && p.acc_loss ? static_cast<acc_t*>(b.loss) : nullptr;
    auto* total_weight = static_cast<acc_t*>(b.total_weight);
    const bool mean = p.reduction == Reduction::Mean;
    if (a.parts > 0)
      cuda::launch_after_prior(plan.overlap, ce_partial_kernel<T>, static_cast<unsigned>(a.parts), 1024, stream, a,
                               loss != nullptr || loss_acc != nullptr);
    cuda::launch_after_prior(plan.overlap, ce_reduce_kernel<T>, 1, 1024, stream, a, loss, loss_acc, total_weight,
                             mean);
  });
}

void cuda_backward(const CePlan& plan, const CeBuffers& b) {
  const CeProblem& p = plan.problem;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(p.device_index);
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using acc_t = acc_type<T>;
    BackwardArgs<T> a;
    fill_row_args<T>(a, p, b);
    a.grad = static_cast<T*>(b.grad);
    a.grad_loss = static_cast<const acc_t*>(b.grad_loss);
    a.row_stats = static_cast<const acc_t*>(b.row_stats);
    a.total_weight = static_cast<const acc_t*>(b.total_weight);
    a.grad_row_stride = p.grad_row_stride;
    a.none = p.reduction == Reduction::None;
    a.mean = p.reduction == Reduction::Mean;
    a.grad_one = static_cast<int*>(b.grad_one);
    a.parts = plan.row_split;
    a.chunk = plan.row_split > 1 ? plan.chunk : p.classes;
    if (plan.lanes > 0) {  // short rows (lanes.cuh)
      a.layout = layout_of<T>(plan, a.logits, a.grad, a.grad_row_stride);
      cuda::dispatch_bool(p.has_weight, [&](auto weighted) {
        ce_lanes_backward_kernel<T, decltype(weighted)::value>
            <<<lanes_grid(p.rows, plan.lanes), kLaneThreads, 0, stream>>>(a);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
      return;
    }
    dispatch_threads(plan.threads, [&](auto threads) {
      cuda::dispatch_bool(p.has_weight, [&](auto weighted) {
        ce_backward_kernel<T, decltype(threads)::value, decltype(weighted)::value>
            <<<cuda::grid_for_rows(p.rows * a.parts), decltype(threads)::value, 0, stream>>>(a);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  });
}

int* cuda_grad_one_flag() {
  // Pinned host memory mapped into every device (UVA: one address for both):
  // the kernels write it, the host reads it without synchronising. Null
  // (nothing is recorded, the fused forward stays on) while the stream is
  // being captured into a CUDA graph, and for good if the memory cannot be
  // had or its device address is not its host address.
  static std::atomic<int*> flag{nullptr};
  static std::atomic<bool> unavailable{false};
  static std::mutex mutex;
  if (int* f = flag.load()) return f;
  if (unavailable.load()) return nullptr;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(), &status) != cudaSuccess ||
      status != cudaStreamCaptureStatusNone) {
    (void)cudaGetLastError();
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (flag.load() == nullptr && !unavailable.load()) {
    void* p = nullptr;
    void* device = nullptr;
    if (cudaHostAlloc(&p, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
      (void)cudaGetLastError();
      unavailable.store(true);
      return nullptr;
    }
    if (cudaHostGetDevicePointer(&device, p, 0) != cudaSuccess || device != p) {
      (void)cudaGetLastError();
      (void)cudaFreeHost(p);
      unavailable.store(true);
      return nullptr;
    }
    *static_cast<volatile int*>(p) = 1;
    flag.store(static_cast<int*>(p));
  }
  return flag.load();
}

void cuda_grad_scale(c10::ScalarType dtype, int device, void* grad, int64_t n, const void* grad_loss,
                     c10::ScalarType loss_type) {
  if (n == 0) return;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kThreads = 256;
    // a grid-stride loop: 2048 blocks keep every SM of a current GPU busy
    const int64_t blocks = std::min<int64_t>((n / kPack<T> + kThreads - 1) / kThreads + 1, 2048);
    ce_grad_scale_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        static_cast<T*>(grad), n, grad_loss, loss_type, cuda_grad_one_flag());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace softmax_ext::ce
