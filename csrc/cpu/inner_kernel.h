// cpu.inner: the axis is strided, and the innermost batch
// dimension has unit stride in every operand (softmax over dim 1 of a
// contiguous (A, B, C): axis B with stride C, inner run C).
//
// Vertical reduction, like torch's non-last-dim kernels: a task takes one
// outer index and a chunk of inner positions (an axis x chunk tile), and
// reduces it along the axis for every position of the chunk, kBlock
// positions side by side in Vectorized<acc_t> lanes. The chunk is sized so
// the tile stays in L2 across the passes. The chunking does not depend on
// the thread count, and each output is reduced by one task in axis order, so
// results do not depend on the number of threads. Two ways through a tile,
// with bit-identical results (the same operations in the same order):
// - narrow tiles (columns): a block of positions walks the axis with its
//   max and sums in registers, one load per element and pass;
// - wide tiles (rows, kRowsMinBytes or more of a row): each pass reads the
//   tile a row at a time, every row one contiguous run, the positions'
//   statistics in a small L1-resident buffer. Walking the axis a column
//   block at a time makes one memory stream per row of the axis and per
//   operand, each in a page of its own when the inner run is long, and the
//   hardware prefetchers follow only a few dozen streams.
// Sums along the axis are blocked (kAxisSumBlock steps a partial sum) so
// their rounding error does not grow with the axis length.
#pragma once

#ifndef CPU_CAPABILITY
#error "include from a per-ISA TU (kernels_*.cpp) that defines CPU_CAPABILITY"
#endif

#include "cpu/epilogue.h"
#include "cpu/heuristics.h"
#include "cpu/numerics.h"
#include "cpu/row_index.h"
#include "cpu/vec_io.h"
#include "plan/plan.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <type_traits>

namespace softmax_ext::cpu::CPU_CAPABILITY {

// Inner positions per task: a multiple of the block, about
// kInnerTileBytes / (axis * sizeof(acc_t)), no more than the inner run.
template <typename acc_t>
int64_t inner_chunk(int64_t axis_size, int64_t inner) {
  constexpr int64_t B = kBlock<acc_t>;
  const int64_t fit = kInnerTileBytes / (axis_size * int64_t(sizeof(acc_t)));
  const int64_t chunk = std::max(B, fit / B * B);
  return std::min(chunk, (inner + B - 1) / B * B);
}

// The geometry every inner task shares.
struct InnerTiling {
  int64_t inner, outer, chunk, chunks;
  bool rows;  // a wide tile: read a row at a time (kRowsMinBytes)

  template <typename acc_t>
  static InnerTiling make(const Problem& p) {
    InnerTiling t;
    t.inner = p.batch_size[p.batch_rank - 1];
    t.outer = p.rows / t.inner;
    t.chunk = inner_chunk<acc_t>(p.axis_size, t.inner);
    t.chunks = (t.inner + t.chunk - 1) / t.chunk;
    t.rows = t.chunk * int64_t(sizeof(acc_t)) >= kRowsMinBytes;
    return t;
  }
  int64_t tasks() const { return outer * chunks; }
  int64_t grain(int64_t axis_size) const {
    return std::max<int64_t>(1, kGrainSize / (kOpsPerElement * axis_size * chunk));
  }
  // Calls f(off, len) for tasks [begin, end): off[k] is where the task's
  // tile starts in operand k, len its width (chunk, or less at the end).
  template <typename F>
  void for_tasks(const Problem& p, int64_t begin, int64_t end, const F& f) const {
    for (int64_t t = begin; t < end; ++t) {
      const RowCursor outer_row(p, p.batch_rank - 1, t / chunks);
      const int64_t i0 = (t % chunks) * chunk;
      int64_t off[kNumOperands];
      for (int k = 0; k < kNumOperands; ++k) off[k] = outer_row[k] + i0;
      f(off, std::min(chunk, inner - i0));
    }
  }
};

// Axis steps per partial sum.
constexpr int64_t kAxisSumBlock = 64;

// Sum over the axis [0, n) of what add(j, s0, s1) adds into the two vector
// partials for step j, in blocks of kAxisSumBlock steps added up at the end
// of each block; (t0, t1) receive the totals. The accumulators stay in
// registers: a buffer of one block's running sums, loaded and stored at every
// axis step, would chain each step to the previous one's store (the wide
// tiles' buffer holds a whole row of positions, so the updates of one entry
// are a row apart).
template <typename V, typename Add>
inline void axis_sum(int64_t n, V& t0, V& t1, const Add& add) {
  using acc_t = typename V::value_type;
  t0 = V(acc_t(0));
  t1 = V(acc_t(0));
  for (int64_t j0 = 0; j0 < n; j0 += kAxisSumBlock) {
    const int64_t j1 = std::min(n, j0 + kAxisSumBlock);
    V s0(acc_t(0)), s1(acc_t(0));
    for (int64_t j = j0; j < j1; ++j) add(j, s0, s1);
    t0 += s0;
    t1 += s1;
  }
}

// Narrow tiles (columns): one (axis x len) tile of the forward pass, a
// column block (kBlock positions side by side) at a time: the block's max,
// sum and result passes each walk the axis with the block's max and sums in
// registers, as torch's non-last-dim kernels do; the tile stays in L2
// between the passes. Softmax keeps exp(x - max) in cache (row j at cache +
// j * cache_pitch) when given.
template <Kind K, typename in_t, typename out_t, typename acc_t = acc_type_t<out_t>>
void forward_tile_columns(const in_t* x, int64_t sx, out_t* y, int64_t sy, int64_t n, int64_t len,
                          acc_t* cache, int64_t cache_pitch) {
  using V = Vec<acc_t>;
  using Fwd = Forward<K, kIs16Bit<out_t>>;
  using X = Io<in_t, out_t, acc_t>;
  using Y = Io<out_t, out_t, acc_t>;
  using C = Io<acc_t, acc_t, acc_t>;
  constexpr int64_t B = kBlock<acc_t>;
  constexpr acc_t kNegInf = -std::numeric_limits<acc_t>::infinity();

  for_blocks<B>(len, [&](int64_t i, int64_t w) {
    V a, b;
    V m0(kNegInf), m1(kNegInf);
    for (int64_t j = 0; j < n; ++j) {
      X::load(x + j * sx + i, w, kNegInf, a, b);
      m0 = vmax(m0, a);
      m1 = vmax(m1, b);
    }
    V t0, t1;
    axis_sum(n, t0, t1, [&](int64_t j, V& s0, V& s1) {
      X::load(x + j * sx + i, w, kNegInf, a, b);
      const V e0 = Fwd::exp(a - m0), e1 = Fwd::exp(b - m1);
      s0 += e0;
      s1 += e1;
      if constexpr (Fwd::kCachesExp) {
        if (cache) C::store(cache + j * cache_pitch + i, w, e0, e1);
      }
    });
    const V c0 = Fwd::finish(t0), c1 = Fwd::finish(t1);

    if constexpr (Fwd::kCachesExp) {
      if (cache) {
        for (int64_t j = 0; j < n; ++j) {
          C::load(cache + j * cache_pitch + i, w, acc_t(0), a, b);
          Y::store(y + j * sy + i, w, Fwd::from_exp(a, c0), Fwd::from_exp(b, c1));
        }
        return;
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      X::load(x + j * sx + i, w, acc_t(0), a, b);
      Y::store(y + j * sy + i, w, Fwd::apply(a, m0, c0), Fwd::apply(b, m1, c1));
    }
  });
}

// Narrow tiles: one (axis x len) tile of the backward pass, a column block
// at a time with the block's sums in registers.
template <Kind K, typename T, typename acc_t = acc_type_t<T>>
void backward_tile_columns(const T* dy, int64_t sdy, const T* y, int64_t sy, T* dx, int64_t sdx,
                           int64_t n, int64_t len) {
  using V = Vec<acc_t>;
  using Bwd = Backward<K, kIs16Bit<T>>;
  using IO = Io<T, T, acc_t>;
  constexpr int64_t B = kBlock<acc_t>;

  for_blocks<B>(len, [&](int64_t i, int64_t w) {
    V g0, g1, y0, y1, t0, t1;
    axis_sum(n, t0, t1, [&](int64_t j, V& s0, V& s1) {
      IO::load(dy + j * sdy + i, w, acc_t(0), g0, g1);
      IO::load(y + j * sy + i, w, acc_t(0), y0, y1);
      s0 += Bwd::term(g0, y0);
      s1 += Bwd::term(g1, y1);
    });
    for (int64_t j = 0; j < n; ++j) {
      IO::load(dy + j * sdy + i, w, acc_t(0), g0, g1);
      IO::load(y + j * sy + i, w, acc_t(0), y0, y1);
      IO::store(dx + j * sdx + i, w, Bwd::apply(g0, y0, t0), Bwd::apply(g1, y1, t1));
    }
  });
}

// Wide tiles (rows).

// totals[i] = sum over the axis of what term(j, i, w, s0, s1) adds for the
// block of positions at i, in blocks of kAxisSumBlock steps (the order of
// axis_sum); part is scratch of len acc_t.
template <typename acc_t, typename Term>
inline void axis_sums(int64_t n, int64_t len, acc_t* totals, acc_t* part, const Term& term) {
  using V = Vec<acc_t>;
  using S = Io<acc_t, acc_t, acc_t>;
  constexpr int64_t B = kBlock<acc_t>;
  std::fill(totals, totals + len, acc_t(0));
  for (int64_t j0 = 0; j0 < n; j0 += kAxisSumBlock) {
    const int64_t j1 = std::min(n, j0 + kAxisSumBlock);
    std::fill(part, part + len, acc_t(0));
    for (int64_t j = j0; j < j1; ++j) {
      for_blocks<B>(len, [&](int64_t i, int64_t w) {
        V s0, s1;
        S::load(part + i, w, acc_t(0), s0, s1);
        term(j, i, w, s0, s1);
        S::store(part + i, w, s0, s1);
      });
    }
    for_blocks<B>(len, [&](int64_t i, int64_t w) {
      V t0, t1, s0, s1;
      S::load(totals + i, w, acc_t(0), t0, t1);
      S::load(part + i, w, acc_t(0), s0, s1);
      S::store(totals + i, w, t0 + s0, t1 + s1);
    });
  }
}

// One (axis x len) tile of the forward pass: the positions' max, their sums
// of exp(x - max), then the results, each pass a row at a time. Softmax
// keeps exp(x - max) in cache (row j at cache + j * cache_pitch) when given.
// stats: 3 * len acc_t.
template <Kind K, typename in_t, typename out_t, typename acc_t = acc_type_t<out_t>>
void forward_tile_rows(const in_t* x, int64_t sx, out_t* y, int64_t sy, int64_t n, int64_t len,
                       acc_t* cache, int64_t cache_pitch, acc_t* stats) {
  using V = Vec<acc_t>;
  using Fwd = Forward<K, kIs16Bit<out_t>>;
  using X = Io<in_t, out_t, acc_t>;
  using Y = Io<out_t, out_t, acc_t>;
  using C = Io<acc_t, acc_t, acc_t>;
  using S = Io<acc_t, acc_t, acc_t>;
  constexpr int64_t B = kBlock<acc_t>;
  constexpr acc_t kNegInf = -std::numeric_limits<acc_t>::infinity();
  acc_t* const mx = stats;
  acc_t* const c = stats + len;  // the sums, then what Fwd::finish makes of them
  acc_t* const part = stats + 2 * len;
  if (n == 0) return;

  for_blocks<B>(len, [&](int64_t i, int64_t w) {
    V a, b;
    X::load(x + i, w, kNegInf, a, b);
    S::store(mx + i, w, a, b);
  });
  for (int64_t j = 1; j < n; ++j) {
    for_blocks<B>(len, [&](int64_t i, int64_t w) {
      V a, b, m0, m1;
      X::load(x + j * sx + i, w, kNegInf, a, b);
      S::load(mx + i, w, kNegInf, m0, m1);
      S::store(mx + i, w, vmax(m0, a), vmax(m1, b));
    });
  }
  axis_sums(n, len, c, part, [&](int64_t j, int64_t i, int64_t w, V& s0, V& s1) {
    V a, b, m0, m1;
    X::load(x + j * sx + i, w, kNegInf, a, b);
    S::load(mx + i, w, acc_t(0), m0, m1);
    const V e0 = Fwd::exp(a - m0), e1 = Fwd::exp(b - m1);
    s0 += e0;
    s1 += e1;
    if constexpr (Fwd::kCachesExp) {
      if (cache) C::store(cache + j * cache_pitch + i, w, e0, e1);
    }
  });
  for_blocks<B>(len, [&](int64_t i, int64_t w) {
    V t0, t1;
    S::load(c + i, w, acc_t(1), t0, t1);
    S::store(c + i, w, Fwd::finish(t0), Fwd::finish(t1));
  });

  if constexpr (Fwd::kCachesExp) {
    if (cache) {
      for (int64_t j = 0; j < n; ++j) {
        for_blocks<B>(len, [&](int64_t i, int64_t w) {
          V a, b, c0, c1;
          C::load(cache + j * cache_pitch + i, w, acc_t(0), a, b);
          S::load(c + i, w, acc_t(1), c0, c1);
          Y::store(y + j * sy + i, w, Fwd::from_exp(a, c0), Fwd::from_exp(b, c1));
        });
      }
      return;
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    for_blocks<B>(len, [&](int64_t i, int64_t w) {
      V a, b, m0, m1, c0, c1;
      X::load(x + j * sx + i, w, acc_t(0), a, b);
      S::load(mx + i, w, acc_t(0), m0, m1);
      S::load(c + i, w, acc_t(1), c0, c1);
      Y::store(y + j * sy + i, w, Fwd::apply(a, m0, c0), Fwd::apply(b, m1, c1));
    });
  }
}

// One (axis x len) tile of the backward pass: the positions' sums, then the
// gradient, each pass a row at a time. sums: 2 * len acc_t.
template <Kind K, typename T, typename acc_t = acc_type_t<T>>
void backward_tile_rows(const T* dy, int64_t sdy, const T* y, int64_t sy, T* dx, int64_t sdx,
                        int64_t n, int64_t len, acc_t* sums) {
  using V = Vec<acc_t>;
  using Bwd = Backward<K, kIs16Bit<T>>;
  using IO = Io<T, T, acc_t>;
  using S = Io<acc_t, acc_t, acc_t>;
  constexpr int64_t B = kBlock<acc_t>;
  acc_t* const total = sums;

  axis_sums(n, len, total, sums + len, [&](int64_t j, int64_t i, int64_t w, V& s0, V& s1) {
    V g0, g1, y0, y1;
    IO::load(dy + j * sdy + i, w, acc_t(0), g0, g1);
    IO::load(y + j * sy + i, w, acc_t(0), y0, y1);
    s0 += Bwd::term(g0, y0);
    s1 += Bwd::term(g1, y1);
  });
  for (int64_t j = 0; j < n; ++j) {
    for_blocks<B>(len, [&](int64_t i, int64_t w) {
      V g0, g1, y0, y1, t0, t1;
      IO::load(dy + j * sdy + i, w, acc_t(0), g0, g1);
      IO::load(y + j * sy + i, w, acc_t(0), y0, y1);
      S::load(total + i, w, acc_t(0), t0, t1);
      IO::store(dx + j * sdx + i, w, Bwd::apply(g0, y0, t0), Bwd::apply(g1, y1, t1));
    });
  }
}

struct Inner {
  template <Kind K, typename in_t, typename out_t>
  static void forward(const Problem& p, const Buffers& buf) {
    using acc_t = acc_type_t<out_t>;
    const auto* x = static_cast<const in_t*>(buf.in0);
    auto* y = static_cast<out_t*>(buf.out);
    const int64_t n = p.axis_size;
    const auto tiling = InnerTiling::make<acc_t>(p);
    // Softmax keeps exp(x - max) in y when y holds acc_t, else in a scratch
    // tile while that stays small (a very long axis recomputes instead).
    constexpr bool kInPlace = std::is_same_v<out_t, acc_t>;
    const bool scratch = Forward<K, kIs16Bit<out_t>>::kCachesExp && !kInPlace &&
                         n * tiling.chunk * int64_t(sizeof(acc_t)) <= 2 * kInnerTileBytes;
    at::parallel_for(0, tiling.tasks(), tiling.grain(n), [&](int64_t begin, int64_t end) {
      const int64_t chunk = tiling.chunk;
      // the exp tile of a 16-bit softmax, then the positions' statistics (rows)
      const int64_t tile_size = scratch ? n * chunk : 0, stats_size = tiling.rows ? 3 * chunk : 0;
      const std::unique_ptr<acc_t[]> mem(tile_size + stats_size > 0 ? new acc_t[tile_size + stats_size] : nullptr);
      acc_t* const tile = scratch ? mem.get() : nullptr;
      acc_t* const stats = tiling.rows ? mem.get() + tile_size : nullptr;
      tiling.for_tasks(p, begin, end, [&](const int64_t* off, int64_t len) {
        out_t* y_tile = y + off[kOut];
        acc_t* cache = tile;
        int64_t pitch = chunk;
        if constexpr (kInPlace) {
          cache = y_tile;
          pitch = p.axis_stride[kOut];
        }
        if (tiling.rows) {
          forward_tile_rows<K>(x + off[kIn0], p.axis_stride[kIn0], y_tile, p.axis_stride[kOut], n, len,
                               cache, pitch, stats);
        } else {
          forward_tile_columns<K>(x + off[kIn0], p.axis_stride[kIn0], y_tile, p.axis_stride[kOut], n, len,
                                  cache, pitch);
        }
      });
    });
  }

  template <Kind K, typename T>
  static void backward(const Problem& p, const Buffers& buf) {
    using acc_t = acc_type_t<T>;
    const auto* dy = static_cast<const T*>(buf.in0);
    const auto* y = static_cast<const T*>(buf.in1);
    auto* dx = static_cast<T*>(buf.out);
    const int64_t n = p.axis_size;
    const auto tiling = InnerTiling::make<acc_t>(p);
    at::parallel_for(0, tiling.tasks(), tiling.grain(n), [&](int64_t begin, int64_t end) {
      const std::unique_ptr<acc_t[]> sums(tiling.rows ? new acc_t[2 * tiling.chunk] : nullptr);
      tiling.for_tasks(p, begin, end, [&](const int64_t* off, int64_t len) {
        if (tiling.rows) {
          backward_tile_rows<K>(dy + off[kIn0], p.axis_stride[kIn0], y + off[kIn1], p.axis_stride[kIn1],
                                dx + off[kOut], p.axis_stride[kOut], n, len, sums.get());
        } else {
          backward_tile_columns<K>(dy + off[kIn0], p.axis_stride[kIn0], y + off[kIn1], p.axis_stride[kIn1],
                                   dx + off[kOut], p.axis_stride[kOut], n, len);
        }
      });
    });
  }
};

}  // namespace softmax_ext::cpu::CPU_CAPABILITY
