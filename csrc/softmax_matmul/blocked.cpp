// The blocked online loop (blocked.h): per block of d2 columns, the row max
// moves, the f32 (f64) accumulator and row sum are rescaled by exp(m_old -
// m_new) and the block's P = exp(x - m) times V is added with one batched
// matmul (d2 within one block: softmax(x) @ v directly). A max
// still at -inf (all entries so far -inf) is replaced by 0 in the exponent
// so that -inf - -inf never makes a NaN; a row all -inf ends with sum 0 and
// so 0/0 = NaN, like softmax(x) @ v.
#include "softmax_matmul/blocked.h"
#include "cpu/isa.h"
#include "ops/ops.h"

#include <ATen/ATen.h>

#include <limits>

namespace softmax_ext::smm {

static c10::ScalarType acc_type(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX-BF16),
// where oneDNN's bf16 GEMMs are the fast ones; elsewhere they are emulated
// and several times slower than float32's.
static bool cpu_has_bf16_dot() {
#if SOFTMAX_EXT_CPU_X86
  static const bool yes = __builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16");
  return yes;
#else
  return false;
#endif
}

// Whether the matmuls run in x's 16-bit type (P rounded to it, f32
// accumulation inside the GEMM), where those GEMMs are the fast ones:
// bf16 and f16 on CUDA (tensor cores; the backward only: the forward has
// kernels of its own there), bf16 on a CPU with bf16 dot products (on a
// 2-core AMD EPYC with AVX512-BF16, (16, 128, 2048) @ (16, 2048, 128) takes
// 3.3 ms in bf16 against float32's 12.1). f16 has no such CPU kernel (347
// ms there), so CPU f16 multiplies in float32, as does bf16 on other CPUs.
static bool matmul_in_16bit(const at::Tensor& x) {
  const auto t = x.scalar_type();
  if (x.is_cuda()) return t == at::kHalf || t == at::kBFloat16;
  return x.is_cpu() && t == at::kBFloat16 && cpu_has_bf16_dot();
}

std::tuple<at::Tensor, at::Tensor> blocked_forward(const at::Tensor& x, const at::Tensor& v, int64_t block) {
  const int64_t B = x.size(0), d1 = x.size(1), d2 = x.size(2), d3 = v.size(2);
  const auto acc = acc_type(x);
  const auto fopt = x.options().dtype(acc);
  constexpr double inf = std::numeric_limits<double>::infinity();
  if (d2 == 0) {
    return {at::zeros({B, d1, d3}, x.options()), at::full({B, d1}, -inf, fopt)};
  }
  // One block on CPU, float32, float64 and (matmul_in_16bit) bf16: P in x's
  // dtype and the rows' (max, sum) in one pass over x (softmax_ext's row
  // kernels), P @ v; lse = max + log(sum). bf16's P is
  // rounded for the GEMM as softmax(x) @ v rounds it, the output once.
  // Several blocks keep their products in the float32 accumulator (a bf16
  // GEMM would round each block's part: twice the naive version's error at
  // (1, 16, 20000, 64)).
  if (d2 <= block && x.is_cpu() && (x.scalar_type() == acc || matmul_in_16bit(x))) {
    auto [p, stats] = distributed::softmax_with_stats(x, -1);  // stats: (batch, d1, 2)
    const at::Tensor m = stats.select(-1, 0);
    const at::Tensor lse = at::where(m == -inf, m, m + stats.select(-1, 1).log());
    // A row of P that is NaN (x all -inf, or NaN / +inf in it) gives a NaN
    // row of out. oneDNN's AMX bf16 GEMM also spreads it to other rows of
    // its tile (measured on a Xeon with AMX: softmax(x) @ v gives the row
    // before it NaN too), so such rows multiply as zeros and are set after.
    const at::Tensor bad = at::isfinite(lse).logical_not_();
    const bool any_bad = bad.any().item<bool>();  // (a CPU tensor: no device sync)
    if (any_bad) p.masked_fill_(bad.unsqueeze(-1), 0);
    at::Tensor out = at::bmm(p, v);
    if (any_bad) out.masked_fill_(bad.unsqueeze(-1), std::numeric_limits<double>::quiet_NaN());
    return {out, lse};
  }
  if (d2 <= block) {  // one block: torch's softmax kernel (one pass out), then P @ v
    const at::Tensor s = x.to(acc);
    const at::Tensor p = at::_softmax(s, -1, false);
    at::Tensor out = at::bmm(p, v.to(acc)).to(x.scalar_type());
    // lse = m - log(max P): a row's largest P is exp(m - lse); a row all
    // -inf keeps lse = -inf
    const at::Tensor m = s.amax(-1);
    return {out, at::where(m == -inf, m, m - p.amax(-1).log())};
  }
  at::Tensor m = at::full({B, d1, 1}, -inf, fopt);
  at::Tensor l = at::zeros({B, d1, 1}, fopt);
  at::Tensor o = at::zeros({B, d1, d3}, fopt);
  // On CPU the running max moves only when a block's exceeds it by more
  // than 8 / log2(e) (P stays below 2^8, as in the CUDA kernels), and a
  // block that moves none skips the rescale of l and the accumulator (a
  // pass over (batch, d1, d3) a block); the test is a host read, free on
  // CPU, so CUDA (float64) moves the max at every block instead.
  const bool lazy = x.is_cpu();
  constexpr double kLazy = 8.0 / 1.4426950408889634;
  for (int64_t j0 = 0; j0 < d2; j0 += block) {
    const int64_t n = std::min(block, d2 - j0);
    at::Tensor s = x.narrow(2, j0, n).to(acc);
    const at::Tensor bm = s.amax(-1, true);
    bool moved = true;
    at::Tensor m_new;
    if (lazy) {
      const at::Tensor move = bm > m + kLazy;  // NaN: no move (it reaches l through P)
      moved = move.any().item<bool>();
      m_new = moved ? at::where(move, bm, m) : m;
    } else {
      m_new = at::maximum(m, bm);
    }
    at::Tensor m_use = at::where(m_new == -inf, at::zeros_like(m_new), m_new);
    at::Tensor p = (s - m_use).exp_();
    if (moved) {
      at::Tensor scale = (m - m_use).exp_();
      l.mul_(scale);
      o.mul_(scale);
    }
    l.add_(p.sum(-1, true));
    o.baddbmm_(p, v.narrow(1, j0, n).to(acc));
    m = m_new;
  }
  at::Tensor out = (o / l).to(x.scalar_type());
  at::Tensor lse = (m + l.log()).squeeze(-1);
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor> blocked_backward(const at::Tensor& grad_out, const at::Tensor& x,
                                                    const at::Tensor& v, const at::Tensor& out,
                                                    const at::Tensor& lse, int64_t block) {
  const int64_t d2 = x.size(2);
  const auto acc = acc_type(x);
  if (d2 == 0 || x.numel() == 0 || v.numel() == 0) {
    return {at::zeros(x.sizes(), x.options()), at::zeros(v.sizes(), v.options())};
  }
  // The half types keep their matmuls in 16 bits where matmul_in_16bit says
  // (f32 accumulation in the GEMM), like autograd through softmax(x) @ v
  // does; the element-wise parts are f32 everywhere.
  const bool mm16 = matmul_in_16bit(x);
  const auto mm_type = mm16 ? x.scalar_type() : acc;
  if (d2 <= block) {
    // One block: P again by torch's softmax kernel, dV = P^T dO, dP = dO V^T,
    // and dX = P * (dP - rowsum(P * dP)) by torch's softmax backward kernel
    // (rowsum(P * dP) = rowsum(dO * out)). Every matmul in the accumulator
    // type, or (matmul_in_16bit) the kernels autograd runs through
    // softmax(x) @ v, P in 16 bits as it saves it: the one pass more is P's.
    const auto t = mm16 ? x.scalar_type() : acc;
    const at::Tensor p = at::_softmax(x.to(t), -1, false);
    const at::Tensor go = grad_out.to(t);
    at::Tensor dv1 = at::bmm(p.transpose(1, 2), go).to(v.scalar_type());
    at::Tensor dx1 = at::_softmax_backward_data(at::bmm(go, v.to(t).transpose(1, 2)), p, -1, t);
    return {dx1.to(x.scalar_type()), dv1};
  }
  at::Tensor dx = at::empty(x.sizes(), x.options());
  at::Tensor dv = at::empty(v.sizes(), v.options());
  at::Tensor go = grad_out.to(acc);
  at::Tensor D = (go * out.to(acc)).sum(-1, true);  // (B, d1, 1)
  at::Tensor go_mm = go.to(mm_type);
  at::Tensor lse3 = lse.to(acc).unsqueeze(-1);
  // Few passes per block (type promotion does the casts inside the ops):
  // p = exp(x - lse) in acc, P in the matmul type, dV = P^T dO, dP = dO V^T,
  // dx = p * (dP - D) written straight into dx's columns.
  for (int64_t j0 = 0; j0 < d2; j0 += block) {
    const int64_t n = std::min(block, d2 - j0);
    at::Tensor p = at::sub(x.narrow(2, j0, n), lse3).exp_();  // (B, d1, n), acc type
    at::Tensor p_mm = mm16 ? p.to(mm_type) : p;
    at::Tensor vb = v.narrow(1, j0, n);
    if (vb.scalar_type() != mm_type) vb = vb.to(mm_type);
    at::Tensor dv_blk = dv.narrow(1, j0, n);
    if (dv.scalar_type() == mm_type) at::bmm_out(dv_blk, p_mm.transpose(1, 2), go_mm);
    else dv_blk.copy_(at::bmm(p_mm.transpose(1, 2), go_mm));
    at::Tensor dx_blk = dx.narrow(2, j0, n);
    at::mul_out(dx_blk, p, at::sub(at::bmm(go_mm, vb.transpose(1, 2)), D));
  }
  return {dx, dv};
}

}  // namespace softmax_ext::smm
