// Reference forward kernel: softmax / log_softmax along one axis of any
// strided tensor, in every (input, output) pair of float, double, half and
// bfloat16. The baseline every faster family is checked against.

#include "cuda/common.cuh"
#include "cuda/launch.h"
#include "cuda/reference.cuh"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

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
    max = block_all_reduce<kReferenceBlock>(max, NanMax{});

    acc_t sum = 0;
    for (int64_t j = threadIdx.x; j < n; j += kReferenceBlock) {
      sum += acc_exp(load_as<out_t>(x_row[j * x_step]) - max);
    }
    sum = block_all_reduce<kReferenceBlock>(sum, Sum{});

    const Epilogue<acc_t> epilogue(max, sum);
    for (int64_t j = threadIdx.x; j < n; j += kReferenceBlock) {
      y_row[j * y_step] = convert<out_t>(epilogue(load_as<out_t>(x_row[j * x_step])));
    }
  }
}

template <template <typename> class Epilogue, typename in_t, typename out_t>
void launch_forward(const RowIndexer<2>& layout, const Buffers& buffers) {
  softmax_forward_reference_kernel<Epilogue, in_t, out_t>
      <<<grid_for_rows(layout.rows), kReferenceBlock, 0, c10::cuda::getCurrentCUDAStream()>>>(
          static_cast<const in_t*>(buffers.in0), static_cast<out_t*>(buffers.out), layout);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void reference_forward(const Problem& problem, const Buffers& buffers) {
  TORCH_INTERNAL_ASSERT(problem.direction == Direction::Forward,
                        "softmax_ext: reference_forward given a backward problem");
  if (problem.rows <= 0 || problem.axis_size <= 0) return;
  const auto layout = make_row_indexer<2>(problem, {kIn0, kOut});
  const bool log = problem.kind == Kind::LogSoftmax;

  constexpr const char* kWhere = "softmax_ext cuda.reference forward";
  dispatch_floating_type(problem.in_dtype, kWhere, [&](auto in_tag) {
    using in_t = typename decltype(in_tag)::type;
    dispatch_floating_type(problem.out_dtype, kWhere, [&](auto out_tag) {
      using out_t = typename decltype(out_tag)::type;
      if (log) {
        launch_forward<LogSoftmaxEpilogues::Forward, in_t, out_t>(layout, buffers);
      } else {
        launch_forward<SoftmaxEpilogues::Forward, in_t, out_t>(layout, buffers);
      }
    });
  });
}

}  // namespace softmax_ext::cuda
