// The family registry: every kernel family, one line each, in the order
// select() asks them (the first that plans a problem runs it). A family is
// a folder (cpu/, cuda/families/<family>/) defining its Family entry
// (plan/family.h); adding one is that folder and a line here.

#include "plan/family.h"

namespace softmax_ext {

extern const Family kCpuLastDim, kCpuInner, kCpuStrided;
#ifdef SOFTMAX_EXT_WITH_CUDA
extern const Family kCudaRowTile, kCudaWarp, kCudaBlock, kCudaCluster, kCudaSplitResident, kCudaSplit,
    kCudaStrided, kCudaStridedSplit, kCudaReference;
#endif

const std::vector<const Family*>& families() {
  static const std::vector<const Family*> registry = {
      &kCpuLastDim,         // cpu/family.cpp: the axis contiguous
      &kCpuInner,           // cpu/family.cpp: a strided axis with a contiguous inner run
      &kCpuStrided,         // cpu/family.cpp: anything else on CPU
#ifdef SOFTMAX_EXT_WITH_CUDA
      &kCudaRowTile,        // cuda/families/row_tile: short rows one after another
      &kCudaWarp,           // cuda/families/warp: contiguous rows in a warp's registers
      &kCudaBlock,          // cuda/families/block: contiguous rows in a block's registers
      &kCudaCluster,        // cuda/families/block: contiguous rows in a cluster's registers (sm_90+)
      &kCudaSplitResident,  // cuda/families/split: longer rows the GPU holds on chip
      &kCudaSplit,          // cuda/families/split: contiguous rows of any length
      &kCudaStrided,        // cuda/families/strided: a strided axis with an inner run
      &kCudaStridedSplit,   // cuda/families/strided_split: longer strided axes with an inner run
      &kCudaReference,      // cuda/families/reference: anything else on CUDA
#endif
  };
  return registry;
}

}  // namespace softmax_ext
