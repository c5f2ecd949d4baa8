// CPU kernels of the sharded-axis steps (rows.h): one row at a time, rows
// spread over threads with at::parallel_for. Each row is reduced in order
// by one thread, so results do not depend on the thread count. Half types
// are widened to float, float64 stays in double.

#include "distributed/rows.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <limits>

namespace softmax_ext::distributed {
namespace {

template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// max that keeps a NaN from either side (std::max would drop it on one).
template <typename A>
inline A nan_max(A a, A b) { return (a != a || a > b) ? a : b; }

// f(r) for every row, rows spread over threads, about 32K elements a task.
// Each row is reduced by one thread in a fixed order: results do not depend
// on the thread count.
template <typename F>
void for_each_row(const RowsProblem& p, const F& f) {
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(p.n, 1));
  at::parallel_for(0, p.rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) f(r);
  });
}

template <typename T>
void stats(const RowsProblem& p, const RowsBuffers& b) {
  using A = acc_t<T>;
  const T* x = static_cast<const T*>(b.a);
  A* s = static_cast<A*>(b.stats);
  const int64_t n = p.n;
  for_each_row(p, [&](int64_t r) {
    const T* row = x + r * n;
    A m = -std::numeric_limits<A>::infinity();
    for (int64_t j = 0; j < n; ++j) m = nan_max(m, static_cast<A>(row[j]));
    A sum = 0;
    // A max of -inf: an empty slice, or all -inf; either adds nothing.
    if (m != -std::numeric_limits<A>::infinity())
      for (int64_t j = 0; j < n; ++j) sum += std::exp(static_cast<A>(row[j]) - m);
    s[2 * r] = m;
    s[2 * r + 1] = sum;
  });
}

template <typename T>
void normalize(const RowsProblem& p, const RowsBuffers& b) {
  using A = acc_t<T>;
  const T* x = static_cast<const T*>(b.a);
  const A* s = static_cast<const A*>(b.stats);
  T* y = static_cast<T*>(b.out);
  const int64_t n = p.n;
  const bool log = p.kind == Kind::LogSoftmax;
  for_each_row(p, [&](int64_t r) {
    const T* in = x + r * n;
    T* out = y + r * n;
    const A m = s[2 * r];
    if (log) {
      const A log_sum = std::log(s[2 * r + 1]);
      for (int64_t j = 0; j < n; ++j) out[j] = static_cast<T>((static_cast<A>(in[j]) - m) - log_sum);
    } else {
      const A inv = A(1) / s[2 * r + 1];
      for (int64_t j = 0; j < n; ++j) out[j] = static_cast<T>(std::exp(static_cast<A>(in[j]) - m) * inv);
    }
  });
}

template <typename T>
void backward_stats(const RowsProblem& p, const RowsBuffers& b) {
  using A = acc_t<T>;
  const T* dy = static_cast<const T*>(b.a);
  const T* y = static_cast<const T*>(b.b);
  A* s = static_cast<A*>(b.stats);
  const int64_t n = p.n;
  const bool log = p.kind == Kind::LogSoftmax;
  for_each_row(p, [&](int64_t r) {
    const T* g = dy + r * n;
    const T* o = y + r * n;
    A sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += log ? static_cast<A>(g[j]) : static_cast<A>(g[j]) * static_cast<A>(o[j]);
    s[r] = sum;
  });
}

template <typename T>
void backward_apply(const RowsProblem& p, const RowsBuffers& b) {
  using A = acc_t<T>;
  const T* dy = static_cast<const T*>(b.a);
  const T* y = static_cast<const T*>(b.b);
  const A* s = static_cast<const A*>(b.stats);
  T* dx = static_cast<T*>(b.out);
  const int64_t n = p.n;
  const bool log = p.kind == Kind::LogSoftmax;
  for_each_row(p, [&](int64_t r) {
    const T* g = dy + r * n;
    const T* o = y + r * n;
    T* out = dx + r * n;
    const A sum = s[r];
    for (int64_t j = 0; j < n; ++j) {
      const A gj = static_cast<A>(g[j]), oj = static_cast<A>(o[j]);
      out[j] = static_cast<T>(log ? gj - std::exp(oj) * sum : oj * (gj - sum));
    }
  });
}

}  // namespace

void run_cpu(const RowsPlan& plan, const RowsBuffers& buffers) {
  const RowsProblem& p = plan.problem;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.dtype, "softmax_ext.distributed", [&] {
    switch (p.step) {
      case Step::Stats: return stats<scalar_t>(p, buffers);
      case Step::Normalize: return normalize<scalar_t>(p, buffers);
      case Step::BackStats: return backward_stats<scalar_t>(p, buffers);
      case Step::BackApply: return backward_apply<scalar_t>(p, buffers);
    }
  });
}

}  // namespace softmax_ext::distributed
