// The tile a softmax_matmul CTA computes, shared by the sm_80 (kernel.cuh)
// and sm_90a (sm90.cu, sm90_f32.cu, sm90_backward*) kernels. The grid's x
// index walks the column blocks of one row block fastest, so the CTAs that
// read the same rows run together and those rows come from L2; its y index
// walks the batch entries of a launch chunk (launch_batch_chunks), or the
// (batch entry, part of d2) pairs where d2 is cut (DRange).
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

// The tiles of d2 (BK columns each) a Hopper forward CTA walks. Where the
// launch cuts d2 into parts (Args::parts > 1) the grid's batch entry vb
// is b * parts + c and part c covers tiles c * part_cols / BK onwards,
// part_cols / BK of them (tiles past d2 read as -inf, like the tail);
// otherwise vb = b and the CTA walks all of d2.
template <int BK>
struct DRange {
  int64_t b;  // batch entry of x and v
  int k0;     // first tile
  int nk;     // tiles walked
  int tail;   // first tile with columns past d2
  template <typename A>
  __device__ __forceinline__ DRange(const A& a, int64_t vb) {
    const int all = static_cast<int>((a.d2 + BK - 1) / BK);
    tail = a.d2 % BK == 0 ? all : all - 1;
    if (a.parts > 1) {
      nk = static_cast<int>(a.part_cols / BK);
      b = vb / a.parts;
      k0 = static_cast<int>(vb % a.parts) * nk;
    } else {
      nk = all;
      b = vb;
      k0 = 0;
    }
  }
  // Whether tile kt (counted from k0) has columns past d2.
  __device__ __forceinline__ bool masked(int kt) const { return k0 + kt >= tail; }
};

}  // namespace softmax_ext::smm::cuda
