# shellcheck shell=bash
# Shared helpers for tools/test.sh and tools/demo.sh: install what is missing, find CUDA, configure a build dir.
# Sourced, not run. Everything it installs goes through the ordinary clients: pip for Python tools, apt-get
# for Debian packages (GoogleTest, pkg-config), and only when the thing is really missing.

# Prints a step header, so a long log can be skimmed.
step() { printf '\n==> %s\n' "$*"; }
die() {
  printf 'error: %s\n' "$*" >&2
  exit 1
}

# Root runs apt-get directly; anyone else needs sudo.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    die "need root (or sudo) to run: $*"
  fi
}

_apt_updated=0
apt_install() {
  command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install these by hand: $*"
  if [ "$_apt_updated" -eq 0 ]; then
    echo "apt-get update"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null || die "apt-get update failed"
    _apt_updated=1
  fi
  echo "apt-get install -y $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null ||
    die "apt-get install $* failed"
}

# Logs of the scripts' own steps (setup, ninja); /build*/ is ignored by git.
LOGS=${LOGS:-build-logs}
mkdir -p "$LOGS"

# pip puts user installs here when site-packages is not writable.
export PATH="$HOME/.local/bin:$PATH"

ensure_python() {
  command -v python3 >/dev/null 2>&1 || apt_install python3 python3-pip python3-venv
  python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
}

# pip install, quiet but showing errors. Debian's system Python refuses plain installs (PEP 668): then retry
# with --break-system-packages, which is what a throwaway build machine wants.
pip_install() {
  echo "pip install $*"
  local log
  log=$(mktemp)
  if python3 -m pip install -q --disable-pip-version-check "$@" >"$log" 2>&1; then
    rm -f "$log"
    return 0
  fi
  if grep -q -i 'externally-managed\|break-system-packages' "$log"; then
    if python3 -m pip install -q --disable-pip-version-check --break-system-packages "$@" >"$log" 2>&1; then
      rm -f "$log"
      return 0
    fi
  fi
  cat "$log" >&2
  rm -f "$log"
  die "pip install $* failed"
}

# Installs each Python module that does not import (module:pip-name pairs).
ensure_py_modules() {
  local missing=() pair
  for pair in "$@"; do
    python3 -c "import ${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair##*:}")
  done
  [ "${#missing[@]}" -eq 0 ] || pip_install "${missing[@]}"
}

# meson >= 1.3 (fs.relative_to) and ninja; pip when missing or too old.
ensure_build_tools() {
  ensure_python
  local want=()
  if ! command -v meson >/dev/null 2>&1 ||
    ! python3 - "$(meson --version 2>/dev/null || echo 0)" <<'EOF' >/dev/null 2>&1; then
import sys
v = tuple(int(x) for x in sys.argv[1].split(".")[:2] if x.isdigit())
sys.exit(0 if v >= (1, 3) else 1)
EOF
    want+=("meson>=1.3")
  fi
  command -v ninja >/dev/null 2>&1 || want+=(ninja)
  [ "${#want[@]}" -eq 0 ] || pip_install "${want[@]}"
  hash -r
  command -v meson >/dev/null 2>&1 || die "meson is still not on PATH after pip install (PATH=$PATH)"
  command -v ninja >/dev/null 2>&1 || die "ninja is still not on PATH after pip install (PATH=$PATH)"
  command -v pkg-config >/dev/null 2>&1 || apt_install pkg-config
}

# ccache: meson uses it when found, so the pip install check compiles nothing build/ already compiled.
ensure_ccache() {
  command -v ccache >/dev/null 2>&1 && return 0
  if command -v apt-get >/dev/null 2>&1; then
    apt_install ccache
  else
    echo "ccache not found and no apt-get: the pip install check compiles the library again"
  fi
}

# GoogleTest: an installed one (pkg-config gtest), Debian's source tree, or GTEST_SOURCE=DIR from the caller.
ensure_gtest() {
  [ -n "${GTEST_SOURCE:-}" ] && return 0
  pkg-config --exists gtest 2>/dev/null && return 0
  [ -f /usr/src/googletest/googletest/src/gtest-all.cc ] && return 0
  apt_install libgtest-dev
}

# CUDA is on when nvcc can be found; the toolkit's usual home is not always on PATH.
find_nvcc() {
  if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
  command -v nvcc >/dev/null 2>&1
}

# setup_build DIR [meson options...]: configures DIR, or reconfigures it with the same options when it exists,
# so running a script twice reuses the build. A build dir meson cannot reconfigure is wiped and set up again.
setup_build() {
  local dir=$1
  shift
  mkdir -p "$LOGS"
  local log="$LOGS/$dir.setup.log"
  if [ -f "$dir/meson-private/coredata.dat" ]; then
    if meson setup --reconfigure "$dir" "$@" >"$log" 2>&1; then
      return 0
    fi
    echo "meson could not reconfigure $dir; wiping it and configuring afresh"
    meson setup --wipe "$dir" "$@" >"$log" 2>&1 || {
      cat "$log" >&2
      die "meson setup $dir failed"
    }
    return 0
  fi
  meson setup "$dir" "$@" >"$log" 2>&1 || {
    cat "$log" >&2
    die "meson setup $dir failed"
  }
}

# Prints the configuration summary meson wrote (the retort section), to show what got enabled.
show_summary() {
  sed -n '/^  retort$/,/^$/p' "$LOGS/$1.setup.log" | sed 's/^  //'
}
