#!/usr/bin/env bash
# On the GPU machine: configure + build, run the gpu tests, run compute-sanitizer memcheck and
# racecheck on them, run oscar-bench and the PyTorch SDPA comparison, then the same checks and the quantise-pack
# timings for the quantise-pack's mma.sync path (a second build); logs and results go to OUTDIR.
# Usage: tests/gpu_check.sh [OUTDIR] [oscar-bench args...]   (default OUTDIR gpu-check)
# Switches (environment): PREBUILT=DIR, SKIP_TORCH=1, MAIN=0, PORTABLE=0 (below).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-check}
shift || true
mkdir -p "$out"
build=${BUILD_DIR:-build-gpu}
log="$out/check.log"
echo "== $(date -u) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)" | tee "$log"
status=0
# The tests run under compute-sanitizer (the mma.sync part takes the QuantizePack ones).
sanitize_filter='*QuantizePackExact*:QuantizePack.RotationWithinFloatTolerance:QuantizePack.RotationWithZeroAndFallbackRowsBitIdentical:QuantizePack.RotationWorkspaceOfCallerOrStreamSameBits:QuantizePack.UnalignedRowsTakeTheWarpKernelSameBits:PagedDecode.EmptyTiers:PagedDecode.SplitBoundariesAndRaggedBatch:PagedDecode.ContextLengthsAroundPageBoundaries:PagedDecode.SmallestSplitsAndRepeatedCalls:PagedDecode.ChunksOfHalfSteps:PagedDecode.GqaRatiosAndHeadDims:PagedDecode.LoQueryTermsInTheFreeMmaColumns:PagedDecode.Fp16MetadataLayoutGivesTheFp32LayoutsBits:PagedDecode.ShortSplitsArePlannedForTheParallelMerge:PagedDecode.SplitTableOfLongSplits:PagedDecode.Int2PiecesInAnyOrder:PagedDecode.MergeCtasOverSplitsAsPieces:PagedDecode.LongBf16SplitsInWorkLists:PagedDecode.Bf16OnlyCachesInBalancedTiles:ShippedData.QuantizePackMatchesCpuOnRealRows'
# Runs the test binary $1 under compute-sanitizer memcheck and racecheck on the gtest filter $2, logs in
# sanitizer_<tool>$3.log, headings suffixed by $4; a failure sets status.
sanitize() {
  local tool rc
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer $tool$4" | tee -a "$log"
    timeout ${SANITIZER_TIMEOUT:-300} compute-sanitizer --tool "$tool" --error-exitcode 3 "$1" --gtest_filter="$2" \
      >"$out/sanitizer_$tool$3.log" 2>&1
    rc=$?
    tail -3 "$out/sanitizer_$tool$3.log" | tee -a "$log"
    [ $rc -eq 0 ] || { status=1; echo "$tool exit $rc" | tee -a "$log"; }
  done
}
# MAIN=0 skips the main build (its build, tests, sanitizers and benchmarks) and runs only the mma.sync part below:
# with PORTABLE=0 in another call, the check in two device commands of at most 600 s each (the whole took 564 s in
# the log's fifty-sixth round).
if [ "${MAIN:-1}" != 0 ]; then
  # PREBUILT=DIR: use DIR/oscar_gpu_tests and DIR/oscar-bench built elsewhere (same image) instead of building.
  if [ -n "${PREBUILT:-}" ]; then
    mkdir -p "$build/tests" "$build/bin"
    cp "$PREBUILT/oscar_gpu_tests" "$build/tests/" && cp "$PREBUILT/oscar-bench" "$build/bin/"
  elif ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 &&
         cmake --build "$build" -j"$(nproc)" --target oscar_gpu_tests oscar-bench; } >"$out/build.log" 2>&1; then
    tail -40 "$out/build.log" | tee -a "$log"
    echo "BUILD FAILED" | tee -a "$log"
    exit 1
  fi
  echo "== gpu tests" | tee -a "$log"
  "$build/tests/oscar_gpu_tests" 2>&1 | tee "$out/gpu_tests.log" |
    grep -E "^\[  (PASSED|FAILED) |FAILED|Failure|error" | tee -a "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  sanitize "$build/tests/oscar_gpu_tests" "$sanitize_filter" "" ""
  echo "== oscar-bench $*" | tee -a "$log"
  "$build/bin/oscar-bench" "$@" -o "$out/bench.md" 2>"$out/bench.log" || status=1
  cat "$out/bench.md" | tee -a "$log"
  if [ -z "${SKIP_TORCH:-}" ]; then
    echo "== PyTorch SDPA" | tee -a "$log"
    PYTHONUNBUFFERED=1 python3 examples/bench_vs_torch.py >"$out/torch.md" 2>"$out/torch.log" || status=1
    cat "$out/torch.md" | tee -a "$log"
  fi
fi
# The quantise-pack's mma.sync path, which builds for any architecture but sm_90a run (those take wgmma at d >= 128):
# its tests under both sanitizers and its quantise-pack timings, from a build with -DOSCAR_QUANTIZE_WGMMA=OFF
# (PREBUILT: DIR/portable/ holds that build's oscar_gpu_tests and oscar-bench). PORTABLE=0 skips this part.
if [ "${PORTABLE:-1}" != 0 ]; then
  pbuild=${PORTABLE_BUILD_DIR:-$build-portable}
  echo "== quantise-pack, mma.sync path ($pbuild)" | tee -a "$log"
  if [ -n "${PREBUILT:-}" ]; then
    mkdir -p "$pbuild/tests" "$pbuild/bin"
    cp "$PREBUILT/portable/oscar_gpu_tests" "$pbuild/tests/" && cp "$PREBUILT/portable/oscar-bench" "$pbuild/bin/"
  elif ! { cmake -S . -B "$pbuild" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
             -DOSCAR_QUANTIZE_WGMMA=OFF &&
           cmake --build "$pbuild" -j"$(nproc)" --target oscar_gpu_tests oscar-bench; } \
       >"$out/build_portable.log" 2>&1; then
    tail -40 "$out/build_portable.log" | tee -a "$log"
    echo "PORTABLE BUILD FAILED" | tee -a "$log"
    echo "== status 1" | tee -a "$log"
    exit 1
  fi
  "$pbuild/tests/oscar_gpu_tests" --gtest_filter='*QuantizePack*' 2>&1 | tee "$out/gpu_tests_portable.log" |
    grep -E "^\[  (PASSED|FAILED) |FAILED|Failure|error" | tee -a "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  quantize_filter=$(tr ':' '\n' <<<"$sanitize_filter" | grep QuantizePack | paste -sd:)
  sanitize "$pbuild/tests/oscar_gpu_tests" "$quantize_filter" _portable " (mma.sync path)"
  for d in 64 128 256; do
    echo "== oscar-bench --kernels quant --head-dim $d (mma.sync path)" | tee -a "$log"
    "$pbuild/bin/oscar-bench" --kernels quant --head-dim $d --iterations 20 --settle-ms 200 \
      -o "$out/bench_portable_d$d.md" 2>>"$out/bench_portable.log" || status=1
    cat "$out/bench_portable_d$d.md" | tee -a "$log"
  done
fi
echo "== status $status" | tee -a "$log"
exit $status
