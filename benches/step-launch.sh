#!/usr/bin/env bash
# step-launch.sh — how long a job step takes to start, run inside an allocation of 2 nodes:
#
#   salloc -N2 benches/step-launch.sh [REPS]       # Slurm's salloc and srun, or Quorum's
#   STEP_OPTS=--container-image=IMAGE salloc -N2 benches/step-launch.sh [REPS]   # in a container
#
# Each repetition runs `srun -N2 date +%s%N` (one task per node, each printing the wall clock
# when it starts) and records, from the moment srun is started: the latest task start (every
# task running) and srun's exit (the step done). Prints p50, p99 and max of both, in ms, and the
# srun it used. The same host clock serves both nodes (a one-machine cluster).
set -euo pipefail
reps=${1:-200}
srun_bin=$(command -v srun)
[[ -n ${SLURM_JOB_ID:-} ]] || { echo "run it inside an allocation: salloc -N2 $0 $reps" >&2; exit 2; }
out=$(mktemp)
trap 'rm -f "$out" "$out".t' EXIT
# Options for every step (STEP_OPTS, split on spaces), such as --container-image=IMAGE.
read -r -a opts <<<"${STEP_OPTS:-}"
srun -N2 "${opts[@]}" true >/dev/null 2>&1 || true  # warm up (caches, connections)
for _ in $(seq "$reps"); do
    t0=$(date +%s%N)
    srun -N2 "${opts[@]}" date +%s%N >"$out".t
    t1=$(date +%s%N)
    last=$(sort -n "$out".t | tail -1)
    [[ $(wc -l <"$out".t) == 2 ]] || { echo "a step printed $(wc -l <"$out".t) lines, not 2" >&2; exit 1; }
    echo "$(( (last - t0) / 1000 )) $(( (t1 - t0) / 1000 ))" >>"$out"
done
pct() { # column, percentile
    sort -n -k"$1","$1" "$out" | awk -v c="$1" -v p="$2" '{v[NR]=$c} END {i=int(NR*p/100+0.999); if (i<1) i=1; printf "%.1f", v[i]/1000}'
}
echo "srun: $srun_bin ($(srun --version 2>/dev/null | head -1 || true)); $reps steps of 2 tasks on $SLURM_JOB_NODELIST"
printf "all tasks running: p50 %s ms  p99 %s ms  max %s ms\n" "$(pct 1 50)" "$(pct 1 99)" "$(pct 1 100)"
printf "step done (srun exits): p50 %s ms  p99 %s ms  max %s ms\n" "$(pct 2 50)" "$(pct 2 99)" "$(pct 2 100)"
