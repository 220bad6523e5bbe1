#!/usr/bin/env bash
# Builds and runs the CPU matmul benchmark against OpenBLAS: installs Debian's libopenblas-dev when it is
# missing (needs root), reconfigures the build so meson finds it, builds bench_matmul_cpu and runs it.
# Arguments go to the benchmark (try --help); BUILD names the build folder (default: build).
# BOOST=1 (root only) raises this session's scheduling priority for the run and restores it after: on a
# machine shared with other jobs, both libraries then get the cores instead of a share of them.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}

if ! pkg-config --exists openblas; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "libopenblas-dev is missing and this is not root: install it, then run this again" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y libopenblas-dev || { apt-get update && apt-get install -y libopenblas-dev; }
fi

if [ -d "$BUILD" ]; then
  meson setup --reconfigure "$BUILD"
else
  meson setup "$BUILD" -Dcuda=disabled
fi
ninja -C "$BUILD" bench/bench_matmul_cpu

# Some machines set OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE in the environment; a fair comparison lets OpenBLAS
# pick its own kernel for this CPU (the benchmark prints the core type it chose).
cmd=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$BUILD/bench/bench_matmul_cpu" "$@")
if [ "${BOOST:-0}" = 1 ] && [ "$(id -u)" -eq 0 ]; then
  # With autogroup scheduling, nice only ranks processes within a session; the session's own nice ranks it
  # against the other sessions.
  if [ -w /proc/self/autogroup ]; then
    old=$(sed -n 's/.*nice \(-\?[0-9]*\).*/\1/p' /proc/self/autogroup)
    trap 'echo "${old:-0}" > /proc/self/autogroup' EXIT
    echo -20 > /proc/self/autogroup
  fi
  nice -n -20 "${cmd[@]}"
else
  "${cmd[@]}"
fi
