#!/usr/bin/env bash
# Installs the Debian packages the build needs (if missing), builds, and runs every test except
# those labelled gpu. Usage: tests/run_tests.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
./.ci/install-deps.sh
build=${1:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)"
ctest --test-dir "$build" -LE gpu --output-on-failure -j"$(nproc)"
