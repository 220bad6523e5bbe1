#!/usr/bin/env bash
# The multi-GPU run (issue 28), one command on a machine with 2 or 4 GPUs and no network: builds retort with
# CUDA and NCCL in build-gpu/, runs the NCCL and data-parallel checks (tests/dist/dist_check) on every
# visible GPU through tools/launch.sh, then the scaling benchmark of the reference distillation step
# (bench_distill_step, dense mode: 6 x 512, context 512, vocab 50257, top-64 KD + CE, batch 16 per GPU) on
# 1, 2 and (when present) 4 GPUs, the same step with ZeRO-1 on every GPU, and the teacher cache written in
# per-rank shards (teacher-cache on 1 and N GPUs, then distill reading it on N and on 1), and prints a short
# table last: tokens/s and speed-up per world, the all-reduce time alone, the fraction of it left exposed
# (ms/step on N GPUs minus on 1, over the all-reduce alone), ZeRO-1 against plain (ms/step, optimizer state
# and peak memory per rank), the cache's write and read rates, and the loss-curve comparison. Logs go to
# $OUT/multi-gpu-logs (or build-gpu/multi-gpu-logs). Exits non-zero when a check or a run failed.
#
# GoogleTest: carry a .gtest/ folder (cp -r /usr/src/googletest .gtest) as for tools/gpu.sh.
# Environment: SM_ARCH (default 90), STEPS (timed steps per run, default 20), BATCH (per GPU, default 16),
# BUCKET (f32 or bf16, default f32), RUN_TIMEOUT seconds per launched run (default 150).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
. tools/lib.sh

logs=${OUT:-$ROOT/build-gpu}/multi-gpu-logs
mkdir -p "$logs"
rows=()
failures=0
row() { rows+=("$(printf '%-34s %-6s %6s  %s' "$1" "$2" "$3" "$4")"); }
t_all=$(date +%s)

find_nvcc || die "nvcc not found (looked on PATH and in /usr/local/cuda/bin)"
ngpu=0
command -v nvidia-smi >/dev/null 2>&1 && ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null
nvidia-smi topo -m 2>/dev/null | head -8
echo "GPUs: $ngpu | nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') | commit $(git rev-parse --short HEAD 2>/dev/null || echo '?') | $(date -u +%Y-%m-%dT%H:%MZ)"
[ "$ngpu" -ge 2 ] || echo "warning: fewer than 2 GPUs visible: the multi-GPU runs are skipped"

gtest_opt=()
if [ -f .gtest/googletest/src/gtest-all.cc ]; then
  gtest_opt=(-Dgtest_source="$ROOT/.gtest")
elif ! pkg-config --exists gtest 2>/dev/null && [ ! -d /usr/src/googletest ]; then
  die "no GoogleTest: run 'cp -r /usr/src/googletest .gtest' on a machine that has it, and carry .gtest here"
fi
t0=$(date +%s)
setup_build build-gpu -Dcuda=enabled -Dnccl=auto -Dsm_arch="${SM_ARCH:-90}" -Dpython=disabled \
  -Dtests=true -Dexamples=true -Dbench=true -Dbuildtype=release "${gtest_opt[@]}"
nccl=$(grep -m1 -o "RETORT_HAS_NCCL [01]" build-gpu/retort_config.h 2>/dev/null | cut -d' ' -f2)
[ "$nccl" = 1 ] || echo "warning: NCCL was not found at build time: the multi-GPU checks will say so and fail"
if ninja -C build-gpu tests/dist_check tests/test_dist bench/bench_distill_step examples/train \
  examples/teacher-cache examples/distill >"$logs/build.log" 2>&1; then
  row build ok "$(($(date +%s) - t0))s" "build-gpu (sm ${SM_ARCH:-90}, NCCL ${nccl:-?})"
else
  grep -v '^\[[0-9]*/[0-9]*\] ' "$logs/build.log" | grep -m 40 -B2 -A8 'error\|FAILED'
  die "build failed (log: $logs/build.log)"
fi

# A fresh port per launch, so a run that left a socket in TIME_WAIT cannot block the next.
port=$((29500 + RANDOM % 1000))
launch() {  # name log n args...
  local name=$1 log=$2 n=$3 t0 st
  shift 3
  port=$((port + 1))
  t0=$(date +%s)
  if timeout -k 10 "${RUN_TIMEOUT:-150}" tools/launch.sh -n "$n" --master-port "$port" --timeout 60 "$@" \
    >"$log" 2>&1; then st=ok; else
    st=FAIL
    failures=$((failures + 1))
  fi
  # The verdict line when there is one, else the last line.
  local last
  last=$(grep -E 'dist_check: |summary: |launch.sh: ' "$log" | tail -1)
  [ -n "$last" ] || last=$(grep -v '^[[:space:]]*$' "$log" | tail -1)
  row "$name" "$st" "$(($(date +%s) - t0))s" "$(cut -c1-110 <<<"$last")"
}

# ---- checks ---------------------------------------------------------------------------------------------
# The CPU suite of the process group (rendezvous, timeouts, TCP collective, sharding, CPU data parallel).
t0=$(date +%s)
if timeout 300 build-gpu/tests/test_dist >"$logs/test_dist.log" 2>&1; then st=ok; else
  st=FAIL
  failures=$((failures + 1))
fi
row "test_dist (CPU, loopback)" "$st" "$(($(date +%s) - t0))s" "$(grep -E '^\[  (PASSED|FAILED)' "$logs/test_dist.log" | head -2 | tr '\n' ' ')"
if [ "$ngpu" -ge 2 ]; then
  launch "dist_check NCCL x$ngpu" "$logs/dist_check.log" "$ngpu" build-gpu/tests/dist_check
  [ "$ngpu" -gt 2 ] && launch "dist_check NCCL x2" "$logs/dist_check-2.log" 2 build-gpu/tests/dist_check
fi

# ---- scaling ----------------------------------------------------------------------------------------------
bench_args=(--mode dense --batch "${BATCH:-16}" --steps "${STEPS:-20}" --warmup 3 --bucket-dtype "${BUCKET:-f32}")
worlds=(1)
[ "$ngpu" -ge 2 ] && worlds+=(2)
[ "$ngpu" -ge 4 ] && worlds+=(4)
declare -A tok ms ar
for n in "${worlds[@]}"; do
  log=$logs/bench-x$n.log
  launch "bench_distill_step x$n" "$log" "$n" build-gpu/bench/bench_distill_step "${bench_args[@]}"
  line=$(grep -m1 '^\(\[rank 0\] \)\?summary' "$log")
  tok[$n]=$(sed -n 's/.*dense \([0-9]*\) tok\/s.*/\1/p' <<<"$line")
  ms[$n]=$(sed -n 's/.*tok\/s \([0-9.]*\) ms\/step.*/\1/p' <<<"$line")
  ar[$n]=$(sed -n 's/.*allreduce alone \([0-9.]*\) ms.*/\1/p' <<<"$line")
done

# ---- ZeRO-1 ----------------------------------------------------------------------------------------------------
# The same step on every GPU with AdamW's moments split over the ranks, against the plain run above.
nmax=${worlds[${#worlds[@]}-1]}
zms="" zstate="" zgib="" pstate="" pgib=""
if [ "$nmax" -ge 2 ]; then
  log=$logs/bench-x$nmax-zero1.log
  launch "bench_distill_step x$nmax ZeRO-1" "$log" "$nmax" build-gpu/bench/bench_distill_step "${bench_args[@]}" \
    --zero1 1
  line=$(grep -m1 '^\(\[rank 0\] \)\?summary' "$log")
  zms=$(sed -n 's/.*tok\/s \([0-9.]*\) ms\/step.*/\1/p' <<<"$line")
  zstate=$(sed -n 's/.*state \([0-9.]*\) MiB.*/\1/p' <<<"$line")
  zgib=$(sed -n 's/.* \([0-9.]*\) GiB.*/\1/p' <<<"$line")
  line=$(grep -m1 '^\(\[rank 0\] \)\?summary' "$logs/bench-x$nmax.log")
  pstate=$(sed -n 's/.*state \([0-9.]*\) MiB.*/\1/p' <<<"$line")
  pgib=$(sed -n 's/.* \([0-9.]*\) GiB.*/\1/p' <<<"$line")
fi

# ---- teacher cache in per-rank shards ------------------------------------------------------------------------
# A small teacher trained here, its top-32 cache of 2 MB of text written by 1 GPU and by every GPU (per-rank
# shards), and a short distill reading the N-rank cache on N GPUs and on 1: rates from the summaries.
tc=$logs/teacher-cache
rm -rf "$tc"
mkdir -p "$tc"
zcat data/kjv.txt.gz | head -c 2000000 >"$tc/t.txt"
TM=(--layers 4 --d-model 256 --heads 4 --context 256 --device cuda --sample-len 0 --eval-windows 8 --eval-every 0)
declare -A tcw tcr
tc_worlds=(1)
[ "$nmax" -ge 2 ] && tc_worlds+=("$nmax")
launch "teacher (train, 1 GPU)" "$tc/teacher.log" 1 build-gpu/examples/train --data "$tc/t.txt" --shards "$tc/s" \
  "${TM[@]}" --steps 60 --batch 16 --save "$tc/teacher.st"
if [ -f "$tc/teacher.st" ]; then
  for n in "${tc_worlds[@]}"; do
    launch "teacher-cache K 32 x$n" "$tc/cache-x$n.log" "$n" build-gpu/examples/teacher-cache \
      --teacher "$tc/teacher.st" --k 32 --batch 32 --device cuda --out "$tc/c$n/c"
    tcw[$n]=$(grep -m1 'summary: ' "$tc/cache-x$n.log" | sed -n 's/.*(\([0-9]*\) tok\/s).*/\1/p')
  done
  if [ -f "$tc/c$nmax/c.teacher" ]; then
    for n in "${tc_worlds[@]}"; do
      launch "distill reading the x$nmax cache, x$n" "$tc/distill-x$n.log" "$n" build-gpu/examples/distill \
        --teacher "$tc/teacher.st" --cache "$tc/c$nmax/c" --layers 2 --d-model 128 --heads 4 --steps 40 \
        --batch $((32 / n)) --device cuda --sample-len 0 --eval-windows 8 --eval-every 0 --svg "$tc/d$n.svg"
      tcr[$n]=$(grep -m1 'summary: ' "$tc/distill-x$n.log" | sed -n 's/.*(\([0-9]*\) tok\/s).*/\1/p')
    done
  fi
  rm -rf "$tc/c1" "$tc/c$nmax" "$tc/s"_*  # hundreds of MB: the logs stay
fi

# ---- table --------------------------------------------------------------------------------------------------
echo
grep -h -E '^(\[rank 0\] )?(ok  |FAIL)' "$logs"/dist_check*.log 2>/dev/null
grep -h -A6 '^\(\[rank 0\] \)\?loss curve (step' "$logs/dist_check.log" 2>/dev/null
echo
echo "scaling of the reference distillation step (dense KD + CE, 6 x 512, T 512, V 50257, K 64, batch ${BATCH:-16}/GPU, ${BUCKET:-f32} buckets):"
printf '%-6s %12s %10s %9s %16s %s\n' GPUs 'tokens/s' 'ms/step' speed-up 'allreduce alone' 'exposed (ms_N - ms_1) / allreduce'
for n in "${worlds[@]}"; do
  t=${tok[$n]:-}
  if [ -z "$t" ]; then
    printf '%-6s %12s\n' "$n" "(no result: see $logs/bench-x$n.log)"
    continue
  fi
  python3 - "$n" "$t" "${ms[$n]}" "${tok[1]:-}" "${ms[1]:-}" "${ar[$n]:-}" <<'PY'
import sys
n, t, ms, t1, ms1, ar = sys.argv[1:]
n = int(n); t = float(t); ms = float(ms)
sp = f"{t / float(t1):.2f}x" if t1 else "-"
target = {2: " (target 1.9x)", 4: " (target 3.7x)"}.get(n, "")
arc = f"{float(ar):.2f} ms" if ar else "-"
exp = "-"
if ar and ms1 and n > 1:
    frac = max(0.0, (ms - float(ms1)) / float(ar))
    exp = f"{min(frac, 1.0) * 100:.0f}% of the all-reduce exposed ({ms - float(ms1):+.2f} ms/step)"
print(f"{n:<6} {t:12.0f} {ms:10.2f} {sp + target:>9} {arc:>16} {exp}")
PY
done
if [ "$nmax" -ge 2 ]; then
  echo
  echo "ZeRO-1 on $nmax GPUs (same step, batch ${BATCH:-16}/GPU): ms/step ${zms:-?} vs plain ${ms[$nmax]:-?};" \
    "optimizer state on rank 0 ${zstate:-?} MiB vs ${pstate:-?} MiB; peak ${zgib:-?} GiB vs ${pgib:-?} GiB"
fi
echo "teacher cache (K 32, 2 MB of text, context 256): write ${tcw[1]:-?} tok/s on 1 GPU, ${tcw[$nmax]:-?} tok/s on" \
  "$nmax (per-rank shards); distill reading the $nmax-rank cache: ${tcr[$nmax]:-?} tok/s on $nmax GPUs, ${tcr[1]:-?} on 1"
echo
printf '%-34s %-6s %6s  %s\n' step status time result
for r in "${rows[@]}"; do echo "$r"; done
echo "total $(($(date +%s) - t_all)) s; logs: $logs"
[ "$failures" -eq 0 ]
