"""Fused cross-entropy benchmark: softmax_ext.cross_entropy against torch eager
F.cross_entropy, torch.compile'd F.cross_entropy (inductor's fused kernels),
Liger-Kernel's and QuACK's cross entropy (when importable), on vocabulary-sized
rows, bf16 and f32 logits, reduction "mean".

    python -m benchmarks.bench_cross_entropy [--quick] [--vocab 32000,128256]
        [--tokens 2048,8192] [--dtype bf16,f32] [--out path.csv]

Timings: the median of 40 timed calls (CUDA events), each after reading a
256 MB buffer that evicts the logits from L2. The eviction only reads, so
the L2 holds no dirty lines when the call starts: triton.testing.do_bench's
eviction (zero_() of its buffer) leaves ~50 MB of them, whose write-back
falls on the next call, 8-13 us of it on the H200 whatever the kernel, a
quarter of a 2048 x 32000 bf16 forward. "fwd" is the loss of logits
that need no gradient; "fwd+bwd" the loss and torch.autograd.grad of it
(softmax_ext: the fused forward, which writes the gradient in the same pass;
"softmax_ext.two_op": the forward op and the backward op); "bwd"
(softmax_ext only) the backward op alone. % floor: the bytes that must move
(fwd: read the logits once; bwd and fwd+bwd: read them once and write the
gradient once) over the time, as a share of the device-to-device copy
bandwidth (read + write) measured in the same run.
"""

import argparse
import csv
import importlib
import os
import re
import time

import torch
import torch.nn.functional as F

import softmax_ext

from .bench_softmax import cuda_events_ms

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
VOCABS = [32000, 50257, 128256, 151936, 262144]
TOKENS = [4096, 16384, 8192, 2048]  # in the order run (with --budget-s, the first ones)
DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}
MAX_BYTES = 8 << 30  # logits per case (torch eager also holds an (N, C) log-softmax and gradient)


def do_bench(fn, reps=40):
    """Median ms of `reps` calls of fn, each after an L2 eviction by a read."""
    return cuda_events_ms(fn, reps, evict_by_read=True)


def copy_gbs():
    x = torch.empty(1 << 28, device="cuda", dtype=torch.float32).uniform_()
    ms = do_bench(lambda: x.clone())
    return 2 * x.numel() * 4 / ms / 1e6


def _torch(x, t):
    return F.cross_entropy(x, t)


_compiled = None


def _compile_fn(x, t):
    """torch.compile'd F.cross_entropy: inductor specialises on the class
    count (its reduction's shape), the token count is dynamic; one cache
    entry per (dtype, vocab)."""
    global _compiled
    if _compiled is None:
        torch._dynamo.config.cache_size_limit = 64
        if hasattr(torch._dynamo.config, "recompile_limit"):
            torch._dynamo.config.recompile_limit = 64
        _compiled = torch.compile(_torch)
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.mark_dynamic(t, 0)
    return _compiled(x, t)


def _with_env(env, fn):
    """softmax_ext with plan overrides (SOFTMAX_EXT_CE_THREADS,
    SOFTMAX_EXT_CE_STAGE_KB: read at each plan) forced for the call."""

    def call(*args):
        os.environ.update(env)
        try:
            return fn(*args)
        finally:
            for k in env:
                os.environ.pop(k, None)

    return call


# softmax_ext.t<threads>[s<KB staged by the fused forward>], e.g. t512s200;
# softmax_ext.split<blocks a row>, e.g. split1 (a block a row), split2
_VARIANT = re.compile(r"softmax_ext\.t(\d+)(?:s(\d+))?$")
_SPLIT = re.compile(r"softmax_ext\.split(\d+)$")


def variant_env(name):
    m = _SPLIT.match(name)
    if m is not None:
        return {"SOFTMAX_EXT_CE_SPLIT": m.group(1)}
    m = _VARIANT.match(name)
    if m is None:
        return None
    env = {"SOFTMAX_EXT_CE_THREADS": m.group(1)}
    if m.group(2) is not None:
        env["SOFTMAX_EXT_CE_STAGE_KB"] = m.group(2)
    return env


def impls(names=()):
    out = {
        "softmax_ext": lambda x, t: softmax_ext.cross_entropy(x, t),
        "softmax_ext.inplace": lambda x, t: softmax_ext.cross_entropy(x, t, inplace_backward=True),
        "softmax_ext.two_op": lambda x, t: torch.ops.softmax_ext._cross_entropy_forward(x, t)[0],
        **{f"softmax_ext.t{n}": None for n in (128, 256, 512)},
        **{n: None for n in names if variant_env(n)},
        "torch": _torch,
        "torch.compile": _compile_fn,
    }
    for name in out:
        if variant_env(name):
            out[name] = _with_env(variant_env(name), lambda x, t: softmax_ext.cross_entropy(x, t))
    unavailable = {}
    try:
        from liger_kernel.transformers.functional import liger_cross_entropy

        out["liger"] = lambda x, t: liger_cross_entropy(x, t)
    except Exception as exc:  # noqa: BLE001 (any import failure means: not in this run)
        unavailable["liger"] = f"{type(exc).__name__}: {exc}"
    try:
        quack = importlib.import_module("quack.cross_entropy")
        out["quack"] = lambda x, t: quack.cross_entropy(x, t, reduction="mean")
    except Exception as exc:  # noqa: BLE001
        unavailable["quack"] = (f"{type(exc).__name__}: {exc} (its nvidia-cutlass-dsl-libs-cu13 4.8.1 wheel, "
                                "92 MB zipped / 237 MB unpacked, exceeds the 64 MiB a device call may carry)")
    return out, unavailable


def run_case(name, fn, x, t, direction, copy, es):
    n, c = x.shape
    if direction == "fwd":
        xi = x.detach()
        call = lambda: fn(xi, t)  # noqa: E731
        nbytes = n * c * es
    elif direction == "bwd":
        loss, stats, total = torch.ops.softmax_ext._cross_entropy_forward(x, t)
        g = torch.ones((), device=x.device, dtype=x.dtype)
        bwd = lambda x_, t_: torch.ops.softmax_ext._cross_entropy_backward(  # noqa: E731
            g, x_, t_, None, stats, total, -100, "mean", 0.0)
        if variant_env(name):
            bwd = _with_env(variant_env(name), bwd)
        call = lambda: bwd(x, t)  # noqa: E731
        nbytes = 2 * n * c * es
    else:
        xi = x.detach().clone().requires_grad_(True)

        def call():
            loss = fn(xi, t)
            return torch.autograd.grad(loss, xi)

        nbytes = 2 * n * c * es
    try:
        call()
        ms = do_bench(call)
    except Exception as exc:  # noqa: BLE001 (a peer refusing a case is recorded, not fatal)
        return dict(impl=name, direction=direction, ms=None, gbs=None, pct_floor=None,
                    status=f"error: {type(exc).__name__}: {str(exc)[:120]}")
    gbs = nbytes / ms / 1e6
    return dict(impl=name, direction=direction, ms=round(ms, 4), gbs=round(gbs, 1),
                pct_floor=round(100 * gbs / copy, 1), status="ok")


def check(x, t):
    ours = softmax_ext.cross_entropy(x, t).double()
    ref = F.cross_entropy(x.double(), t)
    rtol = {torch.bfloat16: 8e-3, torch.float16: 1e-3}.get(x.dtype, 1e-5)  # one rounding of the loss
    assert torch.allclose(ours, ref, rtol=rtol), (ours, ref)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="4096 tokens only")
    p.add_argument("--vocab", default=",".join(map(str, VOCABS)))
    p.add_argument("--tokens", default="")
    p.add_argument("--dtype", default="bf16,f32")
    p.add_argument("--impls", default="", help="comma list (default: every available)")
    p.add_argument("--out", default="")
    p.add_argument("--budget-s", type=float, default=0, help="start no new case after this many seconds")
    args = p.parse_args()
    tokens = [int(v) for v in args.tokens.split(",")] if args.tokens else ([4096] if args.quick else TOKENS)
    vocabs = [int(v) for v in args.vocab.split(",")]
    name = torch.cuda.get_device_name()
    copy = copy_gbs()
    table, unavailable = impls(args.impls.split(",") if args.impls else ())
    if args.impls:
        table = {k: v for k, v in table.items() if k in args.impls.split(",")}
    print(f"device: {name}; copy bandwidth {copy:.0f} GB/s (read + write); torch {torch.__version__}")
    for k, why in unavailable.items():
        print(f"  {k}: not in this run ({why})")
    rows = []
    path = args.out or os.path.join(RESULTS, "cross_entropy-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") + ".csv")
    cases = []  # every (dtype, vocab) at the first token count, then the others
    for n in tokens:
        for c in vocabs:
            for dname in args.dtype.split(","):
                if n * c * (torch.finfo(DTYPES[dname]).bits // 8) <= MAX_BYTES:
                    cases.append((dname, c, n))
    start = time.time()
    for dname, c, n in cases:
        if args.budget_s and time.time() - start > args.budget_s:
            print(f"budget reached: {dname} {n}x{c} and later cases not run")
            continue
        dtype = DTYPES[dname]
        es = torch.finfo(dtype).bits // 8
        g = torch.Generator(device="cuda")
        g.manual_seed(0)
        x = torch.randn(n, c, device="cuda", dtype=dtype, generator=g)
        t = torch.randint(0, c, (n,), device="cuda", generator=g)
        check(x, t)
        kernel = softmax_ext.plan(x, kind="cross_entropy").kernel
        for impl, fn in table.items():
            for direction in ("fwd", "fwd+bwd") + (("bwd",) if impl.startswith("softmax_ext") else ()):
                if impl in ("softmax_ext.inplace", "softmax_ext.two_op") and direction != "fwd+bwd":
                    continue
                r = run_case(impl, fn, x, t, direction, copy, es)
                r.update(device=name, dtype=dname, tokens=n, vocab=c, kernel=kernel if "softmax_ext" in impl else "")
                rows.append(r)
                print(f"{dname} {n}x{c} {impl:20s} {direction:8s} {r['ms']} ms {r['pct_floor']}% {r['status']}",
                      flush=True)
        del x, t
        torch.cuda.empty_cache()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["device", "dtype", "tokens", "vocab", "impl", "direction",
                                              "ms", "gbs", "pct_floor", "status", "kernel"])
            w.writeheader()
            w.writerows(rows)
    print(f"\nwritten: {path}")
    print(f"\n{name}, copy {copy:.0f} GB/s; ms (% of the bandwidth floor)")
    names = list(table)
    print(f"{'dtype':5s} {'shape':>13s} {'dir':8s} " + " ".join(f"{k:>20s}" for k in names))
    keys = sorted({(r["dtype"], r["vocab"], r["tokens"], r["direction"]) for r in rows},
                  key=lambda k: (k[0], k[1], k[2], ["fwd", "bwd", "fwd+bwd"].index(k[3])))
    for key in keys:
        cells = []
        for k in names:
            r = next((r for r in rows if (r["dtype"], r["vocab"], r["tokens"], r["direction"]) == key
                      and r["impl"] == k), None)
            cells.append("-" if r is None else ("ERR" if r["ms"] is None else f"{r['ms']:.3f} ({r['pct_floor']:.0f}%)"))
        print(f"{key[0]:5s} {key[2]:>6d}x{key[1]:<6d} {key[3]:8s} " + " ".join(f"{c:>20s}" for c in cells))


if __name__ == "__main__":
    main()
