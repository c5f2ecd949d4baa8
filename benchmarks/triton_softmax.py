"""The fused-softmax kernel of the Triton tutorial, as a benchmark peer.

One program per row: the whole row is loaded into registers as one block
(BLOCK_SIZE = next power of two >= N), so x is read once and y written once.
Forward only, last axis of a contiguous 2-D view only; log_softmax through a
constexpr flag. `fused_softmax` returns None where this design cannot run.

    TRITON_INTERPRET=1 python -m benchmarks.triton_softmax   # check on CPU
"""

import torch
import triton
import triton.language as tl

# Past this a row no longer fits in one program's registers (the kernel spills
# long before, which is part of what the benchmark shows).
MAX_BLOCK = 1 << 17


@triton.jit
def _softmax_rows(y_ptr, x_ptr, x_row_stride, y_row_stride, n_cols,
                  BLOCK_SIZE: tl.constexpr, LOG: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    shifted = x - tl.max(x, axis=0)
    e = tl.exp(shifted)
    total = tl.sum(e, axis=0)
    if LOG:
        y = shifted - tl.log(total)
    else:
        y = e / total
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def num_warps_for(block_size):
    """More warps for wider rows, so each thread holds fewer elements."""
    if block_size >= 4096:
        return 16
    if block_size >= 2048:
        return 8
    return 4


def supported(x, dim):
    """Last axis of a contiguous, non-empty tensor, with rows that fit one block."""
    if x.dim() == 0 or x.numel() == 0 or not x.is_contiguous():
        return False
    return dim % x.dim() == x.dim() - 1 and triton.next_power_of_2(x.shape[-1]) <= MAX_BLOCK


def fused_softmax(x, dim=-1, log=False):
    """softmax (or log_softmax) of x over its last axis; None where unsupported."""
    if not supported(x, dim):
        return None
    n_cols = x.shape[-1]
    block = triton.next_power_of_2(n_cols)
    x2 = x.view(-1, n_cols)
    y2 = torch.empty_like(x2)
    _softmax_rows[(x2.shape[0],)](y2, x2, x2.stride(0), y2.stride(0), n_cols,
                                  BLOCK_SIZE=block, LOG=log, num_warps=num_warps_for(block))
    return y2.view(x.shape)


def _check():
    """Compare against torch on a few shapes, including ragged and refused ones."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(0)
    for shape in [(3, 1), (5, 7), (4, 128), (2, 1000), (3, 4, 33)]:
        for dtype, tol in [(torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 2e-3)]:
            x = (4 * torch.randn(shape, generator=gen, device=device)).to(dtype)
            for log, ref_fn in [(False, torch.softmax), (True, torch.log_softmax)]:
                ref = ref_fn(x.float(), -1).to(dtype)
                out = fused_softmax(x, -1, log=log)
                assert out.dtype == dtype and out.shape == x.shape
                torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)
    x = torch.randn(8, 8, device=device)
    assert fused_softmax(x.t()) is None
    assert fused_softmax(x, dim=0) is None
    assert fused_softmax(torch.empty(1, MAX_BLOCK + 1, device=device)) is None
    print(f"triton_softmax: matches torch on {device}")


if __name__ == "__main__":
    _check()
