// The launch geometry select() computes for the strided family (family.cu),
// read by its launchers. Host code.
#pragma once

#include "cuda/core/launch.cuh"
#include "cuda/families/strided/policy.h"

namespace softmax_ext::cuda {

struct StridedGeometry {
  StridedShape shape;
  BlockShape launch;  // blocks of more than 512 threads on a persistent grid
  bool one_warp;      // a one-warp tile, no cluster: its lane fold has the column totals
};

}  // namespace softmax_ext::cuda
