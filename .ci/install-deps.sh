#!/usr/bin/env bash
# Installs the design card's Debian packages when any is missing (needs root or sudo).
set -euo pipefail
packages=(cmake ninja-build g++ libhdf5-dev zlib1g-dev hdf5-tools libeigen3-dev libcli11-dev libfmt-dev libopenblas-dev
          nlohmann-json3-dev libgtest-dev python3)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  echo "installing: ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
