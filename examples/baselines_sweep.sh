#!/usr/bin/env bash
# The equal-bits comparison of docs/results.md: every competing method and setting (baselines.md) next to
# OSCAR at one context (default 8192), on one evaluation dump and a pack calibrated on a disjoint dump;
# one CSV with every oscar-eval column (method, bits, bpe, rel_err, cos, kl, ...). Plot: plot_pareto.py.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: examples/baselines_sweep.sh [options]

options:
  --build DIR      build folder with bin/oscar-* (default: build-base; built if the tools are missing)
  --out DIR        where the CSV goes (default: <build>/sweeps)
  --calib DUMP     calibration dump (default: data/smollm2-calib.h5, else a synthetic one)
  --eval DUMP      evaluation dump, disjoint from --calib (default: data/smollm2-eval.h5, else synthetic)
  --pack PACK      use this pack instead of calibrating one from --calib
  --context N      context (default: 8192)
  --queries N      decode positions per sequence (default 16)
  --query-stride N tokens between decode positions (default 16; evaluation dumps keep queries for the
                   last 256 tokens: --queries 256 --query-stride 1 uses every one)
  --layers SPEC    layers to evaluate (default: all)
  -h, --help       this text

output: <out>/equal_bits.csv (all rows of the runs below, one header) and <out>/per_layer.csv (the
methods at <= 2.5 BPE, one row per layer); the commands are echoed to stderr.
USAGE
}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD=build-base OUT="" CALIB="" EVAL="" PACK="" CONTEXT=8192 QUERIES=16 STRIDE=16 LAYERS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$2; shift ;;
    --out) OUT=$2; shift ;;
    --calib) CALIB=$2; shift ;;
    --eval) EVAL=$2; shift ;;
    --pack) PACK=$2; shift ;;
    --context) CONTEXT=$2; shift ;;
    --queries) QUERIES=$2; shift ;;
    --query-stride) STRIDE=$2; shift ;;
    --layers) LAYERS=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
OUT=${OUT:-$BUILD/sweeps}
BIN=$BUILD/bin
mkdir -p "$OUT"

# shellcheck source=examples/sweep_common.sh
source "$ROOT/examples/sweep_common.sh"
ensure_tools "$BUILD"

if [ -z "$EVAL" ] && [ -f data/smollm2-eval.h5 ] && [ -f data/smollm2-calib.h5 ]; then
  EVAL=data/smollm2-eval.h5
  CALIB=${CALIB:-data/smollm2-calib.h5}
elif [ -z "$EVAL" ]; then
  # Synthetic model (d = 128, 4 KV heads), calibration and evaluation from different seeds.
  CALIB=$OUT/synth_calib.h5
  EVAL=$OUT/synth_eval.h5
  [ -f "$CALIB" ] || run "$BIN/oscar-capture" synth -q --layers 4 --q-heads 16 --kv-heads 4 --head-dim 128 \
    --tokens "$CONTEXT" --sequences 2 --seed 1 -o "$CALIB"
  [ -f "$EVAL" ] || run "$BIN/oscar-capture" synth -q --layers 4 --q-heads 16 --kv-heads 4 --head-dim 128 \
    --tokens "$((CONTEXT + 64))" --sequences 2 --seed 2 -o "$EVAL"
fi

if [ -z "$PACK" ]; then
  [ -n "$CALIB" ] || { echo "error: --eval given without --calib or --pack" >&2; exit 2; }
  PACK=$OUT/pack.h5
  run "$BIN/oscar-covariance" -q -o "$OUT/stats.h5" "$CALIB"
  run "$BIN/oscar-calibrate" -q -o "$PACK" "$OUT/stats.h5"
fi

ARGS=(--dump "$EVAL" --pack "$PACK" --context "$CONTEXT" --queries "$QUERIES" --query-stride "$STRIDE" --format csv -q)
[ -n "$LAYERS" ] && ARGS+=(--layers "$LAYERS")

# 2-bit codes: OSCAR, the per-token baselines, KIVI at G = 32 and 128, QuaRot at KIVI granularity,
# OScaR, TurboQuant (MSE, with the QJL bit); then the 3-bit and 4-bit reference points.
run "$BIN/oscar-eval" "${ARGS[@]}" -o "$OUT/b2.csv" --methods \
  bf16,naive,hadamard,oscar,kivi,kivi:128,hadamard:kivi,hadamard:kivi:128,oscars,turboquant,turboquant:qjl
run "$BIN/oscar-eval" "${ARGS[@]}" -o "$OUT/b3.csv" --bits 3 --methods turboquant,turboquant:qjl
run "$BIN/oscar-eval" "${ARGS[@]}" -o "$OUT/k3v3.csv" --methods turboquant:k3v3,int4-hadamard
# OSCAR's BF16 windows cost bits at short contexts: the same method with smaller windows for equal BPE.
run "$BIN/oscar-eval" "${ARGS[@]}" -o "$OUT/oscar_windows.csv" --methods oscar --windows 0/0,16/32,32/128

# Window controls: KIVI without its residual window; TurboQuant and Hadamard with OSCAR-style BF16
# sink/recent windows (0/128 is KIVI's value window).
run "$BIN/oscar-eval" "${ARGS[@]}" -o "$OUT/kivi_r0.csv" --methods kivi:128,hadamard:kivi:128 --recent 0
run "$BIN/oscar-eval" "${ARGS[@]}" -o "$OUT/windows.csv" --methods turboquant,hadamard --windows 0/128,32/128,64/256

# Per layer, for the methods at <= 2.5 BPE at d = 64 (is the winner the winner on every layer?).
# (Each at its own defaults: --windows would also set KIVI's residual R; oscar 0/0 is oscar-ablation:no-windows.)
run "$BIN/oscar-eval" "${ARGS[@]}" -o "$OUT/per_layer.csv" --per-layer --methods \
  naive,hadamard,kivi:128,hadamard:kivi:128,turboquant,turboquant:qjl,oscar-ablation:no-windows

{ head -n 1 "$OUT/b2.csv"; for f in b2 b3 k3v3 oscar_windows kivi_r0 windows; do tail -n +2 "$OUT/$f.csv"; done; } > "$OUT/equal_bits.csv"
echo "wrote $OUT/equal_bits.csv (dump $EVAL, pack $PACK, context $CONTEXT)" >&2
