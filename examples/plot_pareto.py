#!/usr/bin/env python3
"""Pareto plot of the equal-bits comparison (examples/baselines_sweep.sh): attention-output error
(rel_err, and KL) against effective bits per element, one point per method and setting, the
Pareto front drawn through the non-dominated points. Also prints the markdown table of docs/results.md.

usage: examples/plot_pareto.py equal_bits.csv -o docs/pareto.png [--title TEXT] [--budget 2.5]
"""
import argparse
import csv
import sys


def label(row):
    name = row["method"]
    bits = int(row.get("bits", "2") or 2)
    if name.startswith("turboquant") and not name.endswith("k3v3") and bits != 2:
        name += f" ({bits}-bit)"
    if name.startswith("oscar") and not name.startswith("oscars"):
        name += f" {row['sink']}/{row['recent']}"  # OSCAR's sink/recent windows
    elif "kivi" in name and row.get("recent") not in (None, "128"):
        name += f" R={row['recent']}"  # KIVI's residual window when not the default
    elif name in ("turboquant", "hadamard", "naive") and row.get("recent") not in (None, "0"):
        name += f" +{row['sink']}/{row['recent']} BF16"  # sink/recent windows added
    return name


def pareto(points):
    """Indices of the points not dominated in (bpe lower, error lower)."""
    front = []
    for i, (b, e) in enumerate(points):
        if not any((b2 <= b and e2 <= e) and (b2 < b or e2 < e) for j, (b2, e2) in enumerate(points) if j != i):
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("-o", "--output", required=True, help="PNG file")
    parser.add_argument("--title", default="Equal-bits comparison")
    parser.add_argument("--budget", type=float, default=2.5, help="BPE budget for the 'best at <= budget' line")
    args = parser.parse_args()

    with open(args.csv) as f:
        rows = [r for r in csv.DictReader(f) if r["method"] != "bf16"]
    for r in rows:
        for k in ("bpe", "rel_err", "rel_err_p99", "cos", "kl"):
            r[k] = float(r[k])
        r["label"] = label(r)

    # Markdown table, sorted by BPE.
    print("| method | BPE | rel_err | rel_err p99 | cos | KL (nats) |")
    print("|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["bpe"], r["rel_err"])):
        print(f"| {r['label']} | {r['bpe']:.3f} | {r['rel_err']:.4f} | {r['rel_err_p99']:.4f} | {r['cos']:.5f} | "
              f"{r['kl']:.2e} |")
    within = sorted((r for r in rows if r["bpe"] <= args.budget + 1e-9), key=lambda r: r["rel_err"])
    if len(within) >= 2:
        best, second = within[0], within[1]
        print(f"\nbest at <= {args.budget} BPE: {best['label']} (rel_err {best['rel_err']:.4f} at {best['bpe']:.3f} BPE); "
              f"next: {second['label']} (rel_err {second['rel_err']:.4f} at {second['bpe']:.3f} BPE), "
              f"{second['rel_err'] / best['rel_err']:.2f}x the error", file=sys.stderr)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(16, 6.5))
    for ax, key, name in ((axes[0], "rel_err", "relative attention-output error (mean)"),
                          (axes[1], "kl", "KL(p_ref || p_quant), nats (mean)")):
        pts = [(r["bpe"], r[key]) for r in rows]
        for r in rows:
            color = "tab:red" if r["method"] == "oscar" else "tab:blue"
            ax.scatter(r["bpe"], r[key], color=color, s=28, zorder=3)
            ax.annotate(r["label"], (r["bpe"], r[key]), fontsize=6.5, xytext=(4, 3), textcoords="offset points")
        front = pareto(pts)
        ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], color="gray", lw=1, ls="--",
                label="Pareto front", zorder=2)
        ax.axvline(args.budget, color="gray", lw=0.8, ls=":")
        ax.set_yscale("log")
        ax.set_xlabel("effective bits per element, BPE (codes + metadata + BF16 windows)")
        ax.set_ylabel(name)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="upper right", fontsize=8)
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.output, dpi=130)
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
