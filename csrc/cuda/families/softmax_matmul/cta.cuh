// The tile a softmax_matmul CTA computes, shared by the sm_80 (kernel.cuh)
// and sm_90a (sm90.cu, sm90_f32.cu, sm90_backward*) kernels. The grid's x
// index walks the column blocks of one row block fastest, so the CTAs that
// read the same rows run together and those rows come from L2; its y index
// walks the batch entries of a launch chunk (launch_batch_chunks).
#pragma once

#include <cstdint>

namespace softmax_ext::smm::cuda {

// Column block nb (BN of the n output columns), row block mb, batch entry b.
template <int BN>
struct CtaTile {
  int64_t nb;
  int64_t mb;
  int64_t b;
  __device__ __forceinline__ CtaTile(int64_t n, int64_t batch0) {
    const int64_t nblocks_n = (n + BN - 1) / BN;
    nb = blockIdx.x % nblocks_n;
    mb = blockIdx.x / nblocks_n;
    b = batch0 + blockIdx.y;
  }
};

}  // namespace softmax_ext::smm::cuda
