#!/usr/bin/env bash
# The calibration-path benchmark of docs/performance.md: synthesises Qwen3-8B-geometry dumps
# (uncompressed and compressed) and runs `oscar-covariance bench` on each, writing the tables as
# markdown and JSON into OUT_DIR.
#   examples/calibration_bench.sh OUT_DIR [LAYERS=36] [TOKENS=8192] [BUILD_DIR=build-cpu]
# The two dumps take 3.6 + 3.0 GB at the defaults; they are deleted at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
source examples/sweep_common.sh
out=${1:?usage: examples/calibration_bench.sh OUT_DIR [LAYERS] [TOKENS] [BUILD_DIR]}
layers=${2:-36} tokens=${3:-8192} build=${4:-build-cpu}
ensure_tools "$build"
mkdir -p "$out"
bin=$build/bin
geometry=(--layers "$layers" --q-heads 32 --kv-heads 8 --head-dim 128 --tokens "$tokens" --dtype float16)
for kind in uncompressed compressed; do
  dump=$out/qwen3_8b_synth_$kind.h5
  flags=()
  [ "$kind" = uncompressed ] && flags=(--no-compress)
  run "$bin/oscar-capture" synth -q "${flags[@]}" "${geometry[@]}" -o "$dump"
  run "$bin/oscar-covariance" bench -q "$dump" --format json > "$out/bench_$kind.json"
  echo "## $kind dump ($(du -h "$dump" | cut -f1)), $(nproc) cores" | tee -a "$out/bench.md"
  python3 - "$out/bench_$kind.json" <<'PY' | tee -a "$out/bench.md"
import json, sys
rows = json.load(open(sys.argv[1]))
rows = rows["rows"] if isinstance(rows, dict) else rows
print("| measure | value | unit |\n|---|---|---|")
for r in rows:
    print(f"| {r['measure']} | {r['value']:.2f} | {r['unit']} |")
PY
  rm -f "$dump"
done
