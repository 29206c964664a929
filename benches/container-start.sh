#!/usr/bin/env bash
# container-start.sh — what a container costs a step (issue 58), as root on one machine:
#
#   benches/container-start.sh [REPS]
#
# Starts a registry on loopback (Debian's docker-registry, plain HTTP on 127.0.0.1:5599), builds
# the test image from busybox-static with umoci (tag 1, and tags s1..s10 that each add a small
# layer on tag 1's base) and pushes it with skopeo, then starts `quorum dev --agent-processes
# --no-cgroups --http-registries 127.0.0.1:5599` and, inside a 2-node allocation, measures with
# a loop like benches/step-launch.sh's: `srun -N2 echo go` bare and in the cached container
# (REPS steps each, two rounds),
# and cold starts (both nodes' caches emptied before each of 5 steps). Then the disk the cache
# takes for the 10 tags sharing a base, and the agents' memory. Needs the release programs
# (cargo build --release --bins) under $CARGO_TARGET_DIR or target/.
set -euo pipefail
reps=${1:-100}
cd "$(dirname "$0")/.."
bin=${CARGO_TARGET_DIR:-target}/release
port=5599
work=$(mktemp -d /tmp/quorum-container-bench-XXXXXX)
chmod 755 "$work"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

cat >"$work/registry.yml" <<YML
version: 0.1
log: {level: error}
storage: {filesystem: {rootdirectory: $work/registry}}
http: {addr: 127.0.0.1:$port}
YML
docker-registry serve "$work/registry.yml" >"$work/registry.log" 2>&1 & pids+=($!)
until curl -fsS "http://127.0.0.1:$port/v2/" >/dev/null 2>&1; do sleep 0.1; done

layout=$work/layout
umoci init --layout "$layout"
umoci new --image "$layout:1"
umoci unpack --image "$layout:1" "$work/b1" >/dev/null
mkdir -p "$work/b1/rootfs/bin" "$work/b1/rootfs/etc" "$work/b1/rootfs/tmp"
chmod 1777 "$work/b1/rootfs/tmp"
cp /bin/busybox "$work/b1/rootfs/bin/busybox"
for a in sh date true cat echo; do ln -s busybox "$work/b1/rootfs/bin/$a"; done
echo 'NAME="bench"' >"$work/b1/rootfs/etc/os-release"
umoci repack --image "$layout:1" "$work/b1"
umoci config --image "$layout:1" --config.env=PATH=/bin >/dev/null
push() { skopeo copy --quiet --dest-tls-verify=false "oci:$layout:$1" "docker://127.0.0.1:$port/bench/busybox:$1"; }
push 1
for i in $(seq 1 10); do
    umoci unpack --image "$layout:1" "$work/s$i" >/dev/null
    head -c 65536 /dev/urandom >"$work/s$i/rootfs/etc/s$i"
    umoci repack --image "$layout:s$i" "$work/s$i"
    push "s$i"
done
image=127.0.0.1:$port#bench/busybox

"$bin/quorum-dev" dev --data "$work/dev" --port 7301 --agent-processes --no-cgroups \
    --http-registries "127.0.0.1:$port" >"$work/dev.log" 2>&1 & pids+=($!)
until grep -q '^  export ' "$work/dev.log"; do sleep 0.2; done
eval "$(grep '^  export ' "$work/dev.log")"
export PATH=$work/dev/slurm:$bin:$PATH
until quorum nodes 2>/dev/null | grep -c idle | grep -q 2; do sleep 0.2; done

# From srun's start: its first line of output (a task running) and its exit, REPS steps in one
# allocation; prints p50/p99/max in ms.
cat >"$work/steps.sh" <<'STEPS'
#!/usr/bin/env bash
set -euo pipefail
reps=$1; shift
out=$(mktemp)
srun -N2 "$@" true >/dev/null
for _ in $(seq "$reps"); do
    t0=$(date +%s%N)
    srun -N2 "$@" echo go | { read -r _; date +%s%N >"$out.first"; cat >/dev/null; }
    t1=$(date +%s%N)
    echo "$(( ($(cat "$out.first") - t0) / 1000 )) $(( (t1 - t0) / 1000 ))" >>"$out"
done
pct() { sort -n -k"$1","$1" "$out" | awk -v c="$1" -v p="$2" '{v[NR]=$c} END {i=int(NR*p/100+0.999); if (i<1) i=1; printf "%.1f", v[i]/1000}'; }
printf "first line: p50 %s ms  p99 %s ms  max %s ms;  srun done: p50 %s ms  p99 %s ms\n" \
    "$(pct 1 50)" "$(pct 1 99)" "$(pct 1 100)" "$(pct 2 50)" "$(pct 2 99)"
STEPS
chmod +x "$work/steps.sh"
for round in 1 2; do
    echo "== round $round, bare: srun -N2 echo go"
    salloc -N2 "$work/steps.sh" "$reps" 2>/dev/null
    echo "== round $round, cached container: srun -N2 --container-image=$image:1 echo go"
    salloc -N2 "$work/steps.sh" "$reps" "--container-image=$image:1"
done

echo "== cold: both nodes' caches emptied before each step"
caches=("$work"/dev/agent-node0*/images)
for i in 1 2 3 4 5; do
    for c in "${caches[@]}"; do rm -rf "${c:?}"/layers/* "${c:?}"/images/*; done
    t0=$(date +%s%N)
    salloc -N2 srun -N2 "--container-image=$image:1" echo go 2>/dev/null | { read -r _; date +%s%N >"$work/cold.$i"; cat >/dev/null; }
    t1=$(date +%s%N)
    echo "cold $i: first line after $(( ($(cat "$work/cold.$i") - t0) / 1000000 )) ms, salloc done after $(( (t1 - t0) / 1000000 )) ms (its allocation included)"
done

echo "== 10 tags sharing one base"
rss() { ps -C quorum-agent -o rss= | awk '{s+=$1} END {print s}'; }
before=$(rss)
for i in $(seq 1 10); do salloc -N2 srun -N2 "--container-image=$image:s$i" true 2>/dev/null; done
after=$(rss)
base=$(du -sb "${caches[0]}"/layers/* 2>/dev/null | sort -n | tail -1 | cut -f1)
total=$(du -sb "${caches[0]}" | cut -f1)
echo "node01's cache: $total bytes on disk for $(ls "${caches[0]}"/images | wc -l) images; the shared base layer $base bytes (10 copies would be $((base * 10)))"
echo "both agents' resident memory: $before KiB before the 10 tags, $after KiB after"
quorum nodes
