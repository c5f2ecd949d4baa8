// select / can_implement / workspace_size for softmax_matmul (see plan.h).
#include "softmax_matmul/plan.h"

#include "cuda/families/softmax_matmul/cuda_launch.h"  // rows_columns_per_thread (plain C++)

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace softmax_ext::smm {

const char* math_name(Math m) {
  switch (m) {
    case Math::kExactF32: return "exact-f32";
    case Math::kTF32: return "tf32";
    case Math::kHalfF32Acc: return "16-bit-f32-acc";
    case Math::kF64: return "f64";
    case Math::kF32: return "f32";
  }
  return "?";
}

static const char* tag(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return "f32";
    case c10::ScalarType::Half: return "f16";
    case c10::ScalarType::BFloat16: return "bf16";
    case c10::ScalarType::Double: return "f64";
    default: return "?";
  }
}

bool wgmma_built() {
#if defined(SOFTMAX_EXT_WITH_CUDA) && defined(SOFTMAX_EXT_SM90A)
  return true;
#else
  return false;
#endif
}

// The Hopper kernels: f16 / bf16 / f32 on compute capability 9.0, rows read
// as 16-byte chunks (unit inner strides, row and batch strides a multiple of
// 16 bytes, aligned pointers). SOFTMAX_EXT_SMM_SM80=1 keeps the
// mma.sync kernel (A/B work).
static bool wgmma_fits(const Descriptor& d) {
  if (!wgmma_built() || d.arch != 90 || !d.aligned16) return false;
  const bool f32 = d.dtype == c10::ScalarType::Float;
  if (d.dtype != c10::ScalarType::Half && d.dtype != c10::ScalarType::BFloat16 && !f32) return false;
  const int64_t vec = f32 ? 4 : 8;  // elements per 16 bytes
  if (d.x_strides[2] != 1 || d.v_strides[2] != 1) return false;
  if (d.x_strides[1] % vec != 0 || d.v_strides[1] % vec != 0) return false;
  if ((d.batch > 1 && d.x_strides[0] % vec != 0) || (d.batch > 1 && d.v_strides[0] % vec != 0)) return false;
  // (read at each call, so that a benchmark can switch in one process)
  const char* env = std::getenv("SOFTMAX_EXT_SMM_SM80");
  const bool off = env != nullptr && env[0] == '1';
  const char* env32 = std::getenv("SOFTMAX_EXT_SMM_F32_SM80");  // the same for float32 only
  const bool f32_off = env32 != nullptr && env32[0] == '1';
  return !off && !(f32 && f32_off);
}

int64_t blocked_columns(int64_t rows, int64_t d2, bool cuda, bool backward) {
  // Temporaries of (rows, block) elements: ~4M on CPU (cache-sized steps and
  // O(rows) memory), ~32M on CUDA (large enough GEMMs for cuBLAS).
  // On CUDA all of d2 is one block where its temporaries fit the budget
  // (few rows: one launch per op instead of one per block).
  const int64_t budget = cuda ? (int64_t{1} << 25) : (int64_t{1} << 22);
  int64_t cols = budget / std::max<int64_t>(rows, 1);
  if (cuda && cols >= d2) return std::max<int64_t>(d2, 1);
  cols = std::max<int64_t>(64, std::min<int64_t>(cols, backward ? 2048 : 4096));
  return std::min<int64_t>(cols, std::max<int64_t>(d2, 1));
}

// Where a forward's CTAs (batch x row blocks x column blocks) are fewer
// than half of `want` and d2 is long, d2 is cut into parts (a CTA each, at
// least min_cols columns, a multiple of `multiple`, at most max_parts) so
// that up to `want` CTAs run; the parts' outputs (x's dtype), log row sums
// and row maxima are merged after. SOFTMAX_EXT_SMM_D2_PARTS=n asks for n
// parts (1: never cut; tests and A/B work; read at each call).
struct Cut {
  int64_t want, min_d2, min_cols, multiple, max_parts;
};
static void cut_d2(const Descriptor& d, const Cut& cut, Plan* p) {
  const int64_t ctas = d.batch * ((d.d1 + p->bm - 1) / p->bm) * ((d.d3 + p->bn - 1) / p->bn);
  int64_t parts = 1;
  if (2 * ctas <= cut.want && d.d2 >= cut.min_d2) {
    parts = std::min(cut.want / std::max<int64_t>(ctas, 1), d.d2 / cut.min_cols);
  }
  if (const char* env = std::getenv("SOFTMAX_EXT_SMM_D2_PARTS")) parts = std::atoll(env);
  parts = std::clamp<int64_t>(parts, 1, cut.max_parts);
  if (parts <= 1 || d.d2 <= cut.multiple) return;
  const int64_t cols = (d.d2 + parts - 1) / parts;
  p->part_cols = (cols + cut.multiple - 1) / cut.multiple * cut.multiple;
  // none empty; still two or more, as d2 > multiple and parts >= 2 put part_cols below d2
  p->parts = static_cast<int>((d.d2 + p->part_cols - 1) / p->part_cols);
  p->name += ".d2parts" + std::to_string(p->parts);
}

// Few rows of d1 over many batch entries (16-bit: d1 <= 32; float32, whose
// 128-row wgmma tiles cost more: d1 <= 64): mma.sync tiles of one or two
// warps (16 or 32 rows of d1, 64 columns of d3) where they make enough CTAs
// to fill the GPU; a 128-row tile would multiply mostly rows that do not
// exist. One warp where it makes six CTAs an SM, else two (twice the
// threads copying each V tile). 0: neither (docs/softmax_matmul.md, "Few
// rows, many batch entries"). SOFTMAX_EXT_SMM_SMALL_TILES=0 turns them off
// (A/B work; read at each call).
static int small_tile_warps(const Descriptor& d) {
  const char* env = std::getenv("SOFTMAX_EXT_SMM_SMALL_TILES");
  if (env != nullptr && env[0] == '0') return 0;
  if (d.d1 > (d.dtype == c10::ScalarType::Float ? 64 : 32)) return 0;
  auto ctas = [&d](int warps) { return d.batch * ((d.d1 + 16 * warps - 1) / (16 * warps)) * ((d.d3 + 63) / 64); };
  if (d.d1 <= 16 && ctas(1) >= 6 * int64_t{d.sms}) return 1;
  return ctas(2) >= 3 * int64_t{d.sms} ? 2 : 0;
}

// The rows kernel (cuda_launch.h launch_rows). It takes float32 with
// float32 accuracy (TF32 off) up to 8 rows of d1, and up to 16 where d3 is
// at most 32 (a 3xTF32 tensor-core tile of 128 rows and 128 columns then
// uses 1/32 of itself, three products each), but where the small mma.sync
// tiles (above) fill the GPU and d2 is shorter than one of the rows
// kernel's 256-column steps, or d1 is over 8. float32 with TF32 allowed,
// where d2 fills a step: up to 2 rows of d1 over at most 1024 batch
// entries, and up to 8 where no small tiles fill the GPU (the TF32 tiles
// multiply 16 or 128 rows for them). 16-bit tiles stay ahead on the
// tensor cores (docs/softmax_matmul.md, "Few rows").
// SOFTMAX_EXT_SMM_ROWS=n takes it for every dtype up to n rows (0: never;
// A/B work and tests; read at each call).
// small_warps: small_tile_warps(d).
[[maybe_unused]] static bool rows_fit(const Descriptor& d, Math math, int small_warps) {
  const bool dtype_ok = d.dtype == c10::ScalarType::Float || d.dtype == c10::ScalarType::Half ||
                        d.dtype == c10::ScalarType::BFloat16;
  if (!dtype_ok) return false;
  if (const char* env = std::getenv("SOFTMAX_EXT_SMM_ROWS")) return d.d1 <= std::atoll(env);
  constexpr int64_t kStep = 256;  // the rows kernel's columns of d2 a step (rows.cu)
  if (math == Math::kTF32)
    return d.d2 >= kStep && ((d.d1 <= 2 && d.batch <= 1024) || (d.d1 <= 8 && small_warps == 0));
  return math == Math::kExactF32 && (d.d1 <= 8 || (d.d1 <= 16 && d.d3 <= 32)) &&
         (small_warps == 0 || (d.d1 <= 8 && d.d2 >= kStep));
}

// The rows kernel's cut of d2: up to two CTAs of 256 threads per SM, two
// waves; parts of whole 256-column steps, at most 64.
static Cut rows_cut(const Descriptor& d) { return {4 * int64_t{d.sms}, 512, 256, 256, 64}; }

// One CTA: the power of two of rows at or above d1 (at most 16); column
// groups of rows_columns_per_thread columns, a power of two (4-64) covering d3.
[[maybe_unused]] static void rows_tile(const Descriptor& d, Plan* p) {
  int rows = 1;
  while (rows < d.d1 && rows < 16) rows *= 2;
  const int cols = cuda::rows_columns_per_thread(rows, static_cast<int>(c10::elementSize(d.dtype)));
  int groups = 4;
  while (groups < 64 && int64_t{groups} * cols < d.d3) groups *= 2;
  // narrower column blocks where the CTAs, d2 cut into as many parts as
  // cut_d2 could, leave SMs idle
  const Cut cut = rows_cut(d);
  auto ctas = [&](int gr) {
    return d.batch * ((d.d1 + rows - 1) / rows) * ((d.d3 + gr * cols - 1) / (gr * cols)) *
           std::clamp<int64_t>(d.d2 / cut.min_cols, 1, cut.max_parts);
  };
  while (groups > 8 && ctas(groups) < 2 * int64_t{d.sms}) groups /= 2;
  p->bm = rows;
  p->bn = groups * cols;
  p->bk = 256;
}

Status select(const Descriptor& d, bool backward, Plan* plan) {
  using c10::ScalarType;
  const bool supported = d.dtype == ScalarType::Float || d.dtype == ScalarType::Half ||
                         d.dtype == ScalarType::BFloat16 || d.dtype == ScalarType::Double;
  if (!supported) {
    return {Code::kUnsupported, std::string("dtype ") + c10::toString(d.dtype) +
                                    " is not supported; accepted: float32, float16, bfloat16, float64"};
  }
  Plan p;
  p.accumulator = d.dtype == ScalarType::Double ? ScalarType::Double : ScalarType::Float;
  const bool cuda = d.device == c10::DeviceType::CUDA;
  const bool f32 = d.dtype == ScalarType::Float;
  if (d.dtype == ScalarType::Double) p.math = Math::kF64;
  else if (d.dtype != ScalarType::Float) p.math = Math::kHalfF32Acc;
  else p.math = (cuda && d.allow_tf32) ? Math::kTF32 : (cuda ? Math::kExactF32 : Math::kF32);

  const bool tensor_cores = cuda && !backward && d.dtype != ScalarType::Double && d.arch >= 80;
  // The fused Hopper backward (16-bit; f32: TF32 or 3xTF32): also d2 and d3
  // multiples of 8 (dX and dV are written as pairs of elements into
  // contiguous tensors).
  // SOFTMAX_EXT_SMM_BLOCKED_BACKWARD=1 keeps the blocked ATen backward (A/B work).
  const char* bwd_env = std::getenv("SOFTMAX_EXT_SMM_BLOCKED_BACKWARD");
  const bool blocked_bwd = bwd_env != nullptr && bwd_env[0] == '1';
  // float32 with one row of d1 (attention-style pooling) keeps the blocked
  // backward: the fused one's 128-row tiles (three products each for
  // 3xTF32) were 0.29-0.67x autograd there against the blocked 0.74-0.90x
  // (docs/softmax_matmul.md, "Few rows").
  const bool one_row_f32 = d.dtype == ScalarType::Float && d.d1 == 1;
  // So do many batch entries of few rows (those the small mma.sync tiles
  // take forward): the fused one walks them with 128-row tiles too (float32
  // forward + backward GPU time 0.26-0.75x naive, blocked 0.88-1.11x; "Few
  // rows, many batch entries").
  const int small_warps = cuda ? small_tile_warps(d) : 0;
  const bool few_rows = small_warps > 0;
  const bool wgmma_backward = cuda && backward && !blocked_bwd && !one_row_f32 && !few_rows && wgmma_fits(d) &&
                              d.d2 % 8 == 0 && d.d3 % 8 == 0;
#ifndef SOFTMAX_EXT_WITH_CUDA
  (void)tensor_cores;
  (void)wgmma_backward;
  if (false) {
#else
  if (cuda && !backward && rows_fit(d, p.math, small_warps)) {
    p.kernel = Kernel::kCudaRows;
    if (f32) p.math = Math::kF32;  // float32 FMAs, TF32 or not
    rows_tile(d, &p);
    p.name = std::string("cuda.rows.") + tag(d.dtype) + "." + std::to_string(p.bm) + "x" + std::to_string(p.bn) +
             "x" + std::to_string(p.bk);
    cut_d2(d, rows_cut(d), &p);
  } else if (wgmma_backward) {
#endif
    p.kernel = Kernel::kCudaWgmma;
    p.bm = 128;
    // bn: dV's columns of d3 per CTA (TF32: 128 or 256; 3xTF32: 128); bk:
    // dX's K tile
    const bool split3 = p.math == Math::kExactF32;
    p.bn = (d.d3 <= 64 && !f32) ? 64 : ((d.d3 <= 128 || split3) ? 128 : 256);
    // dV's CTAs (batch x blocks of 128 rows of d2 x blocks of bn columns of
    // d3) fill the SMs: narrower columns where wider ones leave SMs idle
    const int min_bn = f32 ? 128 : 64;
    auto dv_ctas = [&d](int bn) { return d.batch * ((d.d2 + 127) / 128) * ((d.d3 + bn - 1) / bn); };
    while (p.bn > min_bn && dv_ctas(p.bn) < d.sms) p.bn /= 2;
    p.bk = f32 ? 32 : 64;
    const char* variant = f32 ? (split3 ? "3xtf32" : "tf32") : tag(d.dtype);
    p.name = std::string("cuda.wgmma.backward.") + variant + ".128x" + std::to_string(p.bn) + "x" +
             std::to_string(p.bk);
  } else if (tensor_cores && wgmma_fits(d) && small_warps == 0) {
    p.kernel = Kernel::kCudaWgmma;
    p.bm = 128;
    if (f32) {  // sm90_f32.cu: TF32 256 columns (128 for small d3), 3xTF32 128
      p.bn = (p.math == Math::kExactF32 || d.d3 <= 128) ? 128 : 256;
      p.bk = 32;
    } else {
      p.bn = d.d3 <= 64 ? 64 : (d.d3 <= 128 ? 128 : 256);
      p.bk = 64;
    }
    // SOFTMAX_EXT_SMM_BN=64|128|256: the 16-bit / TF32 forward's columns of
    // d3 per CTA (A/B work; read at each call)
    if (const char* env = std::getenv("SOFTMAX_EXT_SMM_BN"); env != nullptr && p.math != Math::kExactF32) {
      const int bn = std::atoi(env);
      if (bn == 128 || bn == 256 || (bn == 64 && !f32)) p.bn = bn;
    }
    const char* variant = f32 ? (p.math == Math::kExactF32 ? "3xtf32" : "tf32") : tag(d.dtype);
    p.name = std::string("cuda.wgmma.") + variant + ".128x" + std::to_string(p.bn) + "x" + std::to_string(p.bk);
    // parts of at least 256 columns (3xTF32: 512; docs/softmax_matmul.md,
    // "d2 cut into parts")
    cut_d2(d, Cut{d.sms, 2048, p.math == Math::kExactF32 ? 512 : 256, 128, 256}, &p);
  } else if (tensor_cores) {
    p.kernel = Kernel::kCudaMma;
    // 8 warps (128 rows of d1): every CTA reads its x rows and V columns
    // from L2, so flops per byte grow with both tile sides.
    int warps = 8;
    // (8 warps, 128) measured best on H100 at d3 = 512 (bf16 182 TFLOP/s
    // against 147 for 256 columns, which spills, and 145 for 4 warps).
    int bn = d.d3 <= 64 ? 64 : 128;
    if (small_warps > 0) {
      warps = small_warps;
      bn = 64;
    }
    if (const char* env = std::getenv("SOFTMAX_EXT_SMM_TILE")) {  // "warps,bn": benchmarking only
      int w = 0, n = 0;
      if (std::sscanf(env, "%d,%d", &w, &n) == 2 && (w == 1 || w == 2 || w == 4 || w == 8) &&
          (n == 64 || n == 128 || n == 256)) {
        warps = w;
        if (w < 4) bn = 64;
        else bn = w == 4 ? 128 : (p.math == Math::kExactF32 && n == 256 ? 128 : n);
      }
    }
    p.bm = 16 * warps;
    p.bn = bn;
    p.bk = f32 ? 32 : 64;
    const char* variant = f32 ? (d.allow_tf32 ? "tf32" : "3xtf32") : tag(d.dtype);
    p.name = std::string("cuda.mma_sync.") + variant + "." + std::to_string(p.bm) + "x" +
             std::to_string(p.bn) + "x" + std::to_string(p.bk);
  } else {
    p.kernel = Kernel::kBlocked;
    p.bm = static_cast<int>(std::min<int64_t>(d.d1, INT32_MAX));
    p.bn = static_cast<int>(std::min<int64_t>(d.d3, INT32_MAX));
    p.bk = static_cast<int>(blocked_columns(d.batch * d.d1, d.d2, cuda, backward));
    p.name = std::string(cuda ? "cuda" : "cpu") + ".blocked_aten" + (backward ? ".backward." : ".") +
             tag(d.dtype);
    if (cuda && d.dtype == ScalarType::Double) p.math = Math::kF64;
  }
  p.workspace_bytes = workspace_size(p, d);
  *plan = std::move(p);
  return {};
}

// The fused Hopper backward's plan (select names it cuda.wgmma.backward.*).
static bool fused_backward(const Plan& plan) {
  return plan.kernel == Kernel::kCudaWgmma && plan.name.find("backward") != std::string::npos;
}

Status can_implement(const Plan& plan, const Descriptor& d, const void* x, const void* v) {
  if (plan.kernel == Kernel::kCudaWgmma) {
    if (!wgmma_fits(d) || reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(v) % 16 != 0) {
      return {Code::kUnsupported, "the wgmma kernels need 16-byte aligned rows of x and v"};
    }
  }
  // The float32 fused backward loads by TMA only, and a batch that repeats x
  // or v (stride 0) has no tensor map.
  if (fused_backward(plan) && d.dtype == c10::ScalarType::Float && d.batch > 1 &&
      (d.x_strides[0] <= 0 || d.v_strides[0] <= 0)) {
    return {Code::kUnsupported, "the float32 fused backward needs x and v with a batch stride"};
  }
  if (plan.kernel == Kernel::kBlocked) return {};
  if (plan.kernel == Kernel::kCudaRows) {  // element loads where V's rows are no whole vectors
    if (d.x_strides[2] != 1 || d.v_strides[2] != 1) {
      return {Code::kUnsupported, "the rows kernel needs unit stride along d2 (x) and d3 (v)"};
    }
    return {};
  }
  // The kernel reads columns with unit stride (x along d2, v along d3); other
  // strides are vectorised only where 16-byte aligned, which the kernel checks
  // itself per row (tails and unaligned rows take element loads).
  if (d.x_strides[2] != 1 || d.v_strides[2] != 1) {
    return {Code::kUnsupported, "the tensor-core kernel needs unit stride along d2 (x) and d3 (v)"};
  }
  if (reinterpret_cast<uintptr_t>(x) % 4 != 0 || reinterpret_cast<uintptr_t>(v) % 4 != 0) {
    return {Code::kUnsupported, "the tensor-core kernel needs 4-byte aligned x and v"};
  }
  const int64_t lim = int64_t{1} << 31;
  if (d.d1 >= lim || d.d2 >= lim || d.d3 >= lim || d.batch >= 65536 * 1024) {
    return {Code::kUnsupported, "sizes beyond the kernel's 32-bit grid"};
  }
  return {};
}

BackwardWorkspace backward_workspace(const Plan& plan, const Descriptor& d) {
  BackwardWorkspace w;
  w.d1p = (d.d1 + 3) / 4 * 4;
  auto take = [&w](int64_t floats) {  // a part at the next 16-byte boundary
    const int64_t at = (w.floats + 3) / 4 * 4;
    w.floats = at + floats;
    return at;
  };
  w.delta = take(d.batch * d.d1);
  if (d.dtype == c10::ScalarType::Float) {
    w.lse_p = take(d.batch * w.d1p);
    w.go_t = take(d.batch * d.d3 * w.d1p);
  }
  if (d.dtype == c10::ScalarType::Float) w.v_hi = take(d.batch * d.d2 * d.d3);
  if (plan.math == Math::kExactF32) {
    w.v_lo = take(d.batch * d.d2 * d.d3);
    w.go_t_lo = take(d.batch * d.d3 * w.d1p);
  }
  return w;
}

int64_t workspace_size(const Plan& plan, const Descriptor& d) {
  if (fused_backward(plan)) {
    return backward_workspace(plan, d).floats * static_cast<int64_t>(sizeof(float));
  }
  if (plan.parts > 1) {  // each part's output (x's dtype), log row sum and row max (f32)
    const int64_t rows = d.batch * plan.parts * d.d1;
    return rows * d.d3 * static_cast<int64_t>(c10::elementSize(d.dtype)) + 2 * rows * 4;
  }
  return 0;
}

}  // namespace softmax_ext::smm
