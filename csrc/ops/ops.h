// The ops of the softmax_ext namespace, as C++ functions (schemas in
// registration.cpp, per-device registration in ops.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace softmax_ext {

at::Tensor softmax(const at::Tensor& x, int64_t dim, std::optional<c10::ScalarType> dtype);
at::Tensor log_softmax(const at::Tensor& x, int64_t dim, std::optional<c10::ScalarType> dtype);
at::Tensor softmax_backward(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim);
at::Tensor log_softmax_backward(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim);

namespace distributed {
// softmax(x) along dim and each row's (max, sum(exp(x - max))) in the
// accumulator type, shape (..., 2) without the axis (as the softmax_stats op
// returns them), in one pass over x (CPU; distributed/row_ops.cpp): the row
// kernel of softmax_ext.softmax (16-bit rows summed with its fast exp).
std::tuple<at::Tensor, at::Tensor> softmax_with_stats(const at::Tensor& x, int64_t dim);
}  // namespace distributed

// What softmax_ext.plan() shows: (kernel, workspace bytes, deterministic,
// accumulator dtype name, problem = [rows, axis_size, axis_stride, inner_size,
// batch_rank, batch sizes..., batch strides of x...]).
using PlanInfo = std::tuple<std::string, int64_t, bool, std::string, std::vector<int64_t>>;
PlanInfo plan_info(const at::Tensor& x, int64_t dim, c10::string_view kind, bool backward,
                   std::optional<c10::ScalarType> dtype);

// The axis-length thresholds of select() for a tensor's device and dtype:
// (names, values); empty for CPU tensors (plan/limits.cpp).
std::tuple<std::vector<std::string>, std::vector<int64_t>> limits(const at::Tensor& like, bool backward);

// (torch version built against, CUDA runtime version or "" for a CPU build,
// compiled GPU architectures).
std::tuple<std::string, std::string, std::vector<int64_t>> build_info();

}  // namespace softmax_ext
