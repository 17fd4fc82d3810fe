#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, and runs the whole OSCAR pipeline
# (inspect -> covariance -> calibrate -> eval) on the shipped real-model dumps in data/, printing the
# comparison of naive / Hadamard / OSCAR INT2 against BF16. Without data/ dumps it uses a synthetic one.
# Usage: examples/demo.sh [build-dir]   (outputs in <build-dir>/demo/)
set -euo pipefail
cd "$(dirname "$0")/.."
./.ci/install-deps.sh
build=${1:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target oscar-capture oscar-covariance oscar-calibrate oscar-eval
bin="$build/bin"
out="$build/demo"
mkdir -p "$out"

if [[ -f data/smollm2-calib.h5 && -f data/smollm2-eval.h5 ]]; then
  calib=data/smollm2-calib.h5
  eval=data/smollm2-eval.h5
  contexts=8192  # the shipped evaluation dump keeps queries for the 256 positions after 8192 tokens
  echo "== real SmolLM2-135M activations shipped in data/ (see data/README.md)"
else
  echo "== data/ has no dumps: using synthetic activations (oscar-capture synth)"
  calib="$out/synth_calib.h5"
  eval="$out/synth_eval.h5"
  "$bin/oscar-capture" synth -q --layers 4 --q-heads 8 --kv-heads 2 --head-dim 64 --tokens 4096 --seed 1 -o "$calib"
  "$bin/oscar-capture" synth -q --layers 4 --q-heads 8 --kv-heads 2 --head-dim 64 --tokens 4200 --seed 2 -o "$eval"
  contexts=1024,2048,4096
fi

echo "== oscar-capture info $eval"
"$bin/oscar-capture" info "$eval"
echo
echo "== oscar-covariance -o $out/stats.h5 $calib"
"$bin/oscar-covariance" -o "$out/stats.h5" "$calib"
echo "== oscar-calibrate -o $out/pack.h5 $out/stats.h5"
"$bin/oscar-calibrate" -o "$out/pack.h5" "$out/stats.h5"
echo
echo "== oscar-eval --dump $eval --pack $out/pack.h5 --methods bf16,naive,hadamard,oscar --context $contexts"
"$bin/oscar-eval" --dump "$eval" --pack "$out/pack.h5" --methods bf16,naive,hadamard,oscar --context "$contexts" --queries 16 \
  -o "$out/comparison.md"
cat "$out/comparison.md"
