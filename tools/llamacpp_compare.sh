#!/usr/bin/env bash
# Compares retort with llama.cpp itself on a GGUF model: llama.cpp's tokenization of a text against retort's,
# and the next-token distributions at every position (max |Δ log-prob|, top-1 and top-5 agreement).
#
#   bash tools/llamacpp_compare.sh [MODEL.gguf] [TEXT_FILE] [MAX_TOKENS]
#
# Defaults: SmolLM2-135M (tools/fetch_model.py), the held-out end of the bundled Jane Austen text, 512 tokens.
# llama.cpp comes from the llama-cpp-python source package on PyPI (its vendor/llama.cpp), built for the CPU
# with CMake into build-llamacpp/ (about 20 minutes on 2 cores, a few on 16; reused when run again); set
# LLAMA_SRC=DIR to use a llama.cpp source tree you have. retort is used through its Python module
# (build/bindings). A tool you run, not a test: CI does not build llama.cpp. REF_MODEL=PATH compares llama.cpp on
# MODEL.gguf with retort running another file (an exported student's own checkpoint: see
# tools/llamacpp_export_compare.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MODEL=${1:-$(python3 tools/fetch_model.py smollm2-135m)}
TEXT=${2:-}
MAX_TOKENS=${3:-512}
WORK=build-llamacpp
mkdir -p "$WORK"

if [ -z "${LLAMA_SRC:-}" ]; then
  LLAMA_SRC=$WORK/src/vendor/llama.cpp
  if [ ! -f "$LLAMA_SRC/include/llama.h" ]; then
    echo "fetching llama-cpp-python's source package (llama.cpp is vendored in it) ..."
    rm -rf "$WORK/sdist" "$WORK/src"
    python3 -m pip download -q --no-binary :all: --no-deps -d "$WORK/sdist" llama-cpp-python
    mkdir -p "$WORK/src"
    tar xzf "$WORK"/sdist/llama_cpp_python-*.tar.gz -C "$WORK/src" --strip-components=1
  fi
fi
[ -f "$LLAMA_SRC/include/llama.h" ] || { echo "error: no llama.cpp at $LLAMA_SRC" >&2; exit 1; }
echo "llama.cpp: $LLAMA_SRC ($(cd "$LLAMA_SRC" && git describe --tags 2>/dev/null || sed -n 's/.*"version": *"\([^"]*\)".*/\1/p' ../../pyproject.toml 2>/dev/null || echo unknown))"

if [ ! -f "$WORK/build/src/libllama.a" ]; then
  cmake -S "$LLAMA_SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_CUDA=OFF \
    -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF >"$WORK/cmake.log"
  cmake --build "$WORK/build" --target llama -j "$(nproc)" >"$WORK/build.log"
fi
for tool in dump_logits complete; do
  if [ ! -x "$WORK/$tool" ] || [ "tools/llamacpp/$tool.cpp" -nt "$WORK/$tool" ]; then
    libs=$(find "$WORK/build" -name 'libllama.a' -o -name 'libggml*.a' | sort -r | tr '\n' ' ')
    # shellcheck disable=SC2086  # the archives are meant to split
    c++ -std=c++17 -O2 -I"$LLAMA_SRC/include" -I"$LLAMA_SRC/ggml/include" "tools/llamacpp/$tool.cpp" \
      -Wl,--start-group $libs -Wl,--end-group -fopenmp -lpthread -ldl -o "$WORK/$tool"
  fi
done

if [ -z "$TEXT" ]; then
  TEXT=$WORK/heldout.txt
  python3 - "$TEXT" <<'EOF'
import gzip, os, sys
for p in ("build/data/austen.txt", "data/austen.txt"):
    if os.path.exists(p):
        t = open(p, encoding="utf-8").read()
        break
else:
    t = gzip.open("data/austen.txt.gz", "rt", encoding="utf-8").read()
open(sys.argv[1], "w", encoding="utf-8").write(t[-20000:])
EOF
fi
"$WORK/dump_logits" "$MODEL" "$TEXT" "$MAX_TOKENS" "$WORK/llamacpp"

PYTHONPATH="${RETORT_PYTHONPATH:-$ROOT/build/bindings}${PYTHONPATH:+:$PYTHONPATH}" python3 - "${REF_MODEL:-$MODEL}" "$TEXT" "$WORK/llamacpp" "$MODEL" <<'EOF'
import sys
import retort

model_path, text_path, prefix, gguf_path = sys.argv[1:5]
# Loaded before NumPy is imported: on one machine (a manylinux-built Python with NumPy 2.5.2, system GCC 13)
# load_model crashed when NumPy came first (bench/RESULTS.md, "Real teachers", Open).
m = retort.load_model(model_path)
# A checkpoint that names its tokenizer instead of embedding it: the GGUF's is the same vocabulary.
tok = m.tokenizer if m.tokenizer is not None else retort.load_model(gguf_path).tokenizer
import numpy as np  # noqa: E402

ids = np.fromfile(prefix + ".ids", dtype=np.int32)
V = m.config.vocab
ref = np.fromfile(prefix + ".logits", dtype=np.float32).reshape(len(ids), V).astype(np.float64)
mine = tok.encode(open(text_path, "rb").read())[: len(ids)]
same = int(np.sum(np.asarray(mine) == ids)) if len(mine) == len(ids) else -1
print(f"tokenization: retort {'equals' if same == len(ids) else 'DIFFERS from'} llama.cpp on {len(ids)} tokens")
got = m.logits(ids[None].astype(np.int64))[0].astype(np.float64)
def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))
a, b = log_softmax(got), log_softmax(ref)
top5 = np.mean([list(np.argsort(-a[i])[:5]) == list(np.argsort(-b[i])[:5]) for i in range(len(ids))])
print(f"{m.source}")
print(f"next-token log-probs over {len(ids)} positions: max |d| {np.abs(a - b).max():.4f}, "
      f"mean |d| at the top-1 {np.mean(np.abs(a - b)[np.arange(len(ids)), b.argmax(-1)]):.5f}, "
      f"top-1 agreement {np.mean(a.argmax(-1) == b.argmax(-1)):.4f}, same top-5 order {top5:.4f}")
EOF
