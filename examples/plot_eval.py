#!/usr/bin/env python3
"""Plots from oscar-eval CSV files (matplotlib): error vs context length per method, per-layer error,
and error vs effective bits per element. Reads the files examples/ablation_sweep.sh writes.

usage: examples/plot_eval.py [--context context.csv] [--per-layer per_layer.csv]
                             [--bpe windows.csv group_size.csv ...] [--metric rel_err] [--out DIR]
                             [--prefix NAME] [--title TEXT]
"""
import argparse
import csv
import os
import sys
from collections import defaultdict

PREFIX = "eval"  # file name prefix (--prefix)
TITLE = ""  # title prefix (--title)


def read_rows(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"error: {path}: no rows")
    for required in ("method", "context", "bpe", "rel_err"):
        if required not in rows[0]:
            sys.exit(f"error: {path}: no column '{required}' (is it oscar-eval --format csv output?)")
    return rows


def label(row):
    """Method plus the settings that distinguish sweep variants."""
    return f"{row['method']} (S{row['sink']}/W{row['recent']}, G{row['group_size']})"


def plot_context(plt, rows, metric, out):
    series = defaultdict(list)
    for r in rows:
        if r["method"] == "bf16":
            continue  # ~1e-8: would flatten the log axis
        series[r["method"]].append((int(r["context"]), float(r[metric])))
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for method, points in series.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=method)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length L (tokens before the query)")
    ax.set_ylabel(f"mean {metric}")
    ax.set_title(f"{TITLE}error vs context ({metric})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    path = os.path.join(out, f"{PREFIX}_context_{metric}.png")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def plot_layers(plt, rows, metric, out):
    if "layer" not in rows[0] and "layers" in rows[0]:
        layer_of = lambda r: int(r["layers"])  # --per-layer rows: 'layers' holds the one layer
    else:
        layer_of = lambda r: int(r["layer"])
    series = defaultdict(list)
    for r in rows:
        if r["method"] == "bf16":
            continue
        series[(r["method"], r["context"])].append((layer_of(r), float(r[metric])))
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for (method, context), points in series.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"{method} @ {context}")
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel(f"mean {metric}")
    ax.set_title(f"{TITLE}per-layer error ({metric})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    path = os.path.join(out, f"{PREFIX}_layers_{metric}.png")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def plot_bpe(plt, rows, metric, out):
    series = defaultdict(list)
    for r in rows:
        if r["method"] == "bf16":
            continue
        series[r["method"]].append((float(r["bpe"]), float(r[metric]), label(r)))
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for method, points in series.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", linestyle="", label=method)
    ax.set_yscale("log")
    ax.set_xlabel("effective bits per element BPE(L) (codes + metadata + BF16 windows)")
    ax.set_ylabel(f"mean {metric}")
    ax.set_title(f"{TITLE}error vs storage ({metric})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    path = os.path.join(out, f"{PREFIX}_bpe_{metric}.png")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", help="oscar-eval CSV with several contexts")
    parser.add_argument("--per-layer", help="oscar-eval --per-layer CSV")
    parser.add_argument("--bpe", nargs="+", default=[], help="oscar-eval CSVs of sweeps that change the storage")
    parser.add_argument("--metric", default="rel_err", help="column to plot (rel_err, rel_err_p99, kl, ...)")
    parser.add_argument("--out", default=".", help="folder for the PNG files")
    parser.add_argument("--prefix", default="eval", help="file name prefix: PREFIX_{context,layers,bpe}_METRIC.png")
    parser.add_argument("--title", default="", help="text put before each plot title, e.g. the data set")
    args = parser.parse_args()
    global PREFIX, TITLE
    PREFIX = args.prefix
    TITLE = f"{args.title}: " if args.title else ""
    if not (args.context or args.per_layer or args.bpe):
        parser.error("nothing to plot: give --context, --per-layer or --bpe")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(args.out, exist_ok=True)
    written = []
    if args.context:
        written.append(plot_context(plt, read_rows(args.context), args.metric, args.out))
    if args.per_layer:
        written.append(plot_layers(plt, read_rows(args.per_layer), args.metric, args.out))
    if args.bpe:
        rows = [r for path in args.bpe for r in read_rows(path)]
        written.append(plot_bpe(plt, rows, args.metric, args.out))
    for path in written:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
