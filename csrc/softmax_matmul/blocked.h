// softmax_matmul with ATen matmuls on blocks of d2: the CPU kernels (every
// dtype), CUDA float64, and the backward on every device. Works on the 3-d
// views x (B, d1, d2), v (B, d2, d3); memory O(B * d1 * block) beyond the
// outputs, never the whole (d1, d2) matrix when d2 exceeds one block.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

namespace softmax_ext::smm {

// (out (B, d1, d3) in x's dtype, lse (B, d1) float32 (float64 for f64)).
std::tuple<at::Tensor, at::Tensor> blocked_forward(const at::Tensor& x, const at::Tensor& v, int64_t block);

// (dx like x, dv like v) from dO, the forward's out and its row log-sum-exp.
std::tuple<at::Tensor, at::Tensor> blocked_backward(const at::Tensor& grad_out, const at::Tensor& x,
                                                    const at::Tensor& v, const at::Tensor& out,
                                                    const at::Tensor& lse, int64_t block);

}  // namespace softmax_ext::smm
