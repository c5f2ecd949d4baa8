// Direct Python entry points of the four softmax ops, of the cross-entropy
// forward and of softmax_matmul, for eager calls.
//
// softmax_ext.softmax(x) on a plain tensor outside torch.compile calls
// _C._softmax(x, dim, dtype): one CPython call with positional arguments,
// then the op through the dispatcher (autograd, the device kernel), as
// torch.softmax's own binding does. The generic torch.ops call path parses
// the arguments against the schema at run time, which costs a few
// microseconds a call. Everything else (tensor subclasses, torch function
// modes, tracing) keeps going through torch.ops (softmax_ext/_ops.py).

#include "python/fast_calls.h"

#include "cross_entropy/plan.h"
#include "ops/autograd.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

namespace softmax_ext::python {
namespace {

using ForwardSig = at::Tensor(const at::Tensor&, int64_t, std::optional<c10::ScalarType>);
using BackwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, int64_t);

// Each check raises a TypeError worded like torch's own bindings and returns
// false; true when the argument has the type asked for.
bool tensor_arg(const char* op, const char* name, PyObject* obj) {
  if (THPVariable_Check(obj)) return true;
  PyErr_Format(PyExc_TypeError, "%s(): argument '%s' must be Tensor, not %s", op, name, Py_TYPE(obj)->tp_name);
  return false;
}

bool int_arg(const char* op, const char* name, PyObject* obj, int64_t& value) {
  if (PyIndex_Check(obj)) {  // int, bool, numpy integers; not float
    value = PyLong_AsLongLong(obj);
    return !(value == -1 && PyErr_Occurred());
  }
  PyErr_Format(PyExc_TypeError, "%s(): argument '%s' must be int, not %s", op, name, Py_TYPE(obj)->tp_name);
  return false;
}

bool dtype_arg(const char* op, PyObject* obj, std::optional<c10::ScalarType>& dtype) {
  if (obj == Py_None) return true;
  if (THPDtype_Check(obj)) {
    dtype = reinterpret_cast<THPDtype*>(obj)->scalar_type;
    return true;
  }
  PyErr_Format(PyExc_TypeError, "%s(): argument 'dtype' must be torch.dtype, not %s", op, Py_TYPE(obj)->tp_name);
  return false;
}

bool arg_count(const char* op, Py_ssize_t nargs, Py_ssize_t expected) {
  if (nargs == expected) return true;
  PyErr_Format(PyExc_TypeError, "%s() takes %zd positional arguments but %zd were given", op, expected, nargs);
  return false;
}

// The forward op through the dispatcher, without the GIL; a new Python tensor.
template <bool kLog>
PyObject* call_forward(const at::Tensor& x, int64_t dim, std::optional<c10::ScalarType> dtype) {
  static const auto handle = find_op<ForwardSig>(kLog ? "softmax_ext::log_softmax" : "softmax_ext::softmax");
  at::Tensor y;
  {
    pybind11::gil_scoped_release no_gil;
    y = handle.call(x, dim, dtype);
  }
  return THPVariable_Wrap(std::move(y));
}

// (x, dim, dtype) -> y
template <bool kLog>
PyObject* forward(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  const char* op = kLog ? "softmax_ext.log_softmax" : "softmax_ext.softmax";
  int64_t dim = 0;
  std::optional<c10::ScalarType> dtype;
  if (!arg_count(op, nargs, 3) || !tensor_arg(op, "x", args[0]) || !int_arg(op, "dim", args[1], dim) ||
      !dtype_arg(op, args[2], dtype))
    return nullptr;
  return call_forward<kLog>(THPVariable_Unpack(args[0]), dim, dtype);
  END_HANDLE_TH_ERRORS
}

bool floating(c10::ScalarType t) {
  return t == c10::kFloat || t == c10::kDouble || t == c10::kHalf || t == c10::kBFloat16;
}

// (input, dim, dtype) -> y for the calls softmax_ext.patch() routes to
// softmax_ext, None for the calls it leaves to torch: the rules of
// softmax_ext/patching.py (_serves, _autocast_serves, _autocast_dtype) in
// one C call, so a routed eager call costs about what a direct one does.
template <bool kLog>
PyObject* route(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 3 || !THPVariable_CheckExact(args[0]) || !PyLong_CheckExact(args[1]) ||
      !(args[2] == Py_None || THPDtype_Check(args[2])))
    Py_RETURN_NONE;
  const at::Tensor& x = THPVariable_Unpack(args[0]);
  const c10::DeviceType device = x.device().type();
  if ((device != c10::kCPU && device != c10::kCUDA) || x.layout() != c10::kStrided || x.dim() > 8) Py_RETURN_NONE;
  std::optional<c10::ScalarType> dtype;
  if (args[2] != Py_None) dtype = reinterpret_cast<THPDtype*>(args[2])->scalar_type;
  if (dtype ? !floating(*dtype) || x.is_complex() : !floating(x.scalar_type())) Py_RETURN_NONE;
  // Autocast: CUDA's policy computes softmax and log_softmax in float32 (a
  // 16-bit input is read as it is); other devices' autocast stays with torch.
  if (device == c10::kCUDA) {
    const c10::ScalarType t = x.scalar_type();
    if (!dtype && (t == c10::kHalf || t == c10::kBFloat16) && at::autocast::is_autocast_enabled(c10::kCUDA))
      dtype = c10::kFloat;
  } else if (at::autocast::is_autocast_enabled(device)) {
    Py_RETURN_NONE;
  }
  const int64_t dim = PyLong_AsLongLong(args[1]);
  if (dim == -1 && PyErr_Occurred()) {  // out of int64's range: torch's error
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  return call_forward<kLog>(x, dim, dtype);
  END_HANDLE_TH_ERRORS
}

// (grad_output, output, dim) -> grad_input
template <bool kLog>
PyObject* backward(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  const char* op = kLog ? "softmax_ext.log_softmax_backward" : "softmax_ext.softmax_backward";
  int64_t dim = 0;
  if (!arg_count(op, nargs, 3) || !tensor_arg(op, "grad_output", args[0]) || !tensor_arg(op, "output", args[1]) ||
      !int_arg(op, "dim", args[2], dim))
    return nullptr;
  static const auto handle =
      find_op<BackwardSig>(kLog ? "softmax_ext::log_softmax_backward" : "softmax_ext::softmax_backward");
  const at::Tensor& dy = THPVariable_Unpack(args[0]);
  const at::Tensor& y = THPVariable_Unpack(args[1]);
  at::Tensor dx;
  {
    pybind11::gil_scoped_release no_gil;
    dx = handle.call(dy, y, dim);
  }
  return THPVariable_Wrap(std::move(dx));
  END_HANDLE_TH_ERRORS
}

// (logits (N, C), target (N), weight or None, ignore_index, reduction,
// label_smoothing, inplace_backward, acc_loss, mode) -> mode 0: the loss
// (with its C++ autograd node where a gradient is tracked); 2: the fused
// forward's (loss, row_stats, total_weight, grad). softmax_ext/_cross_entropy.py's
// rows_loss and its fused forward's Function, for plain tensors in eager mode.
// The arguments come from that module (validated there), not from users.
PyObject* cross_entropy_rows(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  const char* op = "softmax_ext.cross_entropy";
  int64_t ignore_index = 0;
  if (!arg_count(op, nargs, 9) || !tensor_arg(op, "logits", args[0]) || !tensor_arg(op, "target", args[1]) ||
      (args[2] != Py_None && !tensor_arg(op, "weight", args[2])) ||
      !int_arg(op, "ignore_index", args[3], ignore_index))
    return nullptr;
  Py_ssize_t length = 0;
  const char* reduction = PyUnicode_AsUTF8AndSize(args[4], &length);
  if (reduction == nullptr) return nullptr;
  const double smoothing = PyFloat_AsDouble(args[5]);
  if (smoothing == -1.0 && PyErr_Occurred()) return nullptr;
  const bool inplace = PyObject_IsTrue(args[6]) == 1;
  const bool acc_loss = PyObject_IsTrue(args[7]) == 1;
  int64_t mode = 0;
  if (!int_arg(op, "mode", args[8], mode)) return nullptr;
  const at::Tensor& logits = THPVariable_Unpack(args[0]);
  const at::Tensor& target = THPVariable_Unpack(args[1]);
  std::optional<at::Tensor> weight;
  if (args[2] != Py_None) weight = THPVariable_Unpack(args[2]);
  const c10::string_view red(reduction, static_cast<size_t>(length));
  // A call no gradient can flow from (grad mode off, or no input requiring
  // grad: every no-grad call, and the fused forward inside its
  // autograd.Function) goes straight to the device kernel: the op's autograd
  // kernel (cross_entropy/autograd.cpp) would only pass it on.
  std::optional<at::AutoDispatchBelowADInplaceOrView> below_autograd;
  if (!needs_grad({&logits, weight.has_value() ? &*weight : nullptr})) below_autograd.emplace();
  if (mode == 2) {
    using Sig = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
        const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, int64_t, c10::string_view, double,
        bool);
    static const auto handle = find_op<Sig>("softmax_ext::_cross_entropy_forward_grad");
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> out;
    {
      pybind11::gil_scoped_release no_gil;
      out = handle.call(logits, target, weight, ignore_index, red, smoothing, acc_loss);
    }
    return pybind11::cast(std::move(out)).release().ptr();
  }
  using Sig = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                             const std::optional<at::Tensor>&, int64_t,
                                                             c10::string_view, double, bool, bool);
  static const auto handle = find_op<Sig>("softmax_ext::_cross_entropy_forward");
  std::tuple<at::Tensor, at::Tensor, at::Tensor> out;
  {
    pybind11::gil_scoped_release no_gil;
    out = handle.call(logits, target, weight, ignore_index, red, smoothing, inplace, acc_loss);
  }
  return THPVariable_Wrap(std::move(std::get<0>(out)));
  END_HANDLE_TH_ERRORS
}

// softmax_matmul(x, v) for plain tensors in eager mode
// (softmax_ext/_softmax_matmul.py). A call no gradient can flow from (grad
// mode off, or neither input requiring grad) runs the forward op below
// autograd: its autograd kernel (softmax_matmul/autograd.cpp) would only
// pass it on. Otherwise the public op, through the dispatcher.
PyObject* softmax_matmul_call(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  const char* op = "softmax_ext.softmax_matmul";
  if (!arg_count(op, nargs, 2) || !tensor_arg(op, "x", args[0]) || !tensor_arg(op, "v", args[1])) return nullptr;
  const at::Tensor& x = THPVariable_Unpack(args[0]);
  const at::Tensor& v = THPVariable_Unpack(args[1]);
  at::Tensor out;
  if (needs_grad({&x, &v})) {
    static const auto handle = find_op<at::Tensor(const at::Tensor&, const at::Tensor&)>("softmax_ext::softmax_matmul");
    pybind11::gil_scoped_release no_gil;
    out = handle.call(x, v);
  } else {
    using Sig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&);
    static const auto handle = find_op<Sig>("softmax_ext::_softmax_matmul_forward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    pybind11::gil_scoped_release no_gil;
    out = std::get<0>(handle.call(x, v));
  }
  return THPVariable_Wrap(std::move(out));
  END_HANDLE_TH_ERRORS
}

// (grad, grad_loss) -> None: the fused forward's backward (grad *= grad_loss
// in place), called by softmax_ext/_cross_entropy.py's _FusedGrad.
PyObject* cross_entropy_grad_scale(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  const char* op = "softmax_ext._cross_entropy_grad_scale_";
  if (!arg_count(op, nargs, 2) || !tensor_arg(op, "grad", args[0]) || !tensor_arg(op, "grad_loss", args[1]))
    return nullptr;
  using Sig = void(at::Tensor&, const at::Tensor&);
  static const auto handle = find_op<Sig>("softmax_ext::_cross_entropy_grad_scale_");
  at::Tensor grad = THPVariable_Unpack(args[0]);
  const at::Tensor& grad_loss = THPVariable_Unpack(args[1]);
  {
    pybind11::gil_scoped_release no_gil;
    handle.call(grad, grad_loss);
  }
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// 1 when the str `reduction` is "mean", "sum" or "none", 0 when it is
// another, -1 with a Python error set.
int known_reduction(PyObject* reduction) {
  const char* text = PyUnicode_AsUTF8(reduction);
  if (text == nullptr) return -1;
  const c10::string_view r(text);
  return r == "mean" || r == "sum" || r == "none" ? 1 : 0;
}

// (logits, target, weight or None, reduction, label_smoothing) -> the class
// count when the call is valid as softmax_ext/_cross_entropy.py's _check
// would find it, else None (and _check then raises its error): the eager
// fast path of that check, for plain tensors.
PyObject* cross_entropy_valid(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 5 || !THPVariable_CheckExact(args[0]) || !THPVariable_CheckExact(args[1]) ||
      !(args[2] == Py_None || THPVariable_CheckExact(args[2])) || !PyUnicode_Check(args[3]) ||
      !(PyFloat_CheckExact(args[4]) || PyLong_CheckExact(args[4])))
    Py_RETURN_NONE;
  const at::Tensor& x = THPVariable_Unpack(args[0]);
  const at::Tensor& t = THPVariable_Unpack(args[1]);
  if (!floating(x.scalar_type()) || (t.scalar_type() != c10::kLong && t.scalar_type() != c10::kInt) ||
      t.device() != x.device() || x.dim() == 0)
    Py_RETURN_NONE;
  const int known = known_reduction(args[3]);
  if (known < 0) return nullptr;
  if (known == 0) Py_RETURN_NONE;
  const double smoothing = PyFloat_AsDouble(args[4]);
  if (smoothing == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  if (!(smoothing >= 0.0 && smoothing <= 1.0)) Py_RETURN_NONE;
  if (x.dim() == 1) {
    if (t.dim() != 0) Py_RETURN_NONE;
  } else {
    if (t.dim() != x.dim() - 1 || t.size(0) != x.size(0)) Py_RETURN_NONE;
    for (int64_t d = 2; d < x.dim(); ++d)
      if (t.size(d - 1) != x.size(d)) Py_RETURN_NONE;
  }
  const int64_t classes = x.dim() == 1 ? x.size(0) : x.size(1);
  if (args[2] != Py_None) {
    const at::Tensor& w = THPVariable_Unpack(args[2]);
    if (w.dim() != 1 || w.size(0) != classes || w.device() != x.device()) Py_RETURN_NONE;
  }
  return PyLong_FromLongLong(classes);
  END_HANDLE_TH_ERRORS
}

// (input, target, weight, size_average, reduce, reduction) -> bool: whether
// softmax_ext.patch() routes this F.cross_entropy call to softmax_ext (the
// rules of softmax_ext/patching.py's _cross_entropy_route in one C call).
PyObject* route_cross_entropy(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 6 || !THPVariable_CheckExact(args[0]) || !THPVariable_CheckExact(args[1]) ||
      !(args[2] == Py_None || THPVariable_CheckExact(args[2])) || args[3] != Py_None || args[4] != Py_None ||
      !PyUnicode_Check(args[5]))
    Py_RETURN_FALSE;
  const at::Tensor& x = THPVariable_Unpack(args[0]);
  const at::Tensor& t = THPVariable_Unpack(args[1]);
  const c10::DeviceType device = x.device().type();
  if ((device != c10::kCPU && device != c10::kCUDA) || x.layout() != c10::kStrided || !floating(x.scalar_type()) ||
      t.scalar_type() != c10::kLong || t.dim() != std::max<int64_t>(x.dim() - 1, 0))
    Py_RETURN_FALSE;
  // autocast computes torch's cross_entropy in float32 and returns a float32
  // loss: calls under autocast stay with torch
  if (at::autocast::is_autocast_enabled(device)) Py_RETURN_FALSE;
  const int known = known_reduction(args[5]);
  if (known < 0) return nullptr;
  return PyBool_FromLong(known);
  END_HANDLE_TH_ERRORS
}

// (cuda) -> bool: whether the latest mean / sum cross-entropy backward on
// that device type had grad_loss 1 (cross_entropy/plan.h, grad_was_one).
PyObject* cross_entropy_grad_was_one(PyObject* /*module*/, PyObject* arg) {
  HANDLE_TH_ERRORS
  if (softmax_ext::ce::grad_was_one(PyObject_IsTrue(arg) == 1)) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
  END_HANDLE_TH_ERRORS
}

// (cuda, value) -> None: sets that flag (tests, and a caller that knows
// its gradient).
PyObject* cross_entropy_set_grad_was_one(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!arg_count("softmax_ext._cross_entropy_set_grad_was_one", nargs, 2)) return nullptr;
  softmax_ext::ce::set_grad_was_one(PyObject_IsTrue(args[0]) == 1, PyObject_IsTrue(args[1]) == 1);
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

PyMethodDef kMethods[] = {
    {"_softmax", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&forward<false>)), METH_FASTCALL,
     "softmax(x, dim, dtype) through the dispatcher (eager fast path of softmax_ext.softmax)"},
    {"_log_softmax", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&forward<true>)), METH_FASTCALL,
     "log_softmax(x, dim, dtype) through the dispatcher"},
    {"_softmax_backward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&backward<false>)),
     METH_FASTCALL, "softmax_backward(grad_output, output, dim) through the dispatcher"},
    {"_log_softmax_backward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&backward<true>)),
     METH_FASTCALL, "log_softmax_backward(grad_output, output, dim) through the dispatcher"},
    {"_route_softmax", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&route<false>)), METH_FASTCALL,
     "softmax(input, dim, dtype) for a call softmax_ext.patch() routes, None for one it leaves to torch"},
    {"_route_log_softmax", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&route<true>)), METH_FASTCALL,
     "log_softmax(input, dim, dtype) for a call softmax_ext.patch() routes, None for one it leaves to torch"},
    {"_softmax_matmul", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&softmax_matmul_call)),
     METH_FASTCALL, "softmax_matmul(x, v) through the dispatcher (below autograd when no gradient is tracked)"},
    {"_cross_entropy_rows", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&cross_entropy_rows)),
     METH_FASTCALL, "the cross-entropy forward (or fused forward) of (N, C) rows through the dispatcher"},
    {"_cross_entropy_grad_scale",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&cross_entropy_grad_scale)), METH_FASTCALL,
     "grad *= grad_loss in place (the fused cross-entropy forward's backward) through the dispatcher"},
    {"_cross_entropy_valid", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&cross_entropy_valid)),
     METH_FASTCALL, "the class count of a valid cross_entropy call on plain tensors, else None"},
    {"_route_cross_entropy", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&route_cross_entropy)),
     METH_FASTCALL, "whether softmax_ext.patch() routes this F.cross_entropy call to softmax_ext"},
    {"_cross_entropy_grad_was_one", &cross_entropy_grad_was_one, METH_O,
     "whether the latest mean / sum cross-entropy backward on CUDA (True) or CPU (False) had grad_loss 1"},
    {"_cross_entropy_set_grad_was_one",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&cross_entropy_set_grad_was_one)), METH_FASTCALL,
     "sets that flag: (cuda, value)"},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

PyMethodDef* methods() { return kMethods; }

}  // namespace softmax_ext::python
