// The CPU kernels of the sharded-axis steps (rows.h), compiled once per
// instruction set like the softmax kernels (cpu/isa.h): rows_cpu_default.cpp,
// rows_cpu_avx2.cpp and rows_cpu_avx512.cpp each set CPU_CAPABILITY and
// include this once; rows_cpu.cpp picks the build at run time.
//
// A row at a time with ATen Vectorized (16-bit rows widened to float in
// registers), rows spread over threads by at::parallel_for. Each row is
// reduced by one thread in an order fixed by its length (the softmax
// family's row_sum, cpu/row_kernel.h): results do not depend on the thread
// count. The formulas are the softmax family's (cpu/epilogue.h):
//
//   Stats        (m, s) = (max x, sum exp(x - m)); s = 0 for an empty or all -inf slice
//   Normalize    Forward<K>::apply(x, M, finish(S))   exp(x - M) / S  |  (x - M) - log S
//   BackStats    sum Backward<K>::term(dy, y)          sum(y * dy)     |  sum(dy)
//   BackApply    Backward<K>::apply(dy, y, s)          y * (dy - s)    |  dy - exp(y) * s
#pragma once

#ifndef CPU_CAPABILITY
#error "include from a per-ISA TU (rows_cpu_*.cpp) that defines CPU_CAPABILITY"
#endif

#include "cpu/dtype_dispatch.h"
#include "cpu/epilogue.h"
#include "cpu/numerics.h"
#include "cpu/row_kernel.h"
#include "cpu/vec_io.h"
#include "distributed/rows.h"

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <type_traits>

namespace softmax_ext::distributed::CPU_CAPABILITY {
namespace {

using ::softmax_ext::cpu::CPU_CAPABILITY::acc_type_t;
using ::softmax_ext::cpu::CPU_CAPABILITY::Backward;
using ::softmax_ext::cpu::CPU_CAPABILITY::for_blocks;
using ::softmax_ext::cpu::CPU_CAPABILITY::forward_row;
using ::softmax_ext::cpu::CPU_CAPABILITY::Forward;
using ::softmax_ext::cpu::CPU_CAPABILITY::Io;
using ::softmax_ext::cpu::CPU_CAPABILITY::kBlock;
using ::softmax_ext::cpu::CPU_CAPABILITY::row_sum;
using ::softmax_ext::cpu::CPU_CAPABILITY::Vec;
using ::softmax_ext::cpu::CPU_CAPABILITY::vexp;
using ::softmax_ext::cpu::CPU_CAPABILITY::visit_dtype;
using ::softmax_ext::cpu::CPU_CAPABILITY::visit_kind;
using ::softmax_ext::cpu::CPU_CAPABILITY::vmax;

// Rows a task: about 32K elements.
int64_t rows_grain(int64_t n) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(n, 1)); }

// f(r) for every row, rows_grain(n) rows a task.
template <typename F>
void for_each_row(const RowsProblem& p, const F& f) {
  at::parallel_for(0, p.rows, rows_grain(p.n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) f(r);
  });
}

template <typename T>
void stats(const RowsProblem& p, const RowsBuffers& b) {
  using A = acc_type_t<T>;
  using V = Vec<A>;
  using X = Io<T, T, A>;
  constexpr A kNegInf = -std::numeric_limits<A>::infinity();
  const T* x = static_cast<const T*>(b.a);
  A* s = static_cast<A*>(b.stats);
  const int64_t n = p.n;
  for_each_row(p, [&](int64_t r) {
    const T* row = x + r * n;
    V m0(kNegInf), m1(kNegInf), u, v;
    for_blocks<kBlock<A>>(n, [&](int64_t j, int64_t len) {
      X::load(row + j, len, kNegInf, u, v);  // (lanes past the row: -inf)
      m0 = vmax(m0, u);
      m1 = vmax(m1, v);
    });
    const A m = at::vec::vec_reduce_all([](V& a, V& c) { return vmax(a, c); }, vmax(m0, m1));
    A sum = 0;
    if (m != kNegInf) {  // an empty slice, or all -inf, adds nothing
      const V vm(m);
      sum = row_sum<A>(n, [&](int64_t j, int64_t len, V& s0, V& s1) {
        X::load(row + j, len, kNegInf, u, v);  // exp(-inf - m) = 0 past the row
        s0 += vexp(u - vm);
        s1 += vexp(v - vm);
      });
    }
    s[2 * r] = m;
    s[2 * r + 1] = sum;
  });
}

// (stats null, softmax: the softmax family's row kernel, its exps kept in y
// or a scratch row, which also writes each row's statistics to stats_out)
template <Kind K, typename T>
void normalize(const RowsProblem& p, const RowsBuffers& b) {
  using A = acc_type_t<T>;
  using V = Vec<A>;
  using X = Io<T, T, A>;
  using Fwd = Forward<K, false>;
  const T* x = static_cast<const T*>(b.a);
  const A* s = static_cast<const A*>(b.stats);
  T* y = static_cast<T*>(b.out);
  const int64_t n = p.n;
  if (s == nullptr) {
    TORCH_INTERNAL_ASSERT(K == Kind::Softmax && b.stats_out != nullptr);
    A* s_out = static_cast<A*>(b.stats_out);
    at::parallel_for(0, p.rows, rows_grain(n), [&](int64_t begin, int64_t end) {
      std::unique_ptr<A[]> scratch(std::is_same_v<T, A> ? nullptr : new A[n]);
      for (int64_t r = begin; r < end; ++r) {
        T* out = y + r * n;
        A* cache = nullptr;
        if constexpr (std::is_same_v<T, A>) cache = out;
        else cache = scratch.get();
        forward_row<Kind::Softmax>(x + r * n, out, n, cache, s_out + 2 * r);
      }
    });
    return;
  }
  for_each_row(p, [&](int64_t r) {
    const T* in = x + r * n;
    T* out = y + r * n;
    const V m(s[2 * r]);
    const V c = Fwd::template finish_row<V>(s[2 * r + 1]);
    V u, v;
    for_blocks<kBlock<A>>(n, [&](int64_t j, int64_t len) {
      X::load(in + j, len, A(0), u, v);
      X::store(out + j, len, Fwd::apply(u, m, c), Fwd::apply(v, m, c));
    });
  });
}

// f(r, dy's row, y's row) for every row of a backward step.
template <typename T, typename F>
void for_each_backward_row(const RowsProblem& p, const RowsBuffers& b, const F& f) {
  const T* dy = static_cast<const T*>(b.a);
  const T* y = static_cast<const T*>(b.b);
  for_each_row(p, [&](int64_t r) { f(r, dy + r * p.n, y + r * p.n); });
}

template <Kind K, typename T>
void backward_stats(const RowsProblem& p, const RowsBuffers& b) {
  using A = acc_type_t<T>;
  using V = Vec<A>;
  using X = Io<T, T, A>;
  A* s = static_cast<A*>(b.stats);
  for_each_backward_row<T>(p, b, [&](int64_t r, const T* g, const T* o) {
    V g0, g1, y0, y1;
    s[r] = row_sum<A>(p.n, [&](int64_t j, int64_t len, V& s0, V& s1) {
      X::load(g + j, len, A(0), g0, g1);  // (lanes past the row: terms of 0)
      X::load(o + j, len, A(0), y0, y1);
      s0 += Backward<K>::term(g0, y0);
      s1 += Backward<K>::term(g1, y1);
    });
  });
}

template <Kind K, typename T>
void backward_apply(const RowsProblem& p, const RowsBuffers& b) {
  using A = acc_type_t<T>;
  using V = Vec<A>;
  using X = Io<T, T, A>;
  const A* s = static_cast<const A*>(b.stats);
  T* dx = static_cast<T*>(b.out);
  for_each_backward_row<T>(p, b, [&](int64_t r, const T* g, const T* o) {
    T* out = dx + r * p.n;
    const V sum(s[r]);
    V g0, g1, y0, y1;
    for_blocks<kBlock<A>>(p.n, [&](int64_t j, int64_t len) {
      X::load(g + j, len, A(0), g0, g1);
      X::load(o + j, len, A(0), y0, y1);
      X::store(out + j, len, Backward<K>::apply(g0, y0, sum), Backward<K>::apply(g1, y1, sum));
    });
  });
}

template <Kind K, typename T>
void run_step(const RowsProblem& p, const RowsBuffers& b) {
  switch (p.step) {
    case Step::Stats: return stats<T>(p, b);
    case Step::Normalize: return normalize<K, T>(p, b);
    case Step::BackStats: return backward_stats<K, T>(p, b);
    case Step::BackApply: return backward_apply<K, T>(p, b);
  }
}

}  // namespace

// (the op bodies have checked the dtype)
void run(const RowsPlan& plan, const RowsBuffers& buffers) {
  const RowsProblem& p = plan.problem;
  visit_kind(p.kind, [&](auto kind) {
    visit_dtype(p.dtype, [&](auto t) { run_step<decltype(kind)::value, typename decltype(t)::type>(p, buffers); });
  });
}

}  // namespace softmax_ext::distributed::CPU_CAPABILITY
