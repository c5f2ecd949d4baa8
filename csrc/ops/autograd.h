// What the C++ autograd kernels share (ops/autograd.cpp,
// softmax_matmul/autograd.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>

#include <initializer_list>

namespace softmax_ext {

// Whether a call records a node: grad mode on and a defined input requiring grad.
inline bool needs_grad(std::initializer_list<const at::Tensor*> tensors) {
  if (!c10::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : tensors)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

}  // namespace softmax_ext
