// Row-tile family kernels (policy.h): short rows laid out one
// after another (row stride = row length in every operand). A block copies a
// tile of whole rows of its inputs (dy and y; forward, x) into shared memory
// as flat, coalesced runs of 16-byte vectors (cp.async), whatever the row
// length or where the rows start; each group of `group` lanes takes a row
// from shared memory into registers (kPerLane elements a lane), reduces it
// with shuffles and writes its result back over its own elements of the
// first input; the tile then leaves as one flat run of vector stores. One
// read of each input, one write, and no lane idles on a row length that is
// not a power of two.
#pragma once

#include "cuda/core/epilogues.cuh"
#include "cuda/core/fragment.cuh"
#include "cuda/core/reduce.cuh"
#include "cuda/core/staging.cuh"
#include "cuda/families/row_tile/policy.h"

#include <cstdint>

namespace softmax_ext::cuda {

// Where element e of a flat run [begin, end) of `src` sits in a shared
// region: at index e - begin + phase, phase = the run's offset (elements)
// from the kRowTileAlign-byte boundary before it, so that full 16-byte
// vectors of the run are 16-byte vectors of the region, and 32-byte sectors
// of global memory are 32-byte spans of it (policy.h).
template <typename T>
__device__ __forceinline__ int flat_phase(const T* run) {
  return static_cast<int>(reinterpret_cast<uintptr_t>(run) % kRowTileAlign / sizeof(T));
}

// A flat run of `len` elements at region index `phase` (any offset), as
// region indices [phase, end): full 16-byte vectors [full_begin, full_end),
// and at most P - 1 elements outside them at either end.
template <int P>
struct FlatRun {
  int end, full_begin, full_end;
  __device__ __forceinline__ FlatRun(int phase, int len)
      : end(phase + len), full_begin((phase + P - 1) / P), full_end((phase + len) / P) {}
  // Calls f(i) for the indices outside full vectors, thread t < P taking
  // the t-th of each end.
  template <typename F>
  __device__ __forceinline__ void for_each_end(int phase, F&& f) const {
    const int t = threadIdx.x;
    if (t >= P) return;
    if (phase + t < min(full_begin * P, end)) f(phase + t);
    if (full_end >= full_begin && full_end * P + t < end) f(full_end * P + t);
  }
};

// Copies the run src[0, len) into `region` at index phase + i: full vectors
// with cp.async (committed, not waited for), the partial vectors at either
// end element by element.
template <typename T>
__device__ __forceinline__ void stage_run(const T* __restrict__ src, int len, T* region) {
  constexpr int P = kPack<T>;
  const int phase = flat_phase(src);
  const FlatRun<P> run(phase, len);
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(region));
  const T* aligned = src - phase;  // region index i <-> aligned[i]
  for (int v = run.full_begin + static_cast<int>(threadIdx.x); v < run.full_end; v += blockDim.x)
    cp_async_16(base + v * kVectorBytes, aligned + v * P);
  cp_async_commit();
  run.for_each_end(phase, [&](int i) { region[i] = aligned[i]; });
}

// Writes region [phase, phase + len) (phase of dst) to dst[0, len), full
// vectors as 16-byte stores.
template <typename T>
__device__ __forceinline__ void store_run(const T* region, T* __restrict__ dst, int len) {
  constexpr int P = kPack<T>;
  const int phase = flat_phase(dst);
  const FlatRun<P> run(phase, len);
  T* aligned = dst - phase;
  for (int v = run.full_begin + static_cast<int>(threadIdx.x); v < run.full_end; v += blockDim.x) {
    Pack<T, P> pk;
    pk.raw[0] = *reinterpret_cast<const uint4*>(region + v * P);
    pk.store(aligned + v * P);
  }
  run.for_each_end(phase, [&](int i) { aligned[i] = region[i]; });
}

// Calls f(begin, rows) for each of this block's tiles (grid-stride): where
// the tile starts (flat element index) and how many rows it has.
template <typename F>
__device__ __forceinline__ void for_each_row_tile(const RowTileShape& s, F&& f) {
  const int64_t tiles = ceil_div(s.rows, int64_t{s.tile_rows});
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x)
    f(tile * s.tile_rows * s.n, static_cast<int>(std::min<int64_t>(s.tile_rows, s.rows - tile * s.tile_rows)));
}

// One tile a block at a time (grid-stride past the grid's limit): stage,
// reduce each row in registers, write it back over the tile, store. A block
// keeps no loads in flight through its own reductions and stores; the other
// blocks on its SM do (a persistent grid staging the next tile ran slower:
// docs/tuning/row_tile.md).
template <template <typename> class Epilogue, typename scalar_t, int kPerLane>
__global__ void __launch_bounds__(kRowTileThreads)
    softmax_row_tile_forward_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, const RowTileShape s,
                                    const bool in_place) {
  using acc_t = acc_type<scalar_t>;
  using Epi = Epilogue<acc_t>;
  extern __shared__ __align__(kRowTileAlign) unsigned char row_tile_shared[];
  // Regions: x, then y unless it is written over x (the same phase).
  scalar_t* xs = reinterpret_cast<scalar_t*>(row_tile_shared);
  scalar_t* ys = in_place ? xs : reinterpret_cast<scalar_t*>(row_tile_shared + s.region);
  const int groups = blockDim.x / s.group;
  const int g = threadIdx.x / s.group, lane = threadIdx.x % s.group;

  for_each_row_tile(s, [&](const int64_t begin, const int rows_here) {
    stage_run(x + begin, rows_here * s.n, xs);
    cp_async_wait_all();
    __syncthreads();
    const int x_phase = flat_phase(x + begin), y_phase = flat_phase(y + begin);
    for (int r0 = 0; r0 < s.tile_rows; r0 += groups) {  // the same trip count in every lane
      const int r = r0 + g;
      const bool valid = r < rows_here;
      const scalar_t* xrow = xs + x_phase + r * s.n;
      acc_t v[kPerLane][1];
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const int j = lane + k * s.group;
        v[k][0] = valid && j < s.n ? load_as<scalar_t>(xrow[j]) : neg_infinity<acc_t>();
      }
      const acc_t max = warp_all_reduce(fragment_max(v), NanMax{}, s.group);
      const acc_t sum =
          warp_all_reduce(fragment_exp_sum<Epi::kKeepsExp, typename Epi::Exp>(v, max), Sum{}, s.group);
      const Epi epilogue(max, sum);
      const acc_t scale = epilogue.scale_from(max);
      scalar_t* out = ys + y_phase + r * s.n;
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const int j = lane + k * s.group;
        if (valid && j < s.n) out[j] = convert<scalar_t>(epilogue.finish(v[k][0], scale));
      }
    }
    __syncthreads();
    store_run(ys, y + begin, rows_here * s.n);
    __syncthreads();  // the regions are free for the next tile
  });
}

// Backward twin: dy and y staged, dx written over dy where it can be.
template <template <typename> class Epilogue, typename scalar_t, int kPerLane>
__global__ void __launch_bounds__(kRowTileThreads)
    softmax_row_tile_backward_kernel(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ y,
                                     scalar_t* __restrict__ dx, const RowTileShape s, const bool in_place) {
  using acc_t = acc_type<scalar_t>;
  using Epi = Epilogue<acc_t>;
  extern __shared__ __align__(kRowTileAlign) unsigned char row_tile_shared[];
  // Regions: dy, y, then dx unless it is written over dy (the same phase).
  scalar_t* dys = reinterpret_cast<scalar_t*>(row_tile_shared);
  scalar_t* ys = reinterpret_cast<scalar_t*>(row_tile_shared + s.region);
  scalar_t* dxs = in_place ? dys : reinterpret_cast<scalar_t*>(row_tile_shared + 2 * s.region);
  const int groups = blockDim.x / s.group;
  const int g = threadIdx.x / s.group, lane = threadIdx.x % s.group;

  for_each_row_tile(s, [&](const int64_t begin, const int rows_here) {
    stage_run(dy + begin, rows_here * s.n, dys);
    stage_run(y + begin, rows_here * s.n, ys);
    cp_async_wait_all();
    __syncthreads();
    const int dy_phase = flat_phase(dy + begin), y_phase = flat_phase(y + begin),
              dx_phase = flat_phase(dx + begin);
    for (int r0 = 0; r0 < s.tile_rows; r0 += groups) {  // the same trip count in every lane
      const int r = r0 + g;
      const bool valid = r < rows_here;
      const scalar_t* grow = dys + dy_phase + r * s.n;
      const scalar_t* yrow = ys + y_phase + r * s.n;
      acc_t gv[kPerLane], yv[kPerLane];
      acc_t sum = 0;
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const int j = lane + k * s.group;
        const bool in = valid && j < s.n;
        gv[k] = in ? load_as<scalar_t>(grow[j]) : acc_t(0);
        yv[k] = in ? load_as<scalar_t>(yrow[j]) : acc_t(0);
        sum += Epi::reduce_term(gv[k], yv[k]);
      }
      const Epi epilogue(warp_all_reduce(sum, Sum{}, s.group));
      scalar_t* out = dxs + dx_phase + r * s.n;
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const int j = lane + k * s.group;
        if (valid && j < s.n) out[j] = convert<scalar_t>(epilogue(gv[k], yv[k]));
      }
    }
    __syncthreads();
    store_run(dxs, dx + begin, rows_here * s.n);
    __syncthreads();  // the regions are free for the next tile
  });
}

}  // namespace softmax_ext::cuda
