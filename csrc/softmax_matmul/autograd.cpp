// Autograd for softmax_matmul, in C++ on the Autograd dispatch key (as
// csrc/ops/autograd.cpp does for the softmax ops).
//
// A differentiable call costs one C++ node, no Python: the forward op's node
// saves x, v, out and lse and its backward calls the backward op through the
// dispatcher. lse is not differentiable. The backward op has no derivative of
// its own: its node raises NotImplementedError when a double backward
// reaches it. A call that needs no gradient goes straight to the kernels.
// Both Functions are traceable: compiled autograd traces these nodes, and
// AOTAutograd (torch.compile) traces through them like any other op.

#include "ops/autograd.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

namespace softmax_ext::smm {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using ForwardSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&);
using BackwardSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                        const at::Tensor&, const at::Tensor&);

const c10::TypedOperatorHandle<ForwardSig>& forward_op() {
  static const auto op = find_op<ForwardSig>("softmax_ext::_softmax_matmul_forward");
  return op;
}

const c10::TypedOperatorHandle<BackwardSig>& backward_op() {
  static const auto op = find_op<BackwardSig>("softmax_ext::_softmax_matmul_backward");
  return op;
}

// out = softmax_matmul forward, lse handed out through `lse` (made with
// grad mode off inside the node: not differentiable, not an output of the
// node, which compiled autograd needs); dx, dv from the backward op.
struct ForwardFunction : public torch::autograd::Function<ForwardFunction> {
  static constexpr bool is_traceable = true;

  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& v, at::Tensor* lse) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, l] = forward_op().call(x, v);
    ctx->save_for_backward({x, v, out, l});
    *lse = std::move(l);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    auto [dx, dv] = backward_op().call(grads[0], s[0], s[1], s[2], s[3]);
    return {ctx->needs_input_grad(0) ? dx : at::Tensor(), ctx->needs_input_grad(1) ? dv : at::Tensor(),
            at::Tensor()};
  }
};

// The backward op under autograd (create_graph=True): its values, and an
// error if anything differentiates through them.
struct BackwardFunction : public torch::autograd::Function<BackwardFunction> {
  static constexpr bool is_traceable = true;

  static variable_list forward(AutogradContext* /*ctx*/, const at::Tensor& grad_out, const at::Tensor& x,
                               const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [dx, dv] = backward_op().call(grad_out, x, v, out, lse);
    return {dx, dv};
  }

  static variable_list backward(AutogradContext* /*ctx*/, variable_list /*grads*/) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "softmax_ext.softmax_matmul: double backward is not supported (the "
                                       "backward op has no derivative of its own)");
  }
};

std::tuple<at::Tensor, at::Tensor> forward_autograd(c10::DispatchKeySet ks, const at::Tensor& x,
                                                    const at::Tensor& v) {
  if (!needs_grad({&x, &v})) return forward_op().redispatch(ks & c10::after_autograd_keyset, x, v);
  at::Tensor lse;
  at::Tensor out = ForwardFunction::apply(x, v, &lse);
  return {std::move(out), std::move(lse)};
}

std::tuple<at::Tensor, at::Tensor> backward_autograd(c10::DispatchKeySet ks, const at::Tensor& grad_out,
                                                     const at::Tensor& x, const at::Tensor& v,
                                                     const at::Tensor& out, const at::Tensor& lse) {
  if (!needs_grad({&grad_out, &x, &v, &out, &lse}))
    return backward_op().redispatch(ks & c10::after_autograd_keyset, grad_out, x, v, out, lse);
  variable_list r = BackwardFunction::apply(grad_out, x, v, out, lse);
  return {r[0], r[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(softmax_ext, Autograd, m) {
  m.impl("_softmax_matmul_forward", &forward_autograd);
  m.impl("_softmax_matmul_backward", &backward_autograd);
}

}  // namespace softmax_ext::smm
