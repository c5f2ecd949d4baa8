// Launch geometry of the reference family (KernelFamily::kCudaReference):
// one block per row, grid-stride over rows, any strides and dtypes. Shared by
// the forward and backward kernels so both reduce in the same order.
#pragma once

namespace softmax_ext::cuda {

// 256 threads: 8 warps keep enough loads in flight per row for long rows,
// while a short row (the reference also sees those) wastes at most one small
// block; 8 resident blocks fill an SM's 2048 threads on sm_80/sm_90. The
// reduction order, hence the exact result, depends on this value.
constexpr int kReferenceBlock = 256;

}  // namespace softmax_ext::cuda
