// The op bodies, shared by the CPU and CUDA dispatch keys: validate the
// arguments, allocate the output, then describe -> select -> can_implement ->
// run. Only the kernel launch differs between devices, and that is the plan's
// business (plan/run.cpp).

#include "ops/ops.h"

#include "plan/plan.h"
#ifdef SOFTMAX_EXT_WITH_CUDA
#include "cuda/core/layout_copy.h"
#endif

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/strides.h>
#include <torch/library.h>


namespace softmax_ext {
namespace {

const char* op_name(Kind kind, Direction direction) {
  const bool log = kind == Kind::LogSoftmax;
  if (direction == Direction::Forward) return log ? "softmax_ext.log_softmax" : "softmax_ext.softmax";
  return log ? "softmax_ext.log_softmax_backward" : "softmax_ext.softmax_backward";
}

// Like torch: a 0-dim tensor accepts dim 0 and -1.
int64_t wrap_dim(const char* op, int64_t dim, int64_t ndim) {
  const int64_t n = std::max<int64_t>(ndim, 1);
  TORCH_CHECK_INDEX(dim >= -n && dim < n, op, ": dim ", dim, " is out of range for a tensor of ",
                    ndim, " dimension(s) (expected to be in range of [", -n, ", ", n - 1, "])");
  return dim < 0 ? dim + n : dim;
}

[[noreturn]] void throw_status(const char* op, const Status& status) {
  if (status.code == StatusCode::kUnsupported) TORCH_CHECK_NOT_IMPLEMENTED(false, op, ": ", status.message);
  TORCH_CHECK_VALUE(false, op, ": ", status.message);
  TORCH_INTERNAL_ASSERT(false);
}

// The output layout of the SPEC: the same strides as `like` when it is dense
// and non-overlapping, contiguous otherwise. _meta.py mirrors this rule.
c10::DimVector output_strides(const at::Tensor& like) {
  if (like.is_non_overlapping_and_dense()) return c10::DimVector(like.strides());
  return c10::contiguous_strides(like.sizes());
}

at::Tensor new_output(const at::Tensor& like, c10::ScalarType dtype) {
  return at::empty_strided(like.sizes(), output_strides(like), like.options().dtype(dtype));
}

// Sizes with a 0-dim tensor read as one element.
c10::IntArrayRef sizes_of(const at::Tensor& t) {
  static const int64_t kOne[] = {1};
  return t.dim() == 0 ? c10::IntArrayRef(kOne) : t.sizes();
}

Plan make_plan(const char* op, Kind kind, Direction direction, const at::Tensor& like,
               c10::ScalarType in_dtype, c10::ScalarType out_dtype, int64_t axis,
               const c10::IntArrayRef (&strides)[kNumOperands], const void* const (&bases)[kNumOperands]) {
  Problem problem;
  Status status = describe(kind, direction, like.device().type(), in_dtype, out_dtype,
                           sizes_of(like), strides, bases, axis, problem);
  if (!status.ok()) throw_status(op, status);
  problem.device_index = like.is_cuda() ? like.device().index() : -1;
  Plan plan;
  status = select(problem, plan);
  if (!status.ok()) throw_status(op, status);
  return plan;
}

// dst = src across layouts. On CUDA a transposing copy goes through shared
// memory tiles, faster than at::Tensor::copy_ there (docs/tuning/reference.md).
void copy_into(at::Tensor& dst, const at::Tensor& src) {
#ifdef SOFTMAX_EXT_WITH_CUDA
  if (dst.is_cuda()) {
    c10::OptionalDeviceGuard guard(dst.device());
    if (cuda::copy_across_layouts(src.const_data_ptr(), dst.mutable_data_ptr(), dst.element_size(), dst.sizes(),
                                  src.strides(), dst.strides()))
      return;
  }
#endif
  dst.copy_(src);
}

void launch(const char* op, const Plan& plan, const Buffers& buffers, const at::Tensor& like) {
  const Status status = can_implement(plan, buffers);
  if (!status.ok()) throw_status(op, status);
  c10::OptionalDeviceGuard guard(like.device());
  at::Tensor workspace;
  if (plan.workspace_bytes > 0)
    workspace = at::empty({plan.workspace_bytes}, like.options().dtype(at::kByte));
  run(plan, buffers, workspace.defined() ? workspace.data_ptr() : nullptr);
}

// Validates a forward call; returns x as the kernel reads it. A non-floating
// input with a floating `dtype=` is cast first (the one case with an extra
// pass: there is no integer kernel).
at::Tensor check_forward(const char* op, const at::Tensor& x, std::optional<c10::ScalarType> dtype) {
  if (dtype.has_value())
    TORCH_CHECK_NOT_IMPLEMENTED(is_supported_dtype(*dtype), op, ": dtype=", *dtype,
                                " is not supported; ", kAcceptedDtypes);
  if (is_supported_dtype(x.scalar_type())) return x;
  TORCH_CHECK_NOT_IMPLEMENTED(dtype.has_value(), op, ": input dtype ", x.scalar_type(), " is not supported; ",
                              kAcceptedDtypes, " (an integer, bool or complex input needs dtype= naming one of them)");
  return x.to(*dtype);  // like torch: a complex input loses its imaginary part (with torch's warning)
}

at::Tensor forward(Kind kind, const at::Tensor& x_in, int64_t dim, std::optional<c10::ScalarType> dtype) {
  const char* op = op_name(kind, Direction::Forward);
  const at::Tensor x = check_forward(op, x_in, dtype);
  const int64_t axis = wrap_dim(op, dim, x.dim());
  const c10::ScalarType out_dtype = dtype.value_or(x.scalar_type());
  at::Tensor y = new_output(x, out_dtype);
  if (y.numel() == 0) return y;
  const Plan plan = make_plan(op, kind, Direction::Forward, x, x.scalar_type(), out_dtype, axis,
                              {x.strides(), {}, y.strides()}, {x.const_data_ptr(), nullptr, y.const_data_ptr()});
  launch(op, plan, {x.const_data_ptr(), nullptr, y.mutable_data_ptr()}, x);
  return y;
}

void check_backward(const char* op, const at::Tensor& grad, const at::Tensor& out) {
  TORCH_CHECK_VALUE(grad.device() == out.device(), op, ": grad_output is on ", grad.device(),
                    " but output is on ", out.device(), "; both must be on one device");
  TORCH_CHECK_VALUE(grad.sizes() == out.sizes(), op, ": grad_output has shape ", grad.sizes(),
                    " but output has shape ", out.sizes(), "; the shapes must be equal");
  TORCH_CHECK_NOT_IMPLEMENTED(is_supported_dtype(out.scalar_type()), op, ": output dtype ",
                              out.scalar_type(), " is not supported; ", kAcceptedDtypes);
  TORCH_CHECK_NOT_IMPLEMENTED(is_supported_dtype(grad.scalar_type()), op, ": grad_output dtype ",
                              grad.scalar_type(), " is not supported; ", kAcceptedDtypes);
}

// The dtype a backward with grad_output and output of different dtypes
// computes in: float64 if either is float64, float32 otherwise.
c10::ScalarType mixed_compute_dtype(const at::Tensor& grad, const at::Tensor& out) {
  return grad.scalar_type() == at::kDouble || out.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// grad_input takes the layout of `output` (which has x's layout when it came
// from the forward op), so the gradient lands in x's layout.
at::Tensor backward(Kind kind, const at::Tensor& grad, const at::Tensor& out, int64_t dim) {
  const char* op = op_name(kind, Direction::Backward);
  check_backward(op, grad, out);
  const int64_t axis = wrap_dim(op, dim, out.dim());
  if (grad.scalar_type() != out.scalar_type()) {
    // A traced backward (torch.compile) can hand over grad_output in another
    // dtype than output. Widening is exact, so the result is the one of a
    // kernel reading both as they are: the maths in the compute dtype, one
    // rounding to output's dtype.
    const c10::ScalarType c = mixed_compute_dtype(grad, out);
    return backward(kind, grad.to(c), out.to(c), axis).to(out.scalar_type());
  }
  at::Tensor dx = new_output(out, out.scalar_type());
  if (dx.numel() == 0) return dx;
  const c10::ScalarType t = out.scalar_type();
  const Plan plan = make_plan(op, kind, Direction::Backward, out, t, t, axis,
                              {grad.strides(), out.strides(), dx.strides()},
                              {grad.const_data_ptr(), out.const_data_ptr(), dx.const_data_ptr()});
  at::Tensor g = grad;
  if (plan.relayout_in0) {  // select() runs the problem on grad_output in dx's layout
    g = at::empty_strided(dx.sizes(), dx.strides(), grad.options());
    copy_into(g, grad);
  }
  launch(op, plan, {g.const_data_ptr(), out.const_data_ptr(), dx.mutable_data_ptr()}, out);
  return dx;
}

}  // namespace

at::Tensor softmax(const at::Tensor& x, int64_t dim, std::optional<c10::ScalarType> dtype) {
  return forward(Kind::Softmax, x, dim, dtype);
}
at::Tensor log_softmax(const at::Tensor& x, int64_t dim, std::optional<c10::ScalarType> dtype) {
  return forward(Kind::LogSoftmax, x, dim, dtype);
}
at::Tensor softmax_backward(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim) {
  return backward(Kind::Softmax, grad_output, output, dim);
}
at::Tensor log_softmax_backward(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim) {
  return backward(Kind::LogSoftmax, grad_output, output, dim);
}

PlanInfo plan_info(const at::Tensor& x, int64_t dim, c10::string_view kind_name, bool backward,
                   std::optional<c10::ScalarType> dtype) {
  const char* op = "softmax_ext.plan";
  TORCH_CHECK_VALUE(kind_name == "softmax" || kind_name == "log_softmax", op, ": kind='",
                    std::string(kind_name), "' is not known; accepted: 'softmax', 'log_softmax'");
  const Kind kind = kind_name == "softmax" ? Kind::Softmax : Kind::LogSoftmax;
  const Direction direction = backward ? Direction::Backward : Direction::Forward;
  const at::Tensor xs = backward ? x : check_forward(op, x, dtype);
  if (backward) check_backward(op, x, x);
  const int64_t axis = wrap_dim(op, dim, xs.dim());
  const c10::ScalarType out_dtype = backward ? xs.scalar_type() : dtype.value_or(xs.scalar_type());
  const c10::DimVector y_strides = output_strides(xs);
  const c10::IntArrayRef y_ref(y_strides);
  // y (and backward, output) new allocations; only x's pointer is known.
  const Plan plan = make_plan(op, kind, direction, xs, xs.scalar_type(), out_dtype, axis,
                              {xs.strides(), backward ? y_ref : c10::IntArrayRef{}, y_ref},
                              {xs.const_data_ptr(), nullptr, nullptr});
  const Problem& p = plan.problem;
  std::vector<int64_t> problem = {p.rows, p.axis_size, p.axis_stride[kIn0], p.inner_size(), p.batch_rank};
  for (int d = 0; d < p.batch_rank; ++d) problem.push_back(p.batch_size[d]);
  for (int d = 0; d < p.batch_rank; ++d) problem.push_back(p.batch_stride[kIn0][d]);
  return {plan.kernel, plan.workspace_bytes, plan.deterministic, c10::toString(plan.accumulator),
          std::move(problem)};
}

// One device-generic body per op: the same registrations for CPU and CUDA.
static void impl_kernels(torch::Library& m) {
  m.impl("softmax", &softmax);
  m.impl("log_softmax", &log_softmax);
  m.impl("softmax_backward", &softmax_backward);
  m.impl("log_softmax_backward", &log_softmax_backward);
}

TORCH_LIBRARY_IMPL(softmax_ext, CPU, m) { impl_kernels(m); }

#ifdef SOFTMAX_EXT_WITH_CUDA
TORCH_LIBRARY_IMPL(softmax_ext, CUDA, m) { impl_kernels(m); }
#endif

}  // namespace softmax_ext
