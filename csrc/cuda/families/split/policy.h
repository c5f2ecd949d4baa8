// Split families (cuda.split, cuda.split_resident): rows longer than a
// block or a cluster holds, down to a single row of 2^28+ elements, spread
// over every SM. A row is cut into tiles of kSplitThreads * elems_per_thread
// positions and the tiles into chunks. Rows the GPU's blocks hold on chip
// run on one cooperative kernel (split_resident); longer ones on three
// kernels (stats, combine, apply) that read x (dy and y) twice. The numbers
// below come from docs/tuning/split.md unless a line says otherwise. Plain
// C++.
#pragma once

#include "cuda/core/budget.h"
#include "cuda/core/workspace.h"
#include "plan/plan.h"

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstdint>

namespace softmax_ext::cuda {

// 512-thread blocks let two share an SM, so one's loads overlap the other's
// reductions.
constexpr int kSplitThreads = 512;
constexpr int kSplitCombineThreads = 256;
constexpr int64_t split_tile(bool double_acc, bool backward) {
  return int64_t{kSplitThreads} * elems_per_thread(double_acc, backward);
}
// A stats block streams up to kSplitMaxChunkTiles tiles with per-thread
// running statistics and reduces across the block once, so its loads are
// not held up by a block barrier every tile; rows keep at least
// kSplitMinChunks chunks each, so even one row fills every SM.
constexpr int64_t kSplitMaxChunkTiles = 8;
constexpr int64_t kSplitMinChunks = 256;
constexpr int64_t split_chunk_tiles(int64_t tiles) {
  return std::clamp<int64_t>(tiles / kSplitMinChunks, 1, kSplitMaxChunkTiles);
}
// The forward apply kernel, with no reduction to wait for, runs f32 rows in
// quarters of the stats tile (8 values a thread) with four blocks per SM;
// the other dtypes and the backward keep the stats tiles, two blocks per SM.
constexpr int split_apply_divisor(int64_t element_bytes, bool backward) {
  return !backward && element_bytes == 4 ? 4 : 1;
}
constexpr int split_apply_blocks_per_sm(int64_t element_bytes, bool backward) {
  return split_apply_divisor(element_bytes, backward) == 1 ? 2 : 4;
}
constexpr int64_t split_apply_tile(bool double_acc, bool backward, int64_t element_bytes) {
  return split_tile(double_acc, backward) / split_apply_divisor(element_bytes, backward);
}

// Tiles per row. A row may start anywhere inside a 16-byte vector
// (core/fragment.cuh), so the tiles cover length + pack - 1.
inline int64_t split_tiles(const Problem& p) {
  const bool dbl = p.out_dtype == c10::ScalarType::Double;
  const int64_t pack = pack_size(c10::elementSize(p.in_dtype));
  return ceil_div(p.axis_size + pack - 1, split_tile(dbl, p.is_backward()));
}
inline int64_t split_chunks(const Problem& p) {
  const int64_t tiles = split_tiles(p);
  return ceil_div(tiles, split_chunk_tiles(tiles));
}
inline int64_t split_apply_tiles(const Problem& p) {
  const bool dbl = p.out_dtype == c10::ScalarType::Double;
  const int64_t pack = pack_size(c10::elementSize(p.in_dtype));
  return ceil_div(p.axis_size + pack - 1,
                  split_apply_tile(dbl, p.is_backward(), static_cast<int64_t>(c10::elementSize(p.in_dtype))));
}
// The three kernels' workspace (core/workspace.h): a partial per chunk.
inline int64_t split_partials_bytes(const Problem& p) { return partials_bytes(p, split_chunks(p)); }
inline int64_t split_workspace_bytes(const Problem& p) { return workspace_bytes(p, split_chunks(p)); }

// Resident split: each block keeps the first tiles of its slice in shared
// memory (as many as its share of the SM's takes with kResidentBlocksPerSM
// blocks per SM) and the last in registers, so x (dy and y) is read from
// global memory once.
constexpr int kResidentBlocksPerSM = 2;
constexpr int64_t kResidentMaxHeldTiles = 32;  // one bit each (HeldTiles, core/staging.cuh)
constexpr int64_t kResidentMaxBlocksPerRow = 1024;
// Shared memory a held tile takes per thread: its packs of x (dy and y).
constexpr int64_t resident_tile_thread_bytes(int64_t in_bytes, bool double_acc, bool backward) {
  return (backward ? 2 : 1) * elems_per_thread(double_acc, backward) * in_bytes;
}
constexpr int64_t resident_held_tiles(int64_t shared_per_block, int64_t in_bytes, bool double_acc, bool backward) {
  return std::clamp<int64_t>(
      shared_per_block / (resident_tile_thread_bytes(in_bytes, double_acc, backward) * kSplitThreads), 0,
      kResidentMaxHeldTiles);
}
// The longest row that runs resident: every block the GPU holds keeps its
// held tiles and one more (the tiles cover the row and pack - 1).
constexpr int64_t split_resident_capacity(int64_t in_bytes, bool double_acc, bool backward,
                                          int64_t shared_per_block, int64_t sms) {
  return sms * kResidentBlocksPerSM * (resident_held_tiles(shared_per_block, in_bytes, double_acc, backward) + 1) *
             split_tile(double_acc, backward) -
         (pack_size(in_bytes) - 1);
}
// Its workspace: a partial per block of each row, then a counter per row.
inline int64_t resident_partials_bytes(const Problem& p) {
  return partials_bytes(p, std::min(split_tiles(p), kResidentMaxBlocksPerRow));
}
inline int64_t resident_workspace_bytes(const Problem& p) { return resident_partials_bytes(p) + p.rows * 4; }

// How the rows are cut for the three kernels: `tiles` stats tiles, folded
// by the stats kernel in `chunks` chunks of chunk_tiles tiles; `apply_tiles`
// tiles of the apply kernel (a kernel parameter).
struct SplitShape {
  int64_t rows;
  int64_t tiles;
  int64_t chunk_tiles;
  int64_t chunks;
  int64_t apply_tiles;
};

// How the resident kernel cuts the rows (a kernel parameter): each row into
// blocks_per_row slices of slice_tiles tiles, group_rows rows at once.
struct ResidentShape {
  int64_t rows;
  int64_t tiles;        // stats tiles per row
  int64_t slice_tiles;  // tiles per slice
  int blocks_per_row;
  int group_rows;       // gridDim.x == group_rows * blocks_per_row
  int held_tiles;       // tiles of a slice a block may hold in shared memory
};
// What select() decides for a resident launch (Plan::geometry_as).
struct ResidentGeometry {
  ResidentShape shape;
  int64_t smem_bytes;  // dynamic shared memory of a block: its held tiles
};

void split_forward(const Plan& plan, const Buffers& buffers, void* workspace);              // forward.cu
void split_backward(const Plan& plan, const Buffers& buffers, void* workspace);             // backward.cu
void split_resident_forward(const Plan& plan, const Buffers& buffers, void* workspace);     // forward.cu
void split_resident_backward(const Plan& plan, const Buffers& buffers, void* workspace);    // backward.cu
// The resident kernel of p's dtypes, kind and direction: how many blocks of
// kSplitThreads threads with `smem_bytes` of dynamic shared memory the
// current device runs at once (core/launch.cuh, persistent_clusters).
int64_t resident_blocks_forward(const Problem& p, int64_t smem_bytes);   // forward.cu
int64_t resident_blocks_backward(const Problem& p, int64_t smem_bytes);  // backward.cu

}  // namespace softmax_ext::cuda
