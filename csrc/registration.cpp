// The one schema file: every op of the softmax_ext namespace is defined here
// (implementations are registered per dispatch key in ops/ops.cpp, autograd
// in ops/autograd.cpp), plus the Python module _C, whose import runs these
// static registrations and which holds the ops' eager entry points
// (python/fast_calls.cpp).

#include "cross_entropy/plan.h"
#include "ops/ops.h"
#include "python/fast_calls.h"

#include <Python.h>
#include <torch/library.h>

#ifdef SOFTMAX_EXT_WITH_CUDA
namespace softmax_ext::cuda {
std::string runtime_version();
std::vector<int64_t> compiled_archs();
}  // namespace softmax_ext::cuda
#endif

#define SOFTMAX_EXT_STR2(x) #x
#define SOFTMAX_EXT_STR(x) SOFTMAX_EXT_STR2(x)

namespace softmax_ext {

std::tuple<std::string, std::string, std::vector<int64_t>> build_info() {
#ifdef SOFTMAX_EXT_WITH_CUDA
  return {SOFTMAX_EXT_STR(SOFTMAX_EXT_TORCH_VERSION), cuda::runtime_version(), cuda::compiled_archs()};
#else
  return {SOFTMAX_EXT_STR(SOFTMAX_EXT_TORCH_VERSION), "", {}};
#endif
}

TORCH_LIBRARY(softmax_ext, m) {
  const std::vector<at::Tag> tags = {at::Tag::pt2_compliant_tag};
  m.def("softmax(Tensor x, int dim=-1, ScalarType? dtype=None) -> Tensor", tags);
  m.def("log_softmax(Tensor x, int dim=-1, ScalarType? dtype=None) -> Tensor", tags);
  m.def("softmax_backward(Tensor grad_output, Tensor output, int dim) -> Tensor", tags);
  m.def("log_softmax_backward(Tensor grad_output, Tensor output, int dim) -> Tensor", tags);
  // Introspection, not maths: what the dispatcher would run, and how the
  // library was built. softmax_ext.plan() and build_info() wrap these.
  m.def("_plan(Tensor x, int dim, str kind, bool backward, ScalarType? dtype=None)"
        " -> (str, int, bool, str, int[])",
        &plan_info);
  m.def("_limits(Tensor like, bool backward) -> (str[], int[])", &limits);
  m.def("_build_info() -> (str, str, int[])", &build_info);
}

}  // namespace softmax_ext

// Importing softmax_ext._C runs the static registrations above; the module
// holds the eager entry points, and the one bound the Python side shares
// with the plans: the longest CUDA rows the fused cross-entropy forward
// takes (softmax_ext/_cross_entropy.py picks that path by it, select_ce
// gives the plain forward of the same losses the same row order).
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1,
                                          softmax_ext::python::methods()};
  PyObject* module = PyModule_Create(&module_def);
  if (module != nullptr &&
      PyModule_AddIntConstant(module, "_CE_MAX_FUSED_ROW_BYTES", softmax_ext::ce::kMaxFusedRowBytes) != 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
