"""The README's figure tables, rendered from the committed benchmark CSVs.

    python -m benchmarks.readme_tables                  # print every table
    python -m benchmarks.readme_tables --write README.md   # refresh them in place

In README.md each table sits between `<!-- table:NAME -->` and
`<!-- /table:NAME -->`; --write replaces what is between the markers with a
fresh rendering and leaves everything else alone. The CSVs come from
`python -m benchmarks.bench_softmax` (GPU; % of the copy bandwidth measured
in the same run) and `python -m benchmarks.bench_softmax --device cpu` (CPU;
milliseconds and speedup over torch, same process).
"""

import argparse
import csv
import os
import re
import sys

RESULTS = os.path.join(os.path.dirname(__file__), "results")
GPU_CSV = {"h200": "nvidia-h200.csv", "h100": "nvidia-h100-80gb-hbm3.csv"}
CPU_CSV = "cpu.csv"
PEERS = ("softmax_ext", "torch", "torch.compile", "liger", "triton-tutorial")
PEER_NAMES = {"softmax_ext": "softmax_ext", "torch": "torch", "torch.compile": "torch.compile",
              "liger": "Liger", "triton-tutorial": "Triton tutorial"}
DIR = {"forward": "fwd", "backward": "bwd"}
SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def load(name):
    """{(case, op, direction, dtype, shape, dim, impl): row}; a later row of
    the same key (a rerun appended to the CSV) replaces an earlier one."""
    rows = {}
    with open(os.path.join(RESULTS, name)) as f:
        for r in csv.DictReader(f):
            key = (r.get("case", ""), r["op"], r["direction"], r["dtype"], r["shape"], r["dim"], r["impl"])
            rows[key] = r
    return rows


def _pct(r):
    if r is None:
        return "–"
    if r.get("status", "ok") != "ok" or not r.get("pct_copy"):
        return {"refuses": "no", "wrong": "wrong"}.get(r.get("status"), "–")
    return f"{float(r['pct_copy']):.0f}%"


def _pow2(n):
    n = int(n)
    return f"2^{n.bit_length() - 1}" if n & (n - 1) == 0 and n >= 1024 else str(n)


def last_axis_table(rows, dtype, op="softmax"):
    """Rows N, columns forward and backward per implementation, % of copy."""
    keys = [k for k in rows if k[0] == "last-axis" and k[3] == dtype and k[1] == op]
    shapes = sorted({k[4] for k in keys}, key=lambda s: int(s.split("x")[1]))
    impls = [p for p in PEERS if any(k[6] == p for k in keys)]
    out = []
    for direction in ("forward", "backward"):
        cols = [p for p in impls if any(k[6] == p and k[2] == direction for k in keys)]
        out.append((direction, cols))
    head = "| N | " + " | ".join(f"{DIR[d]} {PEER_NAMES[p]}" for d, cols in out for p in cols) + " |"
    lines = [head, "|---:|" + "---:|" * sum(len(c) for _, c in out)]
    for shape in shapes:
        cells = [_pct(rows.get(("last-axis", op, d, dtype, shape, "-1", p))) for d, cols in out for p in cols]
        cells = [f"**{c}**" if i == 0 or (d == "backward" and p == "softmax_ext") else c
                 for i, ((d, p), c) in enumerate(zip([(d, p) for d, cols in out for p in cols], cells))]
        lines.append(f"| {_pow2(shape.split('x')[1])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# (case, shape, dtype): the cases of the "other shapes" table, in order
OTHER = [
    ("long-row", "1x268435456", "float32", "(1, 2^28) f32, one huge row"),
    ("long-row", "4x16777216", "float32", "(4, 2^24) f32"),
    ("mid-long-row", "256x1048576", "float32", "(256, 2^20) f32"),
    ("mid-long-row", "64x4194304", "float32", "(64, 2^22) f32"),
    ("mid-long-row", "512x2097152", "bfloat16", "(512, 2^21) bf16"),
    ("short-row", "16777216x16", "float32", "(2^24, 16) f32"),
    ("odd-row", "4473924x60", "float32", "(4473924, 60) f32"),
    ("odd-row", "2725233x197", "bfloat16", "(2725233, 197) bf16, ViT tokens"),
    ("odd-row", "357913x1500", "bfloat16", "(357913, 1500) bf16"),
    ("mid-axis", "32x1024x4096", "float32", "(32, 1024, 4096) f32, dim=1"),
    ("mid-axis", "32x1024x4096", "bfloat16", "(32, 1024, 4096) bf16, dim=1"),
    ("channel-axis", "4096x16x4096", "float32", "(4096, 16, 4096) f32, dim=1"),
    ("transposed", "8192x8192^T", "float32", "randn(8192, 8192).t() f32"),
    ("long-strided-axis", "131072x2048", "float32", "(131072, 2048) f32, dim=0"),
    ("vocab", "8192x131072", "bfloat16", "(8192, 131072) bf16 log_softmax"),
]


def other_table(rows):
    """Softmax (log_softmax for the vocab case), forward and backward, % of copy."""
    cols = [("forward", p) for p in ("softmax_ext", "torch", "torch.compile", "liger")] + \
           [("backward", p) for p in ("softmax_ext", "torch", "torch.compile")]
    lines = ["| shape | " + " | ".join(f"{DIR[d]} {PEER_NAMES[p]}" for d, p in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for case, shape, dtype, label in OTHER:
        op = "log_softmax" if case == "vocab" else "softmax"
        found = {k: r for k, r in rows.items() if k[0] == case and k[4] == shape and k[3] == dtype and k[1] == op}
        if not found:
            continue
        cells = []
        for d, p in cols:
            r = next((r for k, r in found.items() if k[2] == d and k[6] == p), None)
            cells.append(f"**{_pct(r)}**" if p == "softmax_ext" else _pct(r))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cpu_table():
    """Milliseconds and speedup over torch, per case of the CPU CSV."""
    with open(os.path.join(RESULTS, CPU_CSV)) as f:
        rows = list(csv.DictReader(f))
    entries = {}
    for r in rows:
        key = (r["op"], r["direction"], r["dtype"], r["shape"], r["dim"])
        entries.setdefault(key, {})[r["impl"]] = r
    lines = ["| op | direction | dtype | shape | dim | softmax_ext ms | torch ms | torch.compile ms | vs torch |",
             "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for (op, direction, dtype, shape, dim), by in entries.items():
        ours, torch_r, comp = by.get("softmax_ext"), by.get("torch"), by.get("torch.compile")
        if ours is None or torch_r is None:
            continue
        ms = lambda r: f"{float(r['ms']):.2f}" if r and r.get("ms") else "–"  # noqa: E731
        speed = float(torch_r["ms"]) / float(ours["ms"])
        lines.append(f"| {op} | {direction} | {SHORT.get(dtype, dtype)} | {shape.replace('x', '×')} | {dim} | "
                     f"**{ms(ours)}** | {ms(torch_r)} | {ms(comp)} | {speed:.2f}× |")
    return "\n".join(lines)


def tables():
    h200 = load(GPU_CSV["h200"])
    return {
        "h200-f32": last_axis_table(h200, "float32"),
        "h200-bf16": last_axis_table(h200, "bfloat16"),
        "h200-other": other_table(h200),
        "cpu": cpu_table(),
    }


def write(path, rendered):
    with open(path) as f:
        text = f.read()
    for name, table in rendered.items():
        pattern = re.compile(rf"(<!-- table:{re.escape(name)} -->\n)(?:.*?\n)?(<!-- /table:{re.escape(name)} -->)", re.S)
        if not pattern.search(text):
            print(f"{path}: no <!-- table:{name} --> markers; left out", file=sys.stderr)
            continue
        text = pattern.sub(lambda m: m.group(1) + table + "\n" + m.group(2), text)
    with open(path, "w") as f:
        f.write(text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", metavar="README", help="replace the tables between the markers in this file")
    args = parser.parse_args(argv)
    rendered = tables()
    if args.write:
        write(args.write, rendered)
        print(f"refreshed {len(rendered)} tables in {args.write}")
    else:
        for name, table in rendered.items():
            print(f"<!-- table:{name} -->\n{table}\n<!-- /table:{name} -->\n")


if __name__ == "__main__":
    main()
