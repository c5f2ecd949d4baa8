// Strided split family (cuda.strided_split): a strided axis with a
// contiguous inner run of at least kStridedMinInner columns, longer than
// the strided family's reach. The strided family's column tiles
// (core/columns.h) in blocks of kStridedSplitThreads threads, the axis cut
// into chunks of kStridedSplitChunk positions; a partial per column and
// chunk into the workspace, combined per column, then applied: inputs are
// read twice. The numbers come from docs/tuning/strided_split.md. Plain C++.
#pragma once

#include "cuda/core/budget.h"
#include "cuda/core/columns.h"
#include "cuda/core/workspace.h"
#include "plan/plan.h"

#include <cstdint>

namespace softmax_ext::cuda {

constexpr int kStridedSplitThreads = 256;
constexpr int kStridedSplitCombineThreads = 256;
// A chunk takes a thread 32 positions in f32 (8 columns of 4-float vectors
// by 32 thread rows), so a chunk's reads are long enough to hide latency.
constexpr int64_t kStridedSplitChunk = 1024;
inline int64_t strided_split_chunks(const Problem& p) { return ceil_div(p.axis_size, kStridedSplitChunk); }
// Workspace (core/workspace.h): a partial per chunk and column, then a
// combined value per column.
inline int64_t strided_split_partials_bytes(const Problem& p) { return partials_bytes(p, strided_split_chunks(p)); }
inline int64_t strided_split_workspace_bytes(const Problem& p) { return workspace_bytes(p, strided_split_chunks(p)); }

// How the axis is cut (a kernel parameter): `chunks` chunks of `chunk`
// positions; `items` blocks' worth of (chunk, tile) pairs, tiles fastest,
// so that blocks running together read neighbouring columns of the same
// positions.
struct StridedSplitShape {
  int64_t chunk;
  int64_t chunks;
  int64_t items;
};

// What select() decides for a launch (Plan::geometry_as): the pack width,
// the threads across a tile (the strided family's widest tile) and the cut.
struct StridedSplitGeometry {
  int pack;
  int columns;
  StridedSplitShape shape;
};

void strided_split_forward(const Plan& plan, const Buffers& buffers, void* workspace);   // forward.cu
void strided_split_backward(const Plan& plan, const Buffers& buffers, void* workspace);  // backward.cu

}  // namespace softmax_ext::cuda
