#!/usr/bin/env bash
# Fuzzing: `tools/fuzz.sh [SECONDS] [HARNESS...]` builds each libFuzzer harness tests/fuzz/fuzz_<name>.cpp with
# clang (-fsanitize=fuzzer,address,undefined) into build-fuzz/, seeds build-fuzz/corpus/<name>/ with the small
# valid files tests/fuzz/seeds_<name>.cpp writes, and runs each harness for SECONDS (default 60; every harness
# when none is named). A finding (crash, sanitizer report, leak, timeout, out-of-memory) is saved under
# build-fuzz/findings/<name>/ and makes the script exit non-zero; replay it with build-fuzz/fuzz_<name> FILE.
# The corpus is kept between runs, so each run starts where the last one stopped.
#
# A harness is one file, tests/fuzz/fuzz_<name>.cpp, defining LLVMFuzzerTestOneInput, with one or more lines
#   // SOURCES: src/io/x.cpp src/core/y.cpp src/nn/*.cpp
# naming the library files it links (globs allowed; only those: the whole library under ASan takes minutes to
# build on a small machine). Each file is compiled once into build-fuzz/obj/ (through ccache when installed),
# so harnesses that share files share the work.
# Optional: tests/fuzz/seeds_<name>.cpp, a program writing seed files into the directory given as its argument
# (it may have SOURCES lines too, and then uses the library's own writers), and tests/fuzz/<name>.dict, a
# libFuzzer dictionary.
# A harness may instead be tests/fuzz/fuzz_<name>.py, an atheris script (pip install atheris) run on the Python
# module of PYTHON_MODULE_DIR (default build/bindings, built by `ninja -C build`); it takes the same corpus,
# findings and log places, and libFuzzer's flags.
# Environment: CXX (default clang++), FUZZ_FLAGS (more libFuzzer flags, e.g. "-max_len=8192"), JOBS (parallel
# compiles, default the number of cores).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. tools/lib.sh

seconds=60
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then
  seconds=$1
  shift
fi
harnesses=("$@")
if [ ${#harnesses[@]} -eq 0 ]; then
  for f in tests/fuzz/fuzz_*.cpp tests/fuzz/fuzz_*.py; do
    n=${f##*/fuzz_}
    n=${n%.cpp}
    harnesses+=("${n%.py}")
  done
fi
CXX=${CXX:-clang++}
command -v "$CXX" >/dev/null 2>&1 || die "$CXX not found: libFuzzer needs clang (apt-get install clang)"
CCACHE=$(command -v ccache || true)
JOBS=${JOBS:-$(nproc)}
OUT=build-fuzz
mkdir -p "$OUT/obj"
failed=()
SAN=(-fsanitize=address,undefined -fno-sanitize-recover=all)

# The files a "// SOURCES:" line of $1 names, globs expanded, one per line.
sources_of() {
  local f
  for f in $(sed -n 's|^// *SOURCES: *||p' "$1"); do
    [ -e "$f" ] || die "$1: SOURCES names $f, which does not exist"
    echo "$f"
  done
}

# Compiles each file given into $OUT/obj/ (instrumented for coverage and the sanitizers), JOBS at a time, and
# prints the objects, in order.
compile_objects() {
  local f obj pids=() objs=()
  for f in "$@"; do
    obj=$OUT/obj/$(echo "$f" | tr / _).o
    objs+=("$obj")
    $CCACHE "$CXX" -std=c++20 -g -O1 -Wall -Wextra -Isrc -fsanitize=fuzzer-no-link "${SAN[@]}" -c "$f" -o "$obj" \
      >&2 &
    pids+=($!)
    if [ ${#pids[@]} -ge "$JOBS" ]; then
      wait "${pids[0]}" || return 1
      pids=("${pids[@]:1}")
    fi
  done
  for p in "${pids[@]}"; do wait "$p" || return 1; done
  printf '%s\n' "${objs[@]}"
}

# Runs the atheris harness tests/fuzz/fuzz_$1.py for $seconds on the Python module; a finding is recorded
# like a libFuzzer harness's.
run_python() {
  local h=$1 src=tests/fuzz/fuzz_$1.py moddir=${PYTHON_MODULE_DIR:-build/bindings}
  local corpus=$OUT/corpus/$h findings=$OUT/findings/$h
  python3 -c 'import atheris' 2>/dev/null || die "$src needs atheris (pip install atheris)"
  ls "$moddir"/retort*.so >/dev/null 2>&1 || die "$src needs the Python module in $moddir (ninja -C build)"
  mkdir -p "$corpus" "$findings"
  step "run $src for ${seconds}s on $moddir (log: $OUT/fuzz_$h.log)"
  # shellcheck disable=SC2086 # FUZZ_FLAGS is a list of flags
  PYTHONPATH="$moddir${PYTHONPATH:+:$PYTHONPATH}" python3 "$src" "$corpus" -max_total_time="$seconds" \
    -print_final_stats=1 -artifact_prefix="$findings/" ${FUZZ_FLAGS:-} >"$OUT/fuzz_$h.log" 2>&1
  local rc=$?
  grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' \
    "$OUT/fuzz_$h.log"
  if [ $rc -ne 0 ]; then
    tail -40 "$OUT/fuzz_$h.log"
    echo "fuzz_$h: FINDING (exit $rc); artifacts in $findings/: $(ls "$findings" | xargs)"
    failed+=("$h")
  else
    echo "fuzz_$h: no finding in ${seconds}s"
  fi
}

for h in "${harnesses[@]}"; do
  if [ -f "tests/fuzz/fuzz_$h.py" ]; then
    run_python "$h"
    continue
  fi
  src=tests/fuzz/fuzz_$h.cpp
  [ -f "$src" ] || die "no harness $src (harnesses: $(ls tests/fuzz/fuzz_*.cpp tests/fuzz/fuzz_*.py | sed 's|.*/fuzz_||; s|\.cpp||; s|\.py||' | xargs))"
  mapfile -t lib_src < <(sources_of "$src")
  [ ${#lib_src[@]} -gt 0 ] || die "$src has no '// SOURCES:' line naming the library files it links"

  step "build $OUT/fuzz_$h ($CXX, fuzzer + address + undefined; ${#lib_src[@]} library files)"
  mapfile -t objs < <(compile_objects "$src" "${lib_src[@]}") || die "building fuzz_$h failed"
  [ ${#objs[@]} -eq $((${#lib_src[@]} + 1)) ] || die "building fuzz_$h failed"
  "$CXX" -fsanitize=fuzzer "${SAN[@]}" -pthread "${objs[@]}" -o "$OUT/fuzz_$h" || die "linking fuzz_$h failed"

  corpus=$OUT/corpus/$h
  findings=$OUT/findings/$h
  mkdir -p "$corpus" "$findings"
  seeds=tests/fuzz/seeds_$h.cpp
  if [ -f "$seeds" ]; then
    mapfile -t seed_src < <(sources_of "$seeds")
    mapfile -t seed_objs < <(compile_objects "$seeds" "${seed_src[@]}") || die "building seeds_$h failed"
    [ ${#seed_objs[@]} -eq $((${#seed_src[@]} + 1)) ] || die "building seeds_$h failed"
    "$CXX" "${SAN[@]}" -pthread "${seed_objs[@]}" -o "$OUT/seeds_$h" || die "linking seeds_$h failed"
    ASAN_OPTIONS=detect_leaks=0 "$OUT/seeds_$h" "$corpus" || die "seeds_$h failed"
  fi
  dict=()
  [ -f "tests/fuzz/$h.dict" ] && dict=(-dict="tests/fuzz/$h.dict")
  echo "corpus: $corpus ($(ls "$corpus" | wc -l) files)"

  step "run fuzz_$h for ${seconds}s (log: $OUT/fuzz_$h.log)"
  # shellcheck disable=SC2086 # FUZZ_FLAGS is a list of flags
  "$OUT/fuzz_$h" "$corpus" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$findings/" \
    "${dict[@]}" ${FUZZ_FLAGS:-} >"$OUT/fuzz_$h.log" 2>&1
  rc=$?
  grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' \
    "$OUT/fuzz_$h.log"
  if [ $rc -ne 0 ]; then
    tail -40 "$OUT/fuzz_$h.log"
    echo "fuzz_$h: FINDING (exit $rc); artifacts in $findings/: $(ls "$findings" | xargs)"
    failed+=("$h")
  else
    echo "fuzz_$h: no finding in ${seconds}s"
  fi
done

[ ${#failed[@]} -eq 0 ] || die "findings in: ${failed[*]}"
