"""The kernel softmax_ext's plan picks for every case of the benchmark sweep
(python -m benchmarks.bench_softmax: its GPU case list, every op, forward and
backward), one line per case, so two builds can be diffed:

    python scripts/kernel_names.py > before.txt      # one build
    python scripts/kernel_names.py > after.txt       # the other
    diff before.txt after.txt

    python scripts/kernel_names.py --dtype f32,bf16 --device cpu

Tensors are allocated, never filled (plans read shapes, strides and
alignment only). On a machine without a GPU, --device cpu prints the CPU
plans of the same cases.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_softmax import DIRECTIONS, DTYPES, ext_kernel, gpu_cases  # noqa: E402


def unfilled(case, device):
    """The case's input with its layout (Case.make without the random fill)."""
    dtype = DTYPES[case.dtype]
    if case.transposed:
        return torch.empty(case.shape[::-1], device=device, dtype=dtype).t()
    return torch.empty(case.shape, device=device, dtype=dtype)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default=",".join(DTYPES), help="comma list of " + ", ".join(DTYPES))
    args = ap.parse_args()
    dtypes = args.dtype.split(",")
    for case in gpu_cases(quick=False):
        if case.dtype not in dtypes:
            continue
        x = unfilled(case, args.device)
        for op in case.ops:
            for direction in DIRECTIONS:
                # backward: dy and y in x's layout, as the benchmark makes them
                inputs = (x,) if direction == "forward" else (torch.empty_like(x), torch.empty_like(x))
                kernel = ext_kernel(op, direction, case.dim, inputs)
                print(f"{case.group:18s} {case.dtype:5s} {case.label:18s} dim={case.dim:<3d} {op:12s} {direction:9s} {kernel}",
                      flush=True)
                del inputs
        del x
        if args.device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
