"""softmax_matmul on attention-like and other shapes beside the naive
`F.softmax(x, -1) @ v`, in one process: forward (no grad) and backward
(autograd.grad of a kept graph) times, do_bench medians in µs, the plans, and
the largest error against float64 of out, dx and dv, each relative to its largest float64
value (naive ; softmax_ext).

    python scripts/smm_shapes.py [--only=bf16,tf32,f32] [--no-backward] [--ab=name:K=V[+K=V]] [b,d1,d2,d3 ...]

--ab (repeatable): the forward again with those environment switches
(docs/softmax_matmul.md) set, its time and plan beside the others.
"""

import os
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import softmax_ext

SHAPES = [(64, 512, 512, 64), (32, 1024, 1024, 64), (16, 2048, 2048, 64), (4, 4096, 4096, 64),
          (32, 1024, 1024, 128), (8, 2048, 2048, 128), (96, 197, 197, 64), (384, 77, 77, 64),
          (16, 4096, 256, 256), (16, 256, 4096, 256)]
PRECISIONS = (("bf16", torch.bfloat16, False), ("tf32", torch.float32, True), ("f32", torch.float32, False))


def rel_err(got, ref):
    """out / dx / dv: each one's largest error over its largest float64 value."""
    return "/".join(f"{(a.double() - r).abs().max().item() / (r.abs().max().item() or 1.0):.1e}"
                    for a, r in zip(got, ref))


def main(argv):
    backward = "--no-backward" not in argv
    only = next((a.split("=", 1)[1].split(",") for a in argv if a.startswith("--only=")), None)
    abs_ = [a.split("=", 1)[1].split(":", 1) for a in argv if a.startswith("--ab=")]
    abs_ = [(name, dict(kv.split("=", 1) for kv in env.split("+"))) for name, env in abs_]
    shapes = [tuple(int(s) for s in a.split(",")) for a in argv if not a.startswith("--")] or SHAPES
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    print("prec | (b, d1, d2, d3) | fwd naive | fwd ours | x | bwd naive | bwd ours | x | err out/dx/dv naive ; ours | plan")
    for name, dtype, tf32 in PRECISIONS:
        if only is not None and name not in only:
            continue
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for b, d1, d2, d3 in shapes:
            torch.manual_seed(0)
            x = (torch.randn(b, d1, d2, device="cuda", dtype=dtype) * 2).requires_grad_(backward)
            v = torch.randn(b, d2, d3, device="cuda", dtype=dtype, requires_grad=backward)
            g = torch.randn(b, d1, d3, device="cuda", dtype=dtype)
            xd, vd = x.detach().double().requires_grad_(), v.detach().double().requires_grad_()
            out_d = F.softmax(xd, -1) @ vd
            ref = [out_d.detach()]
            if backward:
                ref += list(torch.autograd.grad(out_d, (xd, vd), g.double()))
            del out_d, xd, vd
            with torch.no_grad():
                f_naive = do_bench(lambda: F.softmax(x, -1) @ v) * 1e3
                f_ours = do_bench(lambda: softmax_ext.softmax_matmul(x, v)) * 1e3
            got_n, got_o = [F.softmax(x, -1) @ v], [softmax_ext.softmax_matmul(x, v)]
            plan = softmax_ext.plan(x, kind="softmax_matmul", v=v).kernel
            line = f"{name} | {(b, d1, d2, d3)} | {f_naive:.1f} | {f_ours:.1f} | {f_naive / f_ours:.2f}"
            if backward:
                b_naive = do_bench(lambda: torch.autograd.grad(got_n[0], (x, v), g, retain_graph=True)) * 1e3
                b_ours = do_bench(lambda: torch.autograd.grad(got_o[0], (x, v), g, retain_graph=True)) * 1e3
                got_n += list(torch.autograd.grad(got_n[0], (x, v), g))
                got_o += list(torch.autograd.grad(got_o[0], (x, v), g))
                plan += " / " + softmax_ext.plan(x, kind="softmax_matmul", v=v, backward=True).kernel
                line += f" | {b_naive:.1f} | {b_ours:.1f} | {b_naive / b_ours:.2f}"
            else:
                line += " | - | - | -"
            line += f" | {rel_err(got_n, ref)} ; {rel_err(got_o, ref)} | {plan}"
            for ab_name, env in abs_:
                old = {k: os.environ.get(k) for k in env}
                os.environ.update(env)
                with torch.no_grad():
                    f_ab = do_bench(lambda: softmax_ext.softmax_matmul(x, v)) * 1e3
                ab_plan = softmax_ext.plan(x, kind="softmax_matmul", v=v).kernel
                for k, val in old.items():
                    if val is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = val
                line += f" | {ab_name} {f_ab:.1f} x{f_naive / f_ab:.2f} {ab_plan}"
            print(line, flush=True)
            del x, v, g, got_n, got_o, ref
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
