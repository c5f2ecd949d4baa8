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
// The mean / sum adds the per-row losses in a fixed order (fixed_order_sum):
// bit-identical whatever the thread count. (N, C, d...) logits (inner > 1)
// and rows of fewer than kShortRowClasses classes go a vector lane a
// position / row instead (Positions, walk_positions, walk_short_rows).
#pragma once

#ifndef CPU_CAPABILITY
#error "include from a per-ISA TU (cpu_*.cpp) that defines CPU_CAPABILITY"
#endif

#include "cpu/dtype_dispatch.h"
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
#include <vector>

namespace softmax_ext::ce::CPU_CAPABILITY {
namespace {

// exp at torch's accuracy, inline for float lanes on x86 (cpu/numerics.h).
using ::softmax_ext::cpu::CPU_CAPABILITY::vexp;
using ::softmax_ext::cpu::CPU_CAPABILITY::visit_dtype;
using ::softmax_ext::cpu::CPU_CAPABILITY::vlog;

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
  // kB accumulator values (one per lane of the pair)
  static void load_acc(const acc_t* p, V& a, V& b) {
    a = V::loadu(p);
    b = V::loadu(p + kW);
  }
  static void store_acc(acc_t* p, const V& a, const V& b) {
    a.store(p);
    b.store(p + kW);
  }
};

template <typename I>
inline int64_t target_at(const void* target, int64_t r) {
  return static_cast<int64_t>(static_cast<const I*>(target)[r]);
}

inline int64_t read_target(const CeProblem& p, const void* target, int64_t r) {
  return p.target_dtype == c10::ScalarType::Int ? target_at<int32_t>(target, r) : target_at<int64_t>(target, r);
}

// A sum of value(r) over r < n in a fixed order: eight interleaved partial
// sums (r % 8), added pairwise at the end; the same bits whatever the
// thread count, without one long chain of dependent adds.
template <typename acc_t, typename Value>
acc_t fixed_order_sum(int64_t n, const Value& value) {
  constexpr int64_t kParts = 8;
  acc_t part[kParts] = {};
  int64_t r = 0;
  for (; r + kParts <= n; r += kParts)
    for (int64_t j = 0; j < kParts; ++j) part[j] += value(r + j);
  for (int64_t j = 0; r + j < n; ++j) part[j] += value(r + j);
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

// The non-ignored targets' total weight (a count without weights).
template <typename acc_t>
acc_t total_weight(const CeProblem& p, const void* target, const acc_t* w) {
  // row r's target, or -1 where it counts for nothing (an out-of-range
  // target is reported by the row loop)
  auto counted = [&p, target](int64_t r) {
    const int64_t t = read_target(p, target, r);
    return t != p.ignore_index && t >= 0 && t < p.classes ? t : int64_t{-1};
  };
  if (w == nullptr) {
    int64_t count = 0;
    for (int64_t r = 0; r < p.rows; ++r) count += counted(r) >= 0;
    return static_cast<acc_t>(count);
  }
  return fixed_order_sum<acc_t>(p.rows, [&](int64_t r) {
    const int64_t t = counted(r);
    return t >= 0 ? w[t] : acc_t(0);
  });
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

// The true class's gradient from acc values (grad_row's fix-up): p_t - 1
// keeps its small magnitude.
template <typename acc_t>
inline acc_t true_class_grad(acc_t a, acc_t c, acc_t onehot, acc_t xt, acc_t m, acc_t ls, acc_t wt) {
  return a * std::exp((xt - m) - ls) - c * wt - onehot;
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
  dx[t] = static_cast<T>(true_class_grad(a, c, onehot, xt, m, ls, w != nullptr ? w[t] : acc_t(1)));
}

// A row's gradient coefficients (a, c, onehot of grad_row) for scale s
// (grad_loss, over the total weight for mean), wt = w_t. Not inlined: one
// rounding for the fused forward and the backward, rows and positions alike.
template <typename acc_t>
[[gnu::noinline]] void grad_coefficients(acc_t s, acc_t wt, acc_t W, acc_t eps, acc_t eps_c, acc_t& a, acc_t& c,
                                         acc_t& onehot) {
  a = s * ((1 - eps) * wt + eps_c * W);
  c = s * eps_c;
  onehot = s * (1 - eps) * wt;
}

// The row's gradient coefficients for scale s and then the row itself. Not
// inlined: the fused forward and the backward then run the same machine
// code (the compiler contracts multiply-adds per call site), so their
// gradients are the same bits.
template <typename T>
[[gnu::noinline]] void grad_row_scaled(const T* x, T* dx, int64_t C, int64_t t, const acc_of<T>* w, acc_of<T> W,
                                       acc_of<T> eps, acc_of<T> eps_c, acc_of<T> s, acc_of<T> m, acc_of<T> ls) {
  using acc_t = acc_of<T>;
  acc_t a, c, onehot;
  grad_coefficients(s, w != nullptr ? w[t] : acc_t(1), W, eps, eps_c, a, c, onehot);
  grad_row(x, dx, C, t, w, a, c, onehot, m, ls);
}

// W, the weights' sum (given in float64 with smoothing and a weight), or C.
template <typename acc_t>
acc_t weight_sum(const CeBuffers& b, int64_t classes) {
  return b.weight_sum != nullptr ? static_cast<acc_t>(*static_cast<const double*>(b.weight_sum)) : acc_t(classes);
}

// The (N, C, D) layout read as it is (CeProblem::inner = D > 1): kB
// neighbouring positions of one sample at a time, a vector lane each, the
// classes walked at their stride (a max pass and an exp-sum pass, the
// second from cache). A sample's positions fall into fixed blocks of kB;
// the last, partial one goes position by position through the row kernels
// above (each position's classes copied to a row): the same bits whatever
// the thread count. Position p of sample n is row n * D + p.
template <typename T>
struct Positions {
  using acc_t = acc_of<T>;
  using Io = VecIo<T>;
  using V = typename Io::V;
  static constexpr int64_t kB = Io::kB;
  using Lanes = acc_t[kB];

  // Per lane: m, ls and the smoothing's wd (row_stats' definitions) of the
  // positions at x (class c at x + c * cs).
  static void stats(const T* x, int64_t C, int64_t cs, const acc_t* w, bool smooth, Lanes& m, Lanes& ls, Lanes& wd) {
    V ma(-std::numeric_limits<acc_t>::infinity()), mb = ma;
    for (int64_t c = 0; c < C; ++c) {
      V a, b;
      Io::load(x + c * cs, a, b);
      ma = at::vec::maximum(ma, a);  // propagates NaN
      mb = at::vec::maximum(mb, b);
    }
    V sa(0), sb(0), da(0), db(0);
    for (int64_t c = 0; c < C; ++c) {
      V a, b;
      Io::load(x + c * cs, a, b);
      sa = sa + vexp(a - ma);
      sb = sb + vexp(b - mb);
      if (smooth) {
        const V wc(w != nullptr ? w[c] : acc_t(1));
        da = da + (ma - a) * wc;
        db = db + (mb - b) * wc;
      }
    }
    Io::store_acc(m, ma, mb);
    Io::store_acc(ls, vlog(sa), vlog(sb));
    if (smooth) Io::store_acc(wd, da, db);
  }

  // The positions' gradient (grad_row's formula) with per-lane coefficients
  // a, c, onehot; t[e] < 0: an ignored lane, written as zeros; xt: the true
  // classes' logits, read before (dx may be x). Not inlined, as
  // grad_row_scaled: the fused forward and the backward run the same code.
  [[gnu::noinline]] static void grad(const T* x, T* dx, int64_t C, int64_t cs, int64_t gs, const acc_t* w,
                                     const Lanes& a, const Lanes& c, const Lanes& onehot, const Lanes& m,
                                     const Lanes& ls, const int64_t (&t)[kB], const Lanes& xt) {
    V aa, ab, ca, cb, ma, mb, la, lb;
    Io::load_acc(a, aa, ab);
    Io::load_acc(c, ca, cb);
    Io::load_acc(m, ma, mb);
    Io::load_acc(ls, la, lb);
    for (int64_t j = 0; j < C; ++j) {
      V u, v;
      Io::load(x + j * cs, u, v);
      const V wj(w != nullptr ? w[j] : acc_t(1));
      Io::store(dx + j * gs, aa * vexp((u - ma) - la) - ca * wj, ab * vexp((v - mb) - lb) - cb * wj);
    }
    for (int64_t e = 0; e < kB; ++e) {
      if (t[e] < 0) {
        for (int64_t j = 0; j < C; ++j) dx[j * gs + e] = T(0);
      } else {
        dx[t[e] * gs + e] = static_cast<T>(
            true_class_grad(a[e], c[e], onehot[e], xt[e], m[e], ls[e], w != nullptr ? w[t[e]] : acc_t(1)));
      }
    }
  }
};

// A block of the (N, C, D) layout: unit u is sample u / blocks, positions
// [p0, p0 + count) from (u % blocks) * kB.
struct PositionBlock {
  int64_t n, p0, count;
  PositionBlock(int64_t u, int64_t D, int64_t B) {
    const int64_t blocks = (D + B - 1) / B;
    n = u / blocks;
    p0 = (u % blocks) * B;
    count = std::min(B, D - p0);
  }
};

// What the calls of both directions share: the problem and its buffers,
// the weights and smoothing constants, and the first bad target.
template <typename T>
struct CallBase {
  using acc_t = acc_of<T>;
  const CeProblem& p;
  const CeBuffers& b;
  const T* logits;
  const acc_t* w;
  acc_t W, eps, eps_c;
  std::atomic<bool> bad{false};
  std::atomic<int64_t> bad_value{0};

  CallBase(const CePlan& plan, const CeBuffers& buffers)
      : p(plan.problem), b(buffers), logits(static_cast<const T*>(b.logits)), w(static_cast<const acc_t*>(b.weight)),
        W(weight_sum<acc_t>(b, p.classes)), eps(static_cast<acc_t>(p.smoothing)),
        eps_c(eps / static_cast<acc_t>(p.classes)) {}
  // Row r's target, or -1 where it is ignored or out of range (reported once).
  int64_t target(int64_t r) {
    const int64_t t = read_target(p, b.target, r);
    if (t == p.ignore_index) return -1;
    if (t < 0 || t >= p.classes) {
      if (!bad.exchange(true)) bad_value = t;
      return -1;
    }
    return t;
  }
  // grad_coefficients of a row of target t for scale s
  void coefficients(acc_t s, int64_t t, acc_t& a, acc_t& c, acc_t& onehot) const {
    grad_coefficients(s, w != nullptr ? w[t] : acc_t(1), W, eps, eps_c, a, c, onehot);
  }
  bool ok(int64_t& bad_target) const {
    if (!bad) return true;
    bad_target = bad_value;
    return false;
  }
};

// A forward call's outputs, and the total weight of the non-ignored
// targets (first: the fused forward's gradient rows of a mean are scaled by
// its inverse).
template <typename T>
struct ForwardCall : CallBase<T> {
  using acc_t = acc_of<T>;
  bool smooth, none;
  acc_t* stats_out;
  acc_t* row_loss;  // mean / sum: the workspace; none: the output as acc_t (acc_loss)
  T* loss_none;     // none: the output as T
  acc_t total;
  T* grad;          // the fused forward's gradient (grad_loss = 1)
  acc_t grad_scale;

  ForwardCall(const CePlan& plan, const CeBuffers& buffers, void* workspace)
      : CallBase<T>(plan, buffers), smooth(this->p.smoothing > 0), none(this->p.reduction == Reduction::None),
        stats_out(static_cast<acc_t*>(this->b.row_stats)),
        row_loss(none ? (this->p.acc_loss ? static_cast<acc_t*>(this->b.loss) : nullptr)
                      : static_cast<acc_t*>(workspace)),
        loss_none(none && !this->p.acc_loss ? static_cast<T*>(this->b.loss) : nullptr),
        total(total_weight(this->p, this->b.target, this->w)),
        grad(this->p.fused_grad ? static_cast<T*>(this->b.grad) : nullptr),
        grad_scale(this->p.reduction == Reduction::Mean ? acc_t(1) / total : acc_t(1)) {}

  acc_t loss_of(int64_t t, acc_t xt, acc_t m, acc_t ls, acc_t wd) const {
    const acc_t wt = this->w != nullptr ? this->w[t] : acc_t(1);
    acc_t loss = (1 - this->eps) * wt * ((m - xt) + ls);
    if (smooth) loss += this->eps_c * (this->W * ls + wd);
    return loss;
  }
  void store(int64_t r, acc_t m, acc_t ls, acc_t loss) {
    stats_out[2 * r] = m;
    stats_out[2 * r + 1] = ls;
    if (loss_none != nullptr) loss_none[r] = static_cast<T>(loss);
    else row_loss[r] = loss;
  }
  // The fixed-order tail: the sum of the per-row losses, the outputs.
  bool finish(int64_t& bad_target) {
    if (!this->ok(bad_target)) return false;
    // (ignored rows hold 0)
    const acc_t sum = none ? acc_t(0) : fixed_order_sum<acc_t>(this->p.rows, [this](int64_t r) { return row_loss[r]; });
    *static_cast<acc_t*>(this->b.total_weight) = total;
    if (!none) {
      const acc_t value = this->p.reduction == Reduction::Mean ? sum / total : sum;
      if (this->p.acc_loss) *static_cast<acc_t*>(this->b.loss) = value;
      else *static_cast<T*>(this->b.loss) = static_cast<T>(value);
    }
    return true;
  }
};

// One row of C classes (unit class stride) of a forward call: its
// statistics, loss and, for the fused forward, its gradient into dx.
template <typename T>
void forward_row(ForwardCall<T>& f, int64_t r, const T* x, T* dx) {
  using acc_t = acc_of<T>;
  const int64_t t = f.target(r);
  acc_t loss = 0, m = 0, ls = 0;
  if (t >= 0) {
    acc_t wd = 0;
    row_stats(x, f.p.classes, f.w, f.smooth, m, ls, wd);
    loss = f.loss_of(t, static_cast<acc_t>(x[t]), m, ls, wd);
    if (dx != nullptr) {
      grad_row_scaled(x, dx, f.p.classes, t, f.w, f.W, f.eps, f.eps_c, f.grad_scale, m, ls);
      dx = nullptr;
    }
  }
  if (dx != nullptr) std::fill(dx, dx + f.p.classes, T(0));
  f.store(r, m, ls, loss);
}

// A position's classes (stride cs) to a row and back (stride gs).
template <typename T>
void gather_classes(const T* x, int64_t C, int64_t cs, T* row) {
  for (int64_t c = 0; c < C; ++c) row[c] = x[c * cs];
}
template <typename T>
void scatter_classes(const T* row, int64_t C, int64_t gs, T* dx) {
  for (int64_t c = 0; c < C; ++c) dx[c * gs] = row[c];
}

// kB rows r0.. of a forward call as positions: class c of lane e at
// x[c * cs + e], its gradient (the fused forward) at dx[c * gs + e].
template <typename T>
void forward_block(ForwardCall<T>& f, int64_t r0, const T* x, int64_t cs, T* dx, int64_t gs) {
  using acc_t = acc_of<T>;
  using Pos = Positions<T>;
  constexpr int64_t kB = Pos::kB;
  typename Pos::Lanes m, ls, wd, a, c, onehot, xt;
  int64_t t[kB];
  Pos::stats(x, f.p.classes, cs, f.w, f.smooth, m, ls, wd);
  for (int64_t e = 0; e < kB; ++e) {
    t[e] = f.target(r0 + e);
    if (t[e] < 0) {
      a[e] = c[e] = onehot[e] = xt[e] = 0;
      f.store(r0 + e, 0, 0, 0);
      continue;
    }
    xt[e] = static_cast<acc_t>(x[t[e] * cs + e]);
    if (dx != nullptr) f.coefficients(f.grad_scale, t[e], a[e], c[e], onehot[e]);
    f.store(r0 + e, m[e], ls[e], f.loss_of(t[e], xt[e], m[e], ls[e], wd[e]));
  }
  if (dx != nullptr) Pos::grad(x, dx, f.p.classes, cs, gs, f.w, a, c, onehot, m, ls, t, xt);
}

// The (N, C, D) loop of both directions: fixed blocks of kB positions
// (block(r0, x, cs, dx, gs)), the last partial block of a sample position by
// position, its classes gathered to a row (row(r, x_row, dx_row); dx_row
// null where grad is).
template <typename T, typename Block, typename Row>
void walk_positions(const CeProblem& p, const T* logits, T* grad, const Block& block, const Row& row_fn) {
  constexpr int64_t kB = Positions<T>::kB;
  const int64_t C = p.classes, D = p.inner, cs = p.class_stride, gs = p.grad_class_stride;
  const int64_t units = (p.rows / D) * ((D + kB - 1) / kB);
  const int64_t grain = std::max<int64_t>(1, kGrainSize / (8 * kB * std::max<int64_t>(C, 1)));
  at::parallel_for(0, units, grain, [&](int64_t begin, int64_t end) {
    std::vector<T> row(2 * C);  // a tail position's classes and gradient
    for (int64_t u = begin; u < end; ++u) {
      const PositionBlock blk(u, D, kB);
      const T* x = logits + blk.n * p.row_stride + blk.p0;
      T* dx = grad != nullptr ? grad + blk.n * p.grad_row_stride + blk.p0 : nullptr;
      const int64_t r0 = blk.n * D + blk.p0;
      if (blk.count == kB) {
        block(r0, x, cs, dx, gs);
        continue;
      }
      for (int64_t e = 0; e < blk.count; ++e) {
        gather_classes(x + e, C, cs, row.data());
        row_fn(r0 + e, row.data(), dx != nullptr ? row.data() + C : nullptr);
        if (dx != nullptr) scatter_classes(row.data() + C, C, gs, dx + e);
      }
    }
  });
}

// A backward call's gradient, statistics and incoming gradient.
template <typename T>
struct BackwardCall : CallBase<T> {
  using acc_t = acc_of<T>;
  T* grad;
  const acc_t* stats;
  const acc_t* g;  // grad_loss
  acc_t scalar_scale;

  BackwardCall(const CePlan& plan, const CeBuffers& buffers)
      : CallBase<T>(plan, buffers), grad(static_cast<T*>(this->b.grad)),
        stats(static_cast<const acc_t*>(this->b.row_stats)), g(static_cast<const acc_t*>(this->b.grad_loss)) {
    const Reduction reduction = this->p.reduction;
    scalar_scale = reduction == Reduction::None ? acc_t(0) : g[0];
    if (reduction == Reduction::Mean) scalar_scale /= *static_cast<const acc_t*>(this->b.total_weight);
    if (reduction != Reduction::None && this->b.grad_one != nullptr)
      *static_cast<int*>(this->b.grad_one) = g[0] == acc_t(1);
  }
  acc_t scale(int64_t r) const { return this->p.reduction == Reduction::None ? g[r] : scalar_scale; }
  void row(int64_t r, const T* x, T* dx) {
    const int64_t t = this->target(r);
    if (t < 0) {
      std::fill(dx, dx + this->p.classes, T(0));
      return;
    }
    grad_row_scaled(x, dx, this->p.classes, t, this->w, this->W, this->eps, this->eps_c, scale(r), stats[2 * r],
                    stats[2 * r + 1]);
  }
  bool finish(int64_t& bad_target) const { return this->ok(bad_target); }
};

// kB rows r0.. of a backward call as positions (forward_block's layout).
template <typename T>
void backward_block(BackwardCall<T>& k, int64_t r0, const T* x, int64_t cs, T* dx, int64_t gs) {
  using acc_t = acc_of<T>;
  using Pos = Positions<T>;
  constexpr int64_t kB = Pos::kB;
  typename Pos::Lanes m, ls, a, c, onehot, xt;
  int64_t t[kB];
  for (int64_t e = 0; e < kB; ++e) {
    t[e] = k.target(r0 + e);
    m[e] = k.stats[2 * (r0 + e)];
    ls[e] = k.stats[2 * (r0 + e) + 1];
    if (t[e] < 0) {
      a[e] = c[e] = onehot[e] = xt[e] = 0;
      continue;
    }
    xt[e] = static_cast<acc_t>(x[t[e] * cs + e]);
    k.coefficients(k.scale(r0 + e), t[e], a[e], c[e], onehot[e]);
  }
  Pos::grad(x, dx, k.p.classes, cs, gs, k.w, a, c, onehot, m, ls, t, xt);
}

// Short rows (fewer than kShortRowClasses classes: the row kernels' vector
// loops would not run): kB rows at a time, their classes gathered into a
// block of C x kB (a lane a row) for the positions' kernels, the gradient
// scattered back; the last, partial block row by row.
template <typename T>
struct ShortRows {
  static constexpr int64_t kB = Positions<T>::kB;
  std::vector<T> block;  // the classes, then the gradient
  explicit ShortRows(int64_t C) : block(2 * C * kB) {}
  T* gather(const T* x, int64_t C, int64_t row_stride) {
    for (int64_t e = 0; e < kB; ++e)
      for (int64_t c = 0; c < C; ++c) block[c * kB + e] = x[e * row_stride + c];
    return block.data();
  }
  T* grad(int64_t C) { return block.data() + C * kB; }
  void scatter(T* dx, int64_t C, int64_t row_stride) {
    const T* g = grad(C);
    for (int64_t e = 0; e < kB; ++e)
      for (int64_t c = 0; c < C; ++c) dx[e * row_stride + c] = g[c * kB + e];
  }
};

// The short rows' loop of both directions: blocks of kB rows gathered
// (block(r0, x, cs, dx, gs) on the gathered block), the last partial block
// row by row (row(r, x_row, dx_row); dx_row null where grad is).
template <typename T, typename Block, typename Row>
void walk_short_rows(const CeProblem& p, const T* logits, T* grad, const Block& block, const Row& row_fn) {
  constexpr int64_t kB = ShortRows<T>::kB;
  const int64_t C = p.classes;
  const int64_t grain = std::max<int64_t>(1, kGrainSize / (8 * kB * std::max<int64_t>(C, 1)));
  at::parallel_for(0, (p.rows + kB - 1) / kB, grain, [&](int64_t begin, int64_t end) {
    ShortRows<T> rows(C);
    for (int64_t u = begin; u < end; ++u) {
      const int64_t r0 = u * kB;
      if (p.rows - r0 < kB) {
        for (int64_t r = r0; r < p.rows; ++r)
          row_fn(r, logits + r * p.row_stride, grad != nullptr ? grad + r * p.grad_row_stride : nullptr);
        continue;
      }
      block(r0, rows.gather(logits + r0 * p.row_stride, C, p.row_stride), kB,
            grad != nullptr ? rows.grad(C) : nullptr, kB);
      if (grad != nullptr) rows.scatter(grad + r0 * p.grad_row_stride, C, p.grad_row_stride);
    }
  });
}

// Plain rows: at::parallel_for over them (row(r, x_row, dx_row); dx_row
// null where grad is).
template <typename T, typename Row>
void walk_rows(const CeProblem& p, const T* logits, T* grad, const Row& row_fn) {
  const int64_t grain = std::max<int64_t>(1, kGrainSize / (8 * std::max<int64_t>(p.classes, 1)));
  at::parallel_for(0, p.rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      row_fn(r, logits + r * p.row_stride, grad != nullptr ? grad + r * p.grad_row_stride : nullptr);
  });
}

// The layout's walk: the (N, C, D) positions, short rows gathered a block
// at a time, or rows.
template <typename T, typename Block, typename Row>
void walk(const CeProblem& p, const T* logits, T* grad, const Block& block, const Row& row_fn) {
  if (p.inner > 1) walk_positions(p, logits, grad, block, row_fn);
  else if (p.classes < kShortRowClasses) walk_short_rows(p, logits, grad, block, row_fn);
  else walk_rows(p, logits, grad, row_fn);
}

template <typename T>
bool forward_impl(const CePlan& plan, const CeBuffers& b, void* workspace, int64_t& bad_target) {
  ForwardCall<T> f(plan, b, workspace);
  walk(
      f.p, f.logits, f.grad,
      [&](int64_t r0, const T* x, int64_t cs, T* dx, int64_t gs) { forward_block(f, r0, x, cs, dx, gs); },
      [&](int64_t r, const T* x, T* dx) { forward_row(f, r, x, dx); });
  return f.finish(bad_target);
}

template <typename T>
bool backward_impl(const CePlan& plan, const CeBuffers& b, int64_t& bad_target) {
  BackwardCall<T> k(plan, b);
  walk(
      k.p, k.logits, k.grad,
      [&](int64_t r0, const T* x, int64_t cs, T* dx, int64_t gs) { backward_block(k, r0, x, cs, dx, gs); },
      [&](int64_t r, const T* x, T* dx) { k.row(r, x, dx); });
  return k.finish(bad_target);
}

}  // namespace

// (the op bodies have checked the dtype)
bool forward(const CePlan& plan, const CeBuffers& buffers, void* workspace, int64_t& bad_target) {
  bool ok = true;
  visit_dtype(plan.problem.dtype, [&](auto tag) {
    ok = forward_impl<typename decltype(tag)::type>(plan, buffers, workspace, bad_target);
  });
  return ok;
}

bool backward(const CePlan& plan, const CeBuffers& buffers, int64_t& bad_target) {
  bool ok = true;
  visit_dtype(plan.problem.dtype,
              [&](auto tag) { ok = backward_impl<typename decltype(tag)::type>(plan, buffers, bad_target); });
  return ok;
}

}  // namespace softmax_ext::ce::CPU_CAPABILITY
