// Runtime (kind, dtypes) -> template instantiation of a kernel family.
//
// A Family is a struct with
//   template <Kind K, typename in_t, typename out_t> static void forward(const Problem&, const Buffers&);
//   template <Kind K, typename T> static void backward(const Problem&, const Buffers&);
// Forward instantiates all 16 (in, out) pairs of float, double, Half and
// BFloat16; backward has one dtype for dy, y and dx.
#pragma once

#ifndef CPU_CAPABILITY
#error "include from a per-ISA TU (kernels_*.cpp) that defines CPU_CAPABILITY"
#endif

#include "plan/plan.h"

#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <type_traits>

namespace softmax_ext::cpu::CPU_CAPABILITY {

template <typename T>
struct TypeTag {
  using type = T;
};

template <typename F>
void visit_dtype(c10::ScalarType t, const F& f) {
  switch (t) {
    case c10::ScalarType::Float: return f(TypeTag<float>{});
    case c10::ScalarType::Double: return f(TypeTag<double>{});
    case c10::ScalarType::Half: return f(TypeTag<c10::Half>{});
    case c10::ScalarType::BFloat16: return f(TypeTag<c10::BFloat16>{});
    default: TORCH_INTERNAL_ASSERT(false, "softmax_ext CPU kernels: unexpected dtype ", t);
  }
}

template <typename F>
void visit_kind(Kind k, const F& f) {
  if (k == Kind::Softmax) return f(std::integral_constant<Kind, Kind::Softmax>{});
  return f(std::integral_constant<Kind, Kind::LogSoftmax>{});
}

template <typename Family>
void dispatch(const Problem& p, const Buffers& b) {
  visit_kind(p.kind, [&](auto kind) {
    constexpr Kind K = decltype(kind)::value;
    if (p.is_backward()) {
      visit_dtype(p.in_dtype, [&](auto t) {
        Family::template backward<K, typename decltype(t)::type>(p, b);
      });
      return;
    }
    visit_dtype(p.in_dtype, [&](auto in) {
      visit_dtype(p.out_dtype, [&](auto out) {
        Family::template forward<K, typename decltype(in)::type, typename decltype(out)::type>(p, b);
      });
    });
  });
}

}  // namespace softmax_ext::cpu::CPU_CAPABILITY
