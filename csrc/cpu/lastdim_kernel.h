// cpu.lastdim: the axis is contiguous in every operand. One
// row per iteration (row_kernel.h), rows spread over threads with
// at::parallel_for, as torch's lastdim kernel. Every row is reduced by one
// thread in a fixed order: results do not depend on the thread count.
#pragma once

#ifndef CPU_CAPABILITY
#error "include from a per-ISA TU (kernels_*.cpp) that defines CPU_CAPABILITY"
#endif

#include "cpu/epilogue.h"
#include "cpu/heuristics.h"
#include "cpu/numerics.h"
#include "cpu/row_index.h"
#include "cpu/row_kernel.h"
#include "plan/plan.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <memory>
#include <type_traits>

namespace softmax_ext::cpu::CPU_CAPABILITY {

struct LastDim {
  template <Kind K, typename in_t, typename out_t>
  static void forward(const Problem& p, const Buffers& buf) {
    using acc_t = acc_type_t<out_t>;
    const auto* x = static_cast<const in_t*>(buf.in0);
    auto* y = static_cast<out_t*>(buf.out);
    const int64_t n = p.axis_size;
    if constexpr (K == Kind::LogSoftmax && kIs16Bit<out_t>) {
      if (n <= kGroupedLogSoftmaxMax) {  // short rows: a vector's count of them at a time
        constexpr int G = Vec<acc_t>::size();
        at::parallel_for(0, p.rows, row_grain(n), [&](int64_t begin, int64_t end) {
          RowCursor cur(p, p.batch_rank, begin);
          int64_t xo[G], yo[G];
          for (int64_t r = begin; r < end; r += G) {
            const int rows = static_cast<int>(std::min<int64_t>(G, end - r));
            for (int i = 0; i < rows; ++i, cur.next()) {
              xo[i] = cur[kIn0];
              yo[i] = cur[kOut];
            }
            log_softmax_short_rows(x, y, xo, yo, rows, n);
          }
        });
        return;
      }
    }
    // Where softmax keeps exp(x - max) between passes: y itself when it holds
    // acc_t, else a scratch row, else nowhere (recomputed).
    constexpr bool kInPlace = std::is_same_v<out_t, acc_t>;
    const bool scratch = Forward<K, kIs16Bit<out_t>>::kCachesExp && !kInPlace &&
                         n * int64_t(sizeof(acc_t)) <= kRowScratchMaxBytes;
    at::parallel_for(0, p.rows, row_grain(n), [&](int64_t begin, int64_t end) {
      std::unique_ptr<acc_t[]> row(scratch ? new acc_t[n] : nullptr);
      RowCursor cur(p, p.batch_rank, begin);
      for (int64_t r = begin; r < end; ++r, cur.next()) {
        out_t* y_row = y + cur[kOut];
        acc_t* cache = nullptr;
        if constexpr (kInPlace) cache = y_row;
        else cache = row.get();
        forward_row<K>(x + cur[kIn0], y_row, n, cache);
      }
    });
  }

  template <Kind K, typename T>
  static void backward(const Problem& p, const Buffers& buf) {
    const auto* dy = static_cast<const T*>(buf.in0);
    const auto* y = static_cast<const T*>(buf.in1);
    auto* dx = static_cast<T*>(buf.out);
    const int64_t n = p.axis_size;
    at::parallel_for(0, p.rows, row_grain(n), [&](int64_t begin, int64_t end) {
      RowCursor cur(p, p.batch_rank, begin);
      for (int64_t r = begin; r < end; ++r, cur.next())
        backward_row<K>(dy + cur[kIn0], y + cur[kIn1], dx + cur[kOut], n);
    });
  }
};

}  // namespace softmax_ext::cpu::CPU_CAPABILITY
