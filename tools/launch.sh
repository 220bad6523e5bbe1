#!/usr/bin/env bash
# Starts N local processes of one program with the launcher environment retort reads (RANK, WORLD_SIZE,
# LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), one per GPU. Forwards SIGINT and SIGTERM to all of
# them; when one fails, stops the others and exits with its status. Exits 0 when every rank exits 0.
#
# Usage: tools/launch.sh -n N [--nnodes M --node-rank K] [--master-addr HOST] [--master-port PORT]
#                        [--timeout SECONDS] program [args...]
#   -n N             processes on this host (default: the GPUs nvidia-smi lists, else 1)
#   --nnodes M       hosts in the run (default 1); run this script once per host with its --node-rank
#   --node-rank K    this host's index in [0, M): its ranks are K*N .. K*N+N-1
#   --master-addr    the host of rank 0 (default 127.0.0.1; set it to node 0's address on several hosts)
#   --master-port    rank 0's rendezvous port (default 29500, or MASTER_PORT)
#   --timeout S      seconds a rank waits for another (RETORT_DIST_TIMEOUT, default 300)
# Each rank's output lines are prefixed with "[rank R] " when N > 1 (RETORT_LAUNCH_PREFIX=0: raw output).
set -uo pipefail

n=""
nnodes=1
node_rank=0
addr=${MASTER_ADDR:-127.0.0.1}
port=${MASTER_PORT:-29500}
usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "launch.sh: $*" >&2; exit 2; }
int_arg() { [[ "$2" =~ ^[0-9]+$ ]] || die "$1 needs a non-negative integer, got '$2'"; }
while [ $# -gt 0 ]; do
  case "$1" in
    -n | --nproc) int_arg "$1" "${2:-}"; n=$2; shift 2 ;;
    --nnodes) int_arg "$1" "${2:-}"; nnodes=$2; shift 2 ;;
    --node-rank) int_arg "$1" "${2:-}"; node_rank=$2; shift 2 ;;
    --master-addr) [ -n "${2:-}" ] || die "--master-addr needs a host"; addr=$2; shift 2 ;;
    --master-port) int_arg "$1" "${2:-}"; port=$2; shift 2 ;;
    --timeout) [ -n "${2:-}" ] || die "--timeout needs seconds"; export RETORT_DIST_TIMEOUT=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { usage >&2; die "no program given"; }
if [ -z "$n" ]; then
  n=1
  if command -v nvidia-smi >/dev/null 2>&1; then
    g=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    [ "${g:-0}" -ge 1 ] && n=$g
  fi
fi
[ "$n" -ge 1 ] || die "-n must be at least 1"
[ "$nnodes" -ge 1 ] || die "--nnodes must be at least 1"
[ "$node_rank" -lt "$nnodes" ] || die "--node-rank $node_rank must be below --nnodes $nnodes"
[ "$port" -ge 1 ] && [ "$port" -le 65535 ] || die "--master-port $port is outside [1, 65535]"
world=$((n * nnodes))

pids=()
# Whether process $1 still runs: an exited rank that bash has not reaped yet (a zombie, as inside a trap)
# counts as gone.
alive() {
  if [ -r "/proc/$1/stat" ]; then
    local st
    st=$(sed 's/.*) \(.\).*/\1/' "/proc/$1/stat" 2>/dev/null) || return 1
    [ -n "$st" ] && [ "$st" != Z ]
  else
    kill -0 "$1" 2>/dev/null
  fi
}
cleanup() {  # signal [grace seconds]
  local p
  for p in "${pids[@]}"; do kill -s "$1" "$p" 2>/dev/null; done
  local t=0
  while [ "$t" -lt "${2:-10}" ]; do
    local alive=0
    for p in "${pids[@]}"; do alive "$p" && alive=1; done
    [ "$alive" = 0 ] && return
    sleep 1
    t=$((t + 1))
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
}
finish() {  # grace seconds: waits for every rank to exit on its own, then stops the rest
  local t=0 p alive
  while [ "$t" -lt "$((10 * $1))" ]; do
    alive=0
    for p in "${pids[@]}"; do alive "$p" && alive=1; done
    [ "$alive" = 0 ] && return
    sleep 0.1
    t=$((t + 1))
  done
  cleanup TERM 10
}
on_signal() {
  echo "launch.sh: $1: stopping $world rank(s)" >&2
  cleanup "$1" 10
  exit 130
}
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM

# Each rank in a process group of its own: a Ctrl-C at the terminal reaches this script alone, which forwards
# it once (a rank that got it twice, from the terminal and from here, would abort instead of saving).
set -m
for ((i = 0; i < n; i++)); do
  rank=$((node_rank * n + i))
  if [ "$n" -gt 1 ] && [ "${RETORT_LAUNCH_PREFIX:-1}" != 0 ]; then
    # The rank runs in a subshell whose output goes through sed; the subshell execs the program, so its pid
    # is the program's and signals reach it.
    RANK=$rank WORLD_SIZE=$world LOCAL_RANK=$i LOCAL_WORLD_SIZE=$n MASTER_ADDR=$addr MASTER_PORT=$port \
      "$@" > >(sed -u "s/^/[rank $rank] /") 2> >(sed -u "s/^/[rank $rank] /" >&2) &
  else
    RANK=$rank WORLD_SIZE=$world LOCAL_RANK=$i LOCAL_WORLD_SIZE=$n MASTER_ADDR=$addr MASTER_PORT=$port "$@" &
  fi
  pids+=($!)
done

# The first rank to exit decides: a failure stops the others; a success waits for the rest. Polled, so a
# signal is handled at once and each rank's status is read exactly once.
status=0
declare -A running
for i in "${!pids[@]}"; do running[${pids[$i]}]=$((node_rank * n + i)); done
while [ "${#running[@]}" -gt 0 ]; do
  for p in "${!running[@]}"; do
    alive "$p" && continue
    wait "$p"
    rc=$?
    r=${running[$p]}
    unset "running[$p]"
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then
      status=$rc
      if [ "$rc" = 130 ] || [ "$rc" = 143 ]; then
        # Stopped on request (a signal to one rank): the ranks agree to stop after the same step and rank 0
        # saves the run, so the others get time to finish before a signal would cut the save short.
        echo "launch.sh: rank $r stopped on a signal (status $rc); waiting for the others to stop too" >&2
        finish 60
      else
        echo "launch.sh: rank $r exited with status $rc; stopping the others" >&2
        cleanup TERM 10
      fi
    fi
  done
  sleep 0.1
done
wait  # the output filters
exit "$status"
