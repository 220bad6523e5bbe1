#!/usr/bin/env bash
# Several processes, end to end on the CPU with tiny settings:
#   - tools/launch.sh gives each rank the launcher environment, stops every rank when one fails (exiting with
#     its status) and forwards SIGTERM;
#   - train in a world of 2 with --batch 2 prints the losses of one process with --batch 4;
#   - a checkpoint written by a world of 2 resumes in a world of 1 and the reverse, each continuing like a run
#     that never changed size; a batch that does not split over the world is refused;
#   - a bad RANK / WORLD_SIZE and a rank that never comes are one-line errors, the latter within the timeout.
#   - ZeRO-1 (--zero1 1) takes the same steps and writes the same checkpoint;
#   - SIGINT to one rank or to the launcher stops every rank after the same step, rank 0 saving the run;
#   - teacher-cache on 2 ranks writes per-rank shards that distill reads at any world size.
# Usage: parallel.sh <build/examples dir> <text file> <tools/launch.sh>
set -euo pipefail
X=$(cd "$1" && pwd)
TEXT=$2
L=$3
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
port=$((30000 + RANDOM % 20000))
next_port() { port=$((port + 1)); }
head -c 150000 "$TEXT" >"$W/t.txt"
M="--layers 1 --d-model 32 --heads 2 --context 32 --threads 1 --device cpu --sample-len 0 --eval-windows 8"
M="$M --log-every 1 --eval-every 0"
# The progress lines' losses, one per line ("[rank 0] " dropped).
losses() { sed -n 's/^\(\[rank 0\] \)\{0,1\}\[[#.]\{20\}\] *\([0-9]*\)\/[0-9]* | loss \([0-9.]*\).*/\2 \3/p' "$1"; }

# ---- 1. the launcher ------------------------------------------------------------------------------------
next_port
out=$(bash "$L" -n 3 --master-port "$port" bash -c 'echo "$RANK/$WORLD_SIZE/$LOCAL_RANK/$MASTER_ADDR:$MASTER_PORT"' | sort)
want=$(printf '[rank 0] 0/3/0/127.0.0.1:%s\n[rank 1] 1/3/1/127.0.0.1:%s\n[rank 2] 2/3/2/127.0.0.1:%s' "$port" "$port" "$port")
[ "$out" = "$want" ] || fail "launcher environment: got '$out'"
rc=0
start=$(date +%s)
bash "$L" -n 3 bash -c '[ "$RANK" = 1 ] && exit 7; exec sleep 60' >"$W/l.log" 2>&1 || rc=$?
[ "$rc" = 7 ] || fail "launcher: a rank exited 7, the launcher $rc"
[ $(($(date +%s) - start)) -lt 30 ] || fail "launcher: the other ranks were not stopped"
grep -q "rank 1 exited with status 7; stopping the others" "$W/l.log" || fail "launcher: $(cat "$W/l.log")"
bash "$L" -n 2 bash -c 'exec sleep 60' >"$W/t.log" 2>&1 &
lp=$!
sleep 1
kill -TERM "$lp"
rc=0
wait "$lp" || rc=$?
[ "$rc" = 130 ] || fail "launcher after SIGTERM exited $rc, not 130"
rc=0
bash "$L" -n 0 true 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "launcher -n 0 exited $rc, not 2"
echo "parallel: launcher environment, fail-all, SIGTERM and bad -n"

# ---- 2. a world of 2 trains like one process with twice the batch ---------------------------------------
T="--data $W/t.txt --shards $W/s $M"
"$X"/train $T --steps 6 --batch 4 --save "$W/w1.st" >"$W/w1.log" 2>&1 || fail "train: $(tail -3 "$W/w1.log")"
next_port
bash "$L" -n 2 --master-port "$port" "$X"/train $T --steps 6 --batch 2 --save "$W/w2.st" >"$W/w2.log" 2>&1 ||
  fail "train in a world of 2: $(tail -5 "$W/w2.log")"
grep -q "world: 2 processes over tcp" "$W/w2.log" || fail "no world line: $(head -3 "$W/w2.log")"
[ -n "$(losses "$W/w1.log")" ] || fail "no progress lines in $(head -20 "$W/w1.log")"
[ "$(losses "$W/w1.log")" = "$(losses "$W/w2.log")" ] ||
  fail "losses differ: one process $(losses "$W/w1.log" | tr '\n' ' '), world of 2 $(losses "$W/w2.log" | tr '\n' ' ')"
[ "$(grep -c '^\[rank 1\] ' "$W/w2.log" || true)" = 0 ] || fail "rank 1 printed: $(grep '^\[rank 1\]' "$W/w2.log" | head -3)"
echo "parallel: world of 2 x batch 2 = one process x batch 4 ($(losses "$W/w2.log" | tail -1))"

# ---- 3. resume at another world size ----------------------------------------------------------------------
R="--steps 9 --threads 1 --device cpu --sample-len 0 --eval-windows 8 --log-every 1 --eval-every 0"
"$X"/train --resume "$W/w1.st" $R >"$W/r11.log" 2>&1 || fail "resume 1 -> 1: $(tail -3 "$W/r11.log")"
"$X"/train --resume "$W/w2.st" $R >"$W/r21.log" 2>&1 || fail "resume 2 -> 1: $(tail -3 "$W/r21.log")"
next_port
bash "$L" -n 2 --master-port "$port" "$X"/train --resume "$W/w1.st" $R >"$W/r12.log" 2>&1 ||
  fail "resume 1 -> 2: $(tail -3 "$W/r12.log")"
[ -n "$(losses "$W/r11.log")" ] || fail "no progress lines in $(head -20 "$W/r11.log")"
[ "$(losses "$W/r11.log")" = "$(losses "$W/r21.log")" ] || fail "resume 2 -> 1 differs from 1 -> 1"
[ "$(losses "$W/r11.log")" = "$(losses "$W/r12.log")" ] || fail "resume 1 -> 2 differs from 1 -> 1"
next_port
rc=0
bash "$L" -n 3 --master-port "$port" "$X"/train --resume "$W/w1.st" $R >"$W/r13.log" 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "resume over 3 processes of a batch of 4 exited $rc, not 2"
grep -q "batch of 4 windows per step does not split over 3 processes" "$W/r13.log" || fail "$(tail -3 "$W/r13.log")"
echo "parallel: checkpoints resume at 1 and 2 processes alike; a batch that does not split is refused"
# ZeRO-1: the same steps, and rank 0 writes the whole optimizer state (the plain world's checkpoint, byte for
# byte); a ZeRO-1 world resumes from a one-process checkpoint as that process does.
next_port
bash "$L" -n 2 --master-port "$port" "$X"/train $T --steps 6 --batch 2 --zero1 1 --save "$W/z2.st" >"$W/z2.log" 2>&1 ||
  fail "train --zero1 1 in a world of 2: $(tail -5 "$W/z2.log")"
cmp -s "$W/w2.st" "$W/z2.st" || fail "the ZeRO-1 checkpoint differs from the plain world's"
next_port
bash "$L" -n 2 --master-port "$port" "$X"/train --resume "$W/w1.st" $R --zero1 1 >"$W/rz.log" 2>&1 ||
  fail "resume 1 -> 2 with ZeRO-1: $(tail -3 "$W/rz.log")"
[ "$(losses "$W/r11.log")" = "$(losses "$W/rz.log")" ] || fail "resume 1 -> 2 with ZeRO-1 differs from 1 -> 1"
echo "parallel: ZeRO-1 writes the plain world's checkpoint and resumes a one-process one alike"

# ---- 4. bad environments ----------------------------------------------------------------------------------
rc=0
RANK=2 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 "$X"/train $T --steps 2 --batch 2 >"$W/e1.log" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "RANK=2 WORLD_SIZE=2 exited $rc, not 1"
grep -q "RANK=2 must be below WORLD_SIZE=2" "$W/e1.log" || fail "$(cat "$W/e1.log")"
next_port
rc=0
start=$(date +%s)
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RETORT_DIST_TIMEOUT=2 "$X"/train $T --steps 2 --batch 2 \
  >"$W/e2.log" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "a rank that never comes: exited $rc, not 1"
grep -q "rank(s) 1 did not join the rendezvous" "$W/e2.log" || fail "$(cat "$W/e2.log")"
[ $(($(date +%s) - start)) -lt 20 ] || fail "a rank that never comes: no error within the timeout"
echo "parallel: bad RANK and a missing rank are one-line errors"

# ---- 5. Ctrl-C across ranks -------------------------------------------------------------------------------
# One rank alone is interrupted (the others never see a signal): every rank stops after the same step, rank 0
# saves, the launcher exits 130 at once (not at the collective timeout), and resuming in a world of 2 ends
# with the checkpoint of a run that was never interrupted. Then Ctrl-C to the launcher, which forwards it.
# A model big enough that 300 steps last seconds on a fast machine: the interruptions below land at step 3, and
# with the tiny model a fast CI machine finished all 300 steps before the first one could be sent.
T="--data $W/t.txt --shards $W/s $M --layers 2 --d-model 128 --heads 4 --context 128 --steps 300 --batch 2"
T="$T --eval-every 100"
next_port
bash "$L" -n 2 --master-port "$port" "$X"/train $T --save "$W/i-full.st" >"$W/i-full.log" 2>&1 ||
  fail "uninterrupted world of 2: $(tail -3 "$W/i-full.log")"
# Starts a world of 2 in the background, waits for step 3 on rank 0, and sends SIGINT to `who` (1: rank 1's
# process, L: the launcher); sets rc and secs.
interrupt_world() {  # who log args...
  local who=$1 log=$2 lp p target="" i
  shift 2
  next_port
  # With job control on, the background launcher does not start with SIGINT ignored (as a plain `&` would,
  # which no trap can undo), so it receives SIGINT as a launcher run from a terminal does.
  set -m
  bash "$L" -n 2 --master-port "$port" --timeout 60 "$X"/train "$@" >"$log" 2>&1 &
  lp=$!
  set +m
  for i in $(seq 1 600); do
    grep -qE '^\[rank 0\] \[[#.]{20}\] +([3-9]|[1-9][0-9]+)/' "$log" 2>/dev/null && break
    sleep 0.05
  done
  if [ "$who" = L ]; then
    target=$lp
  else
    for p in $(ps -o pid= --ppid "$lp"); do grep -qz '^RANK=1$' "/proc/$p/environ" 2>/dev/null && target=$p; done
  fi
  [ -n "$target" ] || fail "no process to interrupt: $(tail -3 "$log")"
  local start=$(date +%s)
  kill -INT "$target"
  rc=0
  wait "$lp" || rc=$?
  secs=$(($(date +%s) - start))
}
interrupt_world 1 "$W/i1.log" $T --save "$W/cut/run.st"
[ "$rc" = 130 ] || fail "world of 2 after SIGINT to rank 1 exited $rc, not 130: $(tail -5 "$W/i1.log")"
[ "$secs" -lt 20 ] || fail "world of 2 took $secs s to stop after SIGINT to rank 1"
step=$(sed -n 's/^\[rank 0\] train: stopped at step \([0-9]*\) of 300.*/\1/p' "$W/i1.log")
[ -n "$step" ] && [ "$step" -lt 300 ] || fail "rank 0 did not save a stopped run: $(tail -5 "$W/i1.log")"
R="--threads 1 --device cpu --sample-len 0 --log-every 1 --eval-every 100 --eval-windows 8"
next_port
bash "$L" -n 2 --master-port "$port" "$X"/train --resume "$W/cut/run.st" --save "$W/cut/run.st" $R \
  >"$W/i1r.log" 2>&1 || fail "resume after SIGINT to rank 1: $(tail -3 "$W/i1r.log")"
cmp -s "$W/i-full.st" "$W/cut/run.st" || fail "interrupted (rank 1 at step $step) + resumed differs from uninterrupted"
interrupt_world L "$W/i2.log" $T --save "$W/cut/run2.st"
[ "$rc" = 130 ] || fail "world of 2 after SIGINT to the launcher exited $rc, not 130: $(tail -5 "$W/i2.log")"
[ "$secs" -lt 20 ] || fail "world of 2 took $secs s to stop after SIGINT to the launcher"
grep -q "^\[rank 0\] train: stopped at step [0-9]* of 300; the run is saved" "$W/i2.log" && [ -s "$W/cut/run2.st" ] ||
  fail "SIGINT to the launcher: no saved run: $(tail -5 "$W/i2.log")"
echo "parallel: SIGINT to one rank (step $step) or to the launcher stops every rank in ${secs} s; the resumed run is identical"

# ---- 6. the teacher cache in per-rank shards ----------------------------------------------------------------
# teacher-cache on 2 ranks writes one shard set per rank and a record listing them; the records are byte for
# byte those of one process, and distill reads either cache at 1 or 2 processes with the same losses. A
# missing shard, a shard of another cache and a K that disagrees are errors naming the file.
"$X"/train --data "$W/t.txt" --shards "$W/s" $M --steps 3 --batch 2 --save "$W/teacher.st" >"$W/te.log" 2>&1 ||
  fail "teacher: $(tail -3 "$W/te.log")"
C="--teacher $W/teacher.st --batch 8 --threads 1 --device cpu"
mkdir -p "$W/c" "$W/e"
"$X"/teacher-cache $C --k 4 --out "$W/c/one" >"$W/c1.log" 2>&1 || fail "teacher-cache: $(tail -3 "$W/c1.log")"
next_port
bash "$L" -n 2 --master-port "$port" "$X"/teacher-cache $C --k 4 --out "$W/c/two" >"$W/c2.log" 2>&1 ||
  fail "teacher-cache on 2 ranks: $(tail -3 "$W/c2.log")"
[ -f "$W/c/two_r0_00000.topk" ] && [ -f "$W/c/two_r1_00000.topk" ] && [ ! -e "$W/c/two_00000.topk" ] ||
  fail "teacher-cache on 2 ranks: no per-rank shards: $(ls "$W/c")"
grep -q "^files=two_r0_00000.topk:[0-9]*,two_r1_00000.topk:[0-9]*$" "$W/c/two.teacher" ||
  fail "the record lists no shards: $(grep files "$W/c/two.teacher")"
cmp -s <(tail -c +65 "$W/c/one_00000.topk") <(cat <(tail -c +65 "$W/c/two_r0_00000.topk") \
  <(tail -c +65 "$W/c/two_r1_00000.topk")) || fail "the ranks' records differ from one process's"
D="--teacher $W/teacher.st $M --steps 4"
"$X"/distill $D --cache "$W/c/one" --batch 4 >"$W/d1.log" 2>&1 || fail "distill: $(tail -3 "$W/d1.log")"
"$X"/distill $D --cache "$W/c/two" --batch 4 >"$W/d2.log" 2>&1 || fail "distill 2-rank cache: $(tail -3 "$W/d2.log")"
next_port
bash "$L" -n 2 --master-port "$port" "$X"/distill $D --cache "$W/c/one" --batch 2 >"$W/d3.log" 2>&1 ||
  fail "distill on 2 ranks: $(tail -3 "$W/d3.log")"
[ -n "$(losses "$W/d1.log")" ] || fail "no progress lines in $(head -20 "$W/d1.log")"
[ "$(losses "$W/d1.log")" = "$(losses "$W/d2.log")" ] || fail "distill of the 2-rank cache differs from the 1-rank one"
[ "$(losses "$W/d1.log")" = "$(losses "$W/d3.log")" ] || fail "distill on 2 ranks differs from 1"
next_port
bash "$L" -n 2 --master-port "$port" "$X"/teacher-cache $C --k 8 --out "$W/c/k8" >"$W/c3.log" 2>&1 ||
  fail "teacher-cache k 8: $(tail -3 "$W/c3.log")"
refused() {  # log pattern: distill of $W/e/two must fail naming the fault
  local rc=0
  "$X"/distill $D --cache "$W/e/two" --batch 4 >"$1" 2>&1 || rc=$?
  [ "$rc" = 1 ] && grep -q "$2" "$1" || fail "distill of a broken cache (want '$2'): exit $rc, $(tail -2 "$1")"
}
cp "$W"/c/two* "$W/e/"
rm "$W/e/two_r1_00000.topk"
refused "$W/e1.log" "the shard $W/e/two_r1_00000.topk that $W/e/two.teacher lists is missing"
cp "$W/c/k8_r1_00000.topk" "$W/e/two_r1_00000.topk"
refused "$W/e2.log" "$W/e/two_r1_00000.topk: not the shard $W/e/two.teacher lists"
crc=$(sed -n 's/.*k8_r1_00000.topk:\([0-9]*\).*/\1/p' "$W/c/k8.teacher")
sed -i "s/two_r1_00000.topk:[0-9]*/two_r1_00000.topk:$crc/" "$W/e/two.teacher"
refused "$W/e3.log" "$W/e/two_r1_00000.topk: vocabulary 256, K = 8, bf16 differ from 256, K = 4"
echo "parallel: teacher cache in per-rank shards, read at 1 and 2 processes alike; broken caches refused"
