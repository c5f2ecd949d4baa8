"""A/B of softmax_matmul's CUDA variants (the environment switches of
docs/softmax_matmul.md) at the benchmark's shapes, beside the naive version
and the matmul ceiling, in one process.

    python scripts/smm_ab.py [--backward] [--profile] [--only=bf16,tf32,f32] [--variants=default,...] [d2 ...]

--profile: the CUDA kernels of one softmax_ext call (forward and backward)
at the largest d2, per dtype and variant, with their times.
"""

import os
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import softmax_ext

FORWARD = {"default": {}, "cp.async": {"SOFTMAX_EXT_SMM_CPASYNC": "1"}, "bn128": {"SOFTMAX_EXT_SMM_BN": "128"},
           "bn64": {"SOFTMAX_EXT_SMM_BN": "64"}, "f32-transpose": {"SOFTMAX_EXT_SMM_F32_TRANSPOSE": "1"},
           "out-unstaged": {"SOFTMAX_EXT_SMM_OUT_STAGED": "0"}, "cta-per-tile": {"SOFTMAX_EXT_SMM_PERSISTENT": "0"}}
BACKWARD = {"default": {}, "dx256": {"SOFTMAX_EXT_SMM_DX_BN": "256"}, "dx-rs": {"SOFTMAX_EXT_SMM_DX_SS": "0"},
            "cp.async": {"SOFTMAX_EXT_SMM_CPASYNC": "1"}, "tf32-truncated": {"SOFTMAX_EXT_SMM_TF32_ROUNDED": "0"}}


def with_env(env, fn):
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return fn()
    finally:
        for k, val in old.items():
            if val is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = val


def ceiling(dtype):
    a = torch.randn(8192, 8192, device="cuda", dtype=dtype)
    return 2 * 8192**3 / do_bench(lambda: a @ a, rep=200) / 1e9


def profile(x, v, backward):
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    g = torch.randn(x.shape[:-1] + v.shape[-1:], device="cuda", dtype=x.dtype)
    for _ in range(3):
        out = softmax_ext.softmax_matmul(x, v)
        if backward:
            torch.autograd.grad(out, (x, v), g)
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(10):
            out = softmax_ext.softmax_matmul(x, v)
            if backward:
                torch.autograd.grad(out, (x, v), g)
        torch.cuda.synchronize()
    for e in sorted(p.key_averages(), key=lambda e: -e.device_time_total)[:8]:
        print(f"    {e.device_time_total / 10 / 1000:8.3f} ms/call  {e.key[:110]}")


def main(argv):
    backward = "--backward" in argv
    d2s = [int(a) for a in argv if not a.startswith("--")] or [1024, 2048, 8192]
    b, d1, d3 = 16, 2048, 512
    print(torch.cuda.get_device_name(), torch.__version__)
    variants = BACKWARD if backward else FORWARD
    only = next((a.split("=", 1)[1].split(",") for a in argv if a.startswith("--only=")), None)
    variant_names = next((a.split("=", 1)[1].split(",") for a in argv if a.startswith("--variants=")), list(variants))
    for name, dtype, tf32 in (("bf16", torch.bfloat16, False), ("tf32", torch.float32, True),
                              ("f32", torch.float32, False)):
        if only is not None and name not in only:
            continue
        torch.backends.cuda.matmul.allow_tf32 = tf32
        top = ceiling(dtype)
        for d2 in d2s:
            x = torch.randn(b, d1, d2, device="cuda", dtype=dtype, requires_grad=backward)
            v = torch.randn(b, d2, d3, device="cuda", dtype=dtype, requires_grad=backward)
            flop = 2 * b * d1 * d2 * d3 * (2 if backward else 1)
            if backward:
                g = torch.randn(b, d1, d3, device="cuda", dtype=dtype)
                out_n = F.softmax(x, -1) @ v
                naive = do_bench(lambda: torch.autograd.grad(out_n, (x, v), g, retain_graph=True))
                ref = torch.autograd.grad(out_n, (x, v), g)
            else:
                naive = do_bench(lambda: F.softmax(x, -1) @ v)
                ref = (F.softmax(x, -1) @ v,)
            line = f"{name:4} d2={d2:5} ceiling {top:5.0f} TF/s naive {naive:.3f}"
            for vname, env in variants.items():
                if vname not in variant_names:
                    continue
                def call():
                    if backward:
                        out = softmax_ext.softmax_matmul(x, v)
                        return do_bench(lambda: torch.autograd.grad(out, (x, v), g, retain_graph=True)), \
                            torch.autograd.grad(out, (x, v), g)
                    return do_bench(lambda: softmax_ext.softmax_matmul(x, v)), (softmax_ext.softmax_matmul(x, v),)
                ms, got = with_env(env, call)
                err = max((a.float() - r.float()).abs().max().item() / (r.float().abs().max().item() or 1)
                          for a, r in zip(got, ref))
                pct = flop / ms / 1e9 / top * 100
                line += f" | {vname} {ms:.3f} ms {pct:4.1f}% x{naive / ms:.2f} err {err:.0e}"
            print(line, flush=True)
        if "--profile" in argv:
            for vname in variant_names:
                print(f"  {name} d2={d2} {vname}:")
                with_env(variants[vname], lambda: profile(x, v, backward))


if __name__ == "__main__":
    main(sys.argv[1:])
