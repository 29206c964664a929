#!/usr/bin/env bash
# mpi-start.sh — how long an MPI program waits for its wire-up (issue 59), as root on one machine:
#
#   benches/mpi-start.sh [REPS]
#
# Builds a program with MPICH's and Open MPI's compilers that prints, as soon as MPI_Init returns,
# the wall clock in microseconds. Inside a 2-node allocation of 2 tasks per node it runs REPS times
#   srun --mpi=pmi2 -N2 -n4 ./init         (direct launch: the agents serve PMI-2 and its fences)
#   srun --mpi=pmix -N2 -n4 ./init_ompi    (direct launch of Open MPI: a PMIx server per node)
#   mpiexec.mpich ./init                   (MPICH's hydra, which starts its proxies through srun)
#   mpirun.openmpi ./init_ompi             (Open MPI's, which starts its orted through srun)
# and takes, for each run, the time from just before the command to the last rank's MPI_Init
# returning. Against `quorum dev --agent-processes` (2 agents) and, when the Slurm peer is up
# (../shared/peers/slurm/setup.sh: slurmctld and 4 slurmd on this host), against Slurm 22.05's
# own srun with its mpi/pmi2 plugin, on the same machine in the same run. Prints p50 and p90 in
# ms. Needs the release programs (cargo build --release --bins) under $CARGO_TARGET_DIR or target/.
set -euo pipefail
reps=${1:-30}
cd "$(dirname "$0")/.."
bin=$(realpath "${CARGO_TARGET_DIR:-target}/release")
work=$(mktemp -d /tmp/quorum-mpi-bench-XXXXXX)
chmod 755 "$work"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

cat >"$work/init.c" <<'C'
#include <mpi.h>
#include <stdio.h>
#include <sys/time.h>
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    struct timeval tv;
    gettimeofday(&tv, NULL);
    printf("%lld\n", (long long)tv.tv_sec * 1000000 + tv.tv_usec);
    MPI_Finalize();
    return 0;
}
C
mpicc.mpich -O2 -o "$work/init" "$work/init.c"
mpicc.openmpi -O2 -o "$work/init_ompi" "$work/init.c"

# The loop run inside an allocation: REPS runs of each way, one line "WAY MICROSECONDS" each.
cat >"$work/loop.sh" <<'SH'
#!/bin/bash
reps=$1
cd "$(dirname "$0")"
now() { date +%s%6N; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ways="direct mpiexec mpirun"
srun --mpi=list 2>&1 | grep -qw pmix && ways="direct pmix mpiexec mpirun"
for way in $ways; do
  for _ in $(seq "$reps"); do
    start=$(now)
    case $way in
      direct) srun --mpi=pmi2 -N2 -n4 ./init > out ;;
      pmix) srun --mpi=pmix -N2 -n4 ./init_ompi > out ;;
      mpiexec) mpiexec.mpich -n 4 ./init > out ;;
      mpirun) mpirun.openmpi -n 4 ./init_ompi > out ;;
    esac
    last=$(sort -n out | tail -1)
    # A way this system cannot run is said and skipped (the peer's mpi/pmix may find no library).
    [ "$(wc -l < out)" = 4 ] || { echo "$way: failed: $(cat out)" >&2; continue 2; }
    echo "$way $((last - start))"
  done
done
SH
chmod +x "$work/loop.sh"

summary() { # NAME FILE
  for way in direct pmix mpiexec mpirun; do
    grep -q "^$way " "$2" || continue
    grep "^$way " "$2" | awk '{print $2}' | sort -n | awk -v name="$1" -v way="$way" \
      '{v[NR]=$1} END {printf "%-6s %-8s n=%d p50 %.1f ms  p90 %.1f ms\n", name, way, NR, v[int(NR*0.5+0.5)]/1000, v[int(NR*0.9+0.5)]/1000}'
  done
}

# Quorum.
mkdir -p "$work/qbin"
for c in srun salloc; do ln -s "$bin/quorum" "$work/qbin/$c"; done
"$bin/quorum" dev --agent-processes --agents 2 --cpus 4 --port 7401 >"$work/dev.log" 2>&1 & pids+=($!)
for _ in $(seq 100); do grep -q "export QUORUM_CONTROLLERS" "$work/dev.log" && break; sleep 0.2; done
eval "$(grep -o 'export QUORUM_CONTROLLERS=.*' "$work/dev.log")"
until "$bin/quorum" nodes 2>/dev/null | grep -c idle | grep -q 2; do sleep 0.2; done
PATH=$work/qbin:$PATH salloc -N2 --ntasks-per-node=2 "$work/loop.sh" "$reps" > "$work/quorum.txt"
summary quorum "$work/quorum.txt"

# Slurm, when its peer runs here.
if [ -x /usr/bin/sinfo ] && /usr/bin/sinfo -h >/dev/null 2>&1; then
  /usr/bin/salloc -N2 --ntasks-per-node=2 "$work/loop.sh" "$reps" > "$work/slurm.txt" 2>"$work/slurm.err"
  summary slurm "$work/slurm.txt"
else
  echo "slurm: the peer is not running (../shared/peers/slurm/setup.sh)"
fi
