// softmax_matmul's op bodies and registration (its own TORCH_LIBRARY_FRAGMENT):
//
//   softmax_matmul(x, v) -> out                 CompositeImplicitAutograd: calls
//                                               the forward below, keeps `out`
//   _softmax_matmul_forward(x, v) -> (out, lse) the kernels; lse (..., d1) f32
//                                               (f64 for f64) for the backward
//   _softmax_matmul_backward(dO, x, v, out, lse) -> (dx, dv)
//   _softmax_matmul_plan(x, v, backward) -> the plan, for softmax_ext.plan()
//
// Autograd is autograd.cpp's; the fake kernels are registered from Python
// (softmax_ext/_softmax_matmul.py). Every call goes describe -> select ->
// can_implement -> run (plan.h).
#include "ops/autograd.h"
#include "softmax_matmul/blocked.h"
#include "softmax_matmul/plan.h"
#ifdef SOFTMAX_EXT_WITH_CUDA
#include "plan/family.h"
#include "cuda/families/softmax_matmul/cuda_launch.h"
#endif

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cstdlib>
#include <limits>
#include <optional>
#include <sstream>

namespace softmax_ext::smm {
namespace {

constexpr const char* kOp = "softmax_ext.softmax_matmul";

std::string shape_str(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

// x, v as 3-d (batch, rows, cols) views (a copy only where the leading dims
// cannot be merged into one stride).
at::Tensor as_3d(const at::Tensor& t) {
  int64_t batch = 1;
  for (int64_t i = 0; i + 2 < t.dim(); ++i) batch *= t.size(i);
  return t.reshape({batch, t.size(-2), t.size(-1)});
}

// torch's Python spelling (torch.float32), as the fake kernels print it.
std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kBool: return "torch.bool";
    default: return std::string("torch.") + c10::toString(t);
  }
}

// ValueError for arguments that disagree, NotImplementedError for dtypes.
void check_args(const char* op, const at::Tensor& x, const at::Tensor& v) {
  TORCH_CHECK_VALUE(x.device() == v.device(), op, ": x is on ", x.device(), " but v is on ", v.device(),
                    "; both must be on the same device");
  TORCH_CHECK_VALUE(x.scalar_type() == v.scalar_type(), op, ": x has dtype ", dtype_name(x.scalar_type()),
                    " but v has dtype ", dtype_name(v.scalar_type()), "; both must have the same dtype");
  const auto t = x.scalar_type();
  TORCH_CHECK_NOT_IMPLEMENTED(t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble,
                              op, ": dtype ", dtype_name(t), " is not supported; accepted: float32, float16, bfloat16, float64");
  TORCH_CHECK_VALUE(x.dim() >= 2 && v.dim() >= 2, op, ": x ", shape_str(x), " and v ", shape_str(v),
                    " must have at least 2 dimensions: x (..., d1, d2), v (..., d2, d3)");
  TORCH_CHECK_VALUE(x.dim() == v.dim() && x.sizes().slice(0, x.dim() - 2) == v.sizes().slice(0, v.dim() - 2),
                    op, ": x has shape ", shape_str(x), " and v has shape ", shape_str(v),
                    "; their leading dimensions must be equal (no broadcasting)");
  TORCH_CHECK_VALUE(x.size(-1) == v.size(-2), op, ": x has shape ", shape_str(x), " and v has shape ",
                    shape_str(v), "; x.size(-1) (d2) must equal v.size(-2)");
}

Descriptor describe(const at::Tensor& x3, const at::Tensor& v3) {
  Descriptor d;
  d.batch = x3.size(0);
  d.d1 = x3.size(1);
  d.d2 = x3.size(2);
  d.d3 = v3.size(2);
  for (int i = 0; i < 3; ++i) {
    d.x_strides[i] = x3.stride(i);
    d.v_strides[i] = v3.stride(i);
  }
  d.dtype = x3.scalar_type();
  d.device = x3.device().type();
  if (x3.is_cuda()) {
    d.allow_tf32 = at::globalContext().allowTF32CuBLAS();
    d.aligned16 = reinterpret_cast<uintptr_t>(x3.data_ptr()) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(v3.data_ptr()) % 16 == 0;
#ifdef SOFTMAX_EXT_WITH_CUDA
    const DeviceFacts& facts = softmax_ext::cuda::device_facts(x3.get_device());  // cached
    d.arch = facts.arch;
    d.sms = facts.sms;
#endif
  }
  return d;
}

void raise(const Status& s) {
  if (s.code == Code::kUnsupported) TORCH_CHECK_NOT_IMPLEMENTED(false, kOp, ": ", s.message);
  TORCH_CHECK_VALUE(false, kOp, ": ", s.message);
}

Plan make_plan(const Descriptor& d, bool backward) {
  Plan p;
  const Status s = select(d, backward, &p);
  if (!s.ok()) raise(s);
  return p;
}

std::vector<int64_t> out_shape(const at::Tensor& x, const at::Tensor& v) {
  std::vector<int64_t> s(x.sizes().begin(), x.sizes().end() - 1);
  s.push_back(v.size(-1));
  return s;
}

#ifdef SOFTMAX_EXT_WITH_CUDA
// The problem fields that the forward's and the backward's launch arguments share.
template <typename LaunchArgs>
void set_problem(LaunchArgs& a, const Descriptor& d) {
  a.batch = d.batch;
  a.d1 = d.d1;
  a.d2 = d.d2;
  a.d3 = d.d3;
  a.x_batch_stride = d.x_strides[0];
  a.x_row_stride = d.x_strides[1];
  a.v_batch_stride = d.v_strides[0];
  a.v_row_stride = d.v_strides[1];
}

// Whether t3's rows are laid out as the Hopper kernels read them: unit
// column stride, row (and batch) strides of whole 16-byte chunks (`vec`
// elements), a 16-byte aligned start.
bool hopper_rows(const at::Tensor& t3, int64_t vec) {
  return t3.stride(2) == 1 && t3.stride(1) % vec == 0 && (t3.size(0) <= 1 || t3.stride(0) % vec == 0) &&
         reinterpret_cast<uintptr_t>(t3.data_ptr()) % 16 == 0;
}

// The row stride of `cols` columns rounded up to whole 16-byte chunks of
// `vec` elements.
int64_t hopper_row_stride(int64_t cols, int64_t vec) { return (cols + vec - 1) / vec * vec; }

// A copy of t3 with rows 16 bytes apart (hopper_row_stride), viewed at t3's sizes.
at::Tensor with_hopper_rows(const at::Tensor& t3, int64_t vec) {
  const int64_t cols = hopper_row_stride(t3.size(2), vec);
  at::Tensor view = at::empty({t3.size(0), t3.size(1), cols}, t3.options()).narrow(2, 0, t3.size(2));
  view.copy_(t3);
  return view;
}

// On sm_90 the forward takes the Hopper kernels only for rows of whole
// 16-byte chunks (d2 or d3 a multiple of 8 16-bit / 4 float32 elements, or
// such strides); otherwise the mma.sync kernel, about half as fast. Where
// the Hopper plan would take x and v with their rows so laid out, the
// forward copies them so (one pass over the tensor that needs it): which
// of the two (and their rows' multiple, `vec` elements), and that plan in
// *hopper (its name marked ".rows_copied", the copies counted in its
// workspace).
struct RowCopies {
  bool x = false, v = false;
  int64_t vec = 0;
};
RowCopies hopper_row_copies(const at::Tensor& x3, const at::Tensor& v3, const Plan& plan, Plan* hopper) {
  if (plan.kernel != Kernel::kCudaMma || !wgmma_built()) return {};
  Descriptor d = describe(x3, v3);
  if (d.arch != 90 || d.dtype == at::kDouble) return {};
  const int64_t vec = d.dtype == at::kFloat ? 4 : 8;
  RowCopies c{!hopper_rows(x3, vec), !hopper_rows(v3, vec), vec};
  if (!c.x && !c.v) return {};  // the mma.sync kernel for another reason
  int64_t copied = 0;
  auto rows = [vec, &copied, &d](int64_t(&st)[3], int64_t n_rows, int64_t cols) {
    st[1] = hopper_row_stride(cols, vec);
    st[0] = n_rows * st[1];
    st[2] = 1;
    copied += d.batch * st[0] * static_cast<int64_t>(c10::elementSize(d.dtype));
  };
  if (c.x) rows(d.x_strides, d.d1, d.d2);
  if (c.v) rows(d.v_strides, d.d2, d.d3);
  d.aligned16 = true;
  if (!select(d, false, hopper).ok() || hopper->kernel != Kernel::kCudaWgmma) return {};
  // float32 x whose rows would need the copy stays with the mma.sync kernel,
  // which reads them as they are: the copy is a pass over x as long as the
  // Hopper kernel's own (TF32; 3xTF32 where d3 <= 64: its mma.sync tile for
  // more columns is 128 x 128; docs/softmax_matmul.md, "Float32 rows not in
  // 16-byte chunks"), but where the Hopper plan cuts d2 into parts (few
  // rows against a long d2, which the mma.sync kernel walks with few CTAs).
  if (d.dtype == at::kFloat && c.x && hopper->parts == 1 && (plan.math == Math::kTF32 || d.d3 <= 64)) return {};
  hopper->name += ".rows_copied";
  hopper->workspace_bytes += copied;
  return c;
}

std::tuple<at::Tensor, at::Tensor> run_cuda(const Plan& plan, at::Tensor x3, at::Tensor v3) {
  // The kernel needs unit stride along d2 / d3: other layouts are copied here
  // (the only copy besides as_3d's), and the plan is made again for the copy.
  if (x3.stride(2) != 1) x3 = x3.contiguous();
  if (v3.stride(2) != 1) v3 = v3.contiguous();
  Descriptor d = describe(x3, v3);
  Status s = can_implement(plan, d, x3.data_ptr(), v3.data_ptr());
  if (!s.ok()) {
    x3 = x3.contiguous();
    v3 = v3.contiguous();
    d = describe(x3, v3);
    s = can_implement(plan, d, x3.data_ptr(), v3.data_ptr());
    if (!s.ok()) raise(s);
  }
  at::Tensor out = at::empty({d.batch, d.d1, d.d3}, x3.options());
  at::Tensor lse = at::empty({d.batch, d.d1}, x3.options().dtype(at::kFloat));
  if (lse.numel() == 0) return {out, lse};
  if (d.d3 == 0) return blocked_forward(x3, v3, plan.bk);  // no output to compute, only lse
  if (d.d2 == 0) return {out.zero_(), lse.fill_(-std::numeric_limits<float>::infinity())};
  cuda::Args a;
  a.x = x3.data_ptr();
  a.v = v3.data_ptr();
  a.out = out.data_ptr();
  a.lse = lse.data_ptr<float>();
  set_problem(a, d);
  if (plan.kernel == Kernel::kCudaWgmma || plan.kernel == Kernel::kCudaRows) {
    // d2 cut into parts: each part's output and log-sum-exp first (the
    // plan's workspace), merged into out and lse after.
    at::Tensor part_out, part_rows;
    if (plan.parts > 1) {
      part_out = at::empty({d.batch * plan.parts, d.d1, d.d3}, x3.options());
      part_rows = at::empty({2, d.batch * plan.parts, d.d1}, lse.options());  // log row sums, row maxima
      a.out = part_out.data_ptr();
      a.lse = part_rows[0].data_ptr<float>();
      a.part_max = part_rows[1].data_ptr<float>();
      a.parts = plan.parts;
      a.part_cols = plan.part_cols;
    }
    if (plan.kernel == Kernel::kCudaRows) {  // plan.bn: column groups of rows_columns_per_thread
      const int cols = cuda::rows_columns_per_thread(plan.bm, static_cast<int>(c10::elementSize(d.dtype)));
      cuda::launch_rows(a, plan.bm, plan.bn / cols, static_cast<int>(d.dtype));
    } else if (d.dtype == at::kBFloat16) cuda::launch_sm90_bf16(a, plan.bn);
    else if (d.dtype == at::kHalf) cuda::launch_sm90_f16(a, plan.bn);
    else cuda::launch_sm90_f32(a, plan.bn, plan.math == Math::kExactF32);
    if (plan.parts > 1) {
      cuda::combine_parts(part_out.data_ptr(), a.lse, a.part_max, out.data_ptr(), lse.data_ptr<float>(), d.batch,
                          d.d1, d.d3, plan.parts, static_cast<int>(d.dtype),
                          softmax_ext::cuda::overlap_launches(d.arch));
    }
    return {out, lse};
  }
  switch (d.dtype) {
    case at::kBFloat16: cuda::launch_bf16(a, plan.bm / 16, plan.bn); break;
    case at::kHalf: cuda::launch_f16(a, plan.bm / 16, plan.bn); break;
    default: cuda::launch_f32(a, plan.bm / 16, plan.bn, plan.math == Math::kExactF32); break;
  }
  return {out, lse};
}

using Grads = std::optional<std::tuple<at::Tensor, at::Tensor>>;

// The fused Hopper backward (plan: cuda.wgmma.backward.*): D, dX, dV into
// new contiguous tensors, or nothing where a tensor map cannot be made
// (the caller then takes the blocked backward).
Grads fused_backward(const Plan& plan, const Descriptor& d, const at::Tensor& x3, const at::Tensor& v3,
                     at::Tensor go, at::Tensor o3, at::Tensor l2) {
  // (can_implement turns away a float32 batch without tensor maps before
  // any workspace is filled; backward_sm90_f32 still answers false for a
  // map the driver refuses.)
  if (!can_implement(plan, d, x3.data_ptr(), v3.data_ptr()).ok()) return std::nullopt;
  go = go.contiguous();
  o3 = o3.contiguous();
  l2 = l2.to(at::kFloat).contiguous();
  at::Tensor dx = at::empty({d.batch, d.d1, d.d2}, x3.options());
  at::Tensor dv = at::empty({d.batch, d.d2, d.d3}, v3.options());
  const BackwardWorkspace w = backward_workspace(plan, d);
  at::Tensor ws = at::empty({w.floats}, x3.options().dtype(at::kFloat));
  float* wp = ws.data_ptr<float>();
  cuda::BwdArgs a;
  a.x = x3.data_ptr();
  a.v = v3.data_ptr();
  a.go = go.data_ptr();
  a.out = o3.data_ptr();
  a.lse = l2.data_ptr<float>();
  a.delta = wp + w.delta;
  a.dx = dx.data_ptr();
  a.dv = dv.data_ptr();
  set_problem(a, d);
  if (w.go_t >= 0) {  // lse and dO^T (the kernels write it) with rows of d1p floats (16 bytes a row, for TMA)
    a.lse_p = l2.data_ptr<float>();  // rows of d1p already (or one row), 16-byte aligned: no copy
    if ((d.d1 != w.d1p && d.batch > 1) || reinterpret_cast<uintptr_t>(a.lse_p) % 16 != 0) {
      at::Tensor lse_p = ws.narrow(0, w.lse_p, d.batch * w.d1p).view({d.batch, w.d1p});
      lse_p.narrow(1, 0, d.d1).copy_(l2);
      a.lse_p = wp + w.lse_p;
    }
    a.go_t = wp + w.go_t;
    a.d1p = w.d1p;
  }
  // float32: V rounded to TF32 (3xTF32: split into big and small parts),
  // written by the kernels
  if (w.v_hi >= 0) a.v_hi = wp + w.v_hi;
  if (w.v_lo >= 0) a.v_lo = wp + w.v_lo;
  if (w.go_t_lo >= 0) a.go_t_lo = wp + w.go_t_lo;
  bool launched = true;
  if (d.dtype == at::kBFloat16) cuda::backward_sm90_bf16(a, plan.bn);
  else if (d.dtype == at::kHalf) cuda::backward_sm90_f16(a, plan.bn);
  else launched = cuda::backward_sm90_f32(a, plan.bn, plan.math == Math::kExactF32);
  if (!launched) return std::nullopt;
  return std::make_tuple(dx, dv);
}

// The fused backward takes d2 and d3 multiples of 8 with rows of whole
// 16-byte chunks (plan.cpp). A problem that misses only that (d2 or d3 of
// any other size, rows at odd offsets or strides) runs it on padded
// copies: x with -inf columns up to d2p (P is 0 there, and so are those
// columns of dX), v with zero rows up to d2p and zero columns up to d3p,
// grad_output and output with zero columns up to d3p (D and dP unchanged);
// dX and dV are the leading columns of the results. The blocked backward
// it replaces recomputes P into an (N, d2) buffer and runs autograd's
// kernels, which are slow on such rows too. Named ".padded" in the plan,
// the copies counted in its workspace. Taken from 2^23 elements of x
// (16-bit) or 2^25 (float32), below which the copies' launches and the
// fused kernels' fixed costs outweigh the gain (docs/softmax_matmul.md,
// "Rows of any length: the backward on padded copies");
// SOFTMAX_EXT_SMM_PADDED_BACKWARD=0|1 never / always (A/B work and tests;
// read at each call).
int64_t round8(int64_t n) { return (n + 7) / 8 * 8; }

bool padded_backward(const Descriptor& d, Plan* fused) {
  if (!wgmma_built() || d.device != c10::DeviceType::CUDA || d.arch != 90 || d.dtype == at::kDouble) return false;
  if (d.batch * d.d1 == 0 || d.d2 == 0 || d.d3 == 0) return false;
  const char* env = std::getenv("SOFTMAX_EXT_SMM_PADDED_BACKWARD");
  if (env != nullptr && env[0] == '0') return false;
  const int64_t min_elements = int64_t{1} << (d.dtype == at::kFloat ? 25 : 23);
  if ((env == nullptr || env[0] != '1') && d.batch * d.d1 * d.d2 < min_elements) return false;
  Descriptor p = d;
  p.d2 = round8(d.d2);
  p.d3 = round8(d.d3);
  p.x_strides[0] = d.d1 * p.d2;
  p.x_strides[1] = p.d2;
  p.v_strides[0] = p.d2 * p.d3;
  p.v_strides[1] = p.d3;
  p.x_strides[2] = p.v_strides[2] = 1;
  p.aligned16 = true;
  if (!select(p, true, fused).ok() || fused->kernel != Kernel::kCudaWgmma) return false;
  const int64_t elem = static_cast<int64_t>(c10::elementSize(d.dtype));
  int64_t copies = 2 * d.batch * (d.d1 * p.d2 + p.d2 * p.d3);         // x, v and their gradients
  if (p.d3 != d.d3) copies += 2 * d.batch * d.d1 * p.d3;              // grad_output and output
  fused->name += ".padded";
  fused->workspace_bytes += copies * elem;
  return true;
}

// t3 (batch, rows, cols) copied into (batch, rows_p, cols_p) with `fill` in the added rows and columns.
at::Tensor padded(const at::Tensor& t3, int64_t rows_p, int64_t cols_p, double fill) {
  const int64_t rows = t3.size(1), cols = t3.size(2);
  if (rows == rows_p && cols == cols_p && t3.is_contiguous() && reinterpret_cast<uintptr_t>(t3.data_ptr()) % 16 == 0)
    return t3;
  at::Tensor p = at::empty({t3.size(0), rows_p, cols_p}, t3.options());
  p.narrow(1, 0, rows).narrow(2, 0, cols).copy_(t3);
  if (cols_p > cols) p.narrow(1, 0, rows).narrow(2, cols, cols_p - cols).fill_(fill);
  if (rows_p > rows) p.narrow(1, rows, rows_p - rows).fill_(fill);
  return p;
}

Grads padded_fused_backward(const Plan& fused, const Descriptor& d, const at::Tensor& x3, const at::Tensor& v3,
                            const at::Tensor& go, const at::Tensor& o3, const at::Tensor& l2) {
  const int64_t d2p = round8(d.d2), d3p = round8(d.d3);
  const at::Tensor xp = padded(x3, d.d1, d2p, -std::numeric_limits<double>::infinity());
  const at::Tensor vp = padded(v3, d2p, d3p, 0.0);
  const at::Tensor gop = padded(go, d.d1, d3p, 0.0), op = padded(o3, d.d1, d3p, 0.0);
  auto grads = fused_backward(fused, describe(xp, vp), xp, vp, gop, op, l2);
  if (!grads) return std::nullopt;
  auto [dx, dv] = *grads;
  if (d2p != d.d2) dx = dx.narrow(2, 0, d.d2).contiguous();
  if (d2p != d.d2 || d3p != d.d3) dv = dv.narrow(1, 0, d.d2).narrow(2, 0, d.d3).contiguous();
  return std::make_tuple(dx, dv);
}
#endif

}  // namespace

std::tuple<at::Tensor, at::Tensor> softmax_matmul_forward(const at::Tensor& x, const at::Tensor& v) {
  check_args(kOp, x, v);
  at::Tensor x3 = as_3d(x), v3 = as_3d(v);
  Plan plan = make_plan(describe(x3, v3), false);
  at::Tensor out, lse;
#ifdef SOFTMAX_EXT_WITH_CUDA
  Plan hopper;
  if (const RowCopies c = hopper_row_copies(x3, v3, plan, &hopper); c.x || c.v) {
    if (c.x) x3 = with_hopper_rows(x3, c.vec);
    if (c.v) v3 = with_hopper_rows(v3, c.vec);
    plan = make_plan(describe(x3, v3), false);
  }
  if (plan.kernel != Kernel::kBlocked) std::tie(out, lse) = run_cuda(plan, x3, v3);
#endif
  if (plan.kernel == Kernel::kBlocked) std::tie(out, lse) = blocked_forward(x3, v3, plan.bk);
  std::vector<int64_t> lse_shape(x.sizes().begin(), x.sizes().end() - 1);
  return {out.reshape(out_shape(x, v)), lse.reshape(lse_shape)};
}

std::tuple<at::Tensor, at::Tensor> softmax_matmul_backward(const at::Tensor& grad_out, const at::Tensor& x,
                                                           const at::Tensor& v, const at::Tensor& out,
                                                           const at::Tensor& lse) {
  const char* op = "softmax_ext.softmax_matmul (backward)";
  check_args(op, x, v);
  const auto expect = out_shape(x, v);
  TORCH_CHECK_VALUE(grad_out.sizes() == c10::IntArrayRef(expect) && out.sizes() == grad_out.sizes(), op,
                    ": grad_output has shape ", shape_str(grad_out), " and output ", shape_str(out),
                    "; both must have shape ", c10::IntArrayRef(expect));
  TORCH_CHECK_VALUE(grad_out.device() == x.device() && out.device() == x.device() && lse.device() == x.device(),
                    op, ": grad_output, output and lse must be on x's device ", x.device());
  const at::Tensor x3 = as_3d(x), v3 = as_3d(v);
  const Descriptor d = describe(x3, v3);
  const Plan plan = make_plan(d, true);
  // (contiguous: an expanded gradient, as out.sum() sends, would be copied
  // by every matmul that reads it, and CPU bmm walks its batch one by one)
  at::Tensor go = as_3d(grad_out.to(x.scalar_type()).contiguous()), o3 = as_3d(out);
  at::Tensor l2 = lse.reshape({x3.size(0), x3.size(1)});
#ifdef SOFTMAX_EXT_WITH_CUDA
  if (plan.kernel == Kernel::kCudaWgmma && x3.numel() > 0 && v3.numel() > 0) {
    if (auto grads = fused_backward(plan, d, x3, v3, go, o3, l2)) {
      return {std::get<0>(*grads).reshape(x.sizes()), std::get<1>(*grads).reshape(v.sizes())};
    }
  }
  if (Plan fused; plan.kernel == Kernel::kBlocked && padded_backward(d, &fused)) {
    if (auto grads = padded_fused_backward(fused, d, x3, v3, go, o3, l2)) {
      return {std::get<0>(*grads).reshape(x.sizes()), std::get<1>(*grads).reshape(v.sizes())};
    }
  }
#endif
  const int64_t bk = plan.kernel == Kernel::kBlocked ? plan.bk : blocked_columns(x3.size(0) * x3.size(1), x3.size(2), x3.is_cuda(), true);
  auto [dx, dv] = blocked_backward(go, x3, v3, o3, l2, bk);
  return {dx.reshape(x.sizes()), dv.reshape(v.sizes())};
}

at::Tensor softmax_matmul(const at::Tensor& x, const at::Tensor& v) {
  static const auto op =
      find_op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&)>(
          "softmax_ext::_softmax_matmul_forward");
  return std::get<0>(op.call(x, v));
}

std::tuple<std::string, int64_t, bool, std::string, std::string, std::vector<int64_t>, std::vector<int64_t>>
plan_info(const at::Tensor& x, const at::Tensor& v, bool backward) {
  check_args("softmax_ext.plan", x, v);
  const at::Tensor x3 = as_3d(x), v3 = as_3d(v);
  const Descriptor d = describe(x3, v3);
  Plan p = make_plan(d, backward);
#ifdef SOFTMAX_EXT_WITH_CUDA
  if (Plan hopper; !backward) {  // the forward's row copies for the Hopper kernels
    const RowCopies c = hopper_row_copies(x3, v3, p, &hopper);
    if (c.x || c.v) p = hopper;
  } else if (Plan fused; p.kernel == Kernel::kBlocked && padded_backward(d, &fused)) {
    p = fused;  // the fused backward on padded copies
  }
#endif
  return {p.name, p.workspace_bytes, p.deterministic, c10::toString(p.accumulator), math_name(p.math),
          {p.bm, p.bn, p.bk}, {d.batch, d.d1, d.d2, d.d3}};
}

TORCH_LIBRARY_FRAGMENT(softmax_ext, m) {
  const std::vector<at::Tag> tags = {at::Tag::pt2_compliant_tag};
  m.def("softmax_matmul(Tensor x, Tensor v) -> Tensor", tags);
  m.def("_softmax_matmul_forward(Tensor x, Tensor v) -> (Tensor, Tensor)", tags);
  m.def("_softmax_matmul_backward(Tensor grad_output, Tensor x, Tensor v, Tensor output, Tensor lse)"
        " -> (Tensor, Tensor)",
        tags);
  m.def("_softmax_matmul_plan(Tensor x, Tensor v, bool backward) -> (str, int, bool, str, str, int[], int[])",
        &plan_info);
}

TORCH_LIBRARY_IMPL(softmax_ext, CompositeImplicitAutograd, m) { m.impl("softmax_matmul", &softmax_matmul); }

// One device-generic body per op: the same registrations for CPU and CUDA.
static void impl_kernels(torch::Library& m) {
  m.impl("_softmax_matmul_forward", &softmax_matmul_forward);
  m.impl("_softmax_matmul_backward", &softmax_matmul_backward);
}

TORCH_LIBRARY_IMPL(softmax_ext, CPU, m) { impl_kernels(m); }

#ifdef SOFTMAX_EXT_WITH_CUDA
TORCH_LIBRARY_IMPL(softmax_ext, CUDA, m) { impl_kernels(m); }
#endif

}  // namespace softmax_ext::smm
