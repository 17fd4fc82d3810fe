#!/usr/bin/env bash
# The real-activation comparison of docs/results.md: calibrates packs in every variant (composition,
# scope, value target, key/value targets, fixed vs fitted clipping) on a calibration dump and evaluates
# them with the base methods at several contexts on a disjoint evaluation dump. Writes CSV files.
# The full-size SmolLM2 dumps come from examples/make_real_data.sh --all-layers (not shipped: 1.2 GB).
set -euo pipefail
usage() {
  cat <<'USAGE'
usage: examples/real_comparison.sh [--build DIR] [--out DIR] [--calib DUMP] [--eval DUMP]
                                   [--layers SPEC] [--contexts LIST] [--queries N]
defaults: --build build, --out <build>/real, --calib .scratch/real-data/out/smollm2-calib-all.h5,
          --eval .scratch/real-data/out/smollm2-eval-all.h5, --layers 0,5,10,15,20,25,29,
          --contexts 2048,4096,8192, --queries 8
outputs: methods.csv (every base method x context), per_layer.csv, packs.csv (pack variants at the
         largest context), windows.csv
USAGE
}
cd "$(dirname "$0")/.."
BUILD=build OUT="" CALIB=.scratch/real-data/out/smollm2-calib-all.h5 EVAL=.scratch/real-data/out/smollm2-eval-all.h5
LAYERS=0,5,10,15,20,25,29 CONTEXTS=2048,4096,8192 QUERIES=8
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$2; shift ;; --out) OUT=$2; shift ;; --calib) CALIB=$2; shift ;; --eval) EVAL=$2; shift ;;
    --layers) LAYERS=$2; shift ;; --contexts) CONTEXTS=$2; shift ;; --queries) QUERIES=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
OUT=${OUT:-$BUILD/real}
BIN=$BUILD/bin
mkdir -p "$OUT"
# shellcheck source=examples/sweep_common.sh
source examples/sweep_common.sh
ensure_tools "$BUILD"
LAST=${CONTEXTS##*,}

run "$BIN/oscar-covariance" -q -o "$OUT/stats.h5" --layers "$LAYERS" "$CALIB"
declare -A PACK_ARGS=(
  [default]=""
  [fit]="--clip fit --dump $CALIB"
  [head-scope]="--scope head"
  [scores]="--value-target scores"
  [gram-targets]="--key-target gram --value-target gram"
)
for name in "${!PACK_ARGS[@]}"; do
  # shellcheck disable=SC2086
  run "$BIN/oscar-calibrate" -q -o "$OUT/pack-$name.h5" "$OUT/stats.h5" ${PACK_ARGS[$name]}
done

EV=("$BIN/oscar-eval" -q --dump "$EVAL" --layers "$LAYERS" --queries "$QUERIES" --format csv)
ABLATIONS=oscar-ablation:none,oscar-ablation:h,oscar-ablation:u,oscar-ablation:u_h,oscar-ablation:h_p,oscar-ablation:u_p,oscar-ablation:u_p_h
run "${EV[@]}" --pack "$OUT/pack-default.h5" --methods bf16,naive,hadamard,oscar,$ABLATIONS --context "$CONTEXTS" \
  -o "$OUT/methods.csv"
run "${EV[@]}" --pack "$OUT/pack-default.h5" --methods naive,hadamard,oscar --context "$LAST" --per-layer \
  -o "$OUT/per_layer.csv"
run "${EV[@]}" --pack "$OUT/pack-default.h5" --methods oscar --context "$LAST" --windows 0/0,32/128,64/256,128/512 \
  -o "$OUT/windows.csv"
: > "$OUT/packs.csv"
for name in default fit head-scope scores gram-targets; do
  run "${EV[@]}" --pack "$OUT/pack-$name.h5" --methods oscar --context "$LAST" -o "$OUT/pack-$name.csv"
  if [ ! -s "$OUT/packs.csv" ]; then head -1 "$OUT/pack-$name.csv" | sed 's/^/pack,/' > "$OUT/packs.csv"; fi
  tail -n +2 "$OUT/pack-$name.csv" | sed "s/^/$name,/" >> "$OUT/packs.csv"
done
echo "wrote $OUT/{methods,per_layer,windows,packs}.csv" >&2
