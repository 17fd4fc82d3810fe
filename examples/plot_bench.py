#!/usr/bin/env python3
"""Plots from oscar-bench CSV files (matplotlib): the INT2 decode's share of the measured HBM read peak per
shape, one bar per run (e.g. a short-burst run and a sustained one), against the 75 % target; and the decode
times against the context length per batch, next to PyTorch SDPA when its table is given.

usage: examples/plot_bench.py RUN.csv [RUN2.csv ...] [--labels burst,sustained] [--torch torch.md]
                              [--kernel int2_decode] [--uniform] [--min-mbytes MB] [--out DIR]
                              [--prefix bench] [--title TEXT]

RUN.csv: `oscar-bench --format csv` output. torch.md: `examples/bench_vs_torch.py` output (markdown).
"""
import argparse
import csv
import os
import sys
from collections import defaultdict

TARGET_PCT = 75.0  # issue target: INT2 decode >= 75 % of the measured HBM bandwidth on calls of >= 256 MB
TARGET_MB = 256.0


def open_or_exit(path):
    try:
        return open(path, newline="")
    except OSError as e:
        sys.exit(f"error: {path}: {e.strerror}")


def read_bench(path, kernel):
    with open_or_exit(path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"error: {path}: no rows")
    for required in ("kernel", "batch", "context", "ragged", "mbytes", "time_us", "pct_peak"):
        if required not in rows[0]:
            sys.exit(f"error: {path}: no column '{required}' (is it oscar-bench --format csv output?)")
    picked = [r for r in rows if r["kernel"] == kernel]
    if not picked:
        sys.exit(f"error: {path}: no '{kernel}' rows")
    return picked


def read_torch(path):
    """(backend, batch, context) -> time_us from bench_vs_torch.py's markdown table."""
    times = {}
    with open_or_exit(path) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 4 and cells[0].startswith("sdpa_"):
                try:
                    times[(cells[0], int(cells[1]), int(cells[2]))] = float(cells[3])
                except ValueError:
                    sys.exit(f"error: {path}: cannot read the row '{line.strip()}'")
    if not times:
        sys.exit(f"error: {path}: no sdpa_* rows (is it examples/bench_vs_torch.py output?)")
    return times


def save(fig, out, name):
    path = os.path.join(out, name)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def context_label(tokens):
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else str(tokens)


def plot_share(plt, runs, labels, out, prefix, title):
    """Grouped bars: % of the read peak per (batch, context, ragged) shape, one bar per run."""
    shapes = sorted({(int(r["batch"]), int(r["context"]), r["ragged"]) for rows in runs for r in rows},
                    key=lambda s: (s[2], s[1], s[0]))
    values = []
    for rows in runs:
        by_shape = {(int(r["batch"]), int(r["context"]), r["ragged"]): r for r in rows}
        values.append([by_shape.get(s) for s in shapes])
    bars = len(shapes) * max(1, len(runs))
    fig, ax = plt.subplots(figsize=(max(6.4, min(0.45 * bars, 4 + 0.2 * bars)), 4.6))
    width = 0.8 / len(runs)
    for i, (run, label) in enumerate(zip(values, labels)):
        xs = [j + (i - (len(runs) - 1) / 2) * width for j in range(len(shapes))]
        heights = [float(r["pct_peak"]) if r else 0.0 for r in run]
        bars = ax.bar(xs, heights, width, label=label)
        for bar, r in zip(bars, run):
            if r and float(r["mbytes"]) < TARGET_MB:
                bar.set_alpha(0.45)  # calls below the target's 256 MB
    ax.axhline(TARGET_PCT, color="black", linestyle="--", linewidth=1,
               label=f"target {TARGET_PCT:.0f} % (calls >= 256 MB)")
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels([f"{b}/{context_label(c)}" + ("\nragged" if g == "ragged" else "") for b, c, g in shapes],
                       rotation=90, fontsize=8)
    ax.set_xlabel("batch / context (faded: calls reading < 256 MB)")
    ax.set_ylabel("% of the measured HBM read peak")
    ax.set_ylim(0, 112)  # room above 100 % for a one-row legend
    ax.set_yticks(range(0, 101, 20))
    ax.set_title(f"{title}INT2 decode: share of the HBM read peak")
    ax.grid(True, axis="y", alpha=0.3)
    # Many runs: the legend goes right of the axes; otherwise one row above the bars. Either way it hides no bar.
    if len(runs) > 2:
        legend = ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    else:
        legend = ax.legend(fontsize=8, loc="upper center", ncol=len(runs) + 1)
    for handle in getattr(legend, "legend_handles", getattr(legend, "legendHandles", [])):
        handle.set_alpha(1.0)  # the first bars may be faded ones
    return save(fig, out, f"{prefix}_pct_peak.png")


def plot_times(plt, rows, label, torch_times, out, prefix, title):
    """Time vs context per batch (uniform batches): ours, and SDPA where the torch table has the shape."""
    series = defaultdict(list)
    for r in rows:
        if r["ragged"] != "ragged":
            series[int(r["batch"])].append((int(r["context"]), float(r["time_us"])))
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (batch, points) in enumerate(sorted(series.items())):
        points.sort()
        color = colors[i % len(colors)]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=color,
                label=f"INT2 {label}, batch {batch}")
        for backend, style in (("sdpa_cudnn", "--"), ("sdpa_flash", ":")):
            sdpa = sorted((c, t) for (name, b, c), t in torch_times.items() if name == backend and b == batch)
            if sdpa:
                ax.plot([p[0] for p in sdpa], [p[1] for p in sdpa], marker="x", linestyle=style, color=color,
                        label=f"{backend} (BF16), batch {batch}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("time per decode call (us)")
    ax.set_title(f"{title}decode time")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return save(fig, out, f"{prefix}_time.png")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="oscar-bench --format csv files")
    parser.add_argument("--labels", help="comma list, one per run (default: the file names)")
    parser.add_argument("--torch", help="examples/bench_vs_torch.py output (markdown), for the time plot")
    parser.add_argument("--kernel", default="int2_decode", help="kernel rows to plot (int2_decode, bf16_decode)")
    parser.add_argument("--uniform", action="store_true", help="uniform batches only (no ragged rows)")
    parser.add_argument("--min-mbytes", type=float, default=0.0,
                        help="only calls reading at least this many MB (e.g. 256: the target's calls)")
    parser.add_argument("--out", default=".", help="folder for the PNG files")
    parser.add_argument("--prefix", default="bench", help="file name prefix: PREFIX_{pct_peak,time}.png")
    parser.add_argument("--title", default="", help="text put before each plot title, e.g. the GPU")
    args = parser.parse_args()
    labels = args.labels.split(",") if args.labels else [os.path.splitext(os.path.basename(p))[0] for p in args.runs]
    if len(labels) != len(args.runs):
        parser.error(f"--labels has {len(labels)} names for {len(args.runs)} runs")
    runs = [read_bench(path, args.kernel) for path in args.runs]
    for path, rows in zip(args.runs, runs):
        rows[:] = [r for r in rows if (not args.uniform or r["ragged"] != "ragged") and
                   float(r["mbytes"]) >= args.min_mbytes]
        if not rows:
            sys.exit(f"error: {path}: no '{args.kernel}' rows left after --uniform / --min-mbytes")
    # A run with both INT2 metadata layouts (oscar-bench --int2-metadata fp32,fp16) becomes one series per layout.
    split_runs, split_labels = [], []
    for rows, label in zip(runs, labels):
        layouts = sorted({r.get("int2_metadata", "-") for r in rows})
        for layout in layouts:
            split_runs.append([r for r in rows if r.get("int2_metadata", "-") == layout])
            split_labels.append(f"{label} ({layout} metadata)" if len(layouts) > 1 else label)
    runs, labels = split_runs, split_labels
    torch_times = read_torch(args.torch) if args.torch else {}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    title = f"{args.title}: " if args.title else ""
    os.makedirs(args.out, exist_ok=True)
    for path in (plot_share(plt, runs, labels, args.out, args.prefix, title),
                 plot_times(plt, runs[0], labels[0], torch_times, args.out, args.prefix, title)):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
