# Shared by the sweep scripts in examples/ (sourced, not run): builds the CPU tools into $1 when they
# are missing, and `run` echoes a command to stderr before running it.

ensure_tools() {  # ensure_tools BUILD_DIR
  if [ ! -x "$1/bin/oscar-eval" ]; then
    cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOSCAR_ENABLE_CUDA=OFF >/dev/null
    cmake --build "$1" -j"$(nproc)" --target oscar-capture oscar-covariance oscar-calibrate oscar-eval
  fi
}

run() {  # echo the command, then run it
  echo "+ $*" >&2
  "$@"
}
