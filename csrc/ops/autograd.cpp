// Autograd for the softmax ops, in C++ on the Autograd dispatch key.
//
// A differentiable call costs one C++ node, no Python: the forward saves its
// output y, the backward calls the backward op through the dispatcher, and the
// backward ops carry formulas of their own, so double (and higher) backward
// works. A call that needs no gradient goes straight to the device kernel.
// Every Function is traceable: compiled autograd
// (torch._dynamo.config.compiled_autograd) traces these nodes into its graph,
// and AOTAutograd (torch.compile) traces through them like any other op.

#include "ops/autograd.h"
#include "ops/ops.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

namespace softmax_ext {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using ForwardSig = at::Tensor(const at::Tensor&, int64_t, std::optional<c10::ScalarType>);
using BackwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, int64_t);

const c10::TypedOperatorHandle<ForwardSig>& forward_op(bool log) {
  static const auto softmax = find_op<ForwardSig>("softmax_ext::softmax");
  static const auto log_softmax = find_op<ForwardSig>("softmax_ext::log_softmax");
  return log ? log_softmax : softmax;
}

const c10::TypedOperatorHandle<BackwardSig>& backward_op(bool log) {
  static const auto softmax = find_op<BackwardSig>("softmax_ext::softmax_backward");
  static const auto log_softmax = find_op<BackwardSig>("softmax_ext::log_softmax_backward");
  return log ? log_softmax : softmax;
}

at::Tensor cast_to(const at::Tensor& t, c10::ScalarType dtype) {
  return !t.defined() || t.scalar_type() == dtype ? t : t.to(dtype);
}

// y = softmax(x) or log_softmax(x); dx from the saved y alone.
struct ForwardFunction : public torch::autograd::Function<ForwardFunction> {
  static constexpr bool is_traceable = true;

  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t dim,
                            std::optional<c10::ScalarType> dtype, bool log) {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor y = forward_op(log).call(x, dim, dtype);
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["log"] = log;
    ctx->saved_data["x_dtype"] = x.scalar_type();
    ctx->save_for_backward({y});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor y = ctx->get_saved_variables()[0];
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const bool log = ctx->saved_data["log"].toBool();
    // With dtype=, y (and its gradient) has another dtype than x.
    at::Tensor dx = cast_to(backward_op(log).call(grads[0], y, dim), ctx->saved_data["x_dtype"].toScalarType());
    return {dx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// dx = softmax_backward(dy, y) or log_softmax_backward(dy, y), differentiable
// in dy and y:
//   softmax:      dx = y (dy - s), s = sum(y dy)
//                 d/d dy = softmax_backward(g, y)
//                 d/d y  = g (dy - s) - dy sum(g y)
//   log_softmax:  dx = dy - exp(y) sum(dy)
//                 d/d dy = g - sum(g exp(y))
//                 d/d y  = -g exp(y) sum(dy)
struct BackwardFunction : public torch::autograd::Function<BackwardFunction> {
  static constexpr bool is_traceable = true;

  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& dy, const at::Tensor& y, int64_t dim,
                            bool log) {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor dx = backward_op(log).call(dy, y, dim);
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["log"] = log;
    ctx->save_for_backward({dy, y});
    return dx;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& dy = saved[0];
    const at::Tensor& y = saved[1];
    const at::Tensor& g = grads[0];
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const bool log = ctx->saved_data["log"].toBool();
    at::Tensor grad_dy, grad_y;
    if (log) {
      const at::Tensor p = y.exp();
      if (ctx->needs_input_grad(0)) grad_dy = g - (g * p).sum(dim, /*keepdim=*/true);
      if (ctx->needs_input_grad(1)) grad_y = -g * p * dy.sum(dim, /*keepdim=*/true);
    } else {
      if (ctx->needs_input_grad(0)) grad_dy = backward_op(false).call(g, y, dim);
      if (ctx->needs_input_grad(1)) {
        const at::Tensor s = (y * dy).sum(dim, /*keepdim=*/true);
        const at::Tensor gy = (g * y).sum(dim, /*keepdim=*/true);
        grad_y = g * (dy - s) - dy * gy;
      }
    }
    return {cast_to(grad_dy, dy.scalar_type()), cast_to(grad_y, y.scalar_type()), at::Tensor(), at::Tensor()};
  }
};

at::Tensor forward_autograd(bool log, c10::DispatchKeySet ks, const at::Tensor& x, int64_t dim,
                            std::optional<c10::ScalarType> dtype) {
  if (!needs_grad({&x})) return forward_op(log).redispatch(ks & c10::after_autograd_keyset, x, dim, dtype);
  return ForwardFunction::apply(x, dim, dtype, log);
}

at::Tensor backward_autograd(bool log, c10::DispatchKeySet ks, const at::Tensor& dy, const at::Tensor& y,
                             int64_t dim) {
  if (!needs_grad({&dy, &y})) return backward_op(log).redispatch(ks & c10::after_autograd_keyset, dy, y, dim);
  return BackwardFunction::apply(dy, y, dim, log);
}

at::Tensor softmax_autograd(c10::DispatchKeySet ks, const at::Tensor& x, int64_t dim,
                            std::optional<c10::ScalarType> dtype) {
  return forward_autograd(false, ks, x, dim, dtype);
}
at::Tensor log_softmax_autograd(c10::DispatchKeySet ks, const at::Tensor& x, int64_t dim,
                                std::optional<c10::ScalarType> dtype) {
  return forward_autograd(true, ks, x, dim, dtype);
}
at::Tensor softmax_backward_autograd(c10::DispatchKeySet ks, const at::Tensor& dy, const at::Tensor& y,
                                     int64_t dim) {
  return backward_autograd(false, ks, dy, y, dim);
}
at::Tensor log_softmax_backward_autograd(c10::DispatchKeySet ks, const at::Tensor& dy, const at::Tensor& y,
                                         int64_t dim) {
  return backward_autograd(true, ks, dy, y, dim);
}

}  // namespace

TORCH_LIBRARY_IMPL(softmax_ext, Autograd, m) {
  m.impl("softmax", &softmax_autograd);
  m.impl("log_softmax", &log_softmax_autograd);
  m.impl("softmax_backward", &softmax_backward_autograd);
  m.impl("log_softmax_backward", &log_softmax_backward_autograd);
}

}  // namespace softmax_ext
