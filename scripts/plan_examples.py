"""Prints softmax_ext.plan() for a few representative tensors on each
visible device (the README's plan printout comes from this)."""

import torch

import softmax_ext

CASES = [
    ("x = torch.empty(8, 1024, dtype=torch.bfloat16)", lambda d: torch.empty(8, 1024, dtype=torch.bfloat16, device=d), {}),
    ("x = torch.empty(4096, 50257, dtype=torch.bfloat16)", lambda d: torch.empty(4096, 50257, dtype=torch.bfloat16, device=d), {}),
    ("x = torch.empty(16, 1 << 24)", lambda d: torch.empty(16, 1 << 24, device=d), {}),
    ("x = torch.empty(32, 1024, 4096)", lambda d: torch.empty(32, 1024, 4096, device=d), {"dim": 1}),
    ("x = torch.empty(4096, 4096).t()", lambda d: torch.empty(4096, 4096, device=d).t(), {"kind": "log_softmax", "backward": True}),
    ("x = torch.empty(8, 1024, dtype=torch.bfloat16)", lambda d: torch.empty(8, 1024, dtype=torch.bfloat16, device=d), {"dtype": torch.float32}),
]


def main():
    for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
        name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
        print(f"# on {name}")
        for text, make, kwargs in CASES:
            x = make(device)
            args = "".join(f", {k}={v!r}" for k, v in kwargs.items())
            p = softmax_ext.plan(x, **kwargs)
            print(f">>> {text}")
            print(f">>> softmax_ext.plan(x{args})")
            print(f"    kernel={p.kernel!r}, workspace_size={p.workspace_size}, deterministic={p.deterministic}, "
                  f"accumulator={p.accumulator}")
            print(f"    problem: rows={p.problem.rows}, axis_size={p.problem.axis_size}, "
                  f"axis_stride={p.problem.axis_stride}, inner_size={p.problem.inner_size}")
            del x
        if device == "cuda":
            print(">>> softmax_ext.plan_limits(torch.empty(1, device='cuda'))")
            print("   ", softmax_ext.plan_limits(torch.empty(1, device="cuda")))
            print(">>> softmax_ext.plan_limits(torch.empty(1, device='cuda', dtype=torch.bfloat16), backward=True)")
            print("   ", softmax_ext.plan_limits(torch.empty(1, device="cuda", dtype=torch.bfloat16), backward=True))


if __name__ == "__main__":
    main()
