// What the ops' C++ callers share: the autograd kernels (ops/autograd.cpp,
// softmax_matmul/autograd.cpp, cross_entropy/autograd.cpp) and the eager
// entry points (python/fast_calls.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>

#include <initializer_list>

namespace softmax_ext {

// The typed handle of a registered op ("softmax_ext::name"); callers keep it
// in a function-local static.
template <typename Sig>
c10::TypedOperatorHandle<Sig> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

// Whether a call records a node: grad mode on and a defined input requiring
// grad (nullptr: an optional input not given).
inline bool needs_grad(std::initializer_list<const at::Tensor*> tensors) {
  if (!c10::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : tensors)
    if (t != nullptr && t->defined() && t->requires_grad()) return true;
  return false;
}

}  // namespace softmax_ext
