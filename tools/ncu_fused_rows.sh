#!/usr/bin/env bash
# Nsight Compute sections of the row kernels as the fused benches run them (CE cluster kernel, top-K kernel,
# distillation cluster kernel), one launch each, at the budgets of the issue-4 targets. Run on the GPU
# machine from the repository root; output in $OUT (or /tmp/out): ncu_ce.txt, ncu_topk.txt, ncu_jsd.txt and
# a summary on stdout. Figures from it are in bench/HISTORY.md (session 12).
set -uo pipefail
O=${OUT:-/tmp/out}
mkdir -p "$O"
meson setup build-gpu -Dcuda=enabled -Dsm_arch=90 -Dpython=disabled -Dtests=false -Dexamples=false -Dbench=true \
  -Dbuildtype=release >/dev/null || exit 1
ninja -C build-gpu bench/bench_fused_gpu >"$O/build.log" 2>&1 || {
  grep -B2 -A10 "error" "$O/build.log" | head -60
  exit 1
}
B=build-gpu/bench/bench_fused_gpu
SECS=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats
  --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis --section InstructionStats)
ncu "${SECS[@]}" -k regex:rows_cluster_kernel --launch-skip 8 --launch-count 1 $B --logits bf16 --budget-mib 512 \
  --reps 5 --only CE >"$O/ncu_ce.txt" 2>&1
ncu "${SECS[@]}" -k regex:topk_kernel --launch-skip 8 --launch-count 1 $B --logits bf16 --budget-mib 512 --reps 5 \
  --only "top-K KD" >"$O/ncu_topk.txt" 2>&1
ncu "${SECS[@]}" -k regex:distill_cluster --launch-skip 4 --launch-count 1 $B --logits bf16 --budget-mib 1024 \
  --reps 5 --only "online JSD" >"$O/ncu_jsd.txt" 2>&1
for f in ce topk jsd; do
  echo "==== $f"
  grep -E "  (Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per Thread|Grid Size|Block Size|Cluster Size|No Eligible|Eligible Warps|Warp Cycles Per Issued|Executed Ipc Active|Executed Instructions  )" \
    "$O/ncu_$f.txt" | head -16
done
