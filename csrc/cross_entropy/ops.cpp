// Op bodies and registration of the fused cross-entropy helpers. The public
// op softmax_ext::cross_entropy (the SPEC schema) is defined here too; its
// CompositeImplicitAutograd body is Python (softmax_ext/_cross_entropy.py):
// it flattens (N, C, d...) / (C) logits to rows (eager calls on plain
// tensors: (N, C, d...) to (N, C, D)) and calls the forward helper, which
// carries the autograd formula. Every helper takes logits (N, C) with
// target (N), or (N, C, D) with target (N, D): rows are then the N * D
// positions, read in their layout or copied to rows (through_rows).
//
//   _cross_entropy_forward(logits (N, C), target (N), weight?, ignore_index,
//       reduction, label_smoothing, inplace_backward, acc_loss)
//       -> (loss, row_stats, total_weight)
//     loss: (N) for "none", () otherwise, in the logits' dtype, or with
//     acc_loss in the accumulation dtype (the float32 value of a 16-bit
//     model's loss, with no rounding to 16 bits); row_stats: (N, 2), each
//     row's max and log of its sum of exp(x - max) (plan.h), and
//     total_weight: () in float32 (float64 for float64 logits). The
//     inplace_backward flag only tells the autograd formula which backward
//     op to call.
//   _cross_entropy_backward(grad_loss, logits, target, weight?, row_stats,
//       total_weight, ignore_index, reduction, label_smoothing) -> grad (N, C)
//   _cross_entropy_backward_(..., Tensor(a!) logits, ...) -> ()  the same,
//     written over the logits.
//   _cross_entropy_forward_grad(logits, target, weight?, ignore_index,
//       reduction, label_smoothing, acc_loss) -> (loss, row_stats, total_weight, grad)
//     the fused forward (mean / sum): the forward's outputs and, in the same
//     pass, the gradient for grad_loss = 1 (N, C), contiguous.
//   _cross_entropy_grad_scale_(Tensor(a!) grad, grad_loss) -> ()  its
//     backward: grad *= grad_loss (skipped on the device when it is 1).
//   _plan_cross_entropy(logits, backward) -> what softmax_ext.plan shows.

#include "cross_entropy/plan.h"

#include "plan/problem.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace softmax_ext::ce {
namespace {

constexpr const char* kFwd = "softmax_ext._cross_entropy_forward";
constexpr const char* kBwd = "softmax_ext._cross_entropy_backward";
constexpr const char* kFwdGrad = "softmax_ext._cross_entropy_forward_grad";

Reduction parse_reduction(const char* op, c10::string_view r) {
  if (r == "mean") return Reduction::Mean;
  if (r == "sum") return Reduction::Sum;
  TORCH_CHECK_VALUE(r == "none", op, ": reduction='", std::string(r),
                    "' is not known; accepted: 'mean', 'sum', 'none'");
  return Reduction::None;
}

// Validates the rows-form arguments; returns the logits as the kernels read
// them (unit class stride).
at::Tensor check_args(const char* op, const at::Tensor& logits, const at::Tensor& target,
                      const std::optional<at::Tensor>& weight, double smoothing) {
  TORCH_CHECK_NOT_IMPLEMENTED(is_supported_dtype(logits.scalar_type()), op, ": logits dtype ",
                              logits.scalar_type(), " is not supported; ", kAcceptedDtypes);
  TORCH_CHECK_VALUE(logits.dim() == 2 || logits.dim() == 3, op, ": logits must be (N, C) or (N, C, D) here, got shape ",
                    logits.sizes());
  TORCH_CHECK_NOT_IMPLEMENTED(target.scalar_type() == at::kLong || target.scalar_type() == at::kInt, op,
                              ": target dtype ", target.scalar_type(),
                              " is not supported; accepted: int64 or int32 class indices");
  if (logits.dim() == 3) {
    TORCH_CHECK_VALUE(target.dim() == 2 && target.size(0) == logits.size(0) && target.size(1) == logits.size(2), op,
                      ": target has shape ", target.sizes(), " but logits have shape ", logits.sizes(),
                      "; expected (", logits.size(0), ", ", logits.size(2), ")");
  } else {
    TORCH_CHECK_VALUE(target.dim() == 1 && target.size(0) == logits.size(0), op, ": target has shape ",
                      target.sizes(), " but logits have shape ", logits.sizes(), "; expected (", logits.size(0), ")");
  }
  TORCH_CHECK_VALUE(target.device() == logits.device(), op, ": target is on ", target.device(),
                    " but logits are on ", logits.device(), "; both must be on one device");
  TORCH_CHECK_VALUE(logits.size(1) > 0 || logits.size(0) == 0, op, ": logits have no classes (shape ",
                    logits.sizes(), ")");
  if (weight.has_value()) {
    const at::Tensor& w = *weight;
    TORCH_CHECK_VALUE(w.dim() == 1 && w.size(0) == logits.size(1), op, ": weight has shape ", w.sizes(),
                      " but there are ", logits.size(1), " classes; expected (", logits.size(1), ")");
    TORCH_CHECK_VALUE(w.device() == logits.device(), op, ": weight is on ", w.device(), " but logits are on ",
                      logits.device(), "; both must be on one device");
    TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(w.scalar_type()), op, ": weight dtype ", w.scalar_type(),
                                " is not supported; accepted: a floating dtype");
  }
  TORCH_CHECK_VALUE(smoothing >= 0.0 && smoothing <= 1.0, op, ": label_smoothing=", smoothing,
                    " is out of range; accepted: [0.0, 1.0]");
  if (logits.dim() == 3) return logits.size(2) > 1 && logits.stride(2) != 1 ? logits.contiguous() : logits;
  if (logits.size(1) > 1 && logits.stride(1) != 1) return logits.contiguous();
  return logits;
}

int64_t row_stride_of(const at::Tensor& t) {
  return t.size(0) > 1 ? t.stride(0) : t.size(1);
}

// Rows of the loss: N, or N * D positions of (N, C, D) logits.
int64_t rows_of(const at::Tensor& x) { return x.dim() == 3 ? x.size(0) * x.size(2) : x.size(0); }

// (N, C, D) logits the kernels do not read as they are (ce_reads_layout:
// few positions, D = 1): rows of C classes, a copy in the positions'
// order; and a gradient of such rows back into (N, C, D).
bool through_rows(const at::Tensor& x) {
  return x.dim() == 3 && !ce_reads_layout(x.device().type(), rows_of(x), x.size(2));
}
at::Tensor as_rows(const at::Tensor& x) { return x.movedim(1, 2).reshape({-1, x.size(1)}).contiguous(); }
void rows_into(at::Tensor& grad, const at::Tensor& rows) {
  grad.copy_(rows.view({grad.size(0), grad.size(2), grad.size(1)}).permute({0, 2, 1}));
}

// The gradient's strides in the problem (its row stride, and for the
// (N, C, D) layout its class stride).
void set_grad_layout(CeProblem& p, const at::Tensor& grad) {
  if (grad.dim() == 3) {
    p.grad_row_stride = grad.stride(0);
    p.grad_class_stride = grad.stride(1);
  } else {
    p.grad_row_stride = row_stride_of(grad);
  }
}

CeProblem make_problem(const at::Tensor& x, const at::Tensor& target, bool has_weight, int64_t ignore_index,
                       Reduction reduction, double smoothing, bool acc_loss = false) {
  CeProblem p;
  p.device_type = x.device().type();
  p.device_index = x.is_cuda() ? x.device().index() : -1;
  p.dtype = x.scalar_type();
  p.target_dtype = target.scalar_type();
  p.rows = rows_of(x);
  p.classes = x.size(1);
  p.row_stride = x.dim() == 3 ? x.stride(0) : row_stride_of(x);
  p.grad_row_stride = p.classes;
  if (x.dim() == 3) {  // the (N, C, D) layout as it is (the gradient's strides: set_grad_layout)
    p.inner = x.size(2);
    p.class_stride = x.stride(1);
  }
  p.reduction = reduction;
  p.has_weight = has_weight;
  p.smoothing = smoothing;
  p.ignore_index = ignore_index;
  p.acc_loss = acc_loss && p.acc_dtype() != p.dtype;
  return p;
}

struct WeightArgs {
  at::Tensor weight;  // acc dtype, contiguous
  at::Tensor sum;     // W in float64 (only for smoothing with a weight)
};

WeightArgs weight_args(const std::optional<at::Tensor>& weight, c10::ScalarType acc, double smoothing) {
  WeightArgs a;
  if (!weight.has_value()) return a;
  a.weight = weight->to(acc).contiguous();
  // float64: the smoothing loss takes W m - sum_c w_c x_c, which cancels at
  // a large row max m (plan.h); W must be the weights' sum to the last bit
  if (smoothing > 0) a.sum = a.weight.to(at::kDouble).sum();
  return a;
}

// The forward of both ops: `grad` defined (the fused forward) also gets
// the gradient for grad_loss = 1.
std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_into(const char* op, const at::Tensor& logits_in,
                                                            const at::Tensor& target_in,
                                                            const std::optional<at::Tensor>& weight,
                                                            int64_t ignore_index, c10::string_view reduction_name,
                                                            double smoothing, bool acc_loss, at::Tensor* grad) {
  const Reduction reduction = parse_reduction(op, reduction_name);
  const at::Tensor x3 = check_args(op, logits_in, target_in, weight, smoothing);
  if (through_rows(x3)) {
    at::Tensor rows_grad;
    if (grad != nullptr) rows_grad = at::empty({rows_of(x3), x3.size(1)}, x3.options());
    auto out = forward_into(op, as_rows(x3), target_in.reshape({-1}), weight, ignore_index, reduction_name, smoothing,
                            acc_loss, grad != nullptr ? &rows_grad : nullptr);
    if (grad != nullptr) rows_into(*grad, rows_grad);
    return out;
  }
  const at::Tensor& x = x3;
  const at::Tensor target = target_in.contiguous();
  const c10::ScalarType acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const int64_t n = rows_of(x);
  c10::OptionalDeviceGuard guard(x.device());
  const at::TensorOptions loss_options = x.options().dtype(acc_loss ? acc : x.scalar_type());
  at::Tensor loss = reduction == Reduction::None ? at::empty({n}, loss_options) : at::empty({}, loss_options);
  at::Tensor row_stats = at::empty({n, 2}, x.options().dtype(acc));
  at::Tensor total = at::empty({}, x.options().dtype(acc));
  if (n == 0) {
    total.zero_();
    if (reduction != Reduction::None) loss.fill_(reduction == Reduction::Mean ? NAN : 0.0);
    return {loss, row_stats, total};
  }
  const WeightArgs w = weight_args(weight, acc, smoothing);
  CeProblem problem = make_problem(x, target, weight.has_value(), ignore_index, reduction, smoothing, acc_loss);
  if (grad != nullptr) {
    TORCH_CHECK_VALUE(reduction != Reduction::None, op, ": reduction='none' is not accepted; accepted: 'mean', 'sum'");
    problem.fused_grad = true;
    set_grad_layout(problem, *grad);
  }
  const CePlan plan = select_ce(problem, /*backward=*/false);
  CeBuffers b;
  b.logits = x.const_data_ptr();
  b.target = target.const_data_ptr();
  b.weight = w.weight.defined() ? w.weight.const_data_ptr() : nullptr;
  b.weight_sum = w.sum.defined() ? w.sum.const_data_ptr() : nullptr;
  b.loss = loss.mutable_data_ptr();
  b.row_stats = row_stats.mutable_data_ptr();
  b.total_weight = total.mutable_data_ptr();
  if (grad != nullptr) b.grad = grad->mutable_data_ptr();
  const std::string why = can_implement_ce(plan, b, false);
  TORCH_CHECK_VALUE(why.empty(), op, ": ", why);
  at::Tensor workspace;
  if (plan.workspace_bytes > 0) workspace = at::empty({plan.workspace_bytes}, x.options().dtype(at::kByte));
  run_ce_forward(plan, b, workspace.defined() ? workspace.mutable_data_ptr() : nullptr);
  return {loss, row_stats, total};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(const at::Tensor& logits, const at::Tensor& target,
                                                       const std::optional<at::Tensor>& weight,
                                                       int64_t ignore_index, c10::string_view reduction,
                                                       double smoothing, bool /*inplace_backward*/,
                                                       bool acc_loss) {
  return forward_into(kFwd, logits, target, weight, ignore_index, reduction, smoothing, acc_loss, nullptr);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> forward_grad(
    const at::Tensor& logits, const at::Tensor& target, const std::optional<at::Tensor>& weight,
    int64_t ignore_index, c10::string_view reduction, double smoothing, bool acc_loss) {
  at::Tensor grad = at::empty(logits.sizes(), logits.options());  // contiguous, as the fake kernel
  auto [loss, row_stats, total] =
      forward_into(kFwdGrad, logits, target, weight, ignore_index, reduction, smoothing, acc_loss, &grad);
  return {loss, row_stats, total, grad};
}

// grad *= grad_loss, in place: the backward of the fused forward. On CUDA
// the value stays on the device (the kernel skips the pass when it is 1);
// on CPU it is read.
void grad_scale(at::Tensor& grad, const at::Tensor& grad_loss) {
  const char* op = "softmax_ext._cross_entropy_grad_scale_";
  TORCH_CHECK_NOT_IMPLEMENTED(is_supported_dtype(grad.scalar_type()), op, ": grad dtype ", grad.scalar_type(),
                              " is not supported; ", kAcceptedDtypes);
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(grad_loss.scalar_type()), op, ": grad_loss dtype ",
                              grad_loss.scalar_type(), " is not supported; accepted: a floating dtype");
  TORCH_CHECK_VALUE(grad_loss.numel() == 1, op, ": grad_loss has shape ", grad_loss.sizes(), "; expected one value");
  TORCH_CHECK_VALUE(grad_loss.device() == grad.device(), op, ": grad_loss is on ", grad_loss.device(),
                    " but grad is on ", grad.device());
#ifdef SOFTMAX_EXT_WITH_CUDA
  if (grad.is_cuda() && grad.is_contiguous() && reinterpret_cast<uintptr_t>(grad.data_ptr()) % 16 == 0) {
    // the kernel reads the value in its own dtype (no cast launched first)
    // where it is one of the four it knows
    const c10::ScalarType t = grad_loss.scalar_type();
    const bool known = t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
    const at::Tensor value = known ? grad_loss : grad_loss.to(at::kFloat);
    c10::OptionalDeviceGuard guard(grad.device());
    cuda_grad_scale(grad.scalar_type(), grad.device().index(), grad.mutable_data_ptr(), grad.numel(),
                    value.const_data_ptr(), value.scalar_type());
    return;
  }
#endif
  const c10::ScalarType acc = grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor g = grad_loss.to(acc).reshape({});
  if (grad.is_cuda()) {
    grad.mul_(g);  // (a view of other layout: torch's kernel, always one pass)
    return;
  }
  const bool one = g.item<double>() == 1.0;
  set_grad_was_one(false, one);
  if (!one) grad.mul_(g);
}

// Shared by the out-of-place and in-place backward: `grad` is where the
// gradient goes (a new contiguous tensor, or the logits themselves).
void backward_into(const char* op, const at::Tensor& grad_loss, const at::Tensor& x, const at::Tensor& target_in,
                   const std::optional<at::Tensor>& weight, const at::Tensor& row_stats,
                   const at::Tensor& total_weight, int64_t ignore_index, Reduction reduction, double smoothing,
                   at::Tensor& grad) {
  if (through_rows(x)) {
    at::Tensor rows_grad = at::empty({rows_of(x), x.size(1)}, x.options());
    backward_into(op, grad_loss, as_rows(x), target_in.reshape({-1}), weight, row_stats, total_weight, ignore_index,
                  reduction, smoothing, rows_grad);
    rows_into(grad, rows_grad);
    return;
  }
  const int64_t n = rows_of(x);
  const c10::ScalarType acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(grad_loss.scalar_type()), op, ": grad_loss dtype ",
                              grad_loss.scalar_type(), " is not supported; accepted: a floating dtype");
  if (reduction == Reduction::None) {
    TORCH_CHECK_VALUE(grad_loss.dim() == 1 && grad_loss.size(0) == n, op, ": grad_loss has shape ",
                      grad_loss.sizes(), "; expected (", n, ") for reduction='none'");
  } else {
    TORCH_CHECK_VALUE(grad_loss.numel() == 1, op, ": grad_loss has shape ", grad_loss.sizes(),
                      "; expected one value for reduction='mean' or 'sum'");
  }
  TORCH_CHECK_VALUE(row_stats.dim() == 2 && row_stats.size(0) == n && row_stats.size(1) == 2 &&
                        row_stats.scalar_type() == acc,
                    op, ": row_stats has shape ", row_stats.sizes(), " and dtype ", row_stats.scalar_type(),
                    "; expected (", n, ", 2) of ", acc);
  TORCH_CHECK_VALUE(total_weight.numel() == 1 && total_weight.scalar_type() == acc, op,
                    ": total_weight must be one value of ", acc);
  for (const at::Tensor* t : {&grad_loss, &row_stats, &total_weight})
    TORCH_CHECK_VALUE(t->device() == x.device(), op, ": all tensors must be on ", x.device(), ", got one on ",
                      t->device());
  if (n == 0 || x.size(1) == 0) return;
  const at::Tensor target = target_in.contiguous();
  const at::Tensor g = grad_loss.to(acc).contiguous();
  const at::Tensor stats = row_stats.contiguous();
  const WeightArgs w = weight_args(weight, acc, smoothing);
  c10::OptionalDeviceGuard guard(x.device());
  CeProblem problem = make_problem(x, target, weight.has_value(), ignore_index, reduction, smoothing);
  set_grad_layout(problem, grad);
  const CePlan plan = select_ce(problem, /*backward=*/true);
  CeBuffers b;
  b.logits = x.const_data_ptr();
  b.target = target.const_data_ptr();
  b.weight = w.weight.defined() ? w.weight.const_data_ptr() : nullptr;
  b.weight_sum = w.sum.defined() ? w.sum.const_data_ptr() : nullptr;
  b.row_stats = const_cast<void*>(stats.const_data_ptr());
  b.total_weight = const_cast<void*>(total_weight.const_data_ptr());
  b.grad_loss = g.const_data_ptr();
  b.grad = grad.mutable_data_ptr();
  if (reduction != Reduction::None) b.grad_one = grad_one_flag(x.is_cuda());
  const std::string why = can_implement_ce(plan, b, true);
  TORCH_CHECK_VALUE(why.empty(), op, ": ", why);
  run_ce_backward(plan, b);
}

at::Tensor backward(const at::Tensor& grad_loss, const at::Tensor& logits, const at::Tensor& target,
                    const std::optional<at::Tensor>& weight, const at::Tensor& row_stats,
                    const at::Tensor& total_weight, int64_t ignore_index, c10::string_view reduction_name,
                    double smoothing) {
  const Reduction reduction = parse_reduction(kBwd, reduction_name);
  const at::Tensor x = check_args(kBwd, logits, target, weight, smoothing);
  at::Tensor grad = at::empty(logits.sizes(), logits.options());  // contiguous, as the fake kernel
  backward_into(kBwd, grad_loss, x, target, weight, row_stats, total_weight, ignore_index, reduction, smoothing, grad);
  return grad;
}

void backward_inplace(const at::Tensor& grad_loss, at::Tensor& logits, const at::Tensor& target,
                      const std::optional<at::Tensor>& weight, const at::Tensor& row_stats,
                      const at::Tensor& total_weight, int64_t ignore_index, c10::string_view reduction_name,
                      double smoothing) {
  const char* op = "softmax_ext._cross_entropy_backward_";
  const Reduction reduction = parse_reduction(op, reduction_name);
  const at::Tensor x = check_args(op, logits, target, weight, smoothing);
  if (!x.is_same(logits)) {  // logits not of unit class stride: through a copy
    at::Tensor grad = at::empty(logits.sizes(), logits.options());
    backward_into(op, grad_loss, x, target, weight, row_stats, total_weight, ignore_index, reduction, smoothing, grad);
    logits.copy_(grad);
    return;
  }
  at::Tensor grad = logits;
  backward_into(op, grad_loss, x, target, weight, row_stats, total_weight, ignore_index, reduction, smoothing, grad);
}

std::tuple<std::string, int64_t, bool, std::string, std::vector<int64_t>> plan_info(const at::Tensor& logits,
                                                                                    bool backward) {
  const char* op = "softmax_ext.plan";
  TORCH_CHECK_NOT_IMPLEMENTED(is_supported_dtype(logits.scalar_type()), op, ": logits dtype ",
                              logits.scalar_type(), " is not supported; ", kAcceptedDtypes);
  TORCH_CHECK_INDEX(logits.dim() >= 1, op, ": cross_entropy logits need a class dimension, got a 0-dim tensor");
  // Rows as the public op forms them: (N, C, d...) -> N * prod(d) rows of C.
  const int64_t classes = logits.dim() == 1 ? logits.size(0) : logits.size(1);
  const int64_t rows = classes == 0 ? 0 : logits.numel() / classes;
  const int64_t stride = logits.dim() == 2 && logits.stride(1) == 1 ? row_stride_of(logits) : classes;
  CeProblem p;
  p.device_type = logits.device().type();
  p.device_index = logits.is_cuda() ? logits.device().index() : -1;
  p.dtype = logits.scalar_type();
  p.rows = rows;
  p.classes = classes;
  p.row_stride = stride;
  p.grad_row_stride = classes;
  if (logits.dim() >= 3 && classes > 0 && logits.size(0) > 0 &&
      ce_reads_layout(p.device_type, rows, rows / logits.size(0))) {  // eager calls read (N, C, d...) as it is
    p.inner = p.class_stride = p.grad_class_stride = rows / logits.size(0);
    p.row_stride = p.grad_row_stride = classes * p.inner;
  }
  const CePlan plan = select_ce(p, backward);
  const std::string acc = p.acc_dtype() == at::kDouble ? "Double" : "Float";
  return {plan.kernel, plan.workspace_bytes, true, acc, {rows, classes, stride, 1, 1, rows, stride}};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(softmax_ext, m) {
  const std::vector<at::Tag> tags = {at::Tag::pt2_compliant_tag};
  m.def("cross_entropy(Tensor logits, Tensor target, Tensor? weight=None, int ignore_index=-100, "
        "str reduction=\"mean\", float label_smoothing=0.0) -> Tensor",
        tags);
  m.def("_cross_entropy_forward(Tensor logits, Tensor target, Tensor? weight=None, int ignore_index=-100, "
        "str reduction=\"mean\", float label_smoothing=0.0, bool inplace_backward=False, bool acc_loss=False) "
        "-> (Tensor loss, Tensor row_stats, Tensor total_weight)",
        tags);
  m.def("_cross_entropy_forward_grad(Tensor logits, Tensor target, Tensor? weight=None, int ignore_index=-100, "
        "str reduction=\"mean\", float label_smoothing=0.0, bool acc_loss=False) "
        "-> (Tensor loss, Tensor row_stats, Tensor total_weight, Tensor grad)",
        tags);
  m.def("_cross_entropy_grad_scale_(Tensor(a!) grad, Tensor grad_loss) -> ()", tags);
  m.def("_cross_entropy_backward(Tensor grad_loss, Tensor logits, Tensor target, Tensor? weight, Tensor row_stats, "
        "Tensor total_weight, int ignore_index, str reduction, float label_smoothing) -> Tensor",
        tags);
  m.def("_cross_entropy_backward_(Tensor grad_loss, Tensor(a!) logits, Tensor target, Tensor? weight, "
        "Tensor row_stats, Tensor total_weight, int ignore_index, str reduction, float label_smoothing) -> ()",
        tags);
  m.def("_plan_cross_entropy(Tensor logits, bool backward) -> (str, int, bool, str, int[])", &plan_info);
}

// One device-generic body per op: the same registrations for CPU and CUDA.
static void impl_kernels(torch::Library& m) {
  m.impl("_cross_entropy_forward", &forward);
  m.impl("_cross_entropy_backward", &backward);
  m.impl("_cross_entropy_backward_", &backward_inplace);
  m.impl("_cross_entropy_forward_grad", &forward_grad);
  m.impl("_cross_entropy_grad_scale_", &grad_scale);
}

TORCH_LIBRARY_IMPL(softmax_ext, CPU, m) { impl_kernels(m); }

#ifdef SOFTMAX_EXT_WITH_CUDA
TORCH_LIBRARY_IMPL(softmax_ext, CUDA, m) { impl_kernels(m); }
#endif

}  // namespace softmax_ext::ce
