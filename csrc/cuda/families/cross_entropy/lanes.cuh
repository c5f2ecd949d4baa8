// The cross-entropy's kernels for short rows (CePlan::lanes > 0): a few
// lanes of a warp take a row, so a warp holds 32 / lanes rows, where a block
// a row (kernels.cu) would leave most of its threads idle and end every row
// with a block barrier. Plain rows are folded in groups of one 16-byte
// pack's classes: lane l takes the groups l, l + lanes, ..., a group a step
// of its online (max, sum), then the classes after the last whole group,
// lanes apart; where every row starts on a 16-byte boundary
// (RowLayout::packed) a group is one 16-byte load (kLanePacks in flight),
// element loads otherwise: the same sums in the same order either way. The
// row's lanes then combine theirs by a butterfly (fixed order, every lane
// gets the result).
// lanes = 1 on the (N, C, d...) layout (RowLayout): a thread a position,
// neighbouring threads on neighbouring positions of each class, its classes
// kLaneUnroll loads at a time. The gradient: lane l writes the classes l,
// l + lanes, ... (kLaneUnroll loads in flight), or 16-byte packs where the
// logits' and the gradient's rows are aligned.
//
// The forward (plain or fused) and the backward use one layout and one
// order, so the fused forward's gradient and the backward op's are the same
// bits (the per-element formula of common.cuh).
#pragma once

#include "cuda/core/launch.cuh"
#include "cuda/core/reduce.cuh"
#include "cuda/families/cross_entropy/common.cuh"

namespace softmax_ext::ce::dev {

constexpr int kLaneThreads = 256;
// Loads in flight per lane: a lane of a short row reads its (about eight)
// classes at once; a thread of the (N, C, d...) layout keeps enough bytes
// in flight with all threads of an SM resident.
constexpr int kLaneUnroll = 8;
// 16-byte packs (or groups of as many classes) in flight per lane of a
// plain row: kLanePacks in the plain forward's read, kLaneGradPacks in the
// gradient's write; the fused forward reads one group at a time (64
// registers a thread).
template <typename T>
constexpr int kLanePacks = sizeof(T) == 8 ? 2 : 4;
constexpr int kLaneGradPacks = 2;

// Lane `lane`'s groups q = lane, lane + lanes, ... of a row's `packs`
// groups of one 16-byte pack's classes, U in flight: load(q, pack) for U
// groups, then use(q, pack) for each.
template <typename T, int U, typename Load, typename Use>
__device__ __forceinline__ void for_lane_groups(int lane, int lanes, int64_t packs, const Load& load,
                                                const Use& use) {
  for (int64_t q0 = lane; q0 < packs; q0 += int64_t{lanes} * U) {
    cuda::Pack<T, cuda::kPack<T>> pk[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t q = q0 + int64_t{u} * lanes;
      if (q < packs) load(q, pk[u]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t q = q0 + int64_t{u} * lanes;
      if (q < packs) use(q, pk[u]);
    }
  }
}

// A lane's classes of one row's gradient (the fused forward's and the
// backward's: one formula, the same bits), kLaneUnroll loads in flight, or
// kLaneGradPacks 16-byte packs where the logits' and the gradient's rows
// are packed (RowLayout::grad_packed).
template <typename T>
__device__ __forceinline__ void write_lanes_grad(const acc_type<T>* weight, const GradCoefficients<acc_type<T>>& k,
                                                 const T* x, T* g, int64_t classes, int64_t t, acc_type<T> m,
                                                 acc_type<T> ls, int lane, int lanes, int64_t cs, int64_t gs,
                                                 bool packed) {
  using acc_t = acc_type<T>;
  const auto grad_of = [&](acc_t v, int64_t c) {
    const acc_t d = grad_other<T>(k, v, m, ls, weight != nullptr ? weight[c] : acc_t(1));
    return cuda::convert<T>(c == t ? d - k.cb : d);
  };
  if (packed) {  // 16-byte packs, then the classes after the last one, lanes apart
    constexpr int P = cuda::kPack<T>;
    const int64_t packs = classes / P;
    for_lane_groups<T, kLaneGradPacks>(
        lane, lanes, packs, [&](int64_t q, auto& pk) { pk.load(x + q * P); },
        [&](int64_t q, auto& pk) {
#pragma unroll
          for (int e = 0; e < P; ++e) pk.v[e] = grad_of(cuda::convert<acc_t>(pk.v[e]), q * P + e);
          pk.store(g + q * P);
        });
    for (int64_t c = packs * P + lane; c < classes; c += lanes) g[c] = grad_of(cuda::convert<acc_t>(x[c]), c);
    return;
  }
  for (int64_t c0 = lane; c0 < classes; c0 += int64_t{lanes} * kLaneUnroll) {
    acc_t v[kLaneUnroll];
#pragma unroll
    for (int u = 0; u < kLaneUnroll; ++u) {
      const int64_t c = c0 + int64_t{u} * lanes;
      v[u] = c < classes ? cuda::convert<acc_t>(x[c * cs]) : acc_t(0);
    }
#pragma unroll
    for (int u = 0; u < kLaneUnroll; ++u) {
      const int64_t c = c0 + int64_t{u} * lanes;
      if (c < classes) g[c * gs] = grad_of(v[u], c);
    }
  }
}

// Four blocks an SM (64 registers a thread; float64: two).
template <typename T>
constexpr int kLaneBlocksPerSm = sizeof(T) == 8 ? 2 : 4;

template <typename T, bool kSmooth, bool kGrad>
__global__ void __launch_bounds__(kLaneThreads, kLaneBlocksPerSm<T>) ce_lanes_forward_kernel(ForwardArgs<T> a) {
  using acc_t = acc_type<T>;
  using sx_t = smooth_sum_t<T>;
  using Exp = ce_exp_t<T>;
  const acc_t kNegInf = cuda::neg_infinity<acc_t>();
  cuda::allow_dependents();
  const RowLayout& L = a.layout;
  const int lanes = L.lanes;
  const int lane = static_cast<int>(threadIdx.x) & (lanes - 1);
  const int64_t thread = int64_t{blockIdx.x} * kLaneThreads + threadIdx.x;
  const int64_t step = int64_t{gridDim.x} * (kLaneThreads / lanes);
  const int64_t cs = L.class_stride;
  acc_t grad_scale = 1;
  bool scale_pending = kGrad && a.total_weight != nullptr;
  // Every lane of a warp runs the warp's iterations (the butterflies need
  // them all): `first` is the warp's first row of an iteration.
  for (int64_t first = (thread & ~int64_t{31}) / lanes, row = thread / lanes; first < a.rows;
       first += step, row += step) {
    const bool live = row < a.rows;
    const int64_t t = live ? load_target(a.target64, a.target32, row) : a.ignore_index;
    const bool active = live && t != a.ignore_index;
    const T* x = a.logits + (live ? row_offset(row, a.row_stride, L.inner) : 0);
    acc_t m = kNegInf, s = 0, xt = 0;
    sx_t sx = 0;
    if (active) {
      CUDA_KERNEL_ASSERT(t >= 0 && t < a.classes);
      if (lane == 0) xt = cuda::convert<acc_t>(x[t * cs]);
      // One step of the lane's online (max, sum): n values, value(i) (-inf
      // past the row) of class class_of(i).
      const auto fold = [&](auto n_tag, const auto& value, const auto& class_of) {
        constexpr int n = decltype(n_tag)::value;
        acc_t cm = m;
#pragma unroll
        for (int i = 0; i < n; ++i) cm = cuda::NanMax{}(cm, value(i));
        if (cm != m) {  // a larger max (or NaN): rescale what is summed so far
          s = s * Exp::exp(m - cm);
          m = cm;
        }
        if (m != kNegInf) {
#pragma unroll
          for (int i = 0; i < n; ++i) s += Exp::exp(value(i) - m);
        }
        if constexpr (kSmooth) {
#pragma unroll
          for (int i = 0; i < n; ++i) {
            const int64_t c = class_of(i);
            if (c < a.classes) sx += a.weight != nullptr ? sx_t(a.weight[c]) * sx_t(value(i)) : sx_t(value(i));
          }
        }
      };
      if (L.inner == 1) {
        // Plain rows: groups of P classes from the row's first (16-byte
        // packs where the row is aligned, read as such; element loads
        // otherwise), group q on lane q % lanes, folded a group a step in
        // the order of q, then the classes after the last whole group,
        // lanes apart: the same sums, in the same order, for any alignment
        // and any number U of groups in flight.
        constexpr int P = cuda::kPack<T>, U = kGrad ? 1 : kLanePacks<T>;
        const int64_t packs = a.classes / P;
        for_lane_groups<T, U>(
            lane, lanes, packs,
            [&](int64_t q, auto& pk) {
              if (L.packed) {
                pk.load(x + q * P);
              } else {
#pragma unroll
                for (int e = 0; e < P; ++e) pk.v[e] = x[(q * P + e) * cs];
              }
            },
            [&](int64_t q, const auto& pk) {
              fold(
                  std::integral_constant<int, P>{}, [&](int e) { return cuda::convert<acc_t>(pk.v[e]); },
                  [&](int e) { return q * P + e; });
            });
        for (int64_t c = packs * P + lane; c < a.classes; c += lanes) {
          const acc_t v = cuda::convert<acc_t>(x[c * cs]);
          fold(std::integral_constant<int, 1>{}, [&](int) { return v; }, [&](int) { return c; });
        }
      } else {
        for (int64_t c0 = lane; c0 < a.classes; c0 += int64_t{lanes} * kLaneUnroll) {
          acc_t v[kLaneUnroll];
#pragma unroll
          for (int u = 0; u < kLaneUnroll; ++u) {
            const int64_t c = c0 + int64_t{u} * lanes;
            v[u] = c < a.classes ? cuda::convert<acc_t>(x[c * cs]) : kNegInf;
          }
          fold(
              std::integral_constant<int, kLaneUnroll>{}, [&](int i) { return v[i]; },
              [&](int i) { return c0 + int64_t{i} * lanes; });
        }
      }
    }
    const cuda::MaxSum<acc_t> stats = cuda::warp_all_reduce(cuda::MaxSum<acc_t>{m, s}, cuda::CombineMaxSum{}, lanes);
    if constexpr (kSmooth) sx = cuda::warp_all_reduce(sx, cuda::Sum{}, lanes);
    if (!live) continue;
    T* g = kGrad ? a.grad + row_offset(row, a.grad_row_stride, L.inner) : nullptr;
    if (!active) {
      if (lane == 0) store_row(a, row, acc_t(0), acc_t(0), acc_t(0));
      if constexpr (kGrad) {
        for (int64_t c = lane; c < a.classes; c += lanes) g[c * L.grad_class_stride] = T(0.0f);
      }
      continue;
    }
    m = stats.max;
    const acc_t ls = cuda::acc_log(stats.sum);
    if (lane == 0) store_row(a, row, m, ls, row_loss_of<kSmooth>(a, t, m, ls, xt, sx));
    if constexpr (kGrad) {
      if (scale_pending) {
        cuda::wait_for_prior();
        grad_scale = acc_t(1) / *a.total_weight;
        scale_pending = false;
      }
      const acc_t W = grad_weight_sum<acc_t>(a.weight != nullptr, a.weight_sum, a.classes);
      const GradCoefficients<acc_t> k =
          grad_coefficients(grad_scale, a.weight != nullptr ? a.weight[t] : acc_t(1), W, a.eps, a.eps_c);
      write_lanes_grad(a.weight, k, x, g, a.classes, t, m, ls, lane, lanes, cs, L.grad_class_stride,
                       L.grad_packed);
    }
  }
  // A thread whose rows were all ignored still ends after the divisor's
  // kernel: this kernel's end then orders that one's too.
  if (scale_pending) cuda::wait_for_prior();
}

template <typename T, bool kWeighted>
__global__ void __launch_bounds__(kLaneThreads, kLaneBlocksPerSm<T>) ce_lanes_backward_kernel(BackwardArgs<T> a) {
  using acc_t = acc_type<T>;
  const RowLayout& L = a.layout;
  const int lanes = L.lanes;
  const int lane = static_cast<int>(threadIdx.x) & (lanes - 1);
  const int64_t step = int64_t{gridDim.x} * (kLaneThreads / lanes);
  acc_t scale = 0;
  if (!a.none) scale = a.mean ? a.grad_loss[0] / *a.total_weight : a.grad_loss[0];
  if (!a.none && a.grad_one != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *a.grad_one = a.grad_loss[0] == acc_t(1);
  const acc_t W = grad_weight_sum<acc_t>(kWeighted, a.weight_sum, a.classes);
  const int64_t cs = L.class_stride, gs = L.grad_class_stride;
  for (int64_t row = (int64_t{blockIdx.x} * kLaneThreads + threadIdx.x) / lanes; row < a.rows; row += step) {
    const int64_t t = load_target(a.target64, a.target32, row);
    T* g = a.grad + row_offset(row, a.grad_row_stride, L.inner);
    if (t == a.ignore_index) {
      for (int64_t c = lane; c < a.classes; c += lanes) g[c * gs] = T(0.0f);
      continue;
    }
    CUDA_KERNEL_ASSERT(t >= 0 && t < a.classes);
    const T* x = a.logits + row_offset(row, a.row_stride, L.inner);
    const GradCoefficients<acc_t> k =
        grad_coefficients(a.none ? a.grad_loss[row] : scale, kWeighted ? a.weight[t] : acc_t(1), W, a.eps, a.eps_c);
    write_lanes_grad(kWeighted ? a.weight : nullptr, k, x, g, a.classes, t, a.row_stats[2 * row],
                     a.row_stats[2 * row + 1], lane, lanes, cs, gs, L.grad_packed);
  }
}

// Blocks of kLaneThreads threads for `rows` rows of `lanes` lanes (a
// grid-stride loop beyond kMaxGridBlocks blocks).
inline unsigned int lanes_grid(int64_t rows, int lanes) {
  return cuda::grid_for_rows((rows * lanes + kLaneThreads - 1) / kLaneThreads);
}

}  // namespace softmax_ext::ce::dev
