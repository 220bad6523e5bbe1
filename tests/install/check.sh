#!/usr/bin/env bash
# Install check: installs a build into a temporary root, then builds tests/install/main.cpp against it the way an
# outside project would (only `pkg-config --cflags --libs retort`, from a folder outside the source tree) and runs
# it. Catches headers missing from the install rules and include paths that only resolve inside the repo.
# Usage: tests/install/check.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/../.."
src=$PWD/tests/install/main.cpp
build=$(cd "${1:-build}" && pwd)
CXX=${CXX:-c++}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

meson install -C "$build" --destdir "$tmp/root" --quiet >"$tmp/install.log" 2>&1 || {
  cat "$tmp/install.log" >&2
  echo "install check: meson install failed" >&2
  exit 1
}
pc=$(find "$tmp/root" -name retort.pc | head -1)
[ -n "$pc" ] || {
  echo "install check: no retort.pc was installed" >&2
  exit 1
}
# The .pc file names the configured prefix; point it at the temporary root instead.
prefix=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --variable=prefix retort)
export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$(dirname "$pc")
pc_args=(--define-variable=prefix="$tmp/root$prefix")
cflags=$(pkg-config "${pc_args[@]}" --cflags retort)
libs=$(pkg-config "${pc_args[@]}" --libs retort)
libdir=$(pkg-config "${pc_args[@]}" --variable=libdir retort)
echo "pkg-config --cflags --libs retort: $cflags $libs"

cd "$tmp"
# shellcheck disable=SC2086  # the flags are meant to split
"$CXX" -std=c++20 -Wall -Wextra -o app "$src" $cflags $libs -Wl,-rpath,"$libdir" || {
  echo "install check: the program does not compile against the installed tree" >&2
  exit 1
}
out=$(./app)
expected="11 22 33 44 55 66 "
if [ "$out" != "$expected" ]; then
  echo "install check: the program printed '$out', expected '$expected'" >&2
  exit 1
fi
echo "install check passed: built and ran a program against the installed retort ($out)"
