#!/usr/bin/env bash
# Fuzzing: `tools/fuzz.sh [SECONDS] [HARNESS...]` builds each libFuzzer harness tests/fuzz/fuzz_<name>.cpp with
# clang (-fsanitize=fuzzer,address,undefined) into build-fuzz/, seeds build-fuzz/corpus/<name>/ with the small
# valid files tests/fuzz/seeds_<name>.cpp writes, and runs each harness for SECONDS (default 60; every harness
# when none is named). A finding (crash, sanitizer report, leak, timeout, out-of-memory) is saved under
# build-fuzz/findings/<name>/ and makes the script exit non-zero; replay it with build-fuzz/fuzz_<name> FILE.
# The corpus is kept between runs, so each run starts where the last one stopped.
#
# A harness is one file, tests/fuzz/fuzz_<name>.cpp, defining LLVMFuzzerTestOneInput, with a line
#   // SOURCES: src/io/x.cpp src/core/y.cpp
# naming the library files it links (only those: the whole library under ASan would take long to build).
# Optional: tests/fuzz/seeds_<name>.cpp, a program writing seed files into the directory given as its argument,
# and tests/fuzz/<name>.dict, a libFuzzer dictionary.
# Environment: CXX (default clang++), FUZZ_FLAGS (more libFuzzer flags, e.g. "-max_len=8192").
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
  for f in tests/fuzz/fuzz_*.cpp; do
    n=${f##*/fuzz_}
    harnesses+=("${n%.cpp}")
  done
fi
CXX=${CXX:-clang++}
command -v "$CXX" >/dev/null 2>&1 || die "$CXX not found: libFuzzer needs clang (apt-get install clang)"
OUT=build-fuzz
mkdir -p "$OUT"
failed=()

for h in "${harnesses[@]}"; do
  src=tests/fuzz/fuzz_$h.cpp
  [ -f "$src" ] || die "no harness $src (harnesses: $(ls tests/fuzz/fuzz_*.cpp | sed 's|.*/fuzz_||; s|\.cpp||' | xargs))"
  read -r -a lib_src <<<"$(sed -n 's|^// SOURCES: *||p' "$src")"
  [ ${#lib_src[@]} -gt 0 ] || die "$src has no '// SOURCES:' line naming the library files it links"

  step "build $OUT/fuzz_$h ($CXX, fuzzer + address + undefined)"
  "$CXX" -std=c++20 -g -O1 -Wall -Wextra -Isrc -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    "$src" "${lib_src[@]}" -o "$OUT/fuzz_$h" || die "building fuzz_$h failed"

  corpus=$OUT/corpus/$h
  findings=$OUT/findings/$h
  mkdir -p "$corpus" "$findings"
  if [ -f "tests/fuzz/seeds_$h.cpp" ]; then
    "$CXX" -std=c++20 -O1 -Wall -Wextra "tests/fuzz/seeds_$h.cpp" -o "$OUT/seeds_$h" || die "building seeds_$h failed"
    "$OUT/seeds_$h" "$corpus" || die "seeds_$h failed"
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
