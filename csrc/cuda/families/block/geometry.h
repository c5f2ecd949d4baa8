// The launch geometry select() computes for the block and cluster families
// (family.cu), read by their launchers. Host code.
#pragma once

#include "cuda/core/launch.cuh"

namespace softmax_ext::cuda {

// A block just large enough for the row (up to max_block_threads), or a
// cluster of 1024-thread blocks (of 512-thread blocks where that spares
// threads), its register layout (packs of P elements a thread, packed
// 16-bit pairs) and whether it stages the next row.
struct BlockGeometry {
  BlockShape launch;
  int packs;
  bool packed;
  bool staged;
};

}  // namespace softmax_ext::cuda
