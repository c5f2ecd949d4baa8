// Host-side entry points of the CUDA kernels (defined in the .cu files).
// Included by plan/run.cpp and plan/select.cpp, which the host compiler
// builds: nothing CUDA-specific may appear here.
//
// Each launcher runs on the current CUDA stream of the current device (the op
// layer has set the device guard), checks its launches, and never
// synchronises or allocates; the split family gets its workspace from the
// caller (the caching allocator).
#pragma once

#include "plan/plan.h"

#include <c10/util/ArrayRef.h>

namespace softmax_ext::cuda {

// KernelFamily::kCudaReference: one block per row, any strides and dtypes.
void reference_forward(const Problem& problem, const Buffers& buffers);
void reference_backward(const Problem& problem, const Buffers& buffers);

// KernelFamily::kCudaWarp: contiguous rows up to warp_capacity (config.h).
void warp_forward(const Problem& problem, const Buffers& buffers);
void warp_backward(const Problem& problem, const Buffers& buffers);

// KernelFamily::kCudaRowTile: short f32, bf16 and f16 rows laid out one
// after another (row_tile_takes, config.h).
void row_tile_forward(const Problem& problem, const Buffers& buffers);
void row_tile_backward(const Problem& problem, const Buffers& buffers);

// KernelFamily::kCudaBlock (max_cluster 1) and kCudaCluster (max_cluster > 1,
// sm_90+): contiguous rows up to block_capacity / cluster_capacity.
void block_forward(const Problem& problem, const Buffers& buffers, int max_cluster);
void block_backward(const Problem& problem, const Buffers& buffers, int max_cluster);

// KernelFamily::kCudaSplit: contiguous rows of any length; needs
// split_workspace_bytes(problem) bytes of workspace. With `resident`
// (KernelFamily::kCudaSplitResident: split_resident, config.h), one
// cooperative kernel and resident_workspace_bytes(problem).
void split_forward(const Problem& problem, const Buffers& buffers, void* workspace, bool resident);
void split_backward(const Problem& problem, const Buffers& buffers, void* workspace, bool resident);

// KernelFamily::kCudaStrided: the axis strided, a contiguous inner run.
void strided_forward(const Problem& problem, const Buffers& buffers, int max_cluster);
void strided_backward(const Problem& problem, const Buffers& buffers, int max_cluster);

// KernelFamily::kCudaStridedSplit: the axis strided and longer than
// strided_reach (config.h), a contiguous inner run; needs
// strided_split_workspace_bytes(problem) bytes of workspace.
void strided_split_forward(const Problem& problem, const Buffers& buffers, void* workspace);
void strided_split_backward(const Problem& problem, const Buffers& buffers, void* workspace);

// Copies src into dst (one shape, `element_bytes` of 2, 4 or 8) when their
// fastest dims differ, through shared-memory tiles so that both sides
// coalesce; returns false, copying nothing, where the layouts are not of that
// form (no dim of stride 1 on a side, the same one on both, or more than
// eight dims of size > 1).
bool copy_across_layouts(const void* src, void* dst, int64_t element_bytes, c10::IntArrayRef sizes,
                         c10::IntArrayRef src_strides, c10::IntArrayRef dst_strides);

// Device facts, cached per device: compute capability (major * 10 + minor),
// and the largest thread-block cluster of 1024-thread blocks the kernels may
// use there (1 where the device or this build has no cluster support).
int device_arch(int device);
int max_cluster_size(int device);
// What the resident split family holds on chip (config.h,
// split_resident_capacity): the SMs, and the dynamic shared memory a block
// may take with `blocks` blocks per SM.
int sm_count(int device);
int shared_bytes_per_block(int device, int blocks);

}  // namespace softmax_ext::cuda
