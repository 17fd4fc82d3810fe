#!/usr/bin/env bash
# The oscar-eval sweeps of docs/results.md as CSV files: component ablation, window ablation
# (0/0, 32/128, 64/256, 128/512), group-size and clip-ratio sweeps, context sweep and per-layer rows.
# Uses the shipped dumps data/smollm2-{calib,eval}.h5 when present, else synthetic ones.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: examples/ablation_sweep.sh [options]

options:
  --build DIR      build folder with bin/oscar-* (default: build; built if the tools are missing)
  --out DIR        where the CSV files go (default: <build>/sweeps)
  --calib DUMP     calibration dump (default: data/smollm2-calib.h5, else synthetic)
  --eval DUMP      evaluation dump, disjoint from --calib (default: data/smollm2-eval.h5, else synthetic)
  --pack PACK      use this pack instead of calibrating one from --calib
  --context N      context of the ablations (default: 8192)
  --contexts LIST  contexts of the context sweep (default: 1024:8192:1024)
  --queries N      decode positions per sequence and context (default 16 for the shipped data, else 4)
  --synthetic      use synthetic dumps even when the shipped ones exist
  --skip-existing  do not rerun a sweep whose CSV is already in --out (resume an interrupted run)
  -h, --help       this text

outputs (one oscar-eval CSV each): components.csv, windows.csv, group_size.csv, k_clip.csv, v_clip.csv,
context.csv (skipped for evaluation dumps that keep queries only at the end, like the shipped one),
per_layer.csv; the exact commands are echoed to stderr.
USAGE
}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD=build OUT="" CALIB="" EVAL="" PACK="" CONTEXT="" CONTEXTS="" QUERIES="" SYNTHETIC=0 SKIP_EXISTING=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$2; shift ;;
    --out) OUT=$2; shift ;;
    --calib) CALIB=$2; shift ;;
    --eval) EVAL=$2; shift ;;
    --pack) PACK=$2; shift ;;
    --context) CONTEXT=$2; shift ;;
    --contexts) CONTEXTS=$2; shift ;;
    --queries) QUERIES=$2; shift ;;
    --synthetic) SYNTHETIC=1 ;;
    --skip-existing) SKIP_EXISTING=1 ;;
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
want() {  # want NAME: false when --skip-existing and OUT/NAME.csv exists
  [ $SKIP_EXISTING = 0 ] || [ ! -s "$OUT/$1.csv" ]
}
FAILED=()
try_run() {  # like run, but a failing oscar-eval is reported and the sweep goes on
  echo "+ $*" >&2
  "$@" || FAILED+=("$*")
}
# One oscar-eval per method, rows appended to one CSV (a method that fails leaves the others' rows).
run_per_method() {  # run_per_method OUT.csv METHODS ARGS...
  local out=$1 methods=$2 first=1 tmp
  shift 2
  tmp=$(mktemp)
  : > "$out"
  for m in ${methods//,/ }; do
    echo "+ $BIN/oscar-eval ${EVAL_ARGS[*]} --methods $m $*" >&2
    if "$BIN/oscar-eval" "${EVAL_ARGS[@]}" --methods "$m" "$@" -o "$tmp"; then
      if [ $first = 1 ]; then cat "$tmp" >> "$out"; first=0; else tail -n +2 "$tmp" >> "$out"; fi
    else
      FAILED+=("oscar-eval --methods $m $* (for $out)")
    fi
  done
  rm -f "$tmp"
}

if [ -z "$EVAL" ] && [ $SYNTHETIC = 0 ] && [ -f data/smollm2-eval.h5 ] && [ -f data/smollm2-calib.h5 ]; then
  # The shipped dumps (data/README.md): one 8192 + 256-token evaluation sequence with queries only at
  # the 256 decode positions, so --context 8192 with up to 16 queries at stride 16.
  EVAL=data/smollm2-eval.h5
  CALIB=${CALIB:-data/smollm2-calib.h5}
  CONTEXT=${CONTEXT:-8192}
  QUERIES=${QUERIES:-16}
elif [ -z "$EVAL" ]; then
  # Synthetic model: 6 layers, 12 query heads, 3 KV heads, d = 128; calibration and evaluation from
  # different seeds (disjoint activations); evaluation sequences of 8192 + 256 decode positions.
  CALIB=$OUT/synth_calib.h5
  EVAL=$OUT/synth_eval.h5
  [ -f "$CALIB" ] || run "$BIN/oscar-capture" synth -q --layers 6 --q-heads 12 --kv-heads 3 --head-dim 128 \
    --tokens 8192 --sequences 2 --seed 1 -o "$CALIB"
  [ -f "$EVAL" ] || run "$BIN/oscar-capture" synth -q --layers 6 --q-heads 12 --kv-heads 3 --head-dim 128 \
    --tokens 8448 --sequences 2 --seed 2 -o "$EVAL"
fi
CONTEXT=${CONTEXT:-8192}
CONTEXTS=${CONTEXTS:-1024:8192:1024}
QUERIES=${QUERIES:-4}

if [ -z "$PACK" ]; then
  [ -n "$CALIB" ] || { echo "error: --eval given without --calib or --pack" >&2; exit 2; }
  PACK=$OUT/pack.h5
  run "$BIN/oscar-covariance" -q -o "$OUT/stats.h5" "$CALIB"
  run "$BIN/oscar-calibrate" -q -o "$PACK" "$OUT/stats.h5"
fi

INFO=$("$BIN/oscar-capture" info --json --no-summary "$EVAL")
HEAD_DIM=$(echo "$INFO" | python3 -c 'import json,sys; print(json.load(sys.stdin)["head_dim"])')
QUERIES_KEPT_LAST=$(echo "$INFO" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("queries_kept_last", 0))')
EVAL_ARGS=(--dump "$EVAL" --pack "$PACK" --queries "$QUERIES" --format csv -q)

# 1. Components: baselines, OSCAR, every composition from the pack's eigenbasis, clipping, windows.
want components && try_run "$BIN/oscar-eval" "${EVAL_ARGS[@]}" --context "$CONTEXT" -o "$OUT/components.csv" --methods \
  bf16,naive,hadamard,oscar,oscar-ablation:u_h,oscar-ablation:u_p,oscar-ablation:u,oscar-ablation:h_p,oscar-ablation:h,oscar-ablation:u_p_h,oscar-ablation:none,oscar-ablation:clip-fixed,oscar-ablation:no-clip,oscar-ablation:no-windows
# 2. Windows (sink/recent), every method on equal footing.
want windows && try_run "$BIN/oscar-eval" "${EVAL_ARGS[@]}" --context "$CONTEXT" -o "$OUT/windows.csv" --methods naive,hadamard,oscar \
  --windows 0/0,32/128,64/256,128/512
# 3. Group size G in {d, d/2, d/4, 32} (0 = d).
GROUP_SIZES="0,$((HEAD_DIM / 2)),$((HEAD_DIM / 4))"
[ "$HEAD_DIM" -gt 128 ] && GROUP_SIZES="$GROUP_SIZES,32"
# (per method: naive fails on the synthetic sink token with G < d, see docs/tools/oscar-eval.md)
want group_size && run_per_method "$OUT/group_size.csv" naive,hadamard,oscar --context "$CONTEXT" --group-size "$GROUP_SIZES"
# 4. Clip ratios, one side at a time (the other keeps the pack's ratio).
want k_clip && try_run "$BIN/oscar-eval" "${EVAL_ARGS[@]}" --context "$CONTEXT" -o "$OUT/k_clip.csv" --methods oscar \
  --k-clip 0.84,0.88,0.92,0.94,0.96,0.98,1.0
want v_clip && try_run "$BIN/oscar-eval" "${EVAL_ARGS[@]}" --context "$CONTEXT" -o "$OUT/v_clip.csv" --methods oscar \
  --v-clip 0.84,0.88,0.90,0.92,0.94,0.96,1.0
# 5. Error against context length, and per layer at the ablation context.
if [ "$QUERIES_KEPT_LAST" = 0 ]; then
  want context && try_run "$BIN/oscar-eval" "${EVAL_ARGS[@]}" --context "$CONTEXTS" -o "$OUT/context.csv" --methods bf16,naive,hadamard,oscar
else
  echo "skipping the context sweep: $EVAL keeps queries only for the last $QUERIES_KEPT_LAST tokens" >&2
fi
want per_layer && try_run "$BIN/oscar-eval" "${EVAL_ARGS[@]}" --context "$CONTEXT" -o "$OUT/per_layer.csv" --methods naive,hadamard,oscar \
  --per-layer
echo "wrote the CSV files in $OUT" >&2
if [ ${#FAILED[@]} -gt 0 ]; then
  printf 'failed: %s\n' "${FAILED[@]}" >&2
  exit 1
fi
