// Launch geometry of the CUDA kernel families, shared by select() (host C++,
// which picks a family from these capacities) and the launchers (which build
// the launch from the same numbers). Plain C++: no CUDA types in here.
//
// Every threshold is a named constant; tests/test_cuda_families.py checks each
// family at its capacity and one past it.
#pragma once

#include "plan/problem.h"

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstdint>

namespace softmax_ext::cuda {

// Bytes moved by one vector load or store: 16 (LDG.128 / STG.128).
constexpr int kVectorBytes = 16;

// Elements per vector ("pack") for an element size: 4 f32, 8 f16/bf16, 2 f64.
constexpr int pack_size(int64_t element_bytes) { return kVectorBytes / static_cast<int>(element_bytes); }

// n & (n - 1) == 0: n is a power of two, or 0.
constexpr bool is_pow2(int64_t n) { return (n & (n - 1)) == 0; }
constexpr bool is_16bit_float(c10::ScalarType t) {
  return t == c10::ScalarType::BFloat16 || t == c10::ScalarType::Half;
}

// Row elements each thread keeps in registers, as accumulator values. 32
// floats (16 doubles) is the largest per-thread fragment with which the
// f32/f16/bf16 warp, block and cluster kernels fit 64 registers per thread
// (1024 threads per SM) without spilling (ptxas -v on sm_90; the f64
// variants spill a few bytes); the backward keeps dy and y, so half as many
// of each. The 16-bit cluster and strided forward kernels keep their
// elements packed, two per register: twice as many.
constexpr int kRegisterFloats = 32;
constexpr int elems_per_thread(bool double_acc, bool backward) {
  return (double_acc ? kRegisterFloats / 2 : kRegisterFloats) / (backward ? 2 : 1);
}

// Grids of the warp, row-tile and block families: a block per pass over
// its rows (one group of rows, one tile, one row), so the hardware's block
// scheduler deals the work out to the end. 16-bit rows are the exception,
// but for backward rows whose length is a power of two: they run faster on
// kMaxGridBlocks blocks (common.cuh), each walking several passes. Measured
// on H200 (the op, the two grids alternating in one process, % of the copy
// bandwidth), 65535 blocks -> a block per pass:
//   warp f32 rows of 32 / 128 / 1024 / 100 / 200 forward 97.8 / 98.0 / 98.1
//     / 79.4 / 96.5 -> 99.5 / 99.8 / 98.1 / 81.4 / 97.2, (2^24, 16) 98.1 ->
//     99.8; backward 128 log_softmax 101.2 -> 102.4, 256 101.2 -> 102.3,
//     512 log_softmax 101.5 -> 101.9; bf16 128 / 1024 forward 97.3 / 98.3
//     -> 97.6 / 98.9; bf16 777 forward 66.5 -> 65.2;
//   block f32 backward 1000 / 1024 log_softmax / 1500 / 2048 log_softmax
//     98.8 / 101.1 / 100.3 / 101.2 -> 101.5 / 102.4 / 101.6 / 101.7; f32
//     forward 1500 / 3000 / 4096 95.5 / 95.7 / 96.3 -> 95.2 / 96.3 / 96.4;
//     16-bit, powers of two: bf16 backward 1024 / 2048 100.5 / 101.9 ->
//     103.2 / 103.2, f16 1024 log_softmax 100.6 -> 103.4, bf16 4096 forward
//     96.9 -> 98.4, bf16 8192 log_softmax backward 101.7 -> 101.6; 16-bit,
//     other lengths: bf16 backward 777 / 1500 / 2000 75.2 / 83.7 / 100.6 ->
//     72.6 / 75.0 / 100.4, f16 1000 log_softmax backward 94.4 -> 89.1, bf16
//     forward 1500 / 3000 68.9 / 91.4 -> 65.9 / 89.8.
// In benchmarks/bench_softmax (a block per pass against earlier runs'
// figures), 16-bit forward rows of 32 lost 4-7 points (bf16 softmax 99.0 ->
// 92.2, f16 97.9 -> 91.8) where their backward gained 1-1.5, so 16-bit
// forward rows walk whatever their length. (f64 rows follow the f32 rule,
// unmeasured.) Clusters, the split families and the reference kernels keep
// their grids.
constexpr bool grid_walks_rows(c10::ScalarType in, int64_t axis_size, bool backward) {
  return is_16bit_float(in) && (!backward || !is_pow2(axis_size));
}

// Warp family: a row lives in the registers of one warp, or of a 1..16-lane
// slice of it when rows are tiny, so no lane idles on rows of 4..64 elements.
constexpr int kWarpSize = 32;
constexpr int64_t warp_capacity(bool double_acc, bool backward) {
  return int64_t{kWarpSize} * elems_per_thread(double_acc, backward);
}

// Row-tile family (row_tile_kernels.cuh): the backward of f32, bf16 and f16
// rows of up to kRowTileMaxRow elements that are not a power of two, laid
// out one after another in every operand, and the forward of such f32 rows
// where they fill their lane group (row_tile_forward_fits). A block stages
// kRowTileBytes of whole rows of dy and of y (forward: x) in shared memory
// as flat 16-byte copies, so no lane idles on the part of a power-of-two
// lane group that a row leaves empty, and the per-row 16-byte views of the
// warp family (partial vectors at each end of a row off the 16-byte grid)
// are gone. Measured on H200 (lab: the kernels launched directly, side by
// side in one process), % of the copy bandwidth, softmax / log_softmax
// backward, warp family -> row tile:
//   rows of 24 99.1 / 94.7 -> 103.1 / 103.1, 80 98.4 / 85.3 -> 103.2 / 103.2,
//   100 100.6 / 96.4 -> 103.0 / 103.0, 160 99.5 / 82.5 -> 103.1 / 103.2,
//   200 101.0 / 96.2 -> 103.1 / 103.0, 300 102.2 / 100.1 -> 102.9 / 102.7,
//   500 101.4 / 101.7 -> 103.1 / 102.8 (torch: 51.7 / 103.0-103.7);
// 8 KB tiles ran 1-20 points slower, 32 KB ones up to 13 slower (log_softmax
// rows of 80), and rows of 1000 (16 values a lane) gained nothing. Power-of-
// two rows stay with the warp family (101-103 there): groups of lanes
// reading rows whose starts share a shared-memory bank would conflict.
// 16-bit rows gain more (the same tile bytes, twice the rows), warp or
// block family -> row tile, softmax / log_softmax backward (lab, the op with
// the family switched, torch in the same rounds at 44-80): bf16 rows of 48
// 88.4 -> 94.6, 77 53.9 -> 85.9, 197 64.2 / 53.3 -> 93.0 / 82.3, 300 61.8 /
// 55.6 -> 82.0 / 74.7, 500 log_softmax 77.6 -> 91.3; f16 rows of 100 65.6 ->
// 88.1, 197 63.9 -> 87.9. (Longer 16-bit rows lost in an earlier tile
// layout: f16 rows of 1000, log_softmax, 94.0 -> 65.1.) f64 rows stay with
// the warp family.
constexpr int64_t kRowTileMaxRow = 512;
constexpr int64_t kRowTileMinForwardRow = 32;  // shorter forward rows: not measured
constexpr int64_t kRowTileBytes = 16384;
// A run sits in its shared region at its offset from the 32-byte grid (not
// just the 16-byte one), and regions are 32-byte multiples, so every 32-byte
// sector of global memory lands on one 32-byte span of shared memory. With
// y's region 16 bytes off that grid, the op ran 2.5-4.5 points below the
// lab's launches of the same kernel. Measured on H200 (lab, same process, %
// of the copy bandwidth; region = tile + 16 bytes, then padded by 16 / 32 /
// 48 / 64 / 112 bytes): log_softmax rows of 100 100.4, then 102.8 / 99.1 /
// 103.0 / 99.0 / 102.6; rows of 200 100.4, then 102.8 / 99.2 / 103.0 / 99.1
// / 102.7; softmax rows of 300 98.5, then 102.9 / 98.5 / 102.8 / 99.0 /
// 102.8: every region start off the 32-byte grid lost.
constexpr int64_t kRowTileAlign = 32;
constexpr bool row_tile_dtype(c10::ScalarType t) { return t == c10::ScalarType::Float || is_16bit_float(t); }
// Elements a lane holds of a row: 8 up to rows of 256, else 16.
constexpr int row_tile_per_lane(int64_t n) { return n <= 256 ? 8 : 16; }
// Values a row's lane group holds: a power of two of lanes, per_lane each.
constexpr int64_t row_tile_group_values(int64_t n) {
  int64_t values = row_tile_per_lane(n);
  while (values < n) values *= 2;
  return values;
}
// Forward: f32 rows (y f32 too) that fill most of their lane group: at least
// 90% of it for rows of 33 to 128, 97% for longer ones. The tile's speed
// followed its fill (the share of its lanes' values a row uses) in the
// sweep below; the warp family's dips did not follow one simple rule (rows
// of 58, 62, 126, 250 and 510 at 74-85, 470 at 97). Measured on H200
// (lab: the op with the family switched, torch.compile in the same rounds),
// % of the copy bandwidth, softmax forward, warp family -> row tile:
//   taken: rows of 58 75.8 -> 97.7, 60 90.1 -> 97.7, 62 73.9 -> 98.5,
//   116 94.0 -> 96.4, 120 94.8 -> 96.9, 124 86.6 -> 97.2, 126 75.0 -> 96.5,
//   250 84.7 -> 94.2, 500 96.7 -> 98.3, 508 96.2 -> 98.2, 510 79.1 -> 98.1
//   (torch.compile 94.8-99.3);
//   left to the warp family: 56 97.5 -> 97.7, 68 84.0 -> 68.1, 100 94.4 ->
//   88.7, 110 90.1 -> 96.4, 180 94.8 -> 82.7, 232 96.9 -> 94.0, 240 96.7 ->
//   94.2, 244 95.5 -> 95.1, 300 91.7 -> 78.8, 440 97.7 -> 96.1, 470 96.8 ->
//   98.2.
// 16-bit forward rows lost on the tile at every length tried (bf16 rows of
// 48 64.6 -> 61.4, 197 68.6 -> 56.6, 500 82.8 -> 74.4; f16 100 68.3 ->
// 59.4): their rows hold twice the values of the same bytes, and the
// backward gains came from reading two tensors, not one.
constexpr bool row_tile_forward_fits(c10::ScalarType in, c10::ScalarType out, int64_t n) {
  if (in != c10::ScalarType::Float || out != in || n <= kRowTileMinForwardRow) return false;
  return n * 100 >= row_tile_group_values(n) * (n <= 128 ? 90 : 97);
}
// The longest row the family takes for `in` rows (0: none).
constexpr int64_t row_tile_capacity(c10::ScalarType in, bool backward) {
  return (backward ? row_tile_dtype(in) : in == c10::ScalarType::Float) ? kRowTileMaxRow : 0;
}
inline bool row_tile_takes(const Problem& p) {
  const int64_t n = p.axis_size;
  if (n > row_tile_capacity(p.in_dtype, p.is_backward()) || is_pow2(n)) return false;
  if (!p.is_backward() && !row_tile_forward_fits(p.in_dtype, p.out_dtype, n)) return false;
  // Flat: every operand's rows follow one another (one batch dim after
  // coalescing, of stride n).
  if (p.batch_rank > 1) return false;
  for (int k = 0; k < kNumOperands; ++k) {
    if (k == kIn1 && !p.is_backward()) continue;  // forward has no second input
    if (p.axis_stride[k] != 1 || (p.batch_rank == 1 && p.batch_stride[k][0] != n)) return false;
  }
  return true;
}

// Block family: a row lives in the registers of one block, one read and one
// write of global memory. A forward block grows to the hardware's 1024
// threads (f32 rows of 32768 ran at 98% of the copy bandwidth on H200 in one
// block, at 84-90% as a cluster of two 512-thread blocks). Where clusters
// exist (sm_90+) a backward block has at most 512 threads, so two blocks
// share an SM and one's loads overlap the other's reductions (1024-thread
// blocks, one per SM, reached 69% of the copy bandwidth on 16384-float rows
// backward on H100; benchmarks/bench_softmax); longer rows go to a cluster.
// Without clusters a block grows to 1024 threads before the split family
// takes over.
constexpr int kMaxBlockThreads = 1024;
constexpr int kClusterBlockThreads = 512;
constexpr int max_block_threads(bool clusters, bool backward) {
  return clusters && backward ? kClusterBlockThreads : kMaxBlockThreads;
}
// The smallest block the family launches; shorter rows are the warp family's.
constexpr int kMinBlockThreads = 64;
constexpr int64_t block_capacity(bool double_acc, bool backward, bool clusters) {
  return int64_t{max_block_threads(clusters, backward)} * elems_per_thread(double_acc, backward);
}

// Cluster family (sm_90+): a row lives in the registers of a thread-block
// cluster; blocks exchange partial (max, sum) through distributed shared
// memory. 8 is the portable cluster limit; 16 needs the non-portable
// attribute, which H100/H200 grant for 1024-thread blocks (queried at run
// time: device_info.cu). Blocks have 1024 threads (one per SM), or 512 where
// that takes at least 1/kClusterHalfBlockSaving fewer threads for the row
// (the registers of threads past the row's end are lost to every row), or
// where a 16-bit backward cluster stages nothing (cluster_takes_half_blocks).
// Measured on H200, % of the copy bandwidth, 1024 -> 512-thread blocks:
//   f32  N=40000  forward 76.3 -> 85.1 (3 of 4 SMs' threads needed)
//   bf16 N=40000  backward 66.7 -> 93.0, N=100000 73.9 -> 90.5
//   f32  N=100000 forward 83.7 -> 79.7 (7/8); backward 98.3 -> 91.4 (13/14)
// 16 blocks of 512 threads (the earlier choice for the longest rows) fill
// the GPCs worse than 8 of 1024: at most 14 such clusters run at once on
// H200, 224 of the 264 block slots.
constexpr int kPortableClusterSize = 8;
constexpr int kMaxClusterSize = 16;
constexpr int kClusterHalfBlockSaving = 8;
// 16-bit rows longer than kPackedMinRow elements (every row of the cluster
// family) stay in registers as they are in memory, two values per register,
// widened only for the maths (Fragment, fragment.cuh): a thread holds twice
// as many elements, the same bytes as with f32, so a row needs half the
// threads. Measured on H200, % of the copy bandwidth, widened -> packed:
//   block forward  bf16 N=2048 98.5 -> 45.3, 4096 96.8 -> 95.3,
//                  8192 95.5 -> 96.3, 12288 79.6 -> 98.0, 16384 88.1 -> 96.3,
//                  32768 78.1 -> 97.6 (f16 alike)
//   block backward bf16 N=4096 103.3 -> 102.2, 8192 99.7 -> 102.7
//   cluster        f16 N=65536 forward 71.2 -> 90.0, backward 69.9 -> 100.1;
//                  N=262144 60.7 -> 82.7 and 55.8 -> 88.8
constexpr int64_t kPackedMinRow = 4096;
constexpr bool packs_registers(c10::ScalarType in) { return is_16bit_float(in); }
constexpr bool keeps_packed(c10::ScalarType in, int64_t axis_size, bool cluster) {
  return packs_registers(in) && (cluster || axis_size > kPackedMinRow);
}
constexpr int cluster_elems_per_thread(c10::ScalarType in, bool double_acc, bool backward) {
  return elems_per_thread(double_acc, backward) * (packs_registers(in) ? 2 : 1);
}
// Clusters run on a persistent grid (as many clusters as the GPU holds at
// once, each looping over rows: relaunching a cluster per row left SMs idle
// until a GPC had a whole cluster's worth free), and stage the next row in
// shared memory while they reduce and store the current one (staging.cuh)
// where that pays: every forward cluster; backward clusters of at least
// kStagedMinBackwardThreads threads, whose exchange across six or more SMs
// is long enough to hide loads behind (staging smaller backward clusters,
// whose stage holds dy and y, lost up to 10 points). Measured on H200, % of
// the copy bandwidth, a cluster per row -> persistent -> persistent and
// staged:
//   f32  N=262144 forward 79.9 -> 89.2 -> 92.7, backward 72.4 -> 71.5 -> 94.6
//   f32  N=65536  forward 88.8 -> 92.2 -> 93.6, backward 92.0 -> 98.0 -> 97.5
//   bf16 N=262144 forward 72.6 -> 86.9 -> 90.3, backward 84.9 -> 96.0 -> 98.3
//   bf16 N=131072 backward (4 SMs) 82.2 -> 98.0 -> 88.1
constexpr int kStagedMinBackwardThreads = 6 * kMaxBlockThreads;
constexpr bool stages_rows(int cluster_size, int threads, bool backward) {
  return cluster_size > 1 && (!backward || cluster_size * threads >= kStagedMinBackwardThreads);
}
// A backward cluster that does not stage its rows and needs two or more
// 1024-thread blocks, one per SM, overlaps nothing with its exchange across
// the cluster: 16-bit rows take twice as many 512-thread blocks, two per SM,
// even where that spares no threads. Measured on H200, % of the copy
// bandwidth, softmax / log_softmax backward, 1024 -> 512-thread blocks:
//   taken: bf16 N=50257 66.6 / 63.0 -> 72.1 / 69.1, f16 N=50257 66.3 / 61.0
//   -> 69.8 / 67.2, bf16 N=128256 95.7 / 94.8 -> 97.2 / 96.0, N=131072 95.3 /
//   95.0 -> 97.9 / 96.4, N=151936 87.6 / 86.4 -> 94.7 / 86.5, N=65536 96.6 /
//   96.1 -> 96.4 / 96.0;
//   not taken: rows of one 1024-thread block (bf16 N=20000 74.6 / 71.6 ->
//   69.9 / 72.9) and f32 rows (N=32001 96.0 / 95.6 -> 94.4 / 93.3, though
//   N=65536 95.9 / 95.4 -> 98.3 / 97.8).
// On H100 (the two shapes alternating in one process, medians of 5 rounds):
// bf16 N=50257 79.0 / 74.9 -> 82.3 / 79.9, f16 N=50257 78.5 / 72.1 -> 81.5 /
// 78.2, bf16 N=128256 96.6 / 96.0 -> 97.6 / 97.6, N=131072 95.5 / 96.0 ->
// 96.8 / 96.8, but N=151936 96.4 / 96.4 -> 94.8 / 94.8 and N=65536 97.2 /
// 96.8 -> 96.7 / 96.2 (rows of 100000, 512-thread blocks either way: 95.8 /
// 95.7 and 95.6 / 95.5, the spread of the method).
// A block per row that walks the row twice instead (the sums, then dx, the
// second read from L1/L2, as torch's kernels do) lost almost everywhere on
// H100, % of the copy bandwidth, softmax / log_softmax backward, block or
// cluster family -> row loop: bf16 N=577 67.4 / 60.3 -> 37.9 / 41.9, 1500
// 92.4 / 90.6 -> 83.6 / 83.8, 8191 90.6 / 87.9 -> 48.4 / 52.6, 20000 96.7 /
// 94.0 -> 87.8 / 89.0, 50257 82.1 / 79.4 -> 66.8 / 80.8, 65536 96.8 / 96.5
// -> 65.0 / 79.6; f32 N=20000 94.7 / 93.6 -> 68.1 / 81.9.
constexpr bool cluster_takes_half_blocks(c10::ScalarType in, bool backward, int64_t blocks, int64_t half_blocks) {
  const int64_t full_threads = blocks * kMaxBlockThreads;
  if ((full_threads - half_blocks * kClusterBlockThreads) * kClusterHalfBlockSaving >= full_threads) return true;
  return backward && is_16bit_float(in) && blocks >= 2 &&
         !stages_rows(static_cast<int>(blocks), kMaxBlockThreads, backward);
}
constexpr int64_t cluster_capacity(c10::ScalarType in, bool double_acc, bool backward, int cluster_size) {
  return int64_t{kMaxBlockThreads} * cluster_elems_per_thread(in, double_acc, backward) * cluster_size;
}

// Split family (any length, any GPU): the row is cut into tiles of
// kSplitThreads * elems_per_thread positions; kernel 1 folds each chunk of
// consecutive tiles into a partial in a workspace, kernel 2 combines a row's
// partials in order, kernel 3 normalises tile by tile. x (dy and y) is read
// twice: the family for rows no cluster can hold. 512-thread blocks let two
// share an SM, so one's loads overlap the other's reductions.
constexpr int kSplitThreads = 512;
constexpr int64_t split_tile(bool double_acc, bool backward) {
  return int64_t{kSplitThreads} * elems_per_thread(double_acc, backward);
}
constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
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
// quarters of the stats tile (8 values per thread) with four blocks per SM;
// the other dtypes and the backward keep the stats tiles, two blocks per SM.
// Measured on H200, f32 rows of 2^28, % of the copy bandwidth for the whole
// softmax (log_softmax): full tiles 52.3 (52.2), halves at 3 blocks/SM 58.5
// (56.8), quarters 61.3 (65.8); bf16 rows of 2^28: full 60.0 (62.8), halves
// 56.2 (62.3), quarters 51.9 (59.4). The order of the tiles and a persistent
// grid made no difference.
constexpr int split_apply_divisor(int64_t element_bytes, bool backward) {
  return !backward && element_bytes == 4 ? 4 : 1;
}
constexpr int split_apply_blocks_per_sm(int64_t element_bytes, bool backward) {
  return split_apply_divisor(element_bytes, backward) == 1 ? 2 : 4;
}
constexpr int64_t split_apply_tile(bool double_acc, bool backward, int64_t element_bytes) {
  return split_tile(double_acc, backward) / split_apply_divisor(element_bytes, backward);
}

// Strided family (the axis is not the fastest dim, but an inner run of
// contiguous elements exists): a block holds a tile of W inner columns by the
// axis, threads coalesced along the inner run; a cluster extends the axis on
// sm_90+. W * element size is one 128-byte line (fewer columns when the inner
// run is shorter). Inner runs shorter than kStridedMinInner go to the
// reference kernel. (Measured on H100 for (32, 1024, 4096) over dim 1: 64-byte
// tiles at half the register budget ran at 40% of copy bandwidth, 128-byte
// tiles at the full budget at 60%, despite a few spilled registers. On H200
// the half budget still cost 16-20 points: the per-tile reduction is paid
// per half as many bytes.)
//
// A tile is one block of up to kMaxBlockThreads threads before it is a
// cluster, and a cluster of at most kStridedWideClusterMax blocks has
// 1024-thread blocks; longer axes take 512-thread blocks, two per SM.
// Measured on H200, % of the copy bandwidth, f32 (the larger blocks on a
// persistent grid, below):
//   (32, 1024, 4096) dim 1 forward: 2 x 512 -> one 1024-thread block
//     64.2 -> 78.0 (log_softmax 68.3 -> 79.2)
//   (32, 1024, 4096) dim 1 backward: 4 x 512 -> 2 x 1024 78.0 -> 84.0
//     (log_softmax 75.6 -> 80.5)
//   (8192, 8192).t() forward: 8 x 512 51.5, 4 x 1024 46.0
// (With the kernels' spills gone, StridedLayout: 82.9 forward, 86.6
// backward on (32, 1024, 4096); 57.8 forward on (8192, 8192).t().)
// A copy of the same tiles, with no reduction, ran at 94% (128-byte tiles
// over 1024 positions) and 78-89% ((8192, 8192).t(), 64- and 128-byte tiles):
// the rest is the per-tile reduction and, across clusters, its barriers.
// Clusters push their column totals to each other (reduce.cuh, the
// exchange) rather than meet at a cluster barrier and read their peers':
// (32, 1024, 4096) backward (2 x 1024) 86.6 -> 91.1, (8192, 8192).t()
// forward 57.8 -> 59.8, backward 55.5 -> 59.5.
constexpr int kStridedWideClusterMax = 2;
// Blocks of more than 512 threads have an SM each: between one finishing and
// the next being placed the SM idles, so they run on a persistent grid, each
// looping over tiles (one 1024-thread block per tile of (32, 1024, 4096)
// dim 1: 66.1 -> 78.0; 2 x 1024 backward 71.8 -> 84.0). Clusters of
// 512-thread blocks are not: on (8192, 8192).t() a persistent grid of them
// ran at 47.9 against 51.5.
// Staging the next tile in shared memory (cp.async, as the cluster family
// stages rows) on a persistent grid lost too, on H200, % of the copy
// bandwidth: (8192, 8192).t() f32 forward 59.8 -> 51.0, backward 59.6 ->
// 52.1, bf16 forward 50.3 -> 34.4; (32, 1024, 4096) dim 1 f32 backward 91.2
// -> 81.3. So did ordering the tiles so that the clusters running at once
// spread across the inner run (59.9 -> 44.7): neighbouring tiles read at the
// same time are what the memory serves best.
constexpr bool strided_persistent(int threads) { return threads > kClusterBlockThreads; }
constexpr int64_t kStridedMinInner = 4;
constexpr int kStridedTileBytes = 128;
constexpr int strided_tile_columns(int64_t element_bytes) {
  return kStridedTileBytes / static_cast<int>(element_bytes);
}
constexpr int strided_elems_per_thread(bool double_acc, bool backward) {
  return elems_per_thread(double_acc, backward);
}
// An axis too long for 128-byte tiles runs in narrower ones, halving down to
// one 16-byte vector of columns: a block of W columns holds
// 1024 * elems_per_thread / W axis positions, so narrow tiles hold 8x (f32)
// longer axes. (Measured on H200, narrower tiles run slower: 64-byte tiles at
// 80-100%, 32-byte tiles at 55-80% of the 128-byte tiles' bandwidth; the
// reference kernel, which took these axes before, at a tenth of that.)
constexpr int kStridedMinTileBytes = kVectorBytes;
constexpr int64_t strided_min_tile_columns(int64_t element_bytes) {
  return std::max<int64_t>(kStridedMinTileBytes / element_bytes, 1);
}
// Where the 128-byte tile of an axis would take a cluster of more than
// kStridedPreferredCluster 512-thread blocks, the tile narrows to
// kStridedNarrowTileBytes, halving the cluster: clusters of 16 blocks fill
// the GPCs poorly (on H200 at most 14 run at once, 224 of the 264 block
// slots). Measured on H200, (8192, 8192).t() f32 forward, % of the copy
// bandwidth: 128-byte tiles (clusters of 16) 45.0, log_softmax 47.3;
// 64-byte tiles (clusters of 8) 48.6 and 52.9.
constexpr int kStridedPreferredCluster = kPortableClusterSize;
constexpr int kStridedNarrowTileBytes = 64;
// Axis positions a tile `columns` wide holds in a cluster of `cluster_size`
// blocks (1: one block), `per_thread` elements per thread whatever the
// pack; blocks grow to 1024 threads for the longest axes, as in the cluster
// family.
constexpr int64_t strided_axis_capacity(int64_t per_thread, int64_t columns, int cluster_size) {
  return int64_t{kMaxBlockThreads} * per_thread / columns * cluster_size;
}
// The strided family's reach: its narrowest tiles.
constexpr int64_t strided_capacity(bool double_acc, bool backward, int64_t element_bytes,
                                   int cluster_size) {
  return strided_axis_capacity(strided_elems_per_thread(double_acc, backward),
                               strided_min_tile_columns(element_bytes), cluster_size);
}

// The (input, output) dtype pairs the fast families are compiled for: the
// four same-dtype pairs and f16/bf16 -> f32 (softmax(x, dtype=torch.float32)
// of half inputs). Other `dtype=` pairs run on the reference kernel.
constexpr bool has_fast_kernels(c10::ScalarType in, c10::ScalarType out) {
  if (in == out) return true;
  return out == c10::ScalarType::Float && is_16bit_float(in);
}

// Tiles per row of the split family. A row may start anywhere inside a
// 16-byte vector (fragment.cuh), so the tiles cover length + pack - 1.
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

// Workspace of the split family: one partial per chunk (forward: max and
// sum; backward: a sum), then one combined value per row, in accumulator type.
inline int64_t split_value_bytes(const Problem& p) {
  const int64_t acc = p.out_dtype == c10::ScalarType::Double ? 8 : 4;
  return p.is_backward() ? acc : 2 * acc;
}
// `chunks` partials per row (the strided split family's: per column), padded
// to a vector, then the combined values.
inline int64_t partials_bytes(const Problem& p, int64_t chunks) {
  return ceil_div(p.rows * chunks * split_value_bytes(p), kVectorBytes) * kVectorBytes;
}
inline int64_t workspace_bytes(const Problem& p, int64_t chunks) {
  return partials_bytes(p, chunks) + p.rows * split_value_bytes(p);
}
inline int64_t split_partials_bytes(const Problem& p) { return partials_bytes(p, split_chunks(p)); }
// Resident split: rows whose tiles the whole GPU holds at once run in one
// cooperative kernel, a group of rows at a time (split_kernels.cuh). Each
// block keeps the first tiles of its slice in shared memory (as many as its
// share of the SM's takes with kResidentBlocksPerSM blocks per SM) and the
// last in registers, so x (dy and y) is read from global memory once, as by
// the cluster family. Longer rows take the three kernels.
// Measured on H200, % of the copy bandwidth, same run: three kernels ->
// resident with held tiles (the earlier resident kernel, which sized its
// groups to half of L2 and read each row again from there, ran at 71.8 on
// f32 (256, 2^20) forward and 74.7 on (1024, 600000)):
//   f32  (256, 2^20)   forward 65.9 -> 78.8, backward 63.4 -> 83.5,
//                      log_softmax backward 77.3 -> 86.6
//   f32  (1024, 600000) forward 66.7 -> 76.8; (8, 2^20) 43.9 -> 56.3
//   f32  (64, 2^22)    forward 66.3 -> 71.7, log_softmax backward 78.1 -> 77.6
//   f32  (16, 2^23)    forward 65.1 -> 68.4 (one row per group)
//   bf16 (512, 2^21)   log_softmax forward 54.1 -> 76.7
//   bf16 (1024, 600000) backward 60.2 -> 85.3; (64, 2^22) forward 53.7 -> 67.1
// Refilling each shared-memory slot with the next row's tile as soon as it is
// written out, rather than at the next row's start: f32 (256, 2^20) forward
// 77.2 -> 79.7, backward 82.0 -> 83.3; bf16 (512, 2^21) log_softmax forward
// 74.9 -> 78.7, (16, 2^23) backward 70.9 -> 73.5; f32 (64, 2^22) forward
// 71.8 either way.
// Sizing the groups by L2 with tiles held: (256, 2^20) forward 74.5,
// (64, 2^22) 56.5 (too few blocks per row to hold it). Rows longer than
// the GPU holds (f32 (4, 2^24): a slice of 4 tiles per block, 2 read again)
// gained nothing resident (62.7 against 61.5).
constexpr int kResidentBlocksPerSM = 2;
constexpr int64_t kResidentMaxHeldTiles = 32;  // one bit each (HeldTiles, staging.cuh)
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
// held tiles and one more (the tiles cover the row and pack - 1, fragment.cuh).
constexpr int64_t split_resident_capacity(int64_t in_bytes, bool double_acc, bool backward,
                                          int64_t shared_per_block, int64_t sms) {
  return sms * kResidentBlocksPerSM * (resident_held_tiles(shared_per_block, in_bytes, double_acc, backward) + 1) *
             split_tile(double_acc, backward) -
         (pack_size(in_bytes) - 1);
}
inline bool split_resident(const Problem& p, int64_t shared_per_block, int64_t sms) {
  return p.axis_size <= split_resident_capacity(c10::elementSize(p.in_dtype), p.out_dtype == c10::ScalarType::Double,
                                                p.is_backward(), shared_per_block, sms);
}
// Its workspace: a partial per block of each row, then a counter per row.
inline int64_t resident_partials_bytes(const Problem& p) {
  return partials_bytes(p, std::min(split_tiles(p), kResidentMaxBlocksPerRow));
}
inline int64_t resident_workspace_bytes(const Problem& p) { return resident_partials_bytes(p) + p.rows * 4; }
inline int64_t split_workspace_bytes(const Problem& p) { return workspace_bytes(p, split_chunks(p)); }

// Strided split family (an axis past strided_reach, with an inner run of
// at least kStridedMinInner): the strided family's 128-byte column tiles in
// blocks of kStridedSplitThreads threads, the axis cut into chunks of
// kStridedSplitChunk positions, a partial per column and chunk into a
// workspace, combined per column, then applied (strided_split_kernels.cuh).
// Inputs are read twice. A chunk takes a thread 32 positions in f32 (8
// columns of 4-float vectors by 32 thread rows), so a chunk's reads are
// long enough to hide latency; the reference kernel, which took these axes
// before, ran at 3% of the copy bandwidth on bf16 (100000, 512) over dim 0.
// Axes longer than kStridedSplitMaxStrided take this family even where a
// cluster of the strided family holds them, in narrow tiles: on H200,
// % of the copy bandwidth, strided -> strided split, f32 (2048, 65536).t()
// forward 32.3 -> 56.4, backward 12.9 -> 57.4, bf16 forward 34.5 -> 42.0;
// (64, 32768, 64) over dim 1 f32 forward 54.1 -> 53.8.
// Reading the input the second time from L2 lost: one cooperative kernel
// taking these items in column bands of 8 MB (band b + 1's statistics
// before band b's output, which waited on a per-tile arrival counter whose
// last statistics item folded the tile's partials) ran, on H100, % of the
// copy bandwidth, strided or strided split -> banded: (8192, 8192).t() f32
// forward 70.0 -> 44.4, backward 67.3 -> 52.3, bf16 forward 63.8 -> 30.5;
// (32, 1024, 4096) dim 1 f32 forward 87.6 -> 55.6; (131072, 2048) dim 0 f32
// forward 59.8 -> 16.2 (a band of one 128-byte tile); with a whole band's
// columns folded by its last item's block, 22.2 on (8192, 8192).t(). A band
// that L2 holds twice is narrow: its items read short stretches of many
// rows, where the three kernels' neighbouring tiles read whole rows together.
constexpr int64_t kStridedSplitMaxStrided = 16384;
constexpr int64_t strided_reach(bool double_acc, bool backward, int64_t element_bytes, int cluster_size) {
  return std::min(strided_capacity(double_acc, backward, element_bytes, cluster_size), kStridedSplitMaxStrided);
}
constexpr int kStridedSplitThreads = 256;
constexpr int64_t kStridedSplitChunk = 1024;
inline int64_t strided_split_chunks(const Problem& p) { return ceil_div(p.axis_size, kStridedSplitChunk); }
// Workspace: a partial per chunk and column, then a combined value per
// column, laid out as the split family's.
inline int64_t strided_split_partials_bytes(const Problem& p) { return partials_bytes(p, strided_split_chunks(p)); }
inline int64_t strided_split_workspace_bytes(const Problem& p) { return workspace_bytes(p, strided_split_chunks(p)); }

}  // namespace softmax_ext::cuda
