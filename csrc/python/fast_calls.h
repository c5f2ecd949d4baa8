// The methods of the softmax_ext._C Python module: direct entry points of the
// softmax ops for eager calls (fast_calls.cpp).
#pragma once

#include <Python.h>

namespace softmax_ext::python {

// A null-terminated PyMethodDef table for _C.
PyMethodDef* methods();

}  // namespace softmax_ext::python
