#!/usr/bin/env bash
# What the programs owe a user's work, end to end with tiny settings:
#   - Ctrl-C saves the run, and resuming it gives the very checkpoint an uninterrupted run writes (bit for bit
#     on the CPU), and so do SIGTERM and --resume for distill; a second Ctrl-C aborts at once; an interrupted
#     teacher-cache leaves no partial cache and keeps the previous one;
#   - output directories are made before the work, and an unwritable place is refused before any work;
#   - a checkpoint copied alone to an empty directory generates (its tokenizer is inside), and eval names the
#     shards it cannot find;
#   - distill refuses a cache of another teacher or other tokens; train --resume refuses other data and flags
#     that contradict the run;
#   - failures are one line with the program's name once, exit 2 for usage and 1 for runtime failures; eval
#     names a vocabulary mismatch as such; train, distill and eval report the same validation loss.
# Usage: runs.sh <build/examples dir> <text file>
set -euo pipefail
X=$(cd "$1" && pwd)
TEXT=$2
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
M="--layers 1 --d-model 32 --heads 2 --context 32 --batch 4 --threads 1 --device cpu --sample-len 0"
head -c 120000 "$TEXT" >"$W/t.txt"

# Starts a program in the background with its output in log, waits until a progress line shows step >= 3, and
# sends the signal; returns the program's exit status.
interrupt() {  # signal log cmd...
  local sig=$1 log=$2
  shift 2
  "$@" >"$log" 2>&1 &
  local pid=$! i
  for i in $(seq 1 600); do
    grep -qE '^\[[#.]{20}\] +([3-9]|[1-9][0-9]+)/' "$log" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  kill "-$sig" "$pid" 2>/dev/null || true
  local rc=0
  wait "$pid" || rc=$?
  return "$rc"
}

# ---- 1. Ctrl-C, then --resume: the same checkpoint as an uninterrupted run --------------------------------
# Wider and longer windows than $M: 300 steps last seconds even on a fast machine, so the Ctrl-C at step 3 lands.
T="--data $W/t.txt $M --d-model 96 --context 64 --steps 300 --log-every 1 --eval-every 100 --eval-windows 8"
"$X"/train $T --save "$W/full.st" --curves "$W/full.csv" >"$W/full.log" 2>&1 ||
  fail "uninterrupted train: $(tail -3 "$W/full.log")"
rc=0
interrupt INT "$W/int.log" "$X"/train $T --save "$W/cut/run.st" || rc=$?
[ "$rc" = 130 ] || fail "train after Ctrl-C exited $rc, not 130: $(tail -3 "$W/int.log")"
grep -q "stopping at the end of this step" "$W/int.log" || fail "no stop notice: $(tail -3 "$W/int.log")"
grep -q "continue with: train --resume $W/cut/run.st" "$W/int.log" || fail "no resume hint: $(tail -3 "$W/int.log")"
step=$(sed -n 's/^train: stopped at step \([0-9]*\) of 300.*/\1/p' "$W/int.log")
[ -n "$step" ] && [ "$step" -lt 300 ] || fail "the run was not stopped before its end (step '$step')"
"$X"/train --resume "$W/cut/run.st" --save "$W/cut/run.st" --threads 1 --device cpu --sample-len 0 --log-every 1 \
  --eval-every 100 --eval-windows 8 >"$W/res.log" 2>&1 || fail "train --resume: $(tail -3 "$W/res.log")"
grep -q "resumed from .* at step $step of 300" "$W/res.log" || fail "resume step: $(head -5 "$W/res.log")"
cmp -s "$W/full.st" "$W/cut/run.st" || fail "interrupted + resumed checkpoint differs from the uninterrupted one"
echo "runs: Ctrl-C at step $step, resumed: checkpoint identical to the uninterrupted run's"
# A second Ctrl-C does not wait for the step: steps of a few seconds, two signals 0.3 s apart, no save.
"$X"/train --data "$W/t.txt" --layers 4 --d-model 256 --heads 4 --context 256 --batch 16 --threads 1 --device cpu \
  --steps 50 --eval-windows 1 --sample-len 0 --save "$W/abort.st" >"$W/abort.log" 2>&1 &
pid=$!
for i in $(seq 1 600); do
  grep -q "validation @ step 0" "$W/abort.log" 2>/dev/null && break
  sleep 0.05
done
sleep 0.3
kill -INT "$pid"
sleep 0.3
kill -INT "$pid" 2>/dev/null || true
rc=0
wait "$pid" || rc=$?
[ "$rc" = 130 ] || fail "train after two Ctrl-Cs exited $rc: $(tail -3 "$W/abort.log")"
grep -q "stopping at the end of this step" "$W/abort.log" || fail "no stop notice: $(tail -3 "$W/abort.log")"
! grep -q "the run is saved" "$W/abort.log" && [ ! -e "$W/abort.st" ] ||
  fail "the second Ctrl-C waited for the step (a step took under 0.3 s?): $(tail -3 "$W/abort.log")"
# Without --save, Ctrl-C keeps the run in train-run.safetensors in the current directory; a killed writer's
# temporary beside --save is removed by the next run.
mkdir "$W/cwd"
rc=0
(cd "$W/cwd" && interrupt INT "$W/int2.log" "$X"/train $T) || rc=$?
[ "$rc" = 130 ] && [ -s "$W/cwd/train-run.safetensors" ] || fail "Ctrl-C without --save ($rc): $(tail -3 "$W/int2.log")"
echo stale >"$W/cut/run.st.tmp.999999999"
"$X"/train --data "$W/t.txt" $M --steps 1 --eval-windows 1 --save "$W/cut/run.st" >/dev/null 2>&1 || fail "train"
[ ! -e "$W/cut/run.st.tmp.999999999" ] || fail "a dead writer's temporary was left"

# ---- 2. a checkpoint alone in an empty directory ---------------------------------------------------------
"$X"/train --data "$W/t.txt" $M --tokenizer bpe --vocab 300 --steps 2 --eval-windows 2 --save "$W/bpe.st" \
  >"$W/bpe.log" 2>&1 || fail "train bpe: $(tail -3 "$W/bpe.log")"
mkdir "$W/alone"
cp "$W/bpe.st" "$W/alone/m.st"
rm -f "$W"/t.bpe300*
(cd "$W/alone" && "$X"/generate --model m.st --prompt "And God" --len 5 --device cpu --threads 1 \
  >"$W/gen.log" 2>&1) || fail "generate from a lone checkpoint: $(cat "$W/gen.log")"
grep -q "^And God" "$W/gen.log" || fail "generate output: $(cat "$W/gen.log")"
rc=0
(cd "$W/alone" && "$X"/eval --model m.st --device cpu --threads 1 >/dev/null 2>"$W/e.log") || rc=$?
[ "$rc" = 1 ] && grep -q "no shards .*t.bpe300_val_00000.bin" "$W/e.log" || fail "eval without shards ($rc): $(cat "$W/e.log")"

# ---- 3. refusals before any work -------------------------------------------------------------------------
expect() {  # status pattern cmd...: the command fails with that status and one line naming the fault
  local want=$1 pat=$2
  shift 2
  local rc=0
  "$@" >"$W/o.log" 2>"$W/e.log" || rc=$?
  [ "$rc" = "$want" ] || fail "$* exited $rc, not $want: $(cat "$W/e.log")"
  grep -q -- "$pat" "$W/e.log" || fail "$*: message lacks '$pat': $(cat "$W/e.log")"
  local prog
  prog=$(basename "$1")
  ! grep -q "$prog: $prog:" "$W/e.log" || fail "doubled prefix: $(cat "$W/e.log")"
}
expect 2 "threads must be in \[0, 1024\]" "$X"/train --threads 100000
expect 2 "steps wants an integer, got 'ten'" "$X"/train --steps=ten
expect 2 "unknown option --stpes" "$X"/eval --stpes 3
expect 2 "device is auto, cpu or cuda, got 'gpu'" "$X"/train --device gpu
expect 2 "threads 10000000000 is out of range" "$X"/eval --model x --threads 10000000000
expect 2 "steps 99999999999999999999 is out of range" "$X"/train --steps 99999999999999999999
expect 2 "d-ff must be in \[0, 1048576\], got 4611686018427387903" "$X"/train --d-ff 4611686018427387903
expect 2 "batch must be in \[1, 2^20\]" "$X"/distill --teacher "$W/full.st" --batch=4611686018427387904
mkdir -p "$W/ro" && chmod 555 "$W/ro"
if [ ! -w "$W/ro" ]; then
  expect 2 "cannot write in $W/ro" "$X"/train --data "$W/t.txt" $M --save "$W/ro/m.st"
  ! grep -q "tokenizing" "$W/o.log" || fail "train worked before refusing its --save"
  expect 2 "give --shards PREFIX in a writable place" "$X"/train --data "$W/t.txt" --max-bytes 5000 $M \
    --shards "$W/ro/x" --steps 1
fi
chmod 755 "$W/ro"
expect 2 "t.txt is not a directory" "$X"/train --data "$W/t.txt" $M --save "$W/t.txt/m.st"
! grep -q "tokenizing" "$W/o.log" || fail "train worked before refusing its --save"
expect 2 "t.txt is not a directory" "$X"/teacher-cache --teacher "$W/full.st" --out "$W/t.txt/c"
expect 2 "is a directory" "$X"/train --data "$W/t.txt" $M --save "$W/ro"
expect 2 "differs from the run's 96" "$X"/train --resume "$W/full.st" --d-model 64
expect 2 "not on these data flags" "$X"/train --resume "$W/full.st" --data "$TEXT" --max-bytes 5000
# Out of memory (under a 2 GiB address-space limit, which AddressSanitizer cannot run under): the size asked
# for and the options that set it.
if grep -q __asan_init "$X/train"; then
  echo "runs: an AddressSanitizer build: the out-of-memory check is skipped"
else
  expect 1 "d-model" bash -c "ulimit -v 2000000; exec '$X/train' --data '$W/t.txt' --layers 4 --d-model 8192 \
    --heads 4 --context 32 --batch 1 --steps 1 --threads 1 --device cpu"
  grep -q "MiB" "$W/e.log" || fail "out-of-memory message: $(cat "$W/e.log")"
fi

# ---- 4. teacher caches: identified, refused when they are another teacher's ---------------------------------
"$X"/train --data "$W/t.txt" $M --steps 4 --eval-windows 2 --seed 2 --save "$W/t2.st" >/dev/null 2>&1 ||
  fail "second teacher"
"$X"/teacher-cache --teacher "$W/full.st" --k 4 --out "$W/cache/c" --threads 1 --device cpu >"$W/c.log" 2>&1 ||
  fail "teacher-cache: $(tail -3 "$W/c.log")"
[ -s "$W/cache/c.teacher" ] || fail "no cache record"
D="--layers 1 --d-model 16 --heads 2 --steps 2 --batch 4 --eval-windows 2 --sample-len 0 --threads 1 --device cpu"
expect 1 "was written by another teacher" "$X"/distill --teacher "$W/t2.st" --cache "$W/cache/c" $D --svg "$W/x.svg"
"$X"/distill --teacher "$W/full.st" --cache "$W/cache/c" $D --svg "$W/x.svg" >"$W/d.log" 2>&1 ||
  fail "distill with its own cache: $(tail -3 "$W/d.log")"
head -c 60000 "$TEXT" >"$W/u.txt"
expect 1 "holds the teacher's candidates for other tokens" "$X"/distill --teacher "$W/full.st" --cache "$W/cache/c" \
  --data "$W/u.txt" $D --svg "$W/x.svg"
# Interrupted: the partial cache goes, the previous one stays whole.
rc=0
interrupt INT "$W/ci.log" "$X"/teacher-cache --teacher "$W/full.st" --k 4 --batch 1 --out "$W/cache/c" --threads 1 \
  --device cpu || rc=$?
if grep -q "^summary" "$W/ci.log"; then
  echo "runs: teacher-cache finished before the signal; its interrupt was not tested"
else
  [ "$rc" = 130 ] || fail "teacher-cache after Ctrl-C exited $rc: $(tail -3 "$W/ci.log")"
  ! ls "$W"/cache/c.incomplete* >/dev/null 2>&1 || fail "partial cache left: $(ls "$W/cache")"
  "$X"/distill --teacher "$W/full.st" --cache "$W/cache/c" $D --svg "$W/x.svg" >"$W/d.log" 2>&1 ||
    fail "the previous cache was lost: $(tail -3 "$W/d.log")"
fi

# ---- 5. distill: SIGTERM saves; resume takes the run's student and options ---------------------------------
DL="--layers 1 --d-model 16 --heads 2 --steps 300 --batch 4 --eval-windows 2 --eval-every 0 --sample-len 0 --threads 1 \
  --device cpu --log-every 1 --svg $W/x.svg"
"$X"/distill --teacher "$W/full.st" --cache "$W/cache/c" $DL --save "$W/dfull.st" >"$W/df.log" 2>&1 ||
  fail "uninterrupted distill: $(tail -3 "$W/df.log")"
rc=0
interrupt TERM "$W/dt.log" "$X"/distill --teacher "$W/full.st" --cache "$W/cache/c" $DL --save "$W/ds.st" || rc=$?
[ "$rc" = 143 ] || fail "distill after SIGTERM exited $rc, not 143: $(tail -3 "$W/dt.log")"
"$X"/distill --teacher "$W/full.st" --cache "$W/cache/c" --resume "$W/ds.st" --save "$W/ds.st" --sample-len 0 \
  --threads 1 --device cpu --svg "$W/x.svg" --eval-windows 2 >"$W/dr.log" 2>&1 ||
  fail "distill --resume: $(tail -3 "$W/dr.log")"
grep -q "student: layers=1 d_model=16" "$W/dr.log" || fail "distill resume config: $(grep student "$W/dr.log")"
cmp -s "$W/dfull.st" "$W/ds.st" || fail "interrupted + resumed distill differs from the uninterrupted one"
expect 2 "w-hard 0.9 differs from the run's 0.5" "$X"/distill --teacher "$W/full.st" --cache "$W/cache/c" \
  --resume "$W/ds.st" --w-hard 0.9

# ---- 6. one validation loss, and a vocabulary mismatch named --------------------------------------------------
tv=$(sed -n 's/^  validation @ step 300: loss \([0-9.]*\).*/\1/p' "$W/full.log")
ev=$("$X"/eval --model "$W/full.st" --eval-windows 8 --batch 3 --threads 1 --device cpu | sed -n 's/^val_loss=//p')
python3 -c "import sys; t, e = float('$tv'), float('$ev'); sys.exit(abs(t - e) > 2e-4)" ||
  fail "train's validation loss $tv differs from eval's $ev"
expect 1 "vocabulary mismatch" "$X"/eval --model "$W/bpe.st" --shards "$W/t.bytes" --threads 1 --device cpu

# ---- 7. the demo's loss picture from the programs' curves -------------------------------------------------
"$X"/distill --teacher "$W/full.st" --cache "$W/cache/c" $D --steps 20 --eval-every 5 --svg "$W/x.svg" \
  --curves "$W/d.csv" >/dev/null 2>&1 || fail "distill --curves"
head -1 "$W/d.csv" | grep -q '^step,tokens,loss,hard,soft,val$' || fail "curves header: $(head -1 "$W/d.csv")"
[ "$(grep -c ',[0-9.]*$' "$W/d.csv")" -ge 5 ] || fail "distill's curves lack validation rows: $(cat "$W/d.csv")"
python3 "$(dirname "$0")/../../tools/loss_picture.py" "$W/pic.svg" 4.0 "distilled=$W/d.csv" "scratch=$W/full.csv" ||
  fail "loss_picture.py"
[ "$(grep -c '<polyline' "$W/pic.svg")" -ge 5 ] || fail "the picture lacks curves"
echo "runs: all checks passed"
