#!/usr/bin/env bash
# Upgrades the controller replicas of a running Quorum cluster one at a time while it serves:
# the followers first, then the leader after handing leadership to an upgraded follower. Each
# replica is upgraded by a command you give (install the new binary, restart the service) and
# the next one starts only when it answers again from a new process and has applied everything
# the leader had committed. Commands of the new release stay off until every voter runs it (the
# cluster feature level, `quorum admin versions`). Then, with --agent-cmd, the agents, node by
# node, each waited for until its new process is connected: jobs run on through an agent restart
# (each runs under its own supervisor and the new agent re-attaches to it).
#
#   deploy/rolling-upgrade.sh --controllers ctl1:7101,ctl2:7101,ctl3:7101 \
#       --replica-cmd 'ssh {host} "sudo install -m755 /tmp/quorum-controller /usr/local/bin/ && sudo systemctl restart quorum-controller"' \
#       --agent-cmd 'ssh {node} "sudo install -m755 /tmp/quorum-agent /tmp/quorum-supervisor /usr/local/bin/ && sudo systemctl restart quorum-agent"'
#
# In --replica-cmd, {id} is the replica id, {addr} its host:port and {host} the host alone;
# in --agent-cmd, {node} is the node name.
set -euo pipefail

QUORUM=${QUORUM:-quorum}
controllers=${QUORUM_CONTROLLERS:-}
replica_cmd=""
agent_cmd=""
timeout=600

usage() {
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
    echo
    echo "options: --controllers LIST  --replica-cmd CMD  [--agent-cmd CMD]  [--timeout SECONDS per replica or node (600)]"
    echo "env: QUORUM (the quorum CLI, default: quorum on PATH), QUORUM_CONTROLLERS"
    exit 2
}

while [ $# -gt 0 ]; do
    case "$1" in
        --controllers) controllers=${2:?--controllers needs a value}; shift 2 ;;
        --replica-cmd) replica_cmd=${2:?--replica-cmd needs a value}; shift 2 ;;
        --agent-cmd) agent_cmd=${2:?--agent-cmd needs a value}; shift 2 ;;
        --timeout) timeout=${2:?--timeout needs a value}; shift 2 ;;
        -h|--help) usage ;;
        *) echo "rolling-upgrade: unknown argument '$1'" >&2; usage ;;
    esac
done
[ -n "$controllers" ] || { echo "rolling-upgrade: --controllers (or QUORUM_CONTROLLERS) is required" >&2; exit 2; }
[ -n "$replica_cmd" ] || { echo "rolling-upgrade: --replica-cmd is required" >&2; exit 2; }
case "$timeout" in ''|*[!0-9]*) echo "rolling-upgrade: --timeout must be a number of seconds, not '$timeout'" >&2; exit 2 ;; esac
export QUORUM_CONTROLLERS=$controllers

log() { printf '%s rolling-upgrade: %s\n' "$(date -u +%H:%M:%S)" "$*"; }

# The versions table: ID ADDRESS ROLE VERSION LEVEL APPLIED.
versions() { "$QUORUM" admin versions; }

# Members as "id addr role" lines; fails if any member does not answer.
members() {
    local table
    table=$(versions) || return 1
    echo "$table" | awk 'NR > 1 && $1 ~ /^[0-9]+$/ { print $1, $2, $3 }'
}

# step WHAT CMD WAIT...: runs the upgrade command CMD for WHAT, then `quorum admin WAIT...
# --started-after <before CMD>`; stops the whole upgrade at the first failure.
step() {
    local what=$1 cmd=$2 since
    shift 2
    since=$(( $(date +%s%N) / 1000000 ))
    log "$what: $cmd"
    if ! bash -c "$cmd"; then
        echo "rolling-upgrade: the upgrade command for $what failed; stopping here (the cluster still serves)" >&2
        exit 1
    fi
    if ! "$QUORUM" admin "$@" --started-after "$since" --timeout "$timeout"; then
        echo "rolling-upgrade: $what did not come back; stopping here (the cluster still serves)" >&2
        exit 1
    fi
}

upgrade_one() {
    local id=$1 addr=$2 host=${2%:*} cmd
    cmd=${replica_cmd//\{id\}/$id}
    cmd=${cmd//\{addr\}/$addr}
    cmd=${cmd//\{host\}/$host}
    step "replica $id ($addr)" "$cmd" wait-replica "$id"
}

before=$(members) || { echo "rolling-upgrade: cannot read the cluster's replicas" >&2; exit 1; }
if echo "$before" | awk '$3 == "unreachable" { bad = 1 } END { exit !bad }'; then
    echo "rolling-upgrade: a replica does not answer; fix it before upgrading:" >&2
    versions >&2
    exit 1
fi
leader=$(echo "$before" | awk '$3 == "leader" { print $1 }')
[ -n "$leader" ] || { echo "rolling-upgrade: no leader; the cluster must be healthy to upgrade" >&2; exit 1; }
log "before:"
versions

# Followers first.
while read -r id addr role; do
    [ "$id" = "$leader" ] && continue
    upgrade_one "$id" "$addr"
done <<< "$before"

# Then the leader, once another (upgraded) voter leads.
leader_addr=$(echo "$before" | awk -v l="$leader" '$1 == l { print $2 }')
log "handing leadership away from replica $leader"
"$QUORUM" admin transfer-leader
upgrade_one "$leader" "$leader_addr"

log "after:"
versions

[ -n "$agent_cmd" ] || exit 0
nodes=$("$QUORUM" nodes | awk 'NR > 1 { print $1 }') || { echo "rolling-upgrade: cannot list the nodes" >&2; exit 1; }
for node in $nodes; do
    step "the agent on $node" "${agent_cmd//\{node\}/$node}" wait-node "$node"
done
log "every replica and agent upgraded"
