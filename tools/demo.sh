#!/usr/bin/env bash
# The main job: installs what is missing (meson, ninja), builds the library and examples/train in build/
# (release; CUDA when nvcc is found), then trains a small byte-level language model on the bundled King James
# Bible and prints the falling loss, a text sample and a summary. On a machine with a usable GPU it trains on
# CUDA. Arguments go to the program: bash tools/demo.sh --help, bash tools/demo.sh --steps 1000, ...
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/lib.sh

step "tools"
ensure_build_tools
find_nvcc && echo "nvcc: $(command -v nvcc)" || echo "nvcc: not found (CPU-only build)"

step "build"
if [ -f build/meson-private/coredata.dat ]; then
  # Reuse build/ as configured (tools/test.sh shares it); only make sure the examples are on.
  setup_build build -Dexamples=true
else
  # A first build needs nothing but a compiler: no tests, benchmarks or Python module.
  setup_build build -Dbuildtype=release -Dcuda=auto -Dexamples=true -Dtests=false -Dbench=false -Dpython=disabled
fi
show_summary build
ninja -C build examples/train data/kjv.txt data/austen.txt >"$LOGS"/build.demo.log 2>&1 || {
  grep -v '^\[[0-9]*/[0-9]*\] ' "$LOGS"/build.demo.log | tail -60
  die "build failed (full log: $LOGS/build.demo.log)"
}
echo "built build/examples/train"

step "build/examples/train $*"
exec build/examples/train "$@"
