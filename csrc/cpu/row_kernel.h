// One contiguous row, reduced horizontally with Vectorized<acc_t>: the body
// of the lastdim family, and of the strided family after it has gathered a
// row into a contiguous buffer.
//
// Forward: pass 1 max, pass 2 sum of exp(x - max) (softmax can keep the exps
// in `cache`), pass 3 writes y. Backward: pass 1 the sum, pass 2 writes dx.
// x and y (dy and dx) may be the same buffer: each block is read before it
// is written. The reduction order is fixed by the row length alone.
#pragma once

#ifndef CPU_CAPABILITY
#error "include from a per-ISA TU (kernels_*.cpp) that defines CPU_CAPABILITY"
#endif

#include "cpu/epilogue.h"
#include "cpu/numerics.h"
#include "cpu/vec_io.h"

#include <ATen/cpu/vec/functional.h>

#include <algorithm>
#include <cstdint>
#include <limits>

// The row functions are flattened: every block loop's body (a lambda) and
// ATen's 16-bit conversions are inlined into them, where GCC would call
// them once per block, passing vectors through the stack.
#if defined(__GNUC__) && !defined(__clang__)
#define SOFTMAX_EXT_FLATTEN __attribute__((flatten))
#else
#define SOFTMAX_EXT_FLATTEN
#endif

namespace softmax_ext::cpu::CPU_CAPABILITY {

// Row elements per partial sum in row_sum.
constexpr int64_t kRowSumSpan = 1024;

// Sum over [0, n) of what add(j, len, s0, s1) adds into the two vector
// accumulators for the block at j. Spans of kRowSumSpan elements are summed
// apart and then added up, so rounding error grows with the span plus the
// span count rather than with the row length. Returns the horizontal sum.
template <typename acc_t, typename Add>
acc_t row_sum(int64_t n, const Add& add) {
  using V = Vec<acc_t>;
  V t0(acc_t(0)), t1(acc_t(0));
  for (int64_t j0 = 0; j0 < n; j0 += kRowSumSpan) {
    V s0(acc_t(0)), s1(acc_t(0));
    for_blocks<kBlock<acc_t>>(std::min(kRowSumSpan, n - j0), [&](int64_t j, int64_t len) {
      add(j0 + j, len, s0, s1);
    });
    t0 += s0;
    t1 += s1;
  }
  return at::vec::vec_reduce_all([](V& p, V& q) { return p + q; }, t0 + t1);
}

// The statistics of a row of at most one block, held as the pair (a, b)
// with the lanes past n at -inf: its max (max, and m in every lane), the
// exps e = exp(x - m) (0 past the row) and their sum, returned. The same
// bits as row_stats' block loops (the max of the pair, the sum of the
// pair); a row of at most one vector leaves b out (its max is -inf and its
// exps add 0), so its eb is not computed (0).
template <typename Fwd, typename V>
C10_ALWAYS_INLINE typename V::value_type block_stats(const V& a, const V& b, int64_t n, typename V::value_type& max,
                                                     V& m, V& ea, V& eb) {
  using acc_t = typename V::value_type;
  constexpr int64_t W = V::size();
  if (n <= W) {
    max = at::vec::vec_reduce_all([](V& p, V& q) { return vmax(p, q); }, a);
    m = V(max);
    ea = Fwd::exp(a - m);
    if (n < W) ea = zero_lanes_from(ea, n);
    eb = V(acc_t(0));
    return at::vec::vec_reduce_all([](V& p, V& q) { return p + q; }, ea);
  }
  max = at::vec::vec_reduce_all([](V& p, V& q) { return vmax(p, q); }, vmax(a, b));
  m = V(max);
  ea = Fwd::exp(a - m);
  eb = Fwd::exp(b - m);
  if (n < 2 * W) eb = zero_lanes_from(eb, n - W);
  return at::vec::vec_reduce_all([](V& p, V& q) { return p + q; }, ea + eb);
}

// Passes 1 and 2 of a row of any length: its max and, returned, the sum of
// exp(x - max), kept in `cache` where softmax keeps the exps (forward_row's
// order: the same bits).
template <Kind K, typename in_t, typename out_t, bool kFastExp>
C10_ALWAYS_INLINE acc_type_t<out_t> row_stats(const in_t* x, int64_t n, acc_type_t<out_t>* cache,
                                              acc_type_t<out_t>& max) {
  using acc_t = acc_type_t<out_t>;
  using V = Vec<acc_t>;
  using Fwd = Forward<K, kFastExp>;
  using X = Io<in_t, out_t, acc_t>;
  using C = Io<acc_t, acc_t, acc_t>;
  constexpr int64_t B = kBlock<acc_t>;
  constexpr acc_t kNegInf = -std::numeric_limits<acc_t>::infinity();
  V m0(kNegInf), m1(kNegInf);
  for_blocks<B>(n, [&](int64_t j, int64_t len) {
    V a, b;
    X::load(x + j, len, kNegInf, a, b);
    m0 = vmax(m0, a);
    m1 = vmax(m1, b);
  });
  max = at::vec::vec_reduce_all([](V& p, V& q) { return vmax(p, q); }, vmax(m0, m1));
  const V m(max);

  // Pass 2, a span of kRowSumSpan elements at a time: e = exp(x - m), kept
  // in softmax's cache when it keeps the exps, and summed in row_sum's order.
  // Where the exp is inline (float lanes on x86, numerics.h), one loop.
  // Otherwise the exps go to a buffer (the cache, or a stack buffer the size
  // of a span) and the span's sum is read back from it in a second loop:
  // Sleef's exp is an out-of-line call after which no vector register
  // survives, so a fused loop would spill and reload its sums around every
  // call. The same bits either way.
  V t0(acc_t(0)), t1(acc_t(0));
  for (int64_t j0 = 0; j0 < n; j0 += kRowSumSpan) {
    const int64_t len0 = std::min(kRowSumSpan, n - j0);
    V s0(acc_t(0)), s1(acc_t(0));
    if constexpr (kInlineExp<acc_t>) {
      for_blocks<B>(len0, [&](int64_t j, int64_t len) {
        V a, b;
        X::load(x + j0 + j, len, acc_t(0), a, b);
        V ea = Fwd::exp(a - m), eb = Fwd::exp(b - m);
        if constexpr (Fwd::kCachesExp) {
          if (cache) C::store(cache + j0 + j, len, ea, eb);
        }
        if (C10_UNLIKELY(len < B)) {  // lanes past the row add 0
          ea = zero_lanes_from(ea, std::min<int64_t>(len, V::size()));
          eb = zero_lanes_from(eb, std::max<int64_t>(len - V::size(), 0));
        }
        s0 += ea;
        s1 += eb;
      });
    } else {
      alignas(64) acc_t span[kRowSumSpan];
      acc_t* buf = span;
      if constexpr (Fwd::kCachesExp) {
        if (cache) buf = cache + j0;
      }
      for_blocks<B>(len0, [&](int64_t j, int64_t len) {
        V a, b;
        X::load(x + j0 + j, len, acc_t(0), a, b);
        C::store(buf + j, len, Fwd::exp(a - m), Fwd::exp(b - m));
      });
      for_blocks<B>(len0, [&](int64_t j, int64_t len) {
        V a, b;
        C::load(buf + j, len, acc_t(0), a, b);  // lanes past the row add 0
        s0 += a;
        s1 += b;
      });
    }
    t0 += s0;
    t1 += s1;
  }
  return at::vec::vec_reduce_all([](V& p, V& q) { return p + q; }, t0 + t1);
}

// kFastExp: see numerics.h; the strided family sets it for its final output
// dtype while running this on float rows. stats (optional): the row's max
// and sum(exp(x - max)) written to stats[0], stats[1] (the sum 0 where the
// max is -inf, as the sharded-axis Stats step has it).
template <Kind K, typename in_t, typename out_t, bool kFastExp = kIs16Bit<out_t>>
SOFTMAX_EXT_FLATTEN void forward_row(const in_t* x, out_t* y, int64_t n, acc_type_t<out_t>* cache,
                                     acc_type_t<out_t>* stats = nullptr) {
  using acc_t = acc_type_t<out_t>;
  using V = Vec<acc_t>;
  using Fwd = Forward<K, kFastExp>;
  using X = Io<in_t, out_t, acc_t>;
  using Y = Io<out_t, out_t, acc_t>;
  using C = Io<acc_t, acc_t, acc_t>;
  constexpr int64_t B = kBlock<acc_t>;
  constexpr acc_t kNegInf = -std::numeric_limits<acc_t>::infinity();
  auto put_stats = [stats](acc_t max, acc_t sum) {
    if (stats) {
      stats[0] = max;
      stats[1] = max == kNegInf ? acc_t(0) : sum;
    }
  };
  // (the lambdas below keep their vectors local: captured by reference,
  // they would live on the stack)
  // A row of at most one block: read once (lanes past the row -inf), kept
  // in registers through the three passes (block_stats).
  if (n <= B) {
    V a, b, m, ea, eb;
    acc_t max;
    X::load(x, n, kNegInf, a, b);
    const acc_t sum = block_stats<Fwd>(a, b, n, max, m, ea, eb);
    put_stats(max, sum);
    const V c = Fwd::template finish_row<V>(sum);
    if constexpr (Fwd::kCachesExp) Y::store(y, n, Fwd::from_exp(ea, c), Fwd::from_exp(eb, c));
    else Y::store(y, n, Fwd::apply(a, m, c), Fwd::apply(b, m, c));
    return;
  }

  acc_t max;
  const acc_t sum = row_stats<K, in_t, out_t, kFastExp>(x, n, cache, max);
  put_stats(max, sum);
  const V m(max);
  const V c = Fwd::template finish_row<V>(sum);

  if constexpr (Fwd::kCachesExp) {
    if (cache) {
      for_blocks<B>(n, [&](int64_t j, int64_t len) {
        V a, b;
        C::load(cache + j, len, acc_t(0), a, b);
        Y::store(y + j, len, Fwd::from_exp(a, c), Fwd::from_exp(b, c));
      });
      return;
    }
  }
  for_blocks<B>(n, [&](int64_t j, int64_t len) {
    V a, b;
    X::load(x + j, len, acc_t(0), a, b);
    Y::store(y + j, len, Fwd::apply(a, m, c), Fwd::apply(b, m, c));
  });
}

// log_softmax of up to one vector's count of short rows (row i at x + xo[i],
// y + yo[i]; the lastdim kernel takes this for 16-bit rows of up to
// kGroupedLogSoftmaxMax elements): the rows' statistics first (block_stats
// or row_stats, forward_row's), then the logs of their sums as one vector
// (Sleef's, like torch's lastdim kernel; forward_row takes one scalar log a
// row, the largest cost of a short row), then each row again, from L1, for
// its output (x - max) - log(sum).
template <typename in_t, typename out_t, bool kFastExp = kIs16Bit<out_t>>
SOFTMAX_EXT_FLATTEN void log_softmax_short_rows(const in_t* x, out_t* y, const int64_t* xo, const int64_t* yo,
                                                int rows, int64_t n) {
  using acc_t = acc_type_t<out_t>;
  using V = Vec<acc_t>;
  using Fwd = Forward<Kind::LogSoftmax, kFastExp>;
  using X = Io<in_t, out_t, acc_t>;
  using Y = Io<out_t, out_t, acc_t>;
  constexpr int64_t B = kBlock<acc_t>;
  constexpr int G = V::size();
  constexpr acc_t kNegInf = -std::numeric_limits<acc_t>::infinity();
  alignas(64) acc_t maxes[G], sums[G];
  for (int i = rows; i < G; ++i) maxes[i] = sums[i] = acc_t(1);
  for (int i = 0; i < rows; ++i) {
    if (n <= B) {
      V a, b, m, ea, eb;
      X::load(x + xo[i], n, kNegInf, a, b);
      sums[i] = block_stats<Fwd>(a, b, n, maxes[i], m, ea, eb);
    } else {
      sums[i] = row_stats<Kind::LogSoftmax, in_t, out_t, kFastExp>(x + xo[i], n, nullptr, maxes[i]);
    }
  }
  alignas(64) acc_t logs[G];
  V::loadu(sums).log().store(logs);
  for (int i = 0; i < rows; ++i) {
    const V m(maxes[i]), c(logs[i]);
    for_blocks<B>(n, [&](int64_t j, int64_t len) {
      V a, b;
      X::load(x + xo[i] + j, len, acc_t(0), a, b);
      Y::store(y + yo[i] + j, len, Fwd::apply(a, m, c), Fwd::apply(b, m, c));
    });
  }
}

template <Kind K, typename T>
SOFTMAX_EXT_FLATTEN void backward_row(const T* dy, const T* y, T* dx, int64_t n) {
  using acc_t = acc_type_t<T>;
  using V = Vec<acc_t>;
  using Bwd = Backward<K, kIs16Bit<T>>;
  using IO = Io<T, T, acc_t>;
  constexpr int64_t B = kBlock<acc_t>;
  V g0, g1, y0, y1;
  if (n <= B) {  // a row of at most one block, read once (as in forward_row)
    IO::load(dy, n, acc_t(0), g0, g1);
    IO::load(y, n, acc_t(0), y0, y1);
    // (from zero, as the loops sum: a -0 term gives +0; within one vector
    // the pair's second terms are all 0 and are left out)
    const V zero(acc_t(0));
    if (n <= V::size()) {
      const V s(at::vec::vec_reduce_all([](V& p, V& q) { return p + q; }, zero + Bwd::term(g0, y0)));
      const V out = Bwd::apply(g0, y0, s);
      IO::store(dx, n, out, out);
      return;
    }
    const V s(at::vec::vec_reduce_all([](V& p, V& q) { return p + q; },
                                      (zero + Bwd::term(g0, y0)) + (zero + Bwd::term(g1, y1))));
    IO::store(dx, n, Bwd::apply(g0, y0, s), Bwd::apply(g1, y1, s));
    return;
  }

  V s;
  if (n <= kRowSumSpan) {  // one span: row_sum's order without its span loop
    V s0(acc_t(0)), s1(acc_t(0));
    int64_t j = 0;
    for (; j + B <= n; j += B) {
      IO::load(dy + j, B, acc_t(0), g0, g1);
      IO::load(y + j, B, acc_t(0), y0, y1);
      s0 += Bwd::term(g0, y0);
      s1 += Bwd::term(g1, y1);
    }
    if (j < n) {
      IO::load(dy + j, n - j, acc_t(0), g0, g1);
      IO::load(y + j, n - j, acc_t(0), y0, y1);
      s0 += Bwd::term(g0, y0);
      s1 += Bwd::term(g1, y1);
    }
    s = V(at::vec::vec_reduce_all([](V& p, V& q) { return p + q; }, s0 + s1));
  } else {
    s = V(row_sum<acc_t>(n, [&](int64_t j, int64_t len, V& s0, V& s1) {
      V a0, a1, b0, b1;  // (locals: captured by reference they would live on the stack)
      IO::load(dy + j, len, acc_t(0), a0, a1);
      IO::load(y + j, len, acc_t(0), b0, b1);
      s0 += Bwd::term(a0, b0);
      s1 += Bwd::term(a1, b1);
    }));
  }

  for_blocks<B>(n, [&](int64_t j, int64_t len) {
    V a0, a1, b0, b1;
    IO::load(dy + j, len, acc_t(0), a0, a1);
    IO::load(y + j, len, acc_t(0), b0, b1);
    IO::store(dx + j, len, Bwd::apply(a0, b0, s), Bwd::apply(a1, b1, s));
  });
}

}  // namespace softmax_ext::cpu::CPU_CAPABILITY
