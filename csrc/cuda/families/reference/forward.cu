// Reference forward kernel: softmax / log_softmax along one axis of any
// strided tensor, in every (input, output) pair of float, double, half and
// bfloat16. The baseline every faster family is checked against.

#include "cuda/core/dispatch.cuh"
#include "cuda/core/launch.cuh"
#include "cuda/core/reduce.cuh"
#include "cuda/core/row_indexer.cuh"
#include "cuda/families/reference/policy.h"

namespace softmax_ext::cuda {
namespace {

//////////////////////////////////////////////////////////////////////////////
// Reference forward: block per row, three passes over global memory
//////////////////////////////////////////////////////////////////////////////

// Pass 1 takes the row max, pass 2 sums exp(x - max), pass 3 writes
// Epilogue(max, sum)(x). x is re-read each pass (no caching), so any row
// length works. Each thread walks elements tid, tid + kBlock, ... in order and
// the block reduction order is fixed: results are bit-reproducible.
// Locals index RowIndexer slots: 0 = x (kIn0), 1 = y (kOut). x and y must not
// overlap.
template <template <typename> class Epilogue, typename in_t, typename out_t>
__global__ void __launch_bounds__(kReferenceBlock)
    softmax_forward_reference_kernel(const in_t* __restrict__ x, out_t* __restrict__ y,
                                     const RowIndexer<2> layout) {
  using acc_t = acc_type<out_t>;
  __shared__ acc_t scratch[kWarpSize];
  const int64_t n = layout.axis_size;
  const int64_t x_step = layout.axis_stride[0];
  const int64_t y_step = layout.axis_stride[1];

  for (int64_t row = blockIdx.x; row < layout.rows; row += gridDim.x) {
    int64_t offset[2];
    layout.row_offsets(row, offset);
    const in_t* x_row = x + offset[0];
    out_t* y_row = y + offset[1];

    acc_t max = neg_infinity<acc_t>();
    for (int64_t j = threadIdx.x; j < n; j += kReferenceBlock) {
      max = NanMax{}(max, load_as<out_t>(x_row[j * x_step]));
    }
    max = block_all_reduce(max, NanMax{}, neg_infinity<acc_t>(), scratch);

    acc_t sum = 0;
    for (int64_t j = threadIdx.x; j < n; j += kReferenceBlock) {
      sum += acc_exp(load_as<out_t>(x_row[j * x_step]) - max);
    }
    sum = block_all_reduce(sum, Sum{}, acc_t(0), scratch);

    const Epilogue<acc_t> epilogue(max, sum);
    for (int64_t j = threadIdx.x; j < n; j += kReferenceBlock) {
      y_row[j * y_step] = convert<out_t>(epilogue(load_as<out_t>(x_row[j * x_step])));
    }
  }
}

}  // namespace

void reference_forward(const Plan& plan, const Buffers& buffers, void*) {
  const Problem& problem = plan.problem;
  const auto layout = make_row_indexer<2>(problem, {kIn0, kOut});
  dispatch_types<false, Pairs::kAll>(problem, "softmax_ext cuda.reference",
                 [&]<typename in_t, typename out_t, typename E>(KernelTypes<in_t, out_t, E>) {
    launch_kernel(softmax_forward_reference_kernel<E::template Forward, in_t, out_t>, grid_for_rows(layout.rows),
                  kReferenceBlock, 0, static_cast<const in_t*>(buffers.in0), static_cast<out_t*>(buffers.out), layout);
  });
}

}  // namespace softmax_ext::cuda
