"""Prints the kernel softmax_ext's plan picks for every case of the
benchmark sweep (`python -m benchmarks.bench_softmax`, every dtype, op and
direction), one line per case, so that two builds can be compared with
`diff`:

    python scripts/kernel_names.py [--device cuda] > kernels.txt
"""

import argparse
import sys

import torch

sys.path.insert(0, ".")
from benchmarks.bench_softmax import DIRECTIONS, cpu_cases, ext_kernel, gpu_cases  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    args = p.parse_args()
    cases = gpu_cases(quick=False) if args.device == "cuda" else cpu_cases(quick=False)
    for case in cases:
        gen = torch.Generator(device=args.device).manual_seed(0)
        x = case.make(args.device, gen)
        for op in case.ops:
            y = getattr(torch, op)(x, case.dim)
            for direction in DIRECTIONS:
                inputs = (x,) if direction == "forward" else (torch.empty_like(x), y)
                kernel = ext_kernel(op, direction, case.dim, inputs)
                print(f"{case.dtype:4s} {case.group:18s} {case.label:18s} dim={case.dim:2d} {op:11s} {direction:8s} {kernel}")
            del y
        del x
        if args.device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
