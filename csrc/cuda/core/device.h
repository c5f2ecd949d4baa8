// Device facts (plan/family.h, DeviceFacts; device.cu). Plain C++.
#pragma once

namespace softmax_ext::cuda {

// The kernel whose cluster occupancy sets DeviceFacts::max_cluster: the
// cluster family's forward kernel for f32 rows (families/block/family.cu).
const void* cluster_probe_kernel();

}  // namespace softmax_ext::cuda
