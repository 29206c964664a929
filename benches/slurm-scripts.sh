#!/usr/bin/env bash
# How Slurm 22.05 and Quorum read the batch scripts of cli/tests/scripts/: each is submitted held
# to each, on matching configurations (2 nodes of 8 CPUs, 32768 MB and 4 h100 GPUs, one default
# partition with a 1-hour default and a 7-day maximum time, 1024 MB per CPU by default), and
# what each recorded (`scontrol show job -o`: nodes, tasks, CPUs, GPUs, memory, time limit) is
# compared; then the job is cancelled. Writes cli/tests/scripts/slurm.tsv (what Slurm said,
# which `cargo test` compares Quorum with) and prints the table and the counts.
#
# Needs root, the Slurm peer's packages (../shared/peers/slurm/setup.sh installs them) and a
# release build (QUORUM, default $CARGO_TARGET_DIR/release/quorum). Slurm runs only while this
# does: the peer's own setup is restored by its setup.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
scripts=$here/cli/tests/scripts
peer=${SLURM_PEER_DIR:-$here/../shared/peers/slurm}
target=${CARGO_TARGET_DIR:-$here/target}
QUORUM=${QUORUM:-$target/release/quorum}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The fields compared: nodes tasks cpus gpus mem_mb time_s, from `scontrol show job -o`.
fields() {
    python3 - "$1" <<'PY'
import re, sys
line = sys.argv[1]
def field(key):
    m = re.search(r"(?:^| )" + re.escape(key) + r"=(\S*)", line)
    return m.group(1) if m else ""
tres, tasks, limit = field("TRES"), field("NumTasks"), field("TimeLimit")
kv = dict(p.split("=", 1) for p in tres.split(",") if "=" in p)
# Without accounting, Slurm's TRES leaves GPUs out: count them from what the job asks per job,
# node or task.
def gpus(v):
    m = re.search(r"gpu(?::[A-Za-z0-9_.-]+)?[:=](\d+)", v)
    return int(m.group(1)) if m else 0
if "gres/gpu" not in kv:
    nodes, ntasks = int(kv.get("node", "0") or 0), int(tasks or 0)
    total = gpus(field("TresPerJob")) + gpus(field("TresPerNode")) * nodes + gpus(field("TresPerTask")) * ntasks
    kv["gres/gpu"] = str(total)
def mb(v):
    m = re.fullmatch(r"([0-9.]+)([KMGT]?)", v or "0")
    n, u = float(m.group(1)), m.group(2)
    return round(n * {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[u])
def secs(t):
    if t in ("UNLIMITED", "Partition_Limit", ""):
        return 0
    d, _, rest = t.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return (int(d) if d else 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
print(kv.get("node", "0"), tasks or "0", kv.get("cpu", "0"), kv.get("gres/gpu", "0"), mb(kv.get("mem")), secs(limit), sep="\t")
PY
}

# submit_all NAME SBATCH SCONTROL SCANCEL: a line per script, "script<TAB>ok<TAB>fields" or
# "script<TAB>refused<TAB>message". Whether it is accepted is what `sbatch --test-only` says
# (a held job skips Slurm's check that nodes could ever hold it); what it asks for is what the
# held job records.
submit_all() {
    local name=$1 sbatch=$2 scontrol=$3 scancel=$4 f out id line
    mkdir -p "$work/$name"
    for f in "$scripts"/*.sh; do
        if out=$(cd "$work/$name" && "$sbatch" --test-only "$f" 2>&1) \
            && out=$(cd "$work/$name" && "$sbatch" -H --parsable "$f" 2>&1); then
            id=$(tail -n1 <<<"$out" | cut -d';' -f1)
            line=$("$scontrol" -o show job "$id" | head -n1)
            printf '%s\tok\t%s\n' "$(basename "$f")" "$(fields "$line")"
            "$scancel" "$id" >/dev/null 2>&1 || true
        else
            printf '%s\trefused\t%s\n' "$(basename "$f")" "$(tr '\n\t' '  ' <<<"$out" | cut -c1-160)"
        fi
    done
}

# ---- Slurm, configured as quorum dev's cluster is.
# shellcheck source=/dev/null
source "$peer/lib.sh"
eval "$(declare -f write_conf | sed '1s/write_conf/peer_write_conf/')"
write_conf() {
    peer_write_conf
    sed -i -e 's/CPUs=[0-9]* RealMemory=[0-9]*/CPUs=8 RealMemory=32768 Gres=gpu:h100:4/' \
        -e 's/^DefMemPerCPU=.*/DefMemPerCPU=1024/' \
        -e 's/^PartitionName=batch \(Nodes=[^ ]*\) Default=YES MaxTime=INFINITE/PartitionName=gpu \1 Default=YES DefaultTime=01:00:00 MaxTime=7-00:00:00/' "$CONF"
    printf 'GresTypes=gpu\nSlurmdParameters=config_overrides\n' >>"$CONF"
    mkdir -p "$RUN/gpus"
    touch "$RUN"/gpus/h100-{0..3}
    echo "Name=gpu Type=h100 File=$RUN/gpus/h100-[0-3]" >"$(dirname "$CONF")/gres.conf"
}
peer_nodes=$(nnodes)
echo 2 >"$RUN/nnodes"
cluster_start >&2
submit_all slurm sbatch scontrol scancel >"$work/slurm.tsv"
cluster_stop >&2
rm -f "$(dirname "$CONF")/gres.conf"
# The peer as it was (its setup.sh or cluster_start writes its own configuration again).
echo "$peer_nodes" >"$RUN/nnodes"

# ---- Quorum: quorum dev, its Slurm commands linked.
"$QUORUM" install-slurm-commands "$work/bin" >/dev/null
"$QUORUM" dev --data "$work/dev" --port 7301 --no-cgroups >"$work/dev.log" 2>&1 &
dev=$!
export QUORUM_CONTROLLERS=127.0.0.1:7301,127.0.0.1:7302,127.0.0.1:7303
export QUORUM_CA=$work/dev/security/certs/ca.pem QUORUM_MUNGE_SOCKET=$work/dev/security/munge/munge.socket
for _ in $(seq 100); do "$work/bin/sinfo" -h -o %D 2>/dev/null | grep -q 2 && break; sleep 0.2; done
submit_all quorum "$work/bin/sbatch" "$work/bin/scontrol" "$work/bin/scancel" >"$work/quorum.tsv"
kill "$dev"
wait "$dev" 2>/dev/null || true

# ---- The table and the counts.
cp "$work/slurm.tsv" "$scripts/slurm.tsv"
python3 - "$work/slurm.tsv" "$work/quorum.tsv" <<'PY'
import sys
def load(p):
    return {l.split("\t")[0]: l.rstrip("\n").split("\t")[1:] for l in open(p)}
slurm, quorum = load(sys.argv[1]), load(sys.argv[2])
both = agree = s_ok = q_ok = refused_both = 0
print("| script | Slurm (nodes tasks cpus gpus mem_mb time_s) | Quorum | |")
print("|---|---|---|---|")
for name in sorted(slurm):
    s, q = slurm[name], quorum.get(name, ["missing", ""])
    s_ok += s[0] == "ok"
    q_ok += q[0] == "ok"
    if s[0] == "ok" and q[0] == "ok":
        both += 1
        same = s[1:] == q[1:]
        agree += same
        verdict = "agree" if same else "differ"
    elif s[0] == q[0]:
        refused_both += 1
        verdict = "both refuse"
    else:
        verdict = "only Slurm accepts" if s[0] == "ok" else "only Quorum accepts"
    show = lambda r: " ".join(r[1:]) if r[0] == "ok" else "refused: " + r[1][:70]
    print(f"| {name} | {show(s)} | {show(q)} | {verdict} |")
print()
print(f"scripts: {len(slurm)}; Slurm accepts {s_ok}, Quorum accepts {q_ok}; both accept {both}, "
      f"of which they agree on {agree}; both refuse {refused_both}")
PY
