#!/usr/bin/env bash
# Smoke test of the example programs with tiny settings: every --help, then train (bytes and BPE) with a
# checkpoint and a resume, teacher-cache, distill offline and online, eval and generate, and a few refusals
# (missing checkpoint, K larger than the cache). Usage: smoke.sh <build/examples dir> <text file>
set -euo pipefail
X=$1
TEXT=$2
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
for p in train teacher-cache distill eval generate export; do
  grep -q "Usage: $p" <<<"$("$X/$p" --help)" || fail "$p --help"
done
head -c 40000 "$TEXT" >"$W/t.txt"
M="--layers 1 --d-model 32 --heads 2 --context 32 --batch 4 --threads 1 --device cpu"
"$X"/train --data "$W/t.txt" $M --steps 6 --eval-windows 2 --sample-len 8 --save "$W/t.st" --save-every 3 \
  >"$W/train.log" || fail "train"
grep -q '^summary' "$W/train.log" || fail "train summary"
"$X"/train --data "$W/t.txt" $M --steps 8 --eval-windows 2 --sample-len 0 --resume "$W/t.st" --save "$W/t2.st" \
  >"$W/resume.log" || fail "train --resume"
grep -q 'resumed from .* at step 6' "$W/resume.log" || fail "resume step"
"$X"/train --data "$W/t.txt" $M --tokenizer bpe --vocab 300 --steps 2 --eval-windows 1 --sample-len 4 \
  --save "$W/bpe.st" >"$W/bpe.log" || fail "train bpe"
"$X"/generate --ckpt "$W/bpe.st" --len 5 --threads 1 --device cpu >/dev/null 2>&1 || fail "generate bpe"
"$X"/teacher-cache --teacher "$W/t.st" --k 4 --out "$W/c" --threads 1 --device cpu >"$W/cache.log" ||
  fail "teacher-cache"
"$X"/distill --teacher "$W/t.st" --cache "$W/c" --layers 1 --d-model 16 --heads 2 --steps 3 --batch 4 \
  --eval-windows 1 --sample-len 4 --threads 1 --device cpu --save "$W/s.st" >"$W/d.log" || fail "distill offline"
[ -s "$W/s.svg" ] && grep -q '<svg' "$W/s.svg" || fail "distill svg"
"$X"/distill --teacher "$W/t.st" --k 4 --normalize-topk 1 --w-hard 0 --w-soft 1 --layers 1 --d-model 16 \
  --heads 2 --steps 2 --batch 4 --eval-windows 1 --sample-len 0 --threads 1 --device cpu --svg "$W/on.svg" \
  >"$W/on.log" || fail "distill online"
"$X"/eval --ckpt "$W/s.st" --threads 1 --device cpu | grep -q '^val_loss=' || fail "eval"
"$X"/generate --ckpt "$W/t.st" --prompt "And" --len 10 --top-k 5 --top-p 0.9 --threads 1 --device cpu \
  >/dev/null 2>&1 || fail "generate"
# Mixed precision on the CPU: a bf16 student from the f32 teacher's cache (checkpoints load in any compute
# dtype), evaluated in bf16 and f32.
"$X"/distill --teacher "$W/t.st" --cache "$W/c" --layers 1 --d-model 16 --heads 2 --steps 2 --batch 4 \
  --eval-windows 1 --sample-len 0 --threads 1 --device cpu --compute-dtype bf16 --save "$W/b.st" >"$W/b.log" ||
  fail "distill bf16"
grep -q 'compute: bf16 matmuls, f32 master weights' "$W/b.log" || fail "distill bf16 banner"
"$X"/eval --ckpt "$W/b.st" --threads 1 --device cpu --compute-dtype bf16 | grep -q '^val_loss=' || fail "eval bf16"
"$X"/eval --ckpt "$W/b.st" --threads 1 --device cpu | grep -q 'compute f32' || fail "eval f32 by default on cpu"
# Export: a byte-level and a BPE student to GGUF and HF, each loading back for generate; refusals leave nothing.
"$X"/export --checkpoint "$W/t.st" --out "$W/t.gguf" >"$W/x.log" || fail "export gguf"
grep -q "llama-completion -m '$W/t.gguf'" "$W/x.log" || fail "export prints the llama.cpp line"
"$X"/export --checkpoint "$W/bpe.st" --dtype q8_0 --out "$W/bpe.gguf" >/dev/null || fail "export q8_0"
"$X"/export --checkpoint "$W/bpe.st" --format hf --dtype bf16 --out "$W/bpe-hf" >/dev/null || fail "export hf"
for m in "$W/t.gguf" "$W/bpe.gguf" "$W/bpe-hf"; do
  "$X"/generate --model "$m" --len 5 --threads 1 --device cpu >/dev/null 2>&1 || fail "generate from $m"
done
if "$X"/export --checkpoint "$W/t.st" --format hf --dtype q8_0 --out "$W/x" 2>"$W/e3"; then fail "export hf q8_0"; fi
grep -q "q8_0 is gguf only" "$W/e3" || fail "export dtype message: $(cat "$W/e3")"
if "$X"/export --checkpoint "$W/t.st" --out "$W/x" 2>"$W/e4"; then fail "export without --format"; fi
[ ! -e "$W/x" ] || fail "a refused export left $W/x"
# Refusals: an error naming the fault, exit status 1.
if "$X"/eval --ckpt "$W/t.st" --device cpu --compute-dtype f8 2>"$W/e0" >/dev/null; then fail "eval --compute-dtype f8"; fi
grep -q "compute-dtype is auto, f32, bf16 or f16" "$W/e0" || fail "compute-dtype message: $(cat "$W/e0")"
if "$X"/eval --ckpt "$W/none.st" 2>"$W/e1"; then fail "eval of a missing file succeeded"; fi
grep -q "none.st" "$W/e1" || fail "missing-file message: $(cat "$W/e1")"
if "$X"/distill --teacher "$W/t.st" --cache "$W/c" --k 8 --steps 1 --threads 1 --device cpu 2>"$W/e2" >/dev/null; then
  fail "distill with K above the cache succeeded"
fi
grep -q "larger than the cache" "$W/e2" || fail "K message: $(cat "$W/e2")"
echo "smoke: all example programs ran"
