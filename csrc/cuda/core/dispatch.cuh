// The launch ladder every family climbs, written once: element types
// (dispatch_types) -> kind (the epilogues) -> compile-time geometry (pack
// width, packs, flags: dispatch_int, dispatch_packs, dispatch_bool) -> the
// kernel's instantiation and its launch (launch.cuh). The CPU side's twin is
// cpu/dtype_dispatch.h.
#pragma once

#include "cuda/core/budget.h"
#include "cuda/core/epilogues.cuh"
#include "plan/problem.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <type_traits>
#include <utility>

namespace softmax_ext::cuda {

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) for the C++ type of a supported dtype. select() has
// already rejected anything else; the check keeps a bad call from launching.
template <typename F>
void dispatch_floating_type(c10::ScalarType dtype, const char* where, F&& f) {
  switch (dtype) {
    case c10::ScalarType::Float:
      f(TypeTag<float>{});
      return;
    case c10::ScalarType::Double:
      f(TypeTag<double>{});
      return;
    case c10::ScalarType::Half:
      f(TypeTag<c10::Half>{});
      return;
    case c10::ScalarType::BFloat16:
      f(TypeTag<c10::BFloat16>{});
      return;
    default:
      TORCH_CHECK_NOT_IMPLEMENTED(false, where, ": dtype ", dtype,
                                  " is not supported; supported dtypes are float32, "
                                  "float64, float16 and bfloat16");
  }
}

template <typename F>
void dispatch_kind(Kind kind, F&& f) {
  if (kind == Kind::LogSoftmax) {
    f(LogSoftmaxEpilogues{});
  } else {
    f(SoftmaxEpilogues{});
  }
}

// Which (input, output) pairs a forward launcher is compiled for: the fast
// families' (has_fast_kernels), or every pair of the four dtypes.
enum class Pairs { kFast, kAll };

// The types of one rung: element types and the epilogues of the kind. A
// launcher takes them as a template lambda,
//   [&]<typename in_t, typename out_t, typename E>(KernelTypes<in_t, out_t, E>) { ... },
// and names its kernel's epilogue from E (E::ForwardFor<out_t>::type,
// E::BackwardFor<scalar_t>::type).
template <typename In, typename Out, typename Epilogues>
struct KernelTypes {};

// Rungs 1 and 2: calls f(KernelTypes<in_t, out_t, Epilogues>{}) for the
// problem's dtypes and kind; a backward's dy, y and dx share one dtype
// (in_t == out_t).
template <bool kBackward, Pairs kPairs = Pairs::kFast, typename F>
void dispatch_types(const Problem& p, const char* where, F&& f) {
  TORCH_INTERNAL_ASSERT(p.is_backward() == kBackward, where, ": a ", p.is_backward() ? "backward" : "forward",
                        " problem for the other direction's launcher");
  auto with_kind = [&](auto in_tag, auto out_tag) {
    dispatch_kind(p.kind, [&](auto epilogues) {
      f(KernelTypes<typename decltype(in_tag)::type, typename decltype(out_tag)::type, decltype(epilogues)>{});
    });
  };
  if constexpr (kBackward) {
    dispatch_floating_type(p.out_dtype, where, [&](auto tag) { with_kind(tag, tag); });
  } else if constexpr (kPairs == Pairs::kAll) {
    dispatch_floating_type(p.in_dtype, where, [&](auto in_tag) {
      dispatch_floating_type(p.out_dtype, where, [&](auto out_tag) { with_kind(in_tag, out_tag); });
    });
  } else {
    TORCH_INTERNAL_ASSERT(has_fast_kernels(p.in_dtype, p.out_dtype), where, ": no fast kernel for ", p.in_dtype,
                          " -> ", p.out_dtype);
    if (p.in_dtype == p.out_dtype) {
      dispatch_floating_type(p.in_dtype, where, [&](auto tag) { with_kind(tag, tag); });
    } else if (p.in_dtype == c10::ScalarType::Half) {
      with_kind(TypeTag<c10::Half>{}, TypeTag<float>{});
    } else {
      with_kind(TypeTag<c10::BFloat16>{}, TypeTag<float>{});
    }
  }
}

// Rung 3: a run-time value of the plan's geometry as a template argument.
// Calls f(std::integral_constant<int, V>{}) for the V of kValues equal to
// `value`.
template <int... kValues, typename F>
void dispatch_int(int value, F&& f) {
  const bool done = ((value == kValues ? (f(std::integral_constant<int, kValues>{}), true) : false) || ...);
  TORCH_INTERNAL_ASSERT(done, "softmax_ext: no kernel for the value ", value);
}

// Calls f(std::integral_constant<int, K>{}) for the compiled fragment size
// K in {1, 2, 4, 8, 16} (K <= kMax) equal to `packs`.
template <int kMax, typename F>
void dispatch_packs(int packs, F&& f) {
  dispatch_int<1, 2, 4, 8, 16>(packs, [&](auto k) {
    if constexpr (decltype(k)::value <= kMax) {
      f(k);
    } else {
      TORCH_INTERNAL_ASSERT(false, "softmax_ext: no kernel for ", packs, " packs per thread");
    }
  });
}

// Calls f(std::true_type{}) or f(std::false_type{}): a runtime flag as a
// template argument.
template <typename F>
void dispatch_bool(bool flag, F&& f) {
  if (flag) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

}  // namespace softmax_ext::cuda
