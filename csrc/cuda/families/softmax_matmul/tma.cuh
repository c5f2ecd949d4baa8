// TMA helpers of the sm_90a softmax_matmul kernels (sm90.cu: forward,
// sm90_backward*: dX and dV): the mbarrier operations, tensor-map box
// loads and stores (device), and the driver's tensor-map encoder (host). The
// kernels using them: one thread issues a stage's boxes after
// mbarrier.arrive.expect_tx with the stage's byte count, every thread waits
// on the stage's mbarrier with the phase parity (k / stages) & 1, and a
// block-wide barrier precedes each refill of a stage.
#pragma once

#include "cuda/families/softmax_matmul/sm90_common.cuh"

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <type_traits>

namespace softmax_ext::smm::cuda::sm90 {

// How a kernel fills its pipeline stages. kCpAsync: cp.async by every thread
// (where no tensor map can be made); kTma: TMA (one thread issues, an
// mbarrier per stage completes).
enum Load : int { kCpAsync = 0, kTma = 1 };

#ifdef SMM_SM90A_DEVICE
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}
// After the mbarrier.init of a CTA's barriers, before any thread (or the
// async proxy) uses them.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t phase) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(phase)
      : "memory");
}
// kStages mbarriers at bars, 8 bytes apart, one arrival each: initialised by
// thread 0, visible to every thread and to the async proxy once the
// block-wide barrier this ends with is passed.
template <int kStages>
__device__ __forceinline__ void init_stage_barriers(uint32_t bars) {
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) mbar_init(bars + 8 * s, 1);
    fence_mbarrier_init();
    fence_proxy_async();
  }
  __syncthreads();
}
// A 3-d box of `map` at (c0 innermost, c1, c2) into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
// A 2-d box of `map` at (c0 innermost, c1) into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// A 3-d box of `map` at (c0 innermost, c1, c2) from shared memory at `src`
// to global memory (elements out of the tensor's bounds are not written), in
// this thread's bulk async-group. The writes of the other proxy must be made
// visible first (fence.proxy.async.shared::cta by the writing threads, then
// a barrier); the source is not to be reused or released before
// tma_store_wait_read.
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
// Closes this thread's bulk async-group of the stores issued so far.
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Waits until every committed bulk async-group of this thread has read its
// shared-memory source.
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
// The end of a kernel that stores its output tile from shared memory: after
// every thread has written its part of the tile into kPanels panels of
// kCols columns (the panel p, at shared address addr(p), holds columns
// col0 + kCols p ..), makes the writes visible to the async proxy, and one
// thread stores by TMA each panel that starts before `cols` and waits until
// the stores have read it (the CTA's shared memory is released when its
// threads exit).
template <int kPanels, int kCols, typename Addr>
__device__ __forceinline__ void store_panels(const CUtensorMap* map, const Addr& addr, int64_t col0, int64_t cols,
                                             int64_t row0, int64_t b) {
  fence_proxy_async();
  __syncthreads();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int p = 0; p < kPanels; ++p)
      if (col0 + kCols * p < cols)
        tma_store_3d(map, addr(p), static_cast<int>(col0) + kCols * p, static_cast<int>(row0), static_cast<int>(b));
    tma_store_commit();
    tma_store_wait_read();
  }
}
#endif  // SMM_SM90A_DEVICE

// The driver's cuTensorMapEncodeTiled, looked up once; null where the
// driver has none.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// A tiled tensor map: `rank` dims innermost first, strides (bytes) of dims
// 1.., zero fill out of bounds. False where the driver has no encoder or
// refuses the map.
inline bool encode_tiled(CUtensorMap* map, CUtensorMapDataType dt, cuuint32_t rank, const void* base,
                         const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                         CUtensorMapSwizzle swizzle) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint32_t estr[3] = {1, 1, 1};
  return encode(map, dt, rank, const_cast<void*>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The tensor map of a 16- or 32-bit (batch, rows, cols) tensor with unit
// stride along cols, boxes of box_cols x box_rows x 1 (128-byte swizzle:
// box_cols of 128 bytes). False for an expanded batch (batch > 1, batch
// stride <= 0), dims of 2^31 or more (the kernels' coordinates are int) or
// where the driver refuses the map (the caller then takes cp.async).
template <typename T>
bool map_3d(CUtensorMap* map, const void* base, int64_t cols, int64_t rows, int64_t batch, int64_t row_stride,
            int64_t batch_stride, int box_cols, int box_rows,
            CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half> || std::is_same_v<T, float>,
                "bf16, f16 or f32 elements");
  constexpr int64_t kMax = int64_t{1} << 31;
  if (batch > 1 && batch_stride <= 0) return false;
  if (cols >= kMax || rows >= kMax || batch >= kMax) return false;
  const int64_t es = sizeof(T);
  const CUtensorMapDataType dt = std::is_same_v<T, float>            ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                 : std::is_same_v<T, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                    : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(row_stride * es),
                                 static_cast<cuuint64_t>((batch > 1 ? batch_stride : row_stride * rows) * es)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows), 1};
  return encode_tiled(map, dt, 3, base, dims, strides, box, swizzle);
}

}  // namespace softmax_ext::smm::cuda::sm90
