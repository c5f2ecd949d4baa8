"""Runs one forward softmax (or cross-entropy) case twice (a warm-up, then
the call to profile) for Nsight Compute:

    ncu --launch-skip 1 --launch-count 1 -k regex:oftmax --section SpeedOfLight \
        python3 scripts/ncu_case.py ext|torch f32|bf16|f16 ROWSxN [softmax|log_softmax|cross_entropy]
"""
import sys

import torch

import softmax_ext

impl, dtype, shape = sys.argv[1], sys.argv[2], sys.argv[3]
op = sys.argv[4] if len(sys.argv) > 4 else "softmax"
dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype]
rows, n = (int(v) for v in shape.split("x"))
x = torch.randn(rows, n, device="cuda", dtype=dtype)
lib = softmax_ext if impl == "ext" else torch
if op == "cross_entropy":
    t = torch.randint(0, n, (rows,), device="cuda")
    ce = softmax_ext.cross_entropy if impl == "ext" else torch.nn.functional.cross_entropy

    def fn(x, dim):
        return ce(x, t)
else:
    fn = getattr(lib, op)
for _ in range(2):
    fn(x, -1)
torch.cuda.synchronize()
