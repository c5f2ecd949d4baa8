"""A/B of softmax_matmul's CUDA tiles (SOFTMAX_EXT_SMM_TILE="warps,bn") at
the benchmark's shapes, against the naive version, in one process.

    python scripts/smm_tiles.py [d2 ...]
"""

import os
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import softmax_ext

TILES = ["4,128", "8,64", "8,128", "8,256"]


def main(d2s):
    b, d1, d3 = 16, 2048, 512
    print(torch.cuda.get_device_name())
    for name, dtype, tf32 in (("bf16", torch.bfloat16, False), ("tf32", torch.float32, True),
                              ("f32", torch.float32, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for d2 in d2s:
            x = torch.randn(b, d1, d2, device="cuda", dtype=dtype)
            v = torch.randn(b, d2, d3, device="cuda", dtype=dtype)
            flop = 2 * b * d1 * d2 * d3
            ref = F.softmax(x, -1) @ v
            line = f"{name:5} d2={d2:5} naive {do_bench(lambda: F.softmax(x, -1) @ v):.3f}"
            for tile in TILES:
                os.environ["SOFTMAX_EXT_SMM_TILE"] = tile
                out = softmax_ext.softmax_matmul(x, v)
                err = (out.float() - ref.float()).abs().max().item()
                ms = do_bench(lambda: softmax_ext.softmax_matmul(x, v))
                line += f" | {tile} {ms:.3f} ms {flop / ms / 1e9:.0f} TF/s err {err:.1e}"
            os.environ.pop("SOFTMAX_EXT_SMM_TILE")
            print(line, flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1024, 8192])
