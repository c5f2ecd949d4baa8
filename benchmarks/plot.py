"""GB/s against row length N for the last-axis rows of a bench_softmax CSV.

    python -m benchmarks.plot benchmarks/results/<device>.csv

One PNG per dtype next to the CSV (<csv stem>-<dtype>.png): forward and
backward side by side, one colour per implementation, solid for softmax and
dashed for log_softmax, and the measured copy bandwidth as a grey line.
"""

import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402

LINESTYLE = {"softmax": "-", "log_softmax": "--"}


def last_axis_n(row):
    """N for a row of the last-axis sweep, else None (CSVs without a case
    column: any contiguous 2-D softmax over the last axis)."""
    if row.get("case", "last-axis") != "last-axis" or row["shape"].endswith("^T"):
        return None
    dims = [int(d) for d in row["shape"].split("x")]
    if len(dims) != 2 or int(row["dim"]) not in (-1, 1):
        return None
    return dims[1]


def series(rows, dtype, direction):
    """{(impl, op): [(N, GB/s), ...]} over the timed last-axis rows."""
    lines = {}
    for r in rows:
        n = last_axis_n(r)
        if n is None or r["dtype"] != dtype or r["direction"] != direction or not r.get("gbs"):
            continue
        if r.get("status", "ok") != "ok":
            continue
        lines.setdefault((r["impl"], r["op"]), []).append((n, float(r["gbs"])))
    return {key: sorted(points) for key, points in lines.items()}


def copy_bandwidth(rows):
    for r in rows:
        if r.get("gbs") and r.get("pct_copy") and float(r["pct_copy"]) > 0:
            return float(r["gbs"]) * 100 / float(r["pct_copy"])
    return None


def plot_dtype(rows, dtype, path):
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    colours = {impl: f"C{i}" for i, impl in enumerate(impls)}
    copy = copy_bandwidth(rows)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    for ax, direction in zip(axes, ("forward", "backward")):
        for (impl, op), points in series(rows, dtype, direction).items():
            ns, gbs = zip(*points)
            ax.plot(ns, gbs, LINESTYLE.get(op, ":"), marker="o", ms=3, color=colours[impl], label=f"{impl} {op}")
        if copy:
            ax.axhline(copy, color="grey", lw=1, label=f"copy {copy:.0f} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("N (row length, last axis)")
        ax.set_title(f"{direction}, {dtype}")
        ax.grid(True, alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=7)
    axes[0].set_ylabel("GB/s (bytes read + written)")
    fig.suptitle(f"{rows[0]['device']}: softmax over the last axis")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_csv(csv_path):
    """Write one PNG per dtype that has last-axis rows; returns their paths."""
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    stem = os.path.splitext(csv_path)[0]
    paths = []
    for dtype in dict.fromkeys(r["dtype"] for r in rows if last_axis_n(r)):
        path = f"{stem}-{dtype}.png"
        plot_dtype(rows, dtype, path)
        paths.append(path)
    return paths


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        for png in plot_csv(arg):
            print(f"written: {png}")
