#!/bin/sh
# Runs the compose cluster of deploy/compose (three controllers, two agents, munged) from the
# image scripts/build-image.sh made, and the README's tour in it: who am I, a job, a two-node
# srun step with GPUs, a Slurm batch script, squeue and sinfo, a drain, a GPU fault drill, the
# leader stopped and a job run without it, the replicas' digests, a backup. Tears it down after.
# Needs podman and podman-compose (or docker compose: COMPOSE="docker compose") and root.
#
#   cargo build --release --bins && scripts/build-image.sh && scripts/test-compose.sh [IMAGE_DIR]
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
image=${1:-$root/target/image}/quorum:latest
compose=${COMPOSE:-podman-compose}
engine=${ENGINE:-podman}
file=$root/deploy/compose/compose.yaml

skopeo copy "oci:$image" containers-storage:localhost/quorum:latest >/dev/null
down() { $compose -f "$file" down -v >/dev/null 2>&1 || true; }
down
trap down EXIT
$compose -f "$file" up -d >/dev/null 2>&1

# The node01 container, whatever the project names it.
node01=$($engine ps --filter label=com.docker.compose.service=node01 --format '{{.Names}}' | head -n 1)
ex() { $engine exec -w /shared "$node01" "$@"; }
fail() { echo "test-compose: $*" >&2; exit 1; }
wait_for() { # what, command...
    what=$1; shift
    for _ in $(seq 1 120); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
    fail "timed out waiting for $what"
}
wait_for "both agents" sh -c "$engine exec $node01 quorum nodes | grep -c ' idle ' | grep -qx 2"

ex quorum whoami | grep -q "admin, by munge" || fail "whoami"
job=$(ex quorum submit -- hostname | sed -n 's/^Submitted job //p')
wait_for "job $job" sh -c "$engine exec $node01 quorum show $job | grep -q JobState=COMPLETED"
[ "$(ex cat quorum-$job.out)" = node01 ] || fail "job $job printed $(ex cat quorum-$job.out)"

step=$(ex quorum submit -N 2 --gpus h100:2 -t 10 -- srun sh -c 'echo $SLURM_PROCID $SLURMD_NODENAME' | sed -n 's/^Submitted job //p')
wait_for "job $step" sh -c "$engine exec $node01 quorum show $step | grep -q JobState=COMPLETED"
[ "$(ex sort quorum-$step.out | tr '\n' ' ')" = "0 node01 1 node02 " ] || fail "srun printed $(ex cat quorum-$step.out)"

ex sh -c 'printf "#!/bin/sh\n#SBATCH -J train\n#SBATCH --gres=gpu:h100:2\n#SBATCH -o %%x-%%j.out\necho GPUs \$CUDA_VISIBLE_DEVICES\n" > train.sh'
batch=$(ex sbatch --parsable train.sh)
wait_for "job $batch" sh -c "$engine exec $node01 quorum show $batch | grep -q JobState=COMPLETED"
[ "$(ex cat train-$batch.out)" = "GPUs 0,1" ] || fail "the batch script printed $(ex cat train-$batch.out)"

ex quorum admin drain node02 --reason "bad fan" >/dev/null
ex sinfo -h -n node02 -o '%t %E' | grep -q "drain bad fan" || fail "sinfo after a drain: $(ex sinfo -h -n node02 -o '%t %E')"
ex quorum admin resume node02 >/dev/null
ex quorum admin gpu-fault node01 0 xid:79 >/dev/null
wait_for "the GPU fault's drain" sh -c "$engine exec $node01 quorum nodes | grep node01 | grep -q 'XID 79'"
ex quorum admin gpu-fault node01 0 clear >/dev/null
wait_for "node01 healthy again" sh -c "$engine exec $node01 quorum nodes | grep node01 | grep -q idle"

# The leader stopped: another leads, a job runs; back, every replica agrees.
leader=$(ex quorum cluster | awk '$3 == "leader" { print $1 }')
ctl=$($engine ps --filter label=com.docker.compose.service=ctl$leader --format '{{.Names}}' | head -n 1)
$engine stop -t 5 "$ctl" >/dev/null
after=$(ex quorum submit -- hostname | sed -n 's/^Submitted job //p')
wait_for "job $after without the old leader" sh -c "$engine exec $node01 quorum show $after | grep -q JobState=COMPLETED"
$engine start "$ctl" >/dev/null
wait_for "every replica agreeing" sh -c "$engine exec $node01 quorum admin digest | grep -q 'all 3 replicas agree'"
ex quorum admin backup /shared/cluster.qbk | grep -q ": 4 jobs," || fail "backup: $(ex quorum admin backup /shared/again.qbk)"
echo "test-compose: the tour ran in the compose cluster (3 controllers, 2 agents)"
