#!/usr/bin/env bash
# The main job: the whole distillation pipeline on the bundled King James Bible.
#   1. builds the library and the example programs in build/ (release; CUDA when nvcc is found);
#   2. trains a teacher (examples/train; reused when build/demo/teacher.safetensors was trained with the same
#      settings and still loads);
#   3. writes the teacher's top-K cache over the training tokens (examples/teacher-cache; reused likewise);
#   4. distills a smaller student from the cache (examples/distill; loss curves in build/demo/distill.svg);
#   5. trains the same student from scratch on the same tokens and steps (examples/train);
#   6. evaluates all three on the held-out tokens (examples/eval) and prints a table with the share of the
#      teacher-student gap that distillation closed, (scratch - distilled) / (scratch - teacher), and a sample
#      of the distilled student (examples/generate).
# On the CPU the defaults run a few minutes on two cores; with a usable GPU larger defaults apply. Settings
# are environment variables (printed at the start), e.g. STUDENT_STEPS=600 bash tools/demo.sh; DEVICE=cpu
# forces the CPU; STUDENT_SEEDS="1 2 3 4 5" trains the two students once per seed against the same teacher
# and adds a table of every seed's result. Logs of every step are in build/demo/*.log.
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
PROGRAMS="train teacher-cache distill eval generate"
ninja -C build $(for p in $PROGRAMS; do echo examples/$p; done) data/kjv.txt >"$LOGS"/build.demo.log 2>&1 || {
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
  # A GPU: the whole-ish corpus, a wider teacher and student, longer runs.
  : "${MAX_BYTES:=2000000}" "${CONTEXT:=256}" "${BATCH:=32}"
  : "${TEACHER:=--layers 6 --d-model 256 --heads 8}" "${TEACHER_STEPS:=1500}" "${TEACHER_LR:=2e-3}"
  : "${STUDENT:=--layers 2 --d-model 96 --heads 2}" "${STUDENT_STEPS:=1500}" "${STUDENT_LR:=3e-3}"
  : "${K:=32}"
else
  # A teacher well ahead of what the student can reach (val ~1.21 vs ~1.5), students trained past their early
  # loss plateau (at 250 steps the distilled-vs-scratch order was a coin toss between seeds), pure forward KL
  # over the teacher's top 64: on two cores ~2m10s for the teacher (once, then reused), ~25s per student.
  : "${MAX_BYTES:=1000000}" "${CONTEXT:=128}" "${BATCH:=16}"
  : "${TEACHER:=--layers 4 --d-model 128 --heads 4}" "${TEACHER_STEPS:=1000}" "${TEACHER_LR:=3e-3}"
  : "${STUDENT:=--layers 2 --d-model 96 --heads 2}" "${STUDENT_STEPS:=500}" "${STUDENT_LR:=3e-3}"
  : "${K:=64}" "${W_HARD:=0}" "${W_SOFT:=1}"
fi
: "${W_HARD:=0.1}" "${W_SOFT:=0.9}" "${KD_T:=1.0}" "${BETA:=0}" "${SEED:=1}"
# STUDENT_SEEDS="1 2 3 4 5": the two students once per seed (initialization and batch order) against the same
# teacher, and a table of every seed's result after the first seed's.
: "${STUDENT_SEEDS:=$SEED}"
for s in $STUDENT_SEEDS; do
  [[ "$s" =~ ^[0-9]+$ ]] || die "STUDENT_SEEDS must be whole numbers separated by spaces, got '$STUDENT_SEEDS'"
done
read -r -a SEEDS <<<"$STUDENT_SEEDS"
[ "${#SEEDS[@]}" -ge 1 ] || die "STUDENT_SEEDS is empty"
[ "$(printf '%s\n' "${SEEDS[@]}" | sort -u | wc -l)" = "${#SEEDS[@]}" ] ||
  die "STUDENT_SEEDS repeats a seed: '$STUDENT_SEEDS'"
COMMON="--device $DEVICE --batch $BATCH"
echo "settings (environment variables): GPU=$GPU MAX_BYTES=$MAX_BYTES CONTEXT=$CONTEXT BATCH=$BATCH"
echo "  TEACHER='$TEACHER' TEACHER_STEPS=$TEACHER_STEPS TEACHER_LR=$TEACHER_LR"
echo "  STUDENT='$STUDENT' STUDENT_STEPS=$STUDENT_STEPS STUDENT_LR=$STUDENT_LR"
echo "  K=$K W_HARD=$W_HARD W_SOFT=$W_SOFT KD_T=$KD_T BETA=$BETA SEED=$SEED STUDENT_SEEDS='$STUDENT_SEEDS'"

# Runs a program with its output in a log; shows the progress lines and the summary as it goes.
run() {
  local log=$1
  shift
  echo "\$ $*"
  if ! "$@" >"$OUT/$log" 2>&1; then
    tail -20 "$OUT/$log"
    die "$1 failed (log: $OUT/$log)"
  fi
  # The evaluations and summaries, then the last progress line.
  grep -E 'validation @|^summary|^  (training|validation|[0-9]+ cache)' "$OUT/$log" | sed 's/^/  /' || true
  grep -E '^\[[#.]{20}\] ' "$OUT/$log" | tail -1 | sed 's/^/  /' || true
}

# ---- 1. teacher -----------------------------------------------------------------------------------------
step "1/5 teacher: train"
TARGS="--max-bytes $MAX_BYTES --context $CONTEXT $TEACHER --steps $TEACHER_STEPS --lr $TEACHER_LR --seed $SEED"
if [ -f "$OUT/teacher.args" ] && [ "$(cat "$OUT/teacher.args")" = "$TARGS" ] &&
  "$X"/eval --ckpt "$OUT/teacher.safetensors" --max-batches 1 --device "$DEVICE" >/dev/null 2>&1; then
  echo "reusing $OUT/teacher.safetensors (trained with the same settings: $TARGS)"
else
  rm -f "$OUT/teacher.args" "$OUT/cache.args"
  run teacher.log "$X"/train $TARGS $COMMON --sample-len 0 --save "$OUT/teacher.safetensors"
  echo "$TARGS" >"$OUT/teacher.args"
fi
SHARDS=build/data/kjv.bytes.first$MAX_BYTES

# ---- 2. cache -------------------------------------------------------------------------------------------
step "2/5 teacher top-K cache"
CACHE=$OUT/teacher.topk$K
CARGS="$TARGS K=$K"
if [ -f "$OUT/cache.args" ] && [ "$(cat "$OUT/cache.args")" = "$CARGS" ] && [ -f "${CACHE}_00000.topk" ]; then
  echo "reusing ${CACHE}_*.topk"
else
  rm -f "$OUT"/teacher.topk*_*.topk  # one cache at a time (K = 64 over 1 MB of text is ~400 MB)
  run cache.log "$X"/teacher-cache --teacher "$OUT/teacher.safetensors" --k "$K" --out "$CACHE" $COMMON
  echo "$CARGS" >"$OUT/cache.args"
fi

# ---- 3 and 4. the students, once per student seed --------------------------------------------------------
# Checkpoints and logs of the first seed keep the plain names; later seeds add -seedN.
suffix() { [ "$1" = "${SEEDS[0]}" ] && echo "" || echo "-seed$1"; }
for s in "${SEEDS[@]}"; do
  x=$(suffix "$s")
  SARGS="$STUDENT --steps $STUDENT_STEPS --lr $STUDENT_LR --seed $s $COMMON"
  step "3/5 student: distill from the cache (seed $s)"
  run "distill$x.log" "$X"/distill --teacher "$OUT/teacher.safetensors" --cache "$CACHE" --k "$K" \
    --w-hard "$W_HARD" --w-soft "$W_SOFT" --kd-temperature "$KD_T" --beta "$BETA" $SARGS --sample-len 0 \
    --save "$OUT/student-distilled$x.safetensors" --svg "$OUT/distill$x.svg"
  step "4/5 student: the same model from scratch, same tokens and steps (seed $s)"
  run "scratch$x.log" "$X"/train --max-bytes "$MAX_BYTES" --context "$CONTEXT" $SARGS --sample-len 0 \
    --save "$OUT/student-scratch$x.safetensors"
done

# ---- 5. evaluate ----------------------------------------------------------------------------------------
step "5/5 evaluate on the held-out tokens"
declare -A VAL
evaluate() {  # name: the checkpoint build/demo/<name>.safetensors
  "$X"/eval --ckpt "$OUT/$1.safetensors" --device "$DEVICE" >"$OUT/eval.$1.log" 2>&1 ||
    die "eval failed (log: $OUT/eval.$1.log)"
  VAL[$1]=$(sed -n 's/^val_loss=//p' "$OUT/eval.$1.log")
}
for m in teacher student-distilled student-scratch; do evaluate "$m"; done
params() { sed -n 's/^model: .*, \([0-9.]*M\) parameters$/\1/p;s/^student: .*, \([0-9.]*M\) parameters.*/\1/p' "$OUT/$1" 2>/dev/null | head -1; }
python3 - "${VAL[teacher]}" "${VAL[student-distilled]}" "${VAL[student-scratch]}" \
  "$(params teacher.log)" "$(params distill.log)" "$(params scratch.log)" <<'EOF'
import math, sys
t, d, s = map(float, sys.argv[1:4])
pt, pd, ps = sys.argv[4:7]
print(f"{'model':<20} {'params':>8} {'val loss (nats/token)':>22} {'perplexity':>11}")
for name, p, v in (("distilled student", pd, d), ("scratch student", ps, s), ("teacher", pt, t)):
    print(f"{name:<20} {p or '?':>8} {v:>22.4f} {math.exp(v):>11.3f}")
gap = s - t
if gap > 0:
    print(f"gap closed by distillation: (scratch - distilled) / (scratch - teacher) = "
          f"({s:.4f} - {d:.4f}) / ({s:.4f} - {t:.4f}) = {100 * (s - d) / gap:.1f}%")
else:
    print("the scratch student is not worse than the teacher here: no gap to close")
EOF
if [ "${#SEEDS[@]}" -gt 1 ]; then
  rows=()
  for s in "${SEEDS[@]}"; do
    x=$(suffix "$s")
    evaluate "student-distilled$x"
    evaluate "student-scratch$x"
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

echo
echo "sample of the distilled student (examples/generate, temperature 0.8, top-p 0.95):"
"$X"/generate --ckpt "$OUT/student-distilled.safetensors" --prompt "And God said" --len 200 --top-p 0.95 \
  --device "$DEVICE" 2>/dev/null | sed 's/^/  | /'
echo
echo "loss curves: $OUT/distill.svg; checkpoints and logs: $OUT/"
echo "demo finished in $(($(date +%s) - T0))s"
