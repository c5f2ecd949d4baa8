// Reference backward kernel: the gradient of softmax / log_softmax along one
// axis, for any strides of dy, y and dx (independently), in float, double,
// half and bfloat16. The baseline every faster family is checked against.

#include "cuda/core/dispatch.cuh"
#include "cuda/core/launch.cuh"
#include "cuda/core/reduce.cuh"
#include "cuda/core/row_indexer.cuh"
#include "cuda/families/reference/policy.h"

namespace softmax_ext::cuda {
namespace {

//////////////////////////////////////////////////////////////////////////////
// Reference backward: block per row, two passes over global memory
//////////////////////////////////////////////////////////////////////////////

// Pass 1 sums Epilogue::reduce_term(dy, y) over the row (y * dy for softmax,
// dy for log_softmax), pass 2 writes Epilogue(sum)(dy, y). Fixed per-thread
// and block reduction order: results are bit-reproducible.
// Locals index RowIndexer slots: 0 = dy (kIn0), 1 = y (kIn1), 2 = dx (kOut).
// dx must not overlap dy or y.
template <template <typename> class Epilogue, typename scalar_t>
__global__ void __launch_bounds__(kReferenceBlock)
    softmax_backward_reference_kernel(const scalar_t* __restrict__ dy,
                                      const scalar_t* __restrict__ y,
                                      scalar_t* __restrict__ dx, const RowIndexer<3> layout) {
  using acc_t = acc_type<scalar_t>;
  using Epi = Epilogue<acc_t>;
  __shared__ acc_t scratch[kWarpSize];
  const int64_t n = layout.axis_size;
  const int64_t dy_step = layout.axis_stride[0];
  const int64_t y_step = layout.axis_stride[1];
  const int64_t dx_step = layout.axis_stride[2];

  for (int64_t row = blockIdx.x; row < layout.rows; row += gridDim.x) {
    int64_t offset[3];
    layout.row_offsets(row, offset);
    const scalar_t* dy_row = dy + offset[0];
    const scalar_t* y_row = y + offset[1];
    scalar_t* dx_row = dx + offset[2];

    acc_t sum = 0;
    for (int64_t j = threadIdx.x; j < n; j += kReferenceBlock) {
      const acc_t g = convert<acc_t>(dy_row[j * dy_step]);
      acc_t v = 0;
      if constexpr (Epi::kReduceReadsY) v = convert<acc_t>(y_row[j * y_step]);
      sum += Epi::reduce_term(g, v);
    }
    sum = block_all_reduce(sum, Sum{}, acc_t(0), scratch);

    const Epi epilogue(sum);
    for (int64_t j = threadIdx.x; j < n; j += kReferenceBlock) {
      const acc_t g = convert<acc_t>(dy_row[j * dy_step]);
      const acc_t v = convert<acc_t>(y_row[j * y_step]);
      dx_row[j * dx_step] = convert<scalar_t>(epilogue(g, v));
    }
  }
}

}  // namespace

void reference_backward(const Plan& plan, const Buffers& buffers, void*) {
  const Problem& problem = plan.problem;
  const auto layout = make_row_indexer<3>(problem, {kIn0, kIn1, kOut});
  dispatch_types<true>(problem, "softmax_ext cuda.reference_backward",
                 [&]<typename scalar_t, typename E>(KernelTypes<scalar_t, scalar_t, E>) {
    auto launch = [&](auto kernel) {
      launch_kernel(kernel, grid_for_rows(layout.rows), kReferenceBlock, 0, static_cast<const scalar_t*>(buffers.in0),
                    static_cast<const scalar_t*>(buffers.in1), static_cast<scalar_t*>(buffers.out), layout);
    };
    // The accurate exp in every dtype (the epilogue templates' default).
    if constexpr (std::is_same_v<E, LogSoftmaxEpilogues>) {
      launch(softmax_backward_reference_kernel<LogSoftmaxBackwardEpilogue, scalar_t>);
    } else {
      launch(softmax_backward_reference_kernel<SoftmaxBackwardEpilogue, scalar_t>);
    }
  });
}

}  // namespace softmax_ext::cuda
