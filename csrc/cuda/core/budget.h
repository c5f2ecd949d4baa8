// What every CUDA family plans with: the vector width, the register budget
// of a thread, the hardware's block and cluster sizes, and the (input,
// output) dtype pairs the fast families are compiled for. Plain C++: select()
// (host code) and the kernels read the same numbers.
#pragma once

#include <c10/core/ScalarType.h>

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
constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t next_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}
// The largest power of two not above v (v >= 1).
inline int64_t prev_pow2(int64_t v) { return next_pow2(v + 1) / 2; }

// Row elements each thread keeps in registers, as accumulator values: the
// largest fragment with which the warp, block and cluster kernels fit 64
// registers a thread (1024 threads an SM) without spilling (ptxas -v,
// sm_90; docs/tuning/block.md). f64 halves it; the backward keeps dy and y,
// half as many of each.
constexpr int kRegisterFloats = 32;
constexpr int elems_per_thread(bool double_acc, bool backward) {
  return (double_acc ? kRegisterFloats / 2 : kRegisterFloats) / (backward ? 2 : 1);
}

// Hardware sizes: a warp, the largest block, the block size at which two
// blocks share an SM, and thread-block clusters (8 blocks portable; 16 with
// the non-portable attribute, which H100/H200 grant for 1024-thread blocks,
// queried at run time: core/device.cu).
constexpr int kWarpSize = 32;
constexpr int kMaxBlockThreads = 1024;
constexpr int kClusterBlockThreads = 512;
constexpr int kPortableClusterSize = 8;
constexpr int kMaxClusterSize = 16;

// The (input, output) dtype pairs the fast families are compiled for: the
// four same-dtype pairs and f16/bf16 -> f32 (softmax(x, dtype=torch.float32)
// of half inputs). Other `dtype=` pairs run on the reference family.
constexpr bool has_fast_kernels(c10::ScalarType in, c10::ScalarType out) {
  if (in == out) return true;
  return out == c10::ScalarType::Float && is_16bit_float(in);
}

}  // namespace softmax_ext::cuda
