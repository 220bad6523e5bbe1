#!/usr/bin/env bash
# The test command: installs what is missing, builds everything in build/ (CUDA when nvcc exists), runs every
# meson test, the CPU suites (all but cuda) again under AddressSanitizer + UBSan (build-asan/), a short libFuzzer
# run of each file reader (tests/fuzz/, when clang is installed), pytest on the
# Python module when it was built, and the install check; then prints one line "N passed, M failed[, K skipped]".
# Exits non-zero if anything failed. Safe to run again: build dirs are reused.
#
# Environment knobs (all optional):
#   RETORT_CUDA=auto|enabled|disabled   CUDA backend (default auto: on when nvcc is found)
#   RETORT_ASAN=0                       skip the sanitizer build (and the fuzzing)
#   RETORT_FUZZ_SECONDS=N               seconds per fuzz harness (default 20; 0 skips fuzzing)
#   RETORT_FUZZ_HARNESSES="a b"         which harnesses (default all but checkpoint; RETORT_FUZZ_ALL=1: all)
#   GTEST_SOURCE=DIR                    GoogleTest source tree to build when none is installed
#   JOBS=N                              ninja parallelism (default: ninja's own)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
. tools/lib.sh

START=$(date +%s)
failed_stages=()
ninja_jobs=()
[ -n "${JOBS:-}" ] && ninja_jobs=(-j "$JOBS")

step "tools"
ensure_build_tools
ensure_gtest
ensure_py_modules pybind11:pybind11 numpy:numpy pytest:pytest gguf:gguf tokenizers:tokenizers safetensors:safetensors
if find_nvcc; then
  echo "nvcc: $(command -v nvcc) ($(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))"
else
  echo "nvcc: not found (CPU-only build)"
fi
echo "meson $(meson --version), ninja $(ninja --version), $(python3 --version)"

gtest_opt=()
[ -n "${GTEST_SOURCE:-}" ] && gtest_opt=(-Dgtest_source="$(cd "$GTEST_SOURCE" && pwd)")
# Without a GPU the CUDA code is only compiled, not run: one architecture (sm_90) proves it compiles and halves
# the nvcc time on a small CI machine. With a GPU, the default sm_80 and sm_90. SM_ARCH overrides either.
if [ -z "${SM_ARCH:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then SM_ARCH=80,90; else SM_ARCH=90; fi
fi

# ---- main build ---------------------------------------------------------------------------------------------
step "configure build/"
setup_build build -Dcuda="${RETORT_CUDA:-auto}" -Dsm_arch="$SM_ARCH" -Dpython=auto -Dtests=true -Dexamples=true \
  -Dbench=true "${gtest_opt[@]}"
show_summary build

step "build build/"
ninja -C build "${ninja_jobs[@]}" >"$LOGS"/build.ninja.log 2>&1 || {
  grep -v '^\[[0-9]*/[0-9]*\] ' "$LOGS"/build.ninja.log | tail -60
  die "build failed (full log: $LOGS/build.ninja.log)"
}
echo "built ($(grep -c '^\[' "$LOGS"/build.ninja.log) steps)"

step "meson test -C build"
rm -f build/meson-logs/testlog.json build/meson-logs/testlog.junit.xml
meson test -C build --print-errorlogs || failed_stages+=("meson test (build)")
# Visible skips: the CUDA suite skips on machines without a GPU; say which cases and why.
python3 tools/test_summary.py --skips build/meson-logs/testlog.junit.xml

# ---- sanitizer build ----------------------------------------------------------------------------------------
if [ "${RETORT_ASAN:-1}" != 0 ]; then
  step "configure build-asan/ (AddressSanitizer + UBSan, CPU suites)"
  # -O1 with line tables only (-g1): half the compile time of -O2 -g on the 2-core CI machine (the suites
  # themselves run in seconds), and sanitizer reports still name files and lines.
  setup_build build-asan -Dcuda=disabled -Db_sanitize=address,undefined -Dpython=disabled -Dexamples=false \
    -Dbench=false -Dtests=true -Dbuildtype=plain -Doptimization=1 -Ddebug=false -Db_ndebug=false -Dc_args=-g1 -Dcpp_args=-g1 \
    "${gtest_opt[@]}"
  step "build build-asan/"
  ninja -C build-asan "${ninja_jobs[@]}" >"$LOGS"/build-asan.ninja.log 2>&1 || {
    grep -v '^\[[0-9]*/[0-9]*\] ' "$LOGS"/build-asan.ninja.log | tail -60
    die "sanitizer build failed (full log: $LOGS/build-asan.ninja.log)"
  }
  # Every suite but the CUDA ones (core, ops, losses, nn, ...): new CPU suites are covered without edits here.
  mapfile -t cpu_tests < <(meson introspect build-asan --tests |
    python3 -c 'import json, sys; print("\n".join(t["name"] for t in json.load(sys.stdin) if "cuda" not in t["name"]))')
  step "meson test -C build-asan ${cpu_tests[*]}"
  rm -f build-asan/meson-logs/testlog.json build-asan/meson-logs/testlog.junit.xml
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
    meson test -C build-asan --no-rebuild --print-errorlogs --timeout-multiplier 4 "${cpu_tests[@]}" ||
    failed_stages+=("meson test (build-asan)")
else
  rm -f build-asan/meson-logs/testlog.json build-asan/meson-logs/testlog.junit.xml
  echo "RETORT_ASAN=0: sanitizer build skipped"
fi

# ---- fuzzing ------------------------------------------------------------------------------------------------
# A short libFuzzer run of each file reader's harness (tests/fuzz/), ASan + UBSan, where clang is installed;
# long runs are tools/fuzz.sh's job. The whole-library checkpoint harness costs a few minutes of build: it runs
# when RETORT_FUZZ_HARNESSES names it (or names nothing and RETORT_FUZZ_ALL=1).
fuzz_seconds=${RETORT_FUZZ_SECONDS:-20}
if [ "${RETORT_ASAN:-1}" = 0 ] || [ "$fuzz_seconds" = 0 ]; then
  echo "fuzzing skipped (RETORT_ASAN=0 or RETORT_FUZZ_SECONDS=0)"
elif ! command -v "${CXX_FUZZ:-clang++}" >/dev/null 2>&1; then
  echo "fuzzing skipped: ${CXX_FUZZ:-clang++} not found (libFuzzer needs clang)"
else
  read -r -a fuzz_harnesses <<<"${RETORT_FUZZ_HARNESSES:-}"
  if [ ${#fuzz_harnesses[@]} -eq 0 ]; then
    for f in tests/fuzz/fuzz_*.cpp; do
      n=${f##*/fuzz_}
      n=${n%.cpp}
      [ "$n" = checkpoint ] && [ "${RETORT_FUZZ_ALL:-0}" != 1 ] && continue
      fuzz_harnesses+=("$n")
    done
  fi
  step "fuzz ${fuzz_harnesses[*]} (${fuzz_seconds} s each)"
  CXX=${CXX_FUZZ:-clang++} bash tools/fuzz.sh "$fuzz_seconds" "${fuzz_harnesses[@]}" || failed_stages+=("fuzz")
fi

# ---- Python bindings ----------------------------------------------------------------------------------------
step "pytest"
rm -f build/pytest.xml
module=$(find build/bindings -maxdepth 1 -name 'retort*.so' 2>/dev/null | head -1)
pytest_dirs=()
for d in bindings/tests tests/python; do [ -d "$d" ] && pytest_dirs+=("$d"); done
if [ -z "$module" ]; then
  echo "skipped: the Python module was not built (no build/bindings/retort*.so)"
elif [ "${#pytest_dirs[@]}" -eq 0 ]; then
  echo "skipped: no pytest folder (bindings/tests or tests/python)"
else
  PYTHONPATH="$ROOT/build/bindings${PYTHONPATH:+:$PYTHONPATH}" python3 -m pytest -q \
    --junitxml=build/pytest.xml "${pytest_dirs[@]}"
  rc=$?
  if [ "$rc" -eq 5 ]; then
    echo "pytest: no tests collected"
  elif [ "$rc" -ne 0 ]; then
    failed_stages+=("pytest")
  fi
fi

# ---- install check ------------------------------------------------------------------------------------------
step "install check"
install_result=build/install-check.result
if bash tests/install/check.sh build; then
  echo pass >"$install_result"
else
  echo fail >"$install_result"
  failed_stages+=("install check")
fi

# ---- summary ------------------------------------------------------------------------------------------------
step "summary ($(($(date +%s) - START)) s)"
[ "${#failed_stages[@]}" -eq 0 ] || echo "failed stages: ${failed_stages[*]}"
# The last line printed is the count, alone: "N passed, M failed[, K skipped]".
python3 tools/test_summary.py --meson build --meson build-asan --pytest build/pytest.xml \
  --result "install check=$install_result"
summary_rc=$?
[ "${#failed_stages[@]}" -eq 0 ] || exit 1
exit "$summary_rc"
