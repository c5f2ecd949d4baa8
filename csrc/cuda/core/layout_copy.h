// A copy across layouts through shared-memory tiles (layout_copy.cu): the
// backward's grad_output taken into grad_input's layout where select() asks
// for it (Plan::relayout_in0). Plain C++.
#pragma once

#include <c10/util/ArrayRef.h>

#include <cstdint>

namespace softmax_ext::cuda {

// Copies src into dst (one shape, `element_bytes` of 2, 4 or 8) when their
// fastest dims differ, through shared-memory tiles so that both sides
// coalesce; returns false, copying nothing, where the layouts are not of that
// form (no dim of stride 1 on a side, the same one on both, or more than
// eight dims of size > 1).
bool copy_across_layouts(const void* src, void* dst, int64_t element_bytes, c10::IntArrayRef sizes,
                         c10::IntArrayRef src_strides, c10::IntArrayRef dst_strides);

}  // namespace softmax_ext::cuda
