// Host-side entry points of the CUDA kernels (defined in the .cu files).
// Included by plan/run.cpp, which is compiled by the host compiler: nothing
// CUDA-specific may appear here.
//
// Each launcher runs on the current CUDA stream of the current device (the op
// layer has set the device guard), checks the launch, and never synchronises.
#pragma once

#include "plan/plan.h"

namespace softmax_ext::cuda {

// KernelFamily::kCudaReference: one block per row, any strides and dtypes.
void reference_forward(const Problem& problem, const Buffers& buffers);
void reference_backward(const Problem& problem, const Buffers& buffers);

}  // namespace softmax_ext::cuda
