"""Host cost per call: softmax_ext beside torch, back to back on small
tensors, so the time is the Python + dispatcher + launch path, not the kernel.

    python -m benchmarks.bench_host [--device cuda] [--calls 2000] [--rounds 15]

Rows: the forward without grad, the forward with grad (building the autograd
node), the backward op, the autograd round trip (forward + sum + backward),
and softmax_ext through softmax_ext.patch() (torch.softmax routed); then
cross_entropy's and softmax_matmul's (beside softmax(x) @ v) calls. Each
figure is the median over rounds of the mean µs per call of a round; the
rounds of softmax_ext and torch alternate, after two short warm-up rounds
each. The device is synchronised once per round, so a kernel's GPU time
only shows where it is longer than the host's time per call.
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import softmax_ext


def _per_call_us(fn, calls: int, device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def cases(device: str):
    x = torch.randn(8, 128, device=device)
    xg = x.clone().requires_grad_(True)
    y = torch.softmax(x, -1)
    dy = torch.randn_like(y)
    aten_bwd = torch.ops.aten._softmax_backward_data

    t = torch.randint(0, 128, (8,), device=device)
    ce_ops = torch.ops.softmax_ext

    def round_trip(f):
        def run():
            f(xg, -1).sum().backward()

        return run

    def loss_round_trip(f):
        def run():
            f(xg, t).backward()

        return run

    def two_op(x_, t_):  # the forward op with its registered autograd formula
        return ce_ops._cross_entropy_forward.default(x_, t_)[0]

    # softmax_matmul: (2, 16, 64) x (2, 64, 32), the fused backward's shapes on sm_90
    s = torch.randn(2, 16, 64, device=device)
    sg = s.clone().requires_grad_(True)
    vv = torch.randn(2, 64, 32, device=device)

    def naive_mm(a, b):
        return torch.softmax(a, -1) @ b

    def mm_round_trip(f):
        def run():
            f(sg, vv).sum().backward()

        return run

    return [
        ("softmax, no grad", lambda: softmax_ext.softmax(x, -1), lambda: torch.softmax(x, -1)),
        ("log_softmax, no grad", lambda: softmax_ext.log_softmax(x, -1), lambda: torch.log_softmax(x, -1)),
        ("softmax, input requires grad", lambda: softmax_ext.softmax(xg, -1), lambda: torch.softmax(xg, -1)),
        ("softmax_backward op", lambda: softmax_ext.softmax_backward(dy, y, -1),
         lambda: aten_bwd(dy, y, -1, torch.float32)),
        ("autograd round trip", round_trip(softmax_ext.softmax), round_trip(torch.softmax)),
        ("torch.softmax under patch()", None, lambda: torch.softmax(x, -1)),
        ("F.softmax under patch()", None, lambda: torch.nn.functional.softmax(x, -1)),
        ("cross_entropy, no grad", lambda: softmax_ext.cross_entropy(x, t), lambda: F.cross_entropy(x, t)),
        ("cross_entropy round trip (fused)", loss_round_trip(softmax_ext.cross_entropy),
         loss_round_trip(F.cross_entropy)),
        ("cross_entropy round trip, none", loss_round_trip(lambda x_, t_: softmax_ext.cross_entropy(
            x_, t_, reduction="none").sum()), loss_round_trip(lambda x_, t_: F.cross_entropy(
                x_, t_, reduction="none").sum())),
        ("forward op's registered formula", loss_round_trip(two_op), loss_round_trip(F.cross_entropy)),
        ("softmax_matmul, no grad", lambda: softmax_ext.softmax_matmul(s, vv), lambda: naive_mm(s, vv)),
        ("softmax_matmul round trip", mm_round_trip(softmax_ext.softmax_matmul), mm_round_trip(naive_mm)),
    ]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    if args.calls < 1 or args.rounds < 1:
        parser.error("--calls and --rounds must be at least 1")

    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"host cost per call, {name}, torch {torch.__version__}, (8, 128) float32, median of {args.rounds} rounds")
    print(f"{'call':34s} {'softmax_ext µs':>15s} {'torch µs':>10s} {'ratio':>7s}")
    for label, ours, theirs in cases(args.device):
        patched = ours is None
        if patched:
            ours = theirs  # the same call, routed by patch()
        mine, ref = [], []
        for _ in range(2):  # warm-up: lazy loading, caches, the allocator's blocks
            if patched:
                softmax_ext.patch()
            _per_call_us(ours, args.calls // 4 + 1, args.device)
            softmax_ext.unpatch()
            _per_call_us(theirs, args.calls // 4 + 1, args.device)
        for _ in range(args.rounds):
            if patched:
                softmax_ext.patch()
            mine.append(_per_call_us(ours, args.calls, args.device))
            if patched:
                softmax_ext.unpatch()
            ref.append(_per_call_us(theirs, args.calls, args.device))
        a, b = statistics.median(mine), statistics.median(ref)
        print(f"{label:34s} {a:15.2f} {b:10.2f} {a / b:7.2f}")


if __name__ == "__main__":
    main()
