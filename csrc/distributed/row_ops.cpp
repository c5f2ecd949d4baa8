// The per-rank ops of the sharded-axis softmax (softmax_ext.distributed):
// schemas, argument checks, the row layout, select -> can_implement -> run.
//
//   softmax_stats(Tensor x, int dim) -> Tensor
//       (..., 2): per row of x along dim, its max and sum(exp(x - max)).
//   softmax_normalize(Tensor x, Tensor stats, int dim, str kind) -> Tensor
//       softmax / log_softmax of x given the row statistics of the whole
//       (sharded) row, e.g. the combination of every rank's softmax_stats.
//   softmax_backward_stats(Tensor grad_output, Tensor output, int dim, str kind) -> Tensor
//       (...): sum(y * dy) (softmax) or sum(dy) (log_softmax) of each row.
//   softmax_backward_normalize(Tensor grad_output, Tensor output, Tensor stats, int dim, str kind) -> Tensor
//       the gradient y * (dy - s) (softmax) or dy - exp(y) * s (log_softmax)
//       given the whole row's statistic s.
//
// "(...)" is x's shape without dim. Statistics are float32 (float64 for
// float64 inputs) and contiguous; outputs take x's (output's) strides when it
// is dense and non-overlapping, contiguous otherwise, like every op of the
// package. _distributed_meta.py mirrors these rules.

#include "distributed/rows.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/strides.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

namespace softmax_ext::distributed {

const char* step_name(Step step) {
  switch (step) {
    case Step::Stats: return "stats";
    case Step::Normalize: return "normalize";
    case Step::BackStats: return "backward_stats";
    case Step::BackApply: return "backward_normalize";
  }
  return "?";
}

RowsPlan select(const RowsProblem& p) {
  RowsPlan plan;
  plan.problem = p;
  std::string name;
  if (p.device_type == c10::DeviceType::CUDA) {
    plan.layout = p.n <= kWarpRowMax ? RowsLayout::kWarpPerRow : RowsLayout::kBlockPerRow;
    name = std::string("cuda.rows.") + step_name(p.step) +
           (plan.layout == RowsLayout::kWarpPerRow ? ".warp_per_row." : ".block_per_row.");
  } else {
    plan.layout = RowsLayout::kCpu;
    name = std::string("cpu.rows.") + step_name(p.step) + ".";
  }
  plan.kernel = name + dtype_tag(p.dtype);
  return plan;
}

void run(const RowsPlan& plan, const RowsBuffers& buffers) {
  const RowsProblem& p = plan.problem;
  if (p.rows == 0) return;
  // (stats may be null for a CPU Normalize that writes its own to stats_out: rows.h)
  const bool own_stats = p.step == Step::Normalize && p.device_type == c10::DeviceType::CPU &&
                         buffers.stats_out != nullptr;
  TORCH_INTERNAL_ASSERT((buffers.stats != nullptr || own_stats) && (p.n == 0 || buffers.a != nullptr),
                        "softmax_ext.distributed: missing buffer for ", plan.kernel);
#ifdef SOFTMAX_EXT_WITH_CUDA
  if (p.device_type == c10::DeviceType::CUDA) return run_cuda(plan, buffers);
#endif
  TORCH_CHECK_NOT_IMPLEMENTED(p.device_type == c10::DeviceType::CPU, "softmax_ext.distributed: device ",
                              p.device_type, " is not supported; accepted: cpu, cuda");
  run_cpu(plan, buffers);
}

namespace {

const char* op_name(Step step) {
  switch (step) {
    case Step::Stats: return "softmax_ext.softmax_stats";
    case Step::Normalize: return "softmax_ext.softmax_normalize";
    case Step::BackStats: return "softmax_ext.softmax_backward_stats";
    case Step::BackApply: return "softmax_ext.softmax_backward_normalize";
  }
  return "?";
}

bool supported(c10::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}
constexpr const char* kAccepted = "accepted: float32, float16, bfloat16, float64";

int64_t wrap_dim(const char* op, int64_t dim, int64_t ndim) {
  const int64_t n = std::max<int64_t>(ndim, 1);
  TORCH_CHECK_INDEX(dim >= -n && dim < n, op, ": dim ", dim, " is out of range for a tensor of ", ndim,
                    " dimension(s) (expected to be in range of [", -n, ", ", n - 1, "])");
  return dim < 0 ? dim + n : dim;
}

Kind parse_kind(const char* op, c10::string_view kind) {
  if (kind == "softmax") return Kind::Softmax;
  if (kind == "log_softmax") return Kind::LogSoftmax;
  TORCH_CHECK_VALUE(false, op, ": kind='", std::string(kind), "' is not known; accepted: 'softmax', 'log_softmax'");
  return Kind::Softmax;
}

c10::ScalarType acc_of(c10::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

std::vector<int64_t> batch_shape(const at::Tensor& t, int64_t axis) {
  std::vector<int64_t> s;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (d != axis) s.push_back(t.size(d));
  return s;
}

at::Tensor new_output(const at::Tensor& like) {
  if (like.is_non_overlapping_and_dense()) return at::empty_strided(like.sizes(), like.strides(), like.options());
  return at::empty(like.sizes(), like.options());
}

// The operands seen as (rows, n): the batch dimensions ordered by the
// reference tensor's strides (outermost first), the axis last. Tensors laid
// out like a dense reference whose axis has unit stride are then contiguous
// in that order and read in place; anything else is copied once.
struct Rows {
  std::vector<int64_t> perm;        // batch dims (memory order), then the axis
  std::vector<int64_t> stats_perm;  // the same order for a stats tensor (batch..., [2])
  int64_t rows = 1;
  int64_t n = 1;

  Rows(const at::Tensor& ref, int64_t axis) {
    for (int64_t d = 0; d < ref.dim(); ++d)
      if (d != axis) perm.push_back(d);
    std::stable_sort(perm.begin(), perm.end(),
                     [&](int64_t a, int64_t b) { return ref.stride(a) > ref.stride(b); });
    for (int64_t d : perm) {
      stats_perm.push_back(d < axis ? d : d - 1);
      rows *= ref.size(d);
    }
    perm.push_back(axis);
    n = ref.size(axis);
  }
  at::Tensor in(const at::Tensor& t) const { return t.permute(perm).contiguous().view({rows, n}); }
  at::Tensor stats_in(const at::Tensor& s, bool pair) const {
    std::vector<int64_t> p = stats_perm;
    if (pair) p.push_back(static_cast<int64_t>(stats_perm.size()));
    at::Tensor v = s.permute(p).contiguous();
    return pair ? v.view({rows, 2}) : v.view({rows});
  }
};

// Stats written in the memory order of the rows, returned in the logical
// order (contiguous).
at::Tensor stats_out(const Rows& r, const at::Tensor& tmp, const at::Tensor& logical) {
  if (std::is_sorted(r.stats_perm.begin(), r.stats_perm.end())) return tmp.view(logical.sizes());
  std::vector<int64_t> sizes;
  for (int64_t d : r.stats_perm) sizes.push_back(logical.size(d));
  const bool pair = logical.dim() > static_cast<int64_t>(r.stats_perm.size());
  if (pair) sizes.push_back(2);
  std::vector<int64_t> inverse(sizes.size());
  for (size_t i = 0; i < r.stats_perm.size(); ++i) inverse[r.stats_perm[i]] = static_cast<int64_t>(i);
  if (pair) inverse.back() = static_cast<int64_t>(sizes.size()) - 1;
  logical.copy_(tmp.view(sizes).permute(inverse));
  return logical;
}

// The output's (rows, n) view when it is contiguous in the row order,
// otherwise a contiguous buffer to copy back afterwards.
at::Tensor out_rows(const Rows& r, const at::Tensor& out, bool& copy_back) {
  at::Tensor v = out.permute(r.perm);
  copy_back = !v.is_contiguous();
  return copy_back ? at::empty({r.rows, r.n}, out.options()) : v.view({r.rows, r.n});
}

RowsPlan plan_for(Step step, Kind kind, const at::Tensor& x, const Rows& r) {
  RowsProblem p;
  p.step = step;
  p.kind = kind;
  p.device_type = x.device().type();
  p.dtype = x.scalar_type();
  p.rows = r.rows;
  p.n = r.n;
  return select(p);
}

void launch(const RowsPlan& plan, const RowsBuffers& buffers, const at::Tensor& like) {
  c10::OptionalDeviceGuard guard(like.device());
  run(plan, buffers);
}

void check_stats(const char* op, const at::Tensor& stats, const at::Tensor& like, std::vector<int64_t> shape) {
  TORCH_CHECK_VALUE(stats.device() == like.device(), op, ": stats is on ", stats.device(), " but the input is on ",
                    like.device(), "; both must be on one device");
  TORCH_CHECK_VALUE(stats.scalar_type() == acc_of(like.scalar_type()), op, ": stats has dtype ",
                    stats.scalar_type(), " but a ", like.scalar_type(), " input takes ", acc_of(like.scalar_type()),
                    " statistics");
  TORCH_CHECK_VALUE(stats.sizes() == c10::IntArrayRef(shape), op, ": stats has shape ", stats.sizes(),
                    " but the input's rows take shape ", c10::IntArrayRef(shape));
}

void check_pair(const char* op, const at::Tensor& grad, const at::Tensor& out) {
  TORCH_CHECK_VALUE(grad.device() == out.device(), op, ": grad_output is on ", grad.device(), " but output is on ",
                    out.device(), "; both must be on one device");
  TORCH_CHECK_VALUE(grad.sizes() == out.sizes(), op, ": grad_output has shape ", grad.sizes(),
                    " but output has shape ", out.sizes(), "; the shapes must be equal");
  TORCH_CHECK_VALUE(grad.scalar_type() == out.scalar_type(), op, ": grad_output has dtype ", grad.scalar_type(),
                    " but output has dtype ", out.scalar_type(), "; the dtypes must be equal");
  TORCH_CHECK_NOT_IMPLEMENTED(supported(out.scalar_type()), op, ": dtype ", out.scalar_type(),
                              " is not supported; ", kAccepted);
}

// A 0-dim tensor is one row of one element.
at::Tensor as_1d(const at::Tensor& t) { return t.dim() == 0 ? t.reshape({1}) : t; }

}  // namespace

at::Tensor softmax_stats(const at::Tensor& x_in, int64_t dim) {
  const char* op = op_name(Step::Stats);
  TORCH_CHECK_NOT_IMPLEMENTED(supported(x_in.scalar_type()), op, ": input dtype ", x_in.scalar_type(),
                              " is not supported; ", kAccepted);
  const int64_t axis = wrap_dim(op, dim, x_in.dim());
  const at::Tensor x = as_1d(x_in);
  std::vector<int64_t> shape = batch_shape(x_in, axis);
  shape.push_back(2);
  at::Tensor stats = at::empty(shape, x.options().dtype(acc_of(x.scalar_type())));
  if (stats.numel() == 0) return stats;
  const Rows r(x, axis);
  const at::Tensor xr = r.in(x);
  at::Tensor tmp = std::is_sorted(r.stats_perm.begin(), r.stats_perm.end()) ? stats : at::empty_like(stats);
  launch(plan_for(Step::Stats, Kind::Softmax, x, r), {xr.const_data_ptr(), nullptr, tmp.mutable_data_ptr(), nullptr},
         x);
  return stats_out(r, tmp.view({r.rows, 2}), stats);
}

// The Normalize step of x along `axis` with the statistics stats_in, or
// (stats_in undefined; CPU) with each row's statistics computed in the same
// pass and returned in *stats (the shape softmax_stats returns).
static at::Tensor normalize_rows(const at::Tensor& x_in, const at::Tensor& stats_in, int64_t axis, Kind kind,
                                 at::Tensor* stats) {
  at::Tensor y = new_output(x_in);
  if (stats != nullptr) {
    std::vector<int64_t> shape = batch_shape(x_in, axis);
    shape.push_back(2);
    *stats = at::empty(shape, x_in.options().dtype(acc_of(x_in.scalar_type())));
  }
  if (y.numel() == 0) {
    if (stats != nullptr && stats->numel() > 0) {  // rows of no element: (-inf, 0), as the Stats step
      stats->select(-1, 0).fill_(-std::numeric_limits<double>::infinity());
      stats->select(-1, 1).zero_();
    }
    return y;
  }
  const at::Tensor x = as_1d(x_in);
  at::Tensor y1 = as_1d(y);
  const Rows r(y1, axis);
  const at::Tensor xr = r.in(x);
  bool copy_back = false;
  at::Tensor yr = out_rows(r, y1, copy_back);
  RowsBuffers buffers{xr.const_data_ptr(), nullptr, nullptr, yr.mutable_data_ptr()};
  at::Tensor sr, tmp;
  if (stats == nullptr) {
    sr = r.stats_in(stats_in, true);
    buffers.stats = const_cast<void*>(sr.const_data_ptr());
  } else {
    tmp = at::empty({r.rows, 2}, stats->options());
    buffers.stats_out = tmp.mutable_data_ptr();
  }
  launch(plan_for(Step::Normalize, kind, x, r), buffers, x);
  if (copy_back) y1.permute(r.perm).copy_(yr.view(y1.permute(r.perm).sizes()));
  if (stats != nullptr) *stats = stats_out(r, tmp, *stats);
  return y;
}

at::Tensor softmax_normalize(const at::Tensor& x_in, const at::Tensor& stats_in, int64_t dim,
                             c10::string_view kind_name) {
  const char* op = op_name(Step::Normalize);
  const Kind kind = parse_kind(op, kind_name);
  TORCH_CHECK_NOT_IMPLEMENTED(supported(x_in.scalar_type()), op, ": input dtype ", x_in.scalar_type(),
                              " is not supported; ", kAccepted);
  const int64_t axis = wrap_dim(op, dim, x_in.dim());
  std::vector<int64_t> shape = batch_shape(x_in, axis);
  shape.push_back(2);
  check_stats(op, stats_in, x_in, shape);
  return normalize_rows(x_in, stats_in, axis, kind, nullptr);
}

std::tuple<at::Tensor, at::Tensor> softmax_with_stats(const at::Tensor& x_in, int64_t dim) {
  const char* op = "softmax_ext.softmax_with_stats";
  TORCH_CHECK_NOT_IMPLEMENTED(x_in.is_cpu(), op, ": a CPU path; the input is on ", x_in.device());
  TORCH_CHECK_NOT_IMPLEMENTED(supported(x_in.scalar_type()), op, ": input dtype ", x_in.scalar_type(),
                              " is not supported; ", kAccepted);
  at::Tensor stats;
  at::Tensor y = normalize_rows(x_in, at::Tensor(), wrap_dim(op, dim, x_in.dim()), Kind::Softmax, &stats);
  return {y, stats};
}

at::Tensor softmax_backward_stats(const at::Tensor& grad_in, const at::Tensor& out_in, int64_t dim,
                                  c10::string_view kind_name) {
  const char* op = op_name(Step::BackStats);
  const Kind kind = parse_kind(op, kind_name);
  check_pair(op, grad_in, out_in);
  const int64_t axis = wrap_dim(op, dim, out_in.dim());
  at::Tensor stats = at::empty(batch_shape(out_in, axis), out_in.options().dtype(acc_of(out_in.scalar_type())));
  if (stats.numel() == 0) return stats;
  const at::Tensor g = as_1d(grad_in), y = as_1d(out_in);
  const Rows r(y, axis);
  const at::Tensor gr = r.in(g), yr = r.in(y);
  at::Tensor tmp = std::is_sorted(r.stats_perm.begin(), r.stats_perm.end()) ? stats : at::empty_like(stats);
  launch(plan_for(Step::BackStats, kind, y, r),
         {gr.const_data_ptr(), yr.const_data_ptr(), tmp.mutable_data_ptr(), nullptr}, y);
  return stats_out(r, tmp.view({r.rows}), stats);
}

at::Tensor softmax_backward_normalize(const at::Tensor& grad_in, const at::Tensor& out_in, const at::Tensor& stats_in,
                                      int64_t dim, c10::string_view kind_name) {
  const char* op = op_name(Step::BackApply);
  const Kind kind = parse_kind(op, kind_name);
  check_pair(op, grad_in, out_in);
  const int64_t axis = wrap_dim(op, dim, out_in.dim());
  check_stats(op, stats_in, out_in, batch_shape(out_in, axis));
  at::Tensor dx = new_output(out_in);
  if (dx.numel() == 0) return dx;
  const at::Tensor g = as_1d(grad_in), y = as_1d(out_in);
  at::Tensor dx1 = as_1d(dx);
  const Rows r(dx1, axis);
  const at::Tensor gr = r.in(g), yr = r.in(y);
  const at::Tensor sr = r.stats_in(stats_in, false);
  bool copy_back = false;
  at::Tensor dxr = out_rows(r, dx1, copy_back);
  launch(plan_for(Step::BackApply, kind, y, r),
         {gr.const_data_ptr(), yr.const_data_ptr(), const_cast<void*>(sr.const_data_ptr()), dxr.mutable_data_ptr()},
         y);
  if (copy_back) dx1.permute(r.perm).copy_(dxr.view(dx1.permute(r.perm).sizes()));
  return dx;
}

// What would run for a step on tensors like x: (kernel name, rows, row length).
std::tuple<std::string, int64_t, int64_t> rows_plan(const at::Tensor& x, int64_t dim, c10::string_view step_name_) {
  const char* op = "softmax_ext.distributed.plan";
  Step step;
  if (step_name_ == "stats") step = Step::Stats;
  else if (step_name_ == "normalize") step = Step::Normalize;
  else if (step_name_ == "backward_stats") step = Step::BackStats;
  else if (step_name_ == "backward_normalize") step = Step::BackApply;
  else TORCH_CHECK_VALUE(false, op, ": step='", std::string(step_name_),
                         "' is not known; accepted: 'stats', 'normalize', 'backward_stats', 'backward_normalize'");
  TORCH_CHECK_NOT_IMPLEMENTED(supported(x.scalar_type()), op, ": input dtype ", x.scalar_type(),
                              " is not supported; ", kAccepted);
  const int64_t axis = wrap_dim(op, dim, x.dim());
  const at::Tensor x1 = as_1d(x);
  const Rows r(x1, axis);
  const RowsPlan plan = plan_for(step, Kind::Softmax, x1, r);
  return {plan.kernel, r.rows, r.n};
}

TORCH_LIBRARY_FRAGMENT(softmax_ext, m) {
  const std::vector<at::Tag> tags = {at::Tag::pt2_compliant_tag};
  m.def("softmax_stats(Tensor x, int dim) -> Tensor", tags);
  m.def("softmax_normalize(Tensor x, Tensor stats, int dim, str kind) -> Tensor", tags);
  m.def("softmax_backward_stats(Tensor grad_output, Tensor output, int dim, str kind) -> Tensor", tags);
  m.def("softmax_backward_normalize(Tensor grad_output, Tensor output, Tensor stats, int dim, str kind) -> Tensor",
        tags);
  m.def("_rows_plan(Tensor x, int dim, str step) -> (str, int, int)", &rows_plan);
}

// One device-generic body per op: the same registrations for CPU and CUDA.
static void impl_kernels(torch::Library& m) {
  m.impl("softmax_stats", &softmax_stats);
  m.impl("softmax_normalize", &softmax_normalize);
  m.impl("softmax_backward_stats", &softmax_backward_stats);
  m.impl("softmax_backward_normalize", &softmax_backward_normalize);
}

TORCH_LIBRARY_IMPL(softmax_ext, CPU, m) { impl_kernels(m); }

#ifdef SOFTMAX_EXT_WITH_CUDA
TORCH_LIBRARY_IMPL(softmax_ext, CUDA, m) { impl_kernels(m); }
#endif

}  // namespace softmax_ext::distributed
