#!/usr/bin/env bash
# Install check: `meson install`s a build into a temporary root, then uses it as a user would, from a folder
# outside the source tree and with no LD_LIBRARY_PATH, ldconfig or extra flags:
#  - builds tests/install/main.cpp with only `pkg-config --cflags --libs retort` and runs it (headers missing
#    from the install rules, include paths that only resolve in the repo, or a library the program cannot find
#    at run time fail here);
#  - runs each installed program (bin/retort-<name> --help);
#  - builds examples/embed/main.cpp the same way and streams a completion from a tiny model that the installed
#    train writes, as a checkpoint and, through the installed export, as GGUF;
#  - imports the installed Python module (when built) from the folder the install names, and checks that it
#    loaded the installed libretort, not the build's.
# Usage: tests/install/check.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/../.."
src=$PWD/tests/install/main.cpp
embed_src=$PWD/examples/embed/main.cpp
build=$(cd "${1:-build}" && pwd)
CXX=${CXX:-c++}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "install check: $*" >&2
  exit 1
}

meson install -C "$build" --destdir "$tmp/root" --quiet >"$tmp/install.log" 2>&1 || {
  cat "$tmp/install.log" >&2
  fail "meson install failed"
}
prefix=$(meson introspect "$build" --buildoptions |
  python3 -c 'import json, sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"))')
root=$tmp/root$prefix
pc=$(find "$root" -name retort.pc | head -1)
[ -n "$pc" ] || fail "no retort.pc was installed"
# The .pc file names the configured prefix; point it at the temporary root instead.
export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$(dirname "$pc")
pc_args=(--define-variable=prefix="$root")
cflags=$(pkg-config "${pc_args[@]}" --cflags retort)
libs=$(pkg-config "${pc_args[@]}" --libs retort)
echo "pkg-config --cflags --libs retort: $cflags $libs"

cd "$tmp"
# shellcheck disable=SC2086  # the flags are meant to split
"$CXX" -std=c++20 -Wall -Wextra -o app "$src" $cflags $libs || fail "the program does not compile against the installed tree"
out=$(env -u LD_LIBRARY_PATH ./app) || fail "the program built against the installed tree does not run"
expected="11 22 33 44 55 66 "
[ "$out" = "$expected" ] || fail "the program printed '$out', expected '$expected'"
echo "pkg-config program: built and ran against the installed retort ($out)"

if meson introspect "$build" --targets | grep -q '"name": "train"'; then
  for p in train teacher-cache distill eval generate export; do
    [ -x "$root/bin/retort-$p" ] || fail "bin/retort-$p was not installed"
    env -u LD_LIBRARY_PATH "$root/bin/retort-$p" --help >"$tmp/help.txt" 2>&1 || {
      cat "$tmp/help.txt" >&2
      fail "bin/retort-$p --help failed"
    }
    grep -q "Usage: $p" "$tmp/help.txt" || fail "bin/retort-$p --help printed no usage"
  done
  echo "programs: bin/retort-{train,teacher-cache,distill,eval,generate,export} --help run"

  # The embedding example, built as its README says, on a model the installed programs make.
  # shellcheck disable=SC2086
  "$CXX" -std=c++20 -Wall -Wextra -o embed "$embed_src" $cflags $libs ||
    fail "examples/embed does not compile against the installed tree"
  for _ in $(seq 60); do echo "And God said, Let there be light: and there was light."; done >"$tmp/t.txt"
  env -u LD_LIBRARY_PATH "$root/bin/retort-train" --data "$tmp/t.txt" --tokenizer bpe --vocab 280 --layers 1 \
    --d-model 32 --heads 2 --context 32 --batch 4 --steps 3 --eval-windows 1 --sample-len 0 --threads 1 \
    --device cpu --save "$tmp/s.safetensors" >"$tmp/train.log" 2>&1 || {
    cat "$tmp/train.log" >&2
    fail "bin/retort-train failed"
  }
  env -u LD_LIBRARY_PATH "$root/bin/retort-export" --checkpoint "$tmp/s.safetensors" --out "$tmp/s.gguf" \
    >"$tmp/export.log" 2>&1 || {
    cat "$tmp/export.log" >&2
    fail "bin/retort-export failed"
  }
  for model in s.safetensors s.gguf; do
    out=$(env -u LD_LIBRARY_PATH ./embed "$tmp/$model" "And God" 12 0) || fail "embed on $model failed"
    [ "${out#And God}" != "$out" ] && [ ${#out} -gt 8 ] || fail "embed on $model printed '$out'"
    echo "examples/embed on $model: $out"
  done
fi

module=$(find "$root" -name 'retort*.so' -path '*-packages/*' | head -1)
if [ -n "$module" ]; then
  pydir=$(dirname "$module")
  env -u LD_LIBRARY_PATH PYTHONPATH="$pydir" python3 - "$root" <<'PY' || fail "the installed Python module does not work"
import sys
import numpy as np
import retort

root = sys.argv[1]
assert retort.__file__.startswith(root), f"imported {retort.__file__}, not the installed module under {root}"
with open("/proc/self/maps") as f:
    libs = {line.split()[-1] for line in f if "libretort" in line}
assert libs and all(p.startswith(root) for p in libs), f"loaded {sorted(libs)}, not the installed libretort"
r = retort.losses.cross_entropy(np.zeros((2, 4), np.float32), np.array([1, 2]))
assert np.allclose(r, np.log(4)), r  # the mean loss when no gradient is asked for
print(f"python module: import retort from {retort.__file__[len(root):]} under the prefix, libretort from it too")
PY
fi
echo "install check passed"
