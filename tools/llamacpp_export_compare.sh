#!/usr/bin/env bash
# A retort student in llama.cpp: exports it to GGUF as F32, F16, BF16 and Q8_0 (build/examples/export), and for
# each compares llama.cpp's next-token distributions over a held-out text with retort's on the student's own
# f32 checkpoint (max |Δ log-prob|, top-1 agreement, same top-5 order; tools/llamacpp_compare.sh with
# REF_MODEL), then has llama.cpp continue a prompt greedily and checks retort's greedy continuation
# (examples/generate --temperature 0) is the same text.
#
#   bash tools/llamacpp_export_compare.sh [STUDENT.safetensors] [TEXT_FILE] [MAX_TOKENS]
#
# Defaults: the demo's distilled student (build/demo/student-distilled.safetensors), the held-out end of the
# Jane Austen text, 256 tokens (at most the student's context). llama.cpp is built as tools/llamacpp_compare.sh
# builds it (LLAMA_SRC=DIR for a source tree you have; about 20 minutes on 2 cores, reused). A tool you run.
set -euo pipefail
cd "$(dirname "$0")/.."
CKPT=${1:-build/demo/student-distilled.safetensors}
TEXT=${2:-}
MAX_TOKENS=${3:-256}
PROMPT=${PROMPT:-It was a truth universally acknowledged}
GEN=${GEN:-32}
WORK=build-llamacpp
[ -f "$CKPT" ] || { echo "error: no student at $CKPT (run tools/demo.sh, or name a checkpoint)" >&2; exit 1; }
[ -x build/examples/export ] || { echo "error: build/examples/export is not built" >&2; exit 1; }
mkdir -p "$WORK/export"
retort_text=$(build/examples/generate --model "$CKPT" --prompt "$PROMPT" --len "$GEN" --temperature 0 \
  --device cpu 2>/dev/null | head -c 100000)
echo "student: $CKPT"
for d in f32 f16 bf16 q8_0; do
  g=$WORK/export/student-$d.gguf
  build/examples/export --checkpoint "$CKPT" --dtype "$d" --out "$g" >/dev/null
  echo "== $d ($(du -k "$g" | cut -f1) kB)"
  REF_MODEL=$CKPT bash tools/llamacpp_compare.sh "$g" "$TEXT" "$MAX_TOKENS" 2>"$WORK/export/compare-$d.log" | grep -E '^(llama.cpp|tokenization|next-token)'
  out=$("$WORK/complete" "$g" "$PROMPT" "$GEN" 2>/dev/null)
  llama_text=$(sed -n '/^text: /,$p' <<<"$out" | sed '1s/^text: //')
  echo "llama.cpp greedy: $(tr '\n' ' ' <<<"$llama_text")"
  if [ "$llama_text" = "$retort_text" ]; then
    echo "retort greedy (f32 checkpoint): the same text"
  else
    echo "retort greedy (f32 checkpoint): $(tr '\n' ' ' <<<"$retort_text")"
  fi
done
