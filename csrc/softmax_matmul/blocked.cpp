// The blocked online loop (blocked.h): per block of d2 columns, the row max
// moves, the f32 (f64) accumulator and row sum are rescaled by exp(m_old -
// m_new) and the block's P = exp(x - m) times V is added with one batched
// matmul (d2 within one block: softmax(x) @ v directly). A max
// still at -inf (all entries so far -inf) is replaced by 0 in the exponent
// so that -inf - -inf never makes a NaN; a row all -inf ends with sum 0 and
// so 0/0 = NaN, like softmax(x) @ v.
#include "softmax_matmul/blocked.h"

#include <ATen/ATen.h>

#include <limits>

namespace softmax_ext::smm {

static c10::ScalarType acc_type(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

std::tuple<at::Tensor, at::Tensor> blocked_forward(const at::Tensor& x, const at::Tensor& v, int64_t block) {
  const int64_t B = x.size(0), d1 = x.size(1), d2 = x.size(2), d3 = v.size(2);
  const auto acc = acc_type(x);
  const auto fopt = x.options().dtype(acc);
  constexpr double inf = std::numeric_limits<double>::infinity();
  if (d2 == 0) {
    return {at::zeros({B, d1, d3}, x.options()), at::full({B, d1}, -inf, fopt)};
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
  // On CUDA the half types keep their matmuls in 16 bits (tensor cores, f32
  // accumulation in cuBLAS), like autograd through softmax(x) @ v does; the
  // element-wise parts are f32 everywhere.
  const bool mm16 = x.is_cuda() && (x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16);
  const auto mm_type = mm16 ? x.scalar_type() : acc;
  if (d2 <= block) {
    // One block: P again by torch's softmax kernel, dV = P^T dO, dP = dO V^T,
    // and dX = P * (dP - rowsum(P * dP)) by torch's softmax backward kernel
    // (rowsum(P * dP) = rowsum(dO * out)). Every matmul in the accumulator
    // type, or (16-bit on CUDA) the kernels autograd runs through
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
