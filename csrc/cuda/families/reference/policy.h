// Reference family (cuda.reference): one block per row, grid-stride over
// rows, any strides and any (input, output) pair of the four dtypes; what
// no faster family takes. Forward and backward share the block size, so
// both reduce in the same order.
#pragma once

#include "plan/plan.h"

namespace softmax_ext::cuda {

// 256 threads: 8 warps keep enough loads in flight per row for long rows,
// while a short row wastes at most one small block; 8 resident blocks fill
// an SM's 2048 threads on sm_80/sm_90. The reduction order, hence the exact
// result, depends on this value.
constexpr int kReferenceBlock = 256;

void reference_forward(const Plan& plan, const Buffers& buffers, void* workspace);   // forward.cu
void reference_backward(const Plan& plan, const Buffers& buffers, void* workspace);  // backward.cu

}  // namespace softmax_ext::cuda
