"""Where a model step's GPU time goes, per variant: the kernels of a few
training steps of one benchmarks.bench_models case (torch, patch(),
integration), side by side, the kernels whose time differs most first.

    python scripts/model_kernels.py [--model llama] [--dtype bfloat16] [--mode compiled] [--batch 16]
"""

import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.bench_models import Case, variant_context


def kernel_times(case, reps=3):
    with variant_context(case.variant, case.model):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                case.step()
            torch.cuda.synchronize()
    times = defaultdict(float)
    for e in prof.key_averages():
        if e.device_type.name == "CUDA":
            times[e.key[:90]] += e.device_time_total / reps / 1e3
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--mode", default="compiled")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--variants", default="torch,patch,integration")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    variants = args.variants.split(",")
    per = {}
    for v in variants:
        torch._dynamo.reset()
        case = Case(args.model, getattr(torch, args.dtype), args.mode, v, "cuda", args.batch)
        case.run(3, timed=False)
        per[v] = kernel_times(case)
        del case
        torch.cuda.empty_cache()
    names = set().union(*per.values())
    spread = {n: max(p.get(n, 0.0) for p in per.values()) - min(p.get(n, 0.0) for p in per.values()) for n in names}
    print(f"{args.model} {args.dtype} {args.mode} batch {args.batch} on {torch.cuda.get_device_name()}, ms per step")
    print("  ".join(f"{v:>11s}" for v in variants) + "  kernel")
    print("  ".join(f"{sum(per[v].values()):11.3f}" for v in variants) + "  (all kernels)")
    for n in sorted(names, key=lambda n: -spread[n])[: args.top]:
        print("  ".join(f"{per[v].get(n, 0.0):11.3f}" for v in variants) + "  " + n)


if __name__ == "__main__":
    main()
