// KernelFamily::kCpuInner: the axis is strided, and the innermost batch
// dimension has unit stride in every operand (softmax over dim 1 of a
// contiguous (A, B, C): axis B with stride C, inner run C).
//
// Vertical reduction, like torch's non-last-dim kernels: a task takes one
// outer index and a chunk of inner positions, and walks the axis with the
// chunk's positions side by side in Vectorized<acc_t> lanes. Each axis step
// reads a contiguous run of `chunk` elements; the running max / sum of the
// chunk live in small buffers. The chunk is sized so the (axis x chunk) tile
// stays in L2 across the passes. The chunking does not depend on the thread
// count, and each output is reduced by one task in axis order, so results
// do not depend on the number of threads. Sums along the axis are blocked
// (axis_sum) so their rounding error does not grow with the axis length.
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

  template <typename acc_t>
  static InnerTiling make(const Problem& p) {
    InnerTiling t;
    t.inner = p.batch_size[p.batch_rank - 1];
    t.outer = p.rows / t.inner;
    t.chunk = inner_chunk<acc_t>(p.axis_size, t.inner);
    t.chunks = (t.inner + t.chunk - 1) / t.chunk;
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

// Axis steps per partial sum in axis_sum.
constexpr int64_t kAxisSumBlock = 64;

// total[i] = sum over the axis of what add_row(j, acc) adds into acc[i], for
// the len positions of a tile. Steps are summed in blocks of kAxisSumBlock
// into `part`, and the blocks into `total`: a running sum over the whole axis
// would let rounding error grow with its length. Buffers hold len rounded up
// to a block.
template <typename acc_t, typename AddRow>
void axis_sum(int64_t n, int64_t len, acc_t* total, acc_t* part, const AddRow& add_row) {
  using V = Vec<acc_t>;
  constexpr int64_t B = kBlock<acc_t>, W = V::size();
  auto zero = [&](acc_t* buf) {
    for_blocks<B>(len, [&](int64_t i, int64_t) {
      V(acc_t(0)).store(buf + i);
      V(acc_t(0)).store(buf + i + W);
    });
  };
  zero(total);
  for (int64_t j0 = 0; j0 < n; j0 += kAxisSumBlock) {
    const int64_t j1 = std::min(n, j0 + kAxisSumBlock);
    acc_t* acc = n <= kAxisSumBlock ? total : part;
    if (acc == part) zero(part);
    for (int64_t j = j0; j < j1; ++j) add_row(j, acc);
    if (acc == part) {
      for_blocks<B>(len, [&](int64_t i, int64_t) {
        (V::loadu(total + i) + V::loadu(part + i)).store(total + i);
        (V::loadu(total + i + W) + V::loadu(part + i + W)).store(total + i + W);
      });
    }
  }
}

// One (axis x len) tile of the forward pass. `max` and `c` hold the tile's
// per-position max and finish(sum), `part` is axis_sum's scratch (each len
// rounded up to a block). Softmax keeps exp(x - max) in cache (row j at
// cache + j * cache_pitch) when it is given.
template <Kind K, typename in_t, typename out_t, typename acc_t = acc_type_t<out_t>>
void forward_tile(const in_t* x, int64_t sx, out_t* y, int64_t sy, int64_t n, int64_t len,
                  acc_t* max, acc_t* c, acc_t* part, acc_t* cache, int64_t cache_pitch) {
  using V = Vec<acc_t>;
  using Fwd = Forward<K, kIs16Bit<out_t>>;
  using X = Io<in_t, out_t, acc_t>;
  using Y = Io<out_t, out_t, acc_t>;
  using C = Io<acc_t, acc_t, acc_t>;
  constexpr int64_t B = kBlock<acc_t>, W = V::size();
  constexpr acc_t kNegInf = -std::numeric_limits<acc_t>::infinity();
  V a, b;

  for_blocks<B>(len, [&](int64_t i, int64_t) {
    V(kNegInf).store(max + i);
    V(kNegInf).store(max + i + W);
  });
  for (int64_t j = 0; j < n; ++j) {
    for_blocks<B>(len, [&](int64_t i, int64_t w) {
      X::load(x + j * sx + i, w, kNegInf, a, b);
      vmax(V::loadu(max + i), a).store(max + i);
      vmax(V::loadu(max + i + W), b).store(max + i + W);
    });
  }

  axis_sum(n, len, c, part, [&](int64_t j, acc_t* acc) {
    for_blocks<B>(len, [&](int64_t i, int64_t w) {
      X::load(x + j * sx + i, w, kNegInf, a, b);
      const V e0 = Fwd::exp(a - V::loadu(max + i)), e1 = Fwd::exp(b - V::loadu(max + i + W));
      (V::loadu(acc + i) + e0).store(acc + i);
      (V::loadu(acc + i + W) + e1).store(acc + i + W);
      if constexpr (Fwd::kCachesExp) {
        if (cache) C::store(cache + j * cache_pitch + i, w, e0, e1);
      }
    });
  });
  for_blocks<B>(len, [&](int64_t i, int64_t) {
    Fwd::finish(V::loadu(c + i)).store(c + i);
    Fwd::finish(V::loadu(c + i + W)).store(c + i + W);
  });

  if constexpr (Fwd::kCachesExp) {
    if (cache) {
      for (int64_t j = 0; j < n; ++j) {
        for_blocks<B>(len, [&](int64_t i, int64_t w) {
          C::load(cache + j * cache_pitch + i, w, acc_t(0), a, b);
          Y::store(y + j * sy + i, w, Fwd::from_exp(a, V::loadu(c + i)),
                   Fwd::from_exp(b, V::loadu(c + i + W)));
        });
      }
      return;
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    for_blocks<B>(len, [&](int64_t i, int64_t w) {
      X::load(x + j * sx + i, w, acc_t(0), a, b);
      Y::store(y + j * sy + i, w, Fwd::apply(a, V::loadu(max + i), V::loadu(c + i)),
               Fwd::apply(b, V::loadu(max + i + W), V::loadu(c + i + W)));
    });
  }
}

// One (axis x len) tile of the backward pass; `s` holds the per-position
// sums, `part` is axis_sum's scratch.
template <Kind K, typename T, typename acc_t = acc_type_t<T>>
void backward_tile(const T* dy, int64_t sdy, const T* y, int64_t sy, T* dx, int64_t sdx,
                   int64_t n, int64_t len, acc_t* s, acc_t* part) {
  using V = Vec<acc_t>;
  using Bwd = Backward<K>;
  using IO = Io<T, T, acc_t>;
  constexpr int64_t B = kBlock<acc_t>, W = V::size();
  V g0, g1, y0, y1;

  axis_sum(n, len, s, part, [&](int64_t j, acc_t* acc) {
    for_blocks<B>(len, [&](int64_t i, int64_t w) {
      IO::load(dy + j * sdy + i, w, acc_t(0), g0, g1);
      IO::load(y + j * sy + i, w, acc_t(0), y0, y1);
      (V::loadu(acc + i) + Bwd::term(g0, y0)).store(acc + i);
      (V::loadu(acc + i + W) + Bwd::term(g1, y1)).store(acc + i + W);
    });
  });
  for (int64_t j = 0; j < n; ++j) {
    for_blocks<B>(len, [&](int64_t i, int64_t w) {
      IO::load(dy + j * sdy + i, w, acc_t(0), g0, g1);
      IO::load(y + j * sy + i, w, acc_t(0), y0, y1);
      IO::store(dx + j * sdx + i, w, Bwd::apply(g0, y0, V::loadu(s + i)),
                Bwd::apply(g1, y1, V::loadu(s + i + W)));
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
      // max, finish(sum), axis_sum's partials, then the optional exp tile.
      std::unique_ptr<acc_t[]> mem(new acc_t[3 * chunk + (scratch ? n * chunk : 0)]);
      acc_t* const tile = scratch ? mem.get() + 3 * chunk : nullptr;
      tiling.for_tasks(p, begin, end, [&](const int64_t* off, int64_t len) {
        out_t* y_tile = y + off[kOut];
        acc_t* cache = tile;
        int64_t pitch = chunk;
        if constexpr (kInPlace) {
          cache = y_tile;
          pitch = p.axis_stride[kOut];
        }
        forward_tile<K>(x + off[kIn0], p.axis_stride[kIn0], y_tile, p.axis_stride[kOut], n, len,
                        mem.get(), mem.get() + chunk, mem.get() + 2 * chunk, cache, pitch);
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
      std::unique_ptr<acc_t[]> sums(new acc_t[2 * tiling.chunk]);
      tiling.for_tasks(p, begin, end, [&](const int64_t* off, int64_t len) {
        backward_tile<K>(dy + off[kIn0], p.axis_stride[kIn0], y + off[kIn1], p.axis_stride[kIn1],
                         dx + off[kOut], p.axis_stride[kOut], n, len, sums.get(),
                         sums.get() + tiling.chunk);
      });
    });
  }
};

}  // namespace softmax_ext::cpu::CPU_CAPABILITY
