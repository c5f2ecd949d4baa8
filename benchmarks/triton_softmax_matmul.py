"""The Triton peer of softmax_matmul: the classic online-softmax-matmul
kernel (one program per (batch, BLOCK_1 rows), a loop over d2 in BLOCK_2
chunks, float32 running max / sum / accumulator over the whole d3, which is
padded to a power of two). BLOCK_1 = BLOCK_2 = B as in the course version.
float32 inputs use TF32 dots when torch.backends.cuda.matmul.allow_tf32 is
on, IEEE float32 dots otherwise; 16-bit inputs round P to their type."""

import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_matmul_kernel(x_ptr, v_ptr, o_ptr, d1, d2, d3,
                           sxb, sxr, svb, svr, sob, sor,
                           BLOCK_1: tl.constexpr, BLOCK_2: tl.constexpr, BLOCK_3: tl.constexpr,
                           IEEE: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_b = tl.program_id(1)
    rows = pid_m * BLOCK_1 + tl.arange(0, BLOCK_1)
    cols3 = tl.arange(0, BLOCK_3)
    m = tl.full((BLOCK_1,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_1,), tl.float32)
    acc = tl.zeros((BLOCK_1, BLOCK_3), tl.float32)
    x_base = x_ptr + pid_b * sxb
    v_base = v_ptr + pid_b * svb
    for k0 in range(0, d2, BLOCK_2):
        ks = k0 + tl.arange(0, BLOCK_2)
        x = tl.load(x_base + rows[:, None] * sxr + ks[None, :],
                    mask=(rows[:, None] < d1) & (ks[None, :] < d2), other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(x - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        v = tl.load(v_base + ks[:, None] * svr + cols3[None, :],
                    mask=(ks[:, None] < d2) & (cols3[None, :] < d3), other=0.0)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    acc = acc / l[:, None]
    tl.store(o_ptr + pid_b * sob + rows[:, None] * sor + cols3[None, :], acc.to(o_ptr.dtype.element_ty),
             mask=(rows[:, None] < d1) & (cols3[None, :] < d3))


def softmax_matmul(x: torch.Tensor, v: torch.Tensor, block: int = 32) -> torch.Tensor:
    """softmax(x, -1) @ v for contiguous x (batch, d1, d2), v (batch, d2, d3)."""
    x = x.contiguous()
    v = v.contiguous()
    b, d1, d2 = x.shape
    d3 = v.shape[-1]
    out = torch.empty((b, d1, d3), device=x.device, dtype=x.dtype)
    ieee = x.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32
    grid = (triton.cdiv(d1, block), b)
    _softmax_matmul_kernel[grid](x, v, out, d1, d2, d3, x.stride(0), x.stride(1), v.stride(0), v.stride(1),
                                 out.stride(0), out.stride(1), BLOCK_1=block, BLOCK_2=block,
                                 BLOCK_3=triton.next_power_of_2(d3), IEEE=ieee)
    return out
