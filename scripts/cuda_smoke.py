"""A short CUDA workload for compute-sanitizer: every op (softmax family,
cross_entropy, softmax_matmul, the sharded-axis steps), dtype and layout
family once, checked against float64 on the CPU. Exits non-zero on a mismatch.

    compute-sanitizer --tool memcheck python3 scripts/cuda_smoke.py
"""

import os
import sys

import torch

import softmax_ext

TOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def cases():
    gen = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    yield rnd(7, 1025), -1          # contiguous rows (warp or block family)
    yield rnd(37, 5), -1            # tiny rows: lane groups of a warp (backward f32/bf16/f16: the row tile)
    yield rnd(333, 100), -1         # backward f32/bf16/f16: row tiles, the last one partly filled
    yield rnd(333, 124), -1         # and forward f32 (rows that fill their lane group)
    yield rnd(50, 101)[:, 1:], -1   # warp rows filling their lane group partly, off a 16-byte boundary
    yield rnd(3, 200, 5)[:, :, 1:], 1  # strided, unaligned
    yield rnd(2, 5000)[:, 3:], -1   # block family, rows off a 16-byte boundary
    yield rnd(2, 70001), -1         # cluster family (sm_90) or split
    yield rnd(40, 200003)[:, 3:], -1  # clusters taking several rows each, staged, unaligned
    yield rnd(1, 600001), -1        # resident split family, one row
    yield rnd(1, 9000001), -1       # split family (three kernels, workspace): past the resident reach
    yield rnd(5, 600004)[:, 3:], -1  # resident split family: arrival counters, rows off the 16-byte grid
    yield rnd(3000, 40), 0          # strided family across a cluster
    yield rnd(17000, 9)[:, 1:], 0   # strided split family (an axis past 16384), chunks and a workspace
    yield rnd(3, 33, 17), 1         # strided axis with an inner run
    yield rnd(100, 2100, 16), 1     # strided clusters on a persistent grid, some taking two tiles
    yield rnd(2, 300, 12), 1        # strided, 16-bit packs of 8 bytes
    yield rnd(40, 6).t(), -1        # transposed
    yield rnd(5, 64)[:, ::3], -1    # sliced
    yield rnd(4, 1).expand(4, 9), 1  # stride 0
    yield rnd(2, 3, 4, 5).to(memory_format=torch.channels_last), 1
    yield rnd(()), 0                # 0-dim


def mismatches(got, want, dtype, what):
    """1 (and a MISMATCH line) when `got` is off the float64 `want` by more
    than dtype's tolerance, relative to want's largest magnitude; else 0."""
    err = (got.double().cpu() - want).abs().max().item()
    if err <= TOL[dtype] * max(1.0, want.abs().max().item()):
        return 0
    print(f"MISMATCH {what}: {err:.3g}")
    return 1


def cut_grads_off(x, v, g, grads, dtype, what):
    """1 (and a MISMATCH line) when softmax_matmul's gradients after a forward
    that cut d2 into parts are off float64 by more than dtype's tolerance and
    by more than twice the uncut forward's error plus four roundings of the
    largest gradient; else 0."""
    os.environ["SOFTMAX_EXT_SMM_D2_PARTS"] = "1"
    try:
        whole = torch.autograd.grad(softmax_ext.softmax_matmul(x, v), (x, v), g)
    finally:
        os.environ.pop("SOFTMAX_EXT_SMM_D2_PARTS", None)
    eps = {torch.float16: 2**-11, torch.bfloat16: 2**-8}.get(dtype, 1e-6)
    bad = 0
    for (got, want, name), uncut in zip(grads, whole):
        err = (got.double().cpu() - want).abs().max().item()
        err_whole = (uncut.double().cpu() - want).abs().max().item()
        scale = max(1.0, want.abs().max().item())
        if err > TOL[dtype] * scale and err > 2 * err_whole + 4 * eps * scale:
            print(f"MISMATCH {what} {name}: {err:.3g} (uncut forward {err_whole:.3g})")
            bad += 1
    return bad


def other_ops():
    """cross_entropy, softmax_matmul and the sharded-axis steps: values and
    gradients against float64 on the CPU. Returns the mismatch count."""
    import softmax_ext.distributed as sd

    bad = 0
    gen = torch.Generator().manual_seed(2)
    for dtype in TOL:
        # cross_entropy: short rows, vocab rows (clusters / split), ignored rows, weights, smoothing
        for n, c in ((37, 11), (5, 32003), (3, 250007)):
            x64 = torch.randn(n, c, generator=gen, dtype=torch.float64) * 3
            t = torch.randint(0, c, (n,), generator=gen)
            t[0] = -100
            w = torch.rand(c, generator=gen, dtype=torch.float64) + 0.5
            for kw in ({}, {"weight": w}, {"label_smoothing": 0.1, "reduction": "sum"}, {"reduction": "none"}):
                x = x64.to("cuda", dtype, copy=True).requires_grad_()
                kwd = {k: (v.to("cuda", dtype) if torch.is_tensor(v) else v) for k, v in kw.items()}
                loss = softmax_ext.cross_entropy(x, t.cuda(), **kwd)
                loss.sum().backward()
                xr = x.detach().double().cpu().requires_grad_()
                kwr = {k: (v.to(dtype).double() if torch.is_tensor(v) else v) for k, v in kw.items()}
                ref = torch.nn.functional.cross_entropy(xr, t, **kwr)
                ref.sum().backward()
                what = f"cross_entropy {dtype} ({n}, {c}) {sorted(kw)}"
                bad += mismatches(loss.detach(), ref.detach(), dtype, what)
                bad += mismatches(x.grad, xr.grad, dtype, what + " grad")
        # cross_entropy of a (N, C, d...) map read as it is (90000 positions), and a mean over them
        x64 = torch.randn(2, 5, 150, 300, generator=gen, dtype=torch.float64) * 3
        t = torch.randint(0, 5, (2, 150, 300), generator=gen)
        t[0, 0] = -100
        x = x64.to("cuda", dtype, copy=True).requires_grad_()
        loss = softmax_ext.cross_entropy(x, t.cuda(), label_smoothing=0.1)
        loss.backward()
        xr = x.detach().double().cpu().requires_grad_()
        ref = torch.nn.functional.cross_entropy(xr, t, label_smoothing=0.1)
        ref.backward()
        bad += mismatches(loss.detach(), ref.detach(), dtype, f"cross_entropy {dtype} (2, 5, 150, 300)")
        bad += mismatches(x.grad, xr.grad, dtype, f"cross_entropy {dtype} (2, 5, 150, 300) grad")
        # softmax_matmul: tails on every axis, a batch dim; float32 also with
        # TF32 (the 256-column kernel), checked at bfloat16's tolerance
        mm_cases = [((2, 70, 300), 40, False), ((1, 129, 1000), 64, False), ((2, 72, 264), 40, False),
                    ((3, 5, 17), 3, False)]
        if dtype == torch.float32:  # (+ more tiles than CTAs: the persistent float32 kernel walks several;
            # the fused TF32 / 3xTF32 backward, d1 not a multiple of 4)
            mm_cases += [((2, 130, 520), 264, True), ((40, 300, 40), 264, True), ((40, 300, 40), 264, False),
                         ((2, 129, 136), 72, False)]
        # the rows kernel (few rows of d1; SOFTMAX_EXT_SMM_ROWS takes it for
        # every dtype): d2 cut into parts, V's rows no whole vectors (d3 = 75)
        mm_cases += [((2, 3, 5000), 40, "rows"), ((1, 8, 700), 75, "rows")]
        tf32_before = torch.backends.cuda.matmul.allow_tf32
        for shape_x, d3, allow_tf32 in mm_cases:
            rows = allow_tf32 == "rows"
            allow_tf32 = allow_tf32 is True
            if rows:
                os.environ["SOFTMAX_EXT_SMM_ROWS"] = "16"
            x64 = torch.randn(*shape_x, generator=gen, dtype=torch.float64) * 3
            v64 = torch.randn(*shape_x[:-2], shape_x[-1], d3, generator=gen, dtype=torch.float64)
            x = x64.to("cuda", dtype, copy=True).requires_grad_()
            v = v64.to("cuda", dtype, copy=True).requires_grad_()
            torch.backends.cuda.matmul.allow_tf32 = allow_tf32
            out = softmax_ext.softmax_matmul(x, v)
            g = torch.randn(out.shape, generator=gen, dtype=torch.float64).to("cuda", dtype)
            out.backward(g)
            xr, vr = x.detach().double().cpu().requires_grad_(), v.detach().double().cpu().requires_grad_()
            ref = torch.softmax(xr, -1) @ vr
            ref.backward(g.double().cpu())
            what = f"softmax_matmul {dtype} {shape_x} d3={d3}" + (" tf32" if allow_tf32 else "") + (" rows" if rows else "")
            tol_dtype = torch.bfloat16 if allow_tf32 else dtype
            bad += mismatches(out.detach(), ref.detach(), tol_dtype, what)
            grads = ((x.grad, xr.grad, "dx"), (v.grad, vr.grad, "dv"))
            if rows:
                # d2 cut into parts: each part's output is rounded to the dtype
                # before the merge, and the backward's rowsum(dO * O) sums that
                # rounding over d3; held to the uncut forward's gradients as
                # tests/test_softmax_matmul.py's test_cuda_d2_parts holds them
                bad += cut_grads_off(x, v, g, grads, dtype, what)
            else:
                for got, want, name in grads:
                    bad += mismatches(got, want, tol_dtype, f"{what} {name}")
            torch.backends.cuda.matmul.allow_tf32 = tf32_before
            os.environ.pop("SOFTMAX_EXT_SMM_ROWS", None)
        # the sharded-axis steps on one rank's slice
        for shape in ((7, 1025), (3, 70001), (2, 600001)):
            x64 = torch.randn(*shape, generator=gen, dtype=torch.float64)
            x, dy = x64.to("cuda", dtype), torch.randn(*shape, generator=gen, dtype=torch.float64).to("cuda", dtype)
            for kind in ("softmax", "log_softmax"):
                s = sd.softmax_stats(x, -1)
                y = sd.softmax_normalize(x, s, -1, kind)
                b = sd.softmax_backward_stats(dy, y, -1, kind)
                dx = sd.softmax_backward_normalize(dy, y, b, -1, kind)
                ref = getattr(torch, kind)(x.double().cpu(), -1)
                aten = getattr(torch.ops.aten, f"_{kind}_backward_data")
                dx_ref = aten(dy.double().cpu(), y.double().cpu(), -1, torch.float64)
                what = f"sharded-axis {kind} {dtype} {shape}"
                bad += mismatches(y, ref, dtype, what)
                bad += mismatches(dx, dx_ref, dtype, what + " backward")
    return bad


def main():
    bad = 0
    for x64, dim in cases():
        for dtype in TOL:
            x = x64.to("cuda", dtype)
            dy = torch.randn_like(x)
            for kind in ("softmax", "log_softmax"):
                y = getattr(softmax_ext, kind)(x, dim)
                ref = getattr(torch, kind)(x.double().cpu(), dim)
                dx = getattr(softmax_ext, f"{kind}_backward")(dy, y, dim)
                aten = getattr(torch.ops.aten, f"_{kind}_backward_data")
                dx_ref = aten(dy.double().cpu(), y.double().cpu(), dim, torch.float64)
                for got, want in ((y, ref), (dx, dx_ref)):
                    bad += mismatches(got, want, dtype, f"{kind} {dtype} {tuple(x.shape)} dim={dim}")
    # grad_output in another layout than output: copied through shared-memory tiles
    gen = torch.Generator().manual_seed(1)
    for dtype in TOL:
        y = softmax_ext.softmax(torch.randn(130, 70, generator=gen, dtype=torch.float64).to("cuda", dtype), -1)
        dy = torch.randn(70, 130, generator=gen, dtype=torch.float64).to("cuda", dtype).t()
        dx = softmax_ext.softmax_backward(dy, y, -1)
        want = torch.ops.aten._softmax_backward_data(dy.double().cpu(), y.double().cpu(), -1, torch.float64)
        bad += mismatches(dx, want, dtype, f"softmax_backward {dtype} dy transposed")
    # row-tile backward (rows one after another) with dy, y and dx at
    # different offsets from the 16-byte grid
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for kind in ("softmax", "log_softmax"):
            y64 = getattr(torch, kind)(torch.randn(333, 100, generator=gen, dtype=torch.float64), -1)
            y = torch.empty(333 * 100 + 2, device="cuda", dtype=dtype)[2:].view(333, 100).copy_(y64)
            dy64 = torch.randn(333 * 100 + 1, generator=gen, dtype=torch.float64)[1:].view(333, 100)
            dy = torch.empty(333 * 100 + 1, device="cuda", dtype=dtype)[1:].view(333, 100).copy_(dy64)
            dx = getattr(softmax_ext, f"{kind}_backward")(dy, y, -1)
            want = getattr(torch.ops.aten, f"_{kind}_backward_data")(dy.double().cpu(), y.double().cpu(), -1,
                                                                     torch.float64)
            bad += mismatches(dx, want, dtype, f"{kind}_backward {dtype} row tile off the 16-byte grid")
    # row-tile forward (f32 rows that fill their lane group) with x on the
    # 32-byte grid (y written over x in shared memory) and off it
    for n, start in ((126, 0), (126, 1), (510, 3)):
        x64 = torch.randn(257, n, generator=gen, dtype=torch.float64)
        x = torch.empty(257 * n + start, device="cuda")[start:].view(257, n).copy_(x64)
        for kind in ("softmax", "log_softmax"):
            bad += mismatches(getattr(softmax_ext, kind)(x, -1), getattr(torch, kind)(x64, -1), torch.float32,
                              f"{kind} f32 rows of {n} at {start}: row tile")
    bad += other_ops()
    torch.cuda.synchronize()
    print(f"cuda smoke: {'ok' if bad == 0 else f'{bad} mismatches'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
