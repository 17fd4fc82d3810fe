#!/usr/bin/env bash
# On the GPU machine: configure + build, run the gpu tests, run compute-sanitizer memcheck and
# racecheck on them, run oscar-bench and the PyTorch SDPA comparison; logs and results go to OUTDIR.
# Usage: tests/gpu_check.sh [OUTDIR] [oscar-bench args...]   (default OUTDIR gpu-check)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-check}
shift || true
mkdir -p "$out"
build=${BUILD_DIR:-build-gpu}
log="$out/check.log"
echo "== $(date -u) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)" | tee "$log"
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
status=0
echo "== gpu tests" | tee -a "$log"
"$build/tests/oscar_gpu_tests" 2>&1 | tee "$out/gpu_tests.log" | grep -E "^\[  (PASSED|FAILED) |FAILED|Failure|error" | tee -a "$log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
sanitize_filter='*QuantizePackExact*:QuantizePack.RotationWithinFloatTolerance:QuantizePack.RotationWithZeroAndFallbackRowsBitIdentical:QuantizePack.RotationWorkspaceOfCallerOrStreamSameBits:PagedDecode.EmptyTiers:PagedDecode.SplitBoundariesAndRaggedBatch:PagedDecode.ContextLengthsAroundPageBoundaries:PagedDecode.SmallestSplitsAndRepeatedCalls:PagedDecode.ChunksOfHalfSteps:PagedDecode.GqaRatiosAndHeadDims:PagedDecode.LoQueryTermsInTheFreeMmaColumns:PagedDecode.Fp16MetadataLayoutGivesTheFp32LayoutsBits:PagedDecode.ShortSplitsArePlannedForTheParallelMerge:PagedDecode.SplitTableOfLongSplits:PagedDecode.Int2PiecesInAnyOrder:PagedDecode.MergeCtasOverSplitsAsPieces:PagedDecode.LongBf16SplitsInWorkLists:PagedDecode.Bf16OnlyCachesInBalancedTiles:ShippedData.QuantizePackMatchesCpuOnRealRows'
for tool in memcheck racecheck; do
  echo "== compute-sanitizer $tool" | tee -a "$log"
  timeout ${SANITIZER_TIMEOUT:-300} compute-sanitizer --tool "$tool" --error-exitcode 3 "$build/tests/oscar_gpu_tests" --gtest_filter="$sanitize_filter" \
    >"$out/sanitizer_$tool.log" 2>&1
  rc=$?
  tail -3 "$out/sanitizer_$tool.log" | tee -a "$log"
  [ $rc -eq 0 ] || { status=1; echo "$tool exit $rc" | tee -a "$log"; }
done
echo "== oscar-bench $*" | tee -a "$log"
"$build/bin/oscar-bench" "$@" -o "$out/bench.md" 2>"$out/bench.log" || status=1
cat "$out/bench.md" | tee -a "$log"
if [ -z "${SKIP_TORCH:-}" ]; then
  echo "== PyTorch SDPA" | tee -a "$log"
  PYTHONUNBUFFERED=1 python3 examples/bench_vs_torch.py >"$out/torch.md" 2>"$out/torch.log" || status=1
  cat "$out/torch.md" | tee -a "$log"
fi
echo "== status $status" | tee -a "$log"
exit $status
