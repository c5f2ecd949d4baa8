// cpu.strided: any strides (expanded stride-0 operands
// included), any rank. A task gathers a group of consecutive rows into a
// contiguous acc_t tile (converted as the vector kernels convert), runs each
// through the lastdim family's row kernel in place, and scatters the tile to
// the output. So every element is read and written once, the math is
// vectorised, and results are bit-identical to the lastdim family's.
//
// Each operand is copied in the order that walks its memory more closely:
// along the axis when the axis stride is the smaller one, else across the
// group's rows (consecutive rows are the closest ones, the innermost batch
// dimension being the fastest), so rows that share cache lines and pages load
// each of them once, not once per row (see kStridedMaxRows).
#pragma once

#ifndef CPU_CAPABILITY
#error "include from a per-ISA TU (kernels_*.cpp) that defines CPU_CAPABILITY"
#endif

#include "cpu/heuristics.h"
#include "cpu/numerics.h"
#include "cpu/row_index.h"
#include "cpu/row_kernel.h"
#include "cpu/vec_io.h"
#include "plan/plan.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

namespace softmax_ext::cpu::CPU_CAPABILITY {

// Row groups of the strided kernel and where each row starts.
struct RowGroups {
  int64_t rows, group, count;

  // `tiles`: operands held in a tile at once.
  template <typename acc_t>
  static RowGroups make(const Problem& p, int tiles) {
    const int64_t fit = kStridedTileBytes / (tiles * p.axis_size * int64_t(sizeof(acc_t)));
    RowGroups g;
    g.rows = p.rows;
    g.group = std::clamp<int64_t>(fit, 1, kStridedMaxRows);
    g.count = (p.rows + g.group - 1) / g.group;
    return g;
  }
  int64_t grain(int64_t axis_size) const { return std::max<int64_t>(1, row_grain(axis_size) / group); }

  // Calls f(m, off) for groups [begin, end): m rows, off[k][i] the offset of
  // row i in operand k.
  template <typename F>
  void for_groups(const Problem& p, int64_t begin, int64_t end, const F& f) const {
    int64_t off[kNumOperands][kStridedMaxRows];
    RowCursor cur(p, p.batch_rank, begin * group);
    for (int64_t g = begin; g < end; ++g) {
      const int64_t m = std::min(group, rows - g * group);
      for (int64_t i = 0; i < m; ++i, cur.next())
        for (int k = 0; k < kNumOperands; ++k) off[k][i] = cur[k];
      f(m, off);
    }
  }
};

// Calls f(i, j) for the m x n elements of a group of one operand: along
// each row when its axis stride is no larger than the step between rows,
// else across the rows for each axis step.
template <typename F>
inline void for_group_elements(const Problem& p, int k, int64_t m, int64_t n, const F& f) {
  const int64_t row_step = p.batch_rank ? p.batch_stride[k][p.batch_rank - 1] : 0;
  if (std::abs(p.axis_stride[k]) <= std::abs(row_step)) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) f(i, j);
  } else {
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) f(i, j);
  }
}

struct Strided {
  template <Kind K, typename in_t, typename out_t>
  static void forward(const Problem& p, const Buffers& buf) {
    using acc_t = acc_type_t<out_t>;
    const auto* x = static_cast<const in_t*>(buf.in0);
    auto* y = static_cast<out_t*>(buf.out);
    const int64_t n = p.axis_size, sx = p.axis_stride[kIn0], sy = p.axis_stride[kOut];
    const auto groups = RowGroups::make<acc_t>(p, 1);
    at::parallel_for(0, groups.count, groups.grain(n), [&](int64_t begin, int64_t end) {
      std::unique_ptr<acc_t[]> tile(new acc_t[groups.group * n]);
      acc_t* const t = tile.get();
      groups.for_groups(p, begin, end, [&](int64_t m, const int64_t (*off)[kStridedMaxRows]) {
        for_group_elements(p, kIn0, m, n, [&](int64_t i, int64_t j) {
          t[i * n + j] = load_as<out_t, acc_t>(x[off[kIn0][i] + j * sx]);
        });
        for (int64_t i = 0; i < m; ++i)
          forward_row<K, acc_t, acc_t, kIs16Bit<out_t>>(t + i * n, t + i * n, n, t + i * n);
        for_group_elements(p, kOut, m, n, [&](int64_t i, int64_t j) {
          y[off[kOut][i] + j * sy] = static_cast<out_t>(t[i * n + j]);
        });
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
    const int64_t sdy = p.axis_stride[kIn0], sy = p.axis_stride[kIn1], sdx = p.axis_stride[kOut];
    const auto groups = RowGroups::make<acc_t>(p, 2);
    at::parallel_for(0, groups.count, groups.grain(n), [&](int64_t begin, int64_t end) {
      std::unique_ptr<acc_t[]> tiles(new acc_t[2 * groups.group * n]);
      acc_t* const g = tiles.get();             // dy, then dx in place
      acc_t* const o = g + groups.group * n;    // y
      groups.for_groups(p, begin, end, [&](int64_t m, const int64_t (*off)[kStridedMaxRows]) {
        for_group_elements(p, kIn0, m, n, [&](int64_t i, int64_t j) {
          g[i * n + j] = static_cast<acc_t>(dy[off[kIn0][i] + j * sdy]);
        });
        for_group_elements(p, kIn1, m, n, [&](int64_t i, int64_t j) {
          o[i * n + j] = static_cast<acc_t>(y[off[kIn1][i] + j * sy]);
        });
        for (int64_t i = 0; i < m; ++i) backward_row<K>(g + i * n, o + i * n, g + i * n, n);
        for_group_elements(p, kOut, m, n, [&](int64_t i, int64_t j) {
          dx[off[kOut][i] + j * sdx] = static_cast<T>(g[i * n + j]);
        });
      });
    });
  }
};

}  // namespace softmax_ext::cpu::CPU_CAPABILITY
