// Autograd for the cross-entropy's forward op, in C++ on the Autograd
// dispatch key (as csrc/ops/autograd.cpp does for the softmax ops).
//
// _cross_entropy_forward(logits, target, weight, ...) -> (loss, row_stats,
// total_weight): one C++ node a differentiable call, no Python. It saves the
// logits, target, weight and the two statistics; its backward calls
// _cross_entropy_backward, or _cross_entropy_backward_ (the gradient written
// over the logits) when the call asked for inplace_backward. The gradient is
// the logits' only (weight gets none, as in F.cross_entropy). row_stats and
// total_weight leave the node as tensors made with grad mode off: not
// differentiable, and not outputs of the node (compiled autograd traces no
// C++ node with a non-differentiable output). The fused forward of eager
// training steps keeps its own Function (softmax_ext/_cross_entropy.py).

#include "ops/autograd.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <string>

namespace softmax_ext::ce {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using ForwardSig = Outputs(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, int64_t,
                          c10::string_view, double, bool, bool);
using BackwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                               const std::optional<at::Tensor>&, const at::Tensor&, const at::Tensor&, int64_t,
                               c10::string_view, double);
using BackwardInplaceSig = void(const at::Tensor&, at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                const at::Tensor&, const at::Tensor&, int64_t, c10::string_view, double);

const c10::TypedOperatorHandle<ForwardSig>& forward_op() {
  static const auto op = find_op<ForwardSig>("softmax_ext::_cross_entropy_forward");
  return op;
}

struct ForwardFunction : public torch::autograd::Function<ForwardFunction> {
  static constexpr bool is_traceable = true;

  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& target,
                            const std::optional<at::Tensor>& weight, int64_t ignore_index, c10::string_view reduction,
                            double label_smoothing, bool inplace_backward, bool acc_loss, at::Tensor* stats,
                            at::Tensor* total) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [loss, s, t] = forward_op().call(logits, target, weight, ignore_index, reduction, label_smoothing,
                                          inplace_backward, acc_loss);
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["reduction"] = std::string(reduction);
    ctx->saved_data["label_smoothing"] = label_smoothing;
    ctx->saved_data["inplace"] = inplace_backward;
    ctx->save_for_backward({logits, target, weight.value_or(at::Tensor()), s, t});
    *stats = std::move(s);
    *total = std::move(t);
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(10);
    if (!ctx->needs_input_grad(0)) return out;
    const variable_list s = ctx->get_saved_variables();
    const std::optional<at::Tensor> weight = s[2].defined() ? std::optional<at::Tensor>(s[2]) : std::nullopt;
    const int64_t ignore_index = ctx->saved_data["ignore_index"].toInt();
    const std::string reduction = ctx->saved_data["reduction"].toStringRef();
    const double smoothing = ctx->saved_data["label_smoothing"].toDouble();
    if (ctx->saved_data["inplace"].toBool()) {
      // The caller gave the logits up: the gradient is written over them
      // (no (N, C) buffer). Any other user of these logits sees the change.
      static const auto op = find_op<BackwardInplaceSig>("softmax_ext::_cross_entropy_backward_");
      at::Tensor logits = s[0];
      op.call(grads[0], logits, s[1], weight, s[3], s[4], ignore_index, reduction, smoothing);
      out[0] = logits;
    } else {
      static const auto op = find_op<BackwardSig>("softmax_ext::_cross_entropy_backward");
      out[0] = op.call(grads[0], s[0], s[1], weight, s[3], s[4], ignore_index, reduction, smoothing);
    }
    return out;
  }
};

Outputs forward_autograd(c10::DispatchKeySet ks, const at::Tensor& logits, const at::Tensor& target,
                         const std::optional<at::Tensor>& weight, int64_t ignore_index, c10::string_view reduction,
                         double label_smoothing, bool inplace_backward, bool acc_loss) {
  if (!needs_grad({&logits, weight.has_value() ? &*weight : nullptr})) {
    return forward_op().redispatch(ks & c10::after_autograd_keyset, logits, target, weight, ignore_index, reduction,
                                   label_smoothing, inplace_backward, acc_loss);
  }
  at::Tensor stats, total;
  at::Tensor loss = ForwardFunction::apply(logits, target, weight, ignore_index, reduction, label_smoothing,
                                           inplace_backward, acc_loss, &stats, &total);
  return {std::move(loss), std::move(stats), std::move(total)};
}

}  // namespace

TORCH_LIBRARY_IMPL(softmax_ext, Autograd, m) { m.impl("_cross_entropy_forward", &forward_autograd); }

}  // namespace softmax_ext::ce
