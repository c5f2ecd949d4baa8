// The CPU kernels of the fused cross-entropy, compiled once per instruction
// set like the softmax kernels (cpu/isa.h): cpu_default.cpp, cpu_avx2.cpp and
// cpu_avx512.cpp each set CPU_CAPABILITY and include this once;
// cpu_dispatch.cpp picks the build at run time.
//
// at::parallel_for over rows, each row read with ATen Vectorized (16-bit
// logits widened to float in registers, never in memory). Forward: a max pass
// and an exp-sum pass over the row (the second from cache), writing the row's
// loss and statistics (max, log of the exp-sum). Backward: one pass writing softmax - smoothed one-hot,
// scaled; the true class is fixed up from f32 (f64) values after the vector
// loop, which also makes the in-place variant (grad over the logits) safe.
// The mean / sum is a sequential sum of the per-row losses: fixed order,
// bit-identical whatever the thread count.
#pragma once

#ifndef CPU_CAPABILITY
#error "include from a per-ISA TU (cpu_*.cpp) that defines CPU_CAPABILITY"
#endif

#include "cpu/numerics.h"
#include "cross_entropy/plan.h"

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <type_traits>

namespace softmax_ext::ce::CPU_CAPABILITY {
namespace {

// exp at torch's accuracy, inline for float lanes on x86 (cpu/numerics.h).
using ::softmax_ext::cpu::CPU_CAPABILITY::vexp;

// Elements of work per parallel_for chunk (ATen's GRAIN_SIZE), counting a
// row element as 8 (an exp is several operations).
constexpr int64_t kGrainSize = 32768;

template <typename T>
using acc_of = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Two acc vectors (kB elements) of T at p.
template <typename T>
struct VecIo {
  using acc_t = acc_of<T>;
  using V = at::vec::Vectorized<acc_t>;
  static constexpr int64_t kW = V::size();
  static constexpr int64_t kB = 2 * kW;
  static void load(const T* p, V& a, V& b) {
    if constexpr (std::is_same_v<T, acc_t>) {
      a = V::loadu(p);
      b = V::loadu(p + kW);
    } else {
      at::vec::load_to_float(p, a, b);
    }
  }
  static void store(T* p, const V& a, const V& b) {
    if constexpr (std::is_same_v<T, acc_t>) {
      a.store(p);
      b.store(p + kW);
    } else {
      at::vec::convert_from_float<T>(a, b).store(p);
    }
  }
};

template <typename I>
inline int64_t target_at(const void* target, int64_t r) {
  return static_cast<int64_t>(static_cast<const I*>(target)[r]);
}

inline int64_t read_target(const CeProblem& p, const void* target, int64_t r) {
  return p.target_dtype == c10::ScalarType::Int ? target_at<int32_t>(target, r) : target_at<int64_t>(target, r);
}

// The non-ignored targets' total weight, summed in row order.
template <typename acc_t>
acc_t total_weight(const CeProblem& p, const void* target, const acc_t* w) {
  acc_t total = 0;
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t t = read_target(p, target, r);
    // (an out-of-range target is reported by the row loop)
    if (t != p.ignore_index && t >= 0 && t < p.classes) total += w != nullptr ? w[t] : acc_t(1);
  }
  return total;
}

// Per-row statistics (plan.h): the max m, ls = log sum_c exp(x_c - m), and
// (for smoothing) wd = sum_c w_c (m - x_c), a sum of terms >= 0 (the
// smoothing loss is W ls + wd: no cancellation at a large m).
template <typename T>
void row_stats(const T* x, int64_t C, const acc_of<T>* w, bool smooth, acc_of<T>& m, acc_of<T>& ls,
               acc_of<T>& wd) {
  using acc_t = acc_of<T>;
  using Io = VecIo<T>;
  using V = typename Io::V;
  const int64_t vec_end = C - C % Io::kB;
  V vmax(-std::numeric_limits<acc_t>::infinity());
  acc_t max = -std::numeric_limits<acc_t>::infinity();
  bool nan = false;
  for (int64_t j = 0; j < vec_end; j += Io::kB) {
    V a, b;
    Io::load(x + j, a, b);
    vmax = at::vec::maximum(vmax, at::vec::maximum(a, b));  // propagates NaN
  }
  alignas(64) acc_t lanes[V::size()];
  vmax.store(lanes);
  for (int64_t e = 0; e < V::size(); ++e) {
    nan = nan || std::isnan(lanes[e]);
    max = std::max(max, lanes[e]);
  }
  for (int64_t j = vec_end; j < C; ++j) {
    const acc_t v = static_cast<acc_t>(x[j]);
    nan = nan || std::isnan(v);
    max = std::max(max, v);
  }
  if (nan) max = std::numeric_limits<acc_t>::quiet_NaN();
  // A row of -inf: x - max is NaN, hence a NaN loss, as in torch.
  const V vm(max);
  V vsum(0), vwd(0);
  for (int64_t j = 0; j < vec_end; j += Io::kB) {
    V a, b;
    Io::load(x + j, a, b);
    vsum = vsum + vexp(a - vm) + vexp(b - vm);
    if (smooth) {
      if (w != nullptr) {
        vwd = vwd + (vm - a) * V::loadu(w + j) + (vm - b) * V::loadu(w + j + Io::kW);
      } else {
        vwd = vwd + (vm - a) + (vm - b);
      }
    }
  }
  acc_t sum = at::vec::vec_reduce_all<acc_t>([](V& p, V& q) { return p + q; }, vsum);
  acc_t sd = smooth ? at::vec::vec_reduce_all<acc_t>([](V& p, V& q) { return p + q; }, vwd) : acc_t(0);
  for (int64_t j = vec_end; j < C; ++j) {
    const acc_t v = static_cast<acc_t>(x[j]);
    sum += std::exp(v - max);
    if (smooth) sd += w != nullptr ? w[j] * (max - v) : max - v;
  }
  m = max;
  ls = std::log(sum);
  wd = sd;
}

// One row of the gradient (plan.h): dx_c = a * p_c - c * w_c - [c == t] * onehot.
// dx may be x (in place): x[t] is read before the row is written.
// p_c = exp((x_c - m) - ls) from the row's statistics.
template <typename T>
void grad_row(const T* x, T* dx, int64_t C, int64_t t, const acc_of<T>* w, acc_of<T> a, acc_of<T> c,
              acc_of<T> onehot, acc_of<T> m, acc_of<T> ls) {
  using acc_t = acc_of<T>;
  using Io = VecIo<T>;
  using V = typename Io::V;
  const int64_t vec_end = C - C % Io::kB;
  const acc_t xt = static_cast<acc_t>(x[t]);  // read before an in-place write
  const V va(a), vc(c), vm(m), vl(ls);
  for (int64_t j = 0; j < vec_end; j += Io::kB) {
    V u, v;
    Io::load(x + j, u, v);
    u = va * vexp((u - vm) - vl);
    v = va * vexp((v - vm) - vl);
    if (w != nullptr) {
      u = u - vc * V::loadu(w + j);
      v = v - vc * V::loadu(w + j + Io::kW);
    } else {
      u = u - vc;
      v = v - vc;
    }
    Io::store(dx + j, u, v);
  }
  for (int64_t j = vec_end; j < C; ++j) {
    const acc_t v = static_cast<acc_t>(x[j]);
    dx[j] = static_cast<T>(a * std::exp((v - m) - ls) - c * (w != nullptr ? w[j] : acc_t(1)));
  }
  // The true class from acc values: p_t - 1 keeps its small magnitude.
  dx[t] = static_cast<T>(a * std::exp((xt - m) - ls) - c * (w != nullptr ? w[t] : acc_t(1)) - onehot);
}

// The row's gradient coefficients for scale s (grad_loss, over the total
// weight for mean) and then the row itself. Not inlined: the fused forward
// and the backward then run the same machine code (the compiler contracts
// multiply-adds per call site), so their gradients are the same bits.
template <typename T>
[[gnu::noinline]] void grad_row_scaled(const T* x, T* dx, int64_t C, int64_t t, const acc_of<T>* w, acc_of<T> W, acc_of<T> eps,
                     acc_of<T> eps_c, acc_of<T> s, acc_of<T> m, acc_of<T> ls) {
  using acc_t = acc_of<T>;
  const acc_t wt = w != nullptr ? w[t] : acc_t(1);
  grad_row(x, dx, C, t, w, s * ((1 - eps) * wt + eps_c * W), s * eps_c, s * (1 - eps) * wt, m, ls);
}

// W, the weights' sum (given in float64 with smoothing and a weight), or C.
template <typename acc_t>
acc_t weight_sum(const CeBuffers& b, int64_t classes) {
  return b.weight_sum != nullptr ? static_cast<acc_t>(*static_cast<const double*>(b.weight_sum)) : acc_t(classes);
}

template <typename T>
bool forward_impl(const CePlan& plan, const CeBuffers& b, void* workspace, int64_t& bad_target) {
  using acc_t = acc_of<T>;
  const CeProblem& p = plan.problem;
  const T* logits = static_cast<const T*>(b.logits);
  const acc_t* w = static_cast<const acc_t*>(b.weight);
  const acc_t W = weight_sum<acc_t>(b, p.classes);
  const bool smooth = p.smoothing > 0;
  const acc_t eps = static_cast<acc_t>(p.smoothing);
  const acc_t eps_c = eps / static_cast<acc_t>(p.classes);
  acc_t* stats_out = static_cast<acc_t*>(b.row_stats);
  // Per-row losses: the workspace for mean / sum; for "none" the output,
  // written as T or (acc_loss) as acc_t.
  const bool none = p.reduction == Reduction::None;
  acc_t* row_loss = none ? (p.acc_loss ? static_cast<acc_t*>(b.loss) : nullptr) : static_cast<acc_t*>(workspace);
  T* loss_none = none && !p.acc_loss ? static_cast<T*>(b.loss) : nullptr;
  // The total weight of the non-ignored targets first: the fused forward's
  // gradient rows (grad_loss = 1) of a mean are scaled by its inverse.
  const acc_t total = total_weight(p, b.target, w);
  T* grad = p.fused_grad ? static_cast<T*>(b.grad) : nullptr;
  const acc_t grad_scale = p.reduction == Reduction::Mean ? acc_t(1) / total : acc_t(1);
  std::atomic<bool> bad{false};
  std::atomic<int64_t> bad_value{0};
  const int64_t grain = std::max<int64_t>(1, kGrainSize / (8 * std::max<int64_t>(p.classes, 1)));
  at::parallel_for(0, p.rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t t = read_target(p, b.target, r);
      acc_t loss = 0, m = 0, ls = 0;
      T* dx = grad != nullptr ? grad + r * p.grad_row_stride : nullptr;
      if (t != p.ignore_index) {
        if (t < 0 || t >= p.classes) {
          if (!bad.exchange(true)) bad_value = t;
        } else {
          const T* x = logits + r * p.row_stride;
          acc_t wd = 0;
          row_stats(x, p.classes, w, smooth, m, ls, wd);
          const acc_t wt = w != nullptr ? w[t] : acc_t(1);
          loss = (1 - eps) * wt * ((m - static_cast<acc_t>(x[t])) + ls);
          if (smooth) loss += eps_c * (W * ls + wd);
          if (dx != nullptr) {
            grad_row_scaled(x, dx, p.classes, t, w, W, eps, eps_c, grad_scale, m, ls);
            dx = nullptr;
          }
        }
      }
      if (dx != nullptr) std::fill(dx, dx + p.classes, T(0));
      stats_out[2 * r] = m;
      stats_out[2 * r + 1] = ls;
      if (loss_none != nullptr) {
        loss_none[r] = static_cast<T>(loss);
      } else {
        row_loss[r] = loss;
      }
    }
  });
  if (bad) {
    bad_target = bad_value;
    return false;
  }
  // The fixed-order tail: the sum of the per-row losses.
  acc_t sum = 0;
  if (!none)
    for (int64_t r = 0; r < p.rows; ++r) sum += row_loss[r];  // ignored rows hold 0
  *static_cast<acc_t*>(b.total_weight) = total;
  if (!none) {
    const acc_t value = p.reduction == Reduction::Mean ? sum / total : sum;
    if (p.acc_loss) *static_cast<acc_t*>(b.loss) = value;
    else *static_cast<T*>(b.loss) = static_cast<T>(value);
  }
  return true;
}

template <typename T>
bool backward_impl(const CePlan& plan, const CeBuffers& b, int64_t& bad_target) {
  using acc_t = acc_of<T>;
  const CeProblem& p = plan.problem;
  const int64_t C = p.classes;
  const T* logits = static_cast<const T*>(b.logits);
  T* grad = static_cast<T*>(b.grad);
  const acc_t* w = static_cast<const acc_t*>(b.weight);
  const acc_t W = weight_sum<acc_t>(b, C);
  const acc_t eps = static_cast<acc_t>(p.smoothing);
  const acc_t eps_c = eps / static_cast<acc_t>(C);
  const acc_t* stats = static_cast<const acc_t*>(b.row_stats);
  const acc_t* g = static_cast<const acc_t*>(b.grad_loss);
  acc_t scalar_scale = p.reduction == Reduction::None ? acc_t(0) : g[0];
  if (p.reduction == Reduction::Mean) scalar_scale /= *static_cast<const acc_t*>(b.total_weight);
  if (p.reduction != Reduction::None && b.grad_one != nullptr) *static_cast<int*>(b.grad_one) = g[0] == acc_t(1);
  std::atomic<bool> bad{false};
  std::atomic<int64_t> bad_value{0};
  const int64_t grain = std::max<int64_t>(1, kGrainSize / (8 * std::max<int64_t>(C, 1)));
  at::parallel_for(0, p.rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* dx = grad + r * p.grad_row_stride;
      const int64_t t = read_target(p, b.target, r);
      if (t == p.ignore_index || t < 0 || t >= C) {
        if (t != p.ignore_index && !bad.exchange(true)) bad_value = t;
        std::fill(dx, dx + C, T(0));
        continue;
      }
      const acc_t s = p.reduction == Reduction::None ? g[r] : scalar_scale;
      grad_row_scaled(logits + r * p.row_stride, dx, C, t, w, W, eps, eps_c, s, stats[2 * r], stats[2 * r + 1]);
    }
  });
  if (bad) {
    bad_target = bad_value;
    return false;
  }
  return true;
}

template <typename F>
void dispatch(c10::ScalarType t, F&& f) {
  switch (t) {
    case c10::ScalarType::Float: return f(float{});
    case c10::ScalarType::Double: return f(double{});
    case c10::ScalarType::Half: return f(c10::Half{});
    case c10::ScalarType::BFloat16: return f(c10::BFloat16{});
    default: TORCH_CHECK_NOT_IMPLEMENTED(false, "softmax_ext.cross_entropy: dtype ", t, " is not supported");
  }
}

}  // namespace

bool forward(const CePlan& plan, const CeBuffers& buffers, void* workspace, int64_t& bad_target) {
  bool ok = true;
  dispatch(plan.problem.dtype, [&](auto tag) {
    ok = forward_impl<decltype(tag)>(plan, buffers, workspace, bad_target);
  });
  return ok;
}

bool backward(const CePlan& plan, const CeBuffers& buffers, int64_t& bad_target) {
  bool ok = true;
  dispatch(plan.problem.dtype, [&](auto tag) { ok = backward_impl<decltype(tag)>(plan, buffers, bad_target); });
  return ok;
}

}  // namespace softmax_ext::ce::CPU_CAPABILITY
