#!/usr/bin/env bash
# Upgrades the controller replicas of a running Quorum cluster one at a time while it serves:
# the followers first, then the leader after handing leadership to an upgraded follower. Each
# replica is upgraded by a command you give (install the new binary, restart the service) and
# the next one starts only when it answers again from a new process and has applied everything
# the leader had committed. Commands of the new release stay off until every voter runs it (the
# cluster feature level, `quorum admin versions`).
#
#   deploy/rolling-upgrade.sh --controllers ctl1:7101,ctl2:7101,ctl3:7101 \
#       --replica-cmd 'ssh {host} "sudo install -m755 /tmp/quorum-controller /usr/local/bin/ && sudo systemctl restart quorum-controller"'
#
# In the command, {id} is the replica id, {addr} its host:port and {host} the host alone.
# Agents are not restarted here: an agent restart still ends the jobs it runs (issue 5), so
# upgrade agents node by node when they are idle.
set -euo pipefail

QUORUM=${QUORUM:-quorum}
controllers=${QUORUM_CONTROLLERS:-}
replica_cmd=""
timeout=600

usage() {
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
    echo
    echo "options: --controllers LIST  --replica-cmd CMD  [--timeout SECONDS per replica (600)]"
    echo "env: QUORUM (the quorum CLI, default: quorum on PATH), QUORUM_CONTROLLERS"
    exit 2
}

while [ $# -gt 0 ]; do
    case "$1" in
        --controllers) controllers=${2:?--controllers needs a value}; shift 2 ;;
        --replica-cmd) replica_cmd=${2:?--replica-cmd needs a value}; shift 2 ;;
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

upgrade_one() {
    local id=$1 addr=$2 host=${2%:*} cmd since
    cmd=${replica_cmd//\{id\}/$id}
    cmd=${cmd//\{addr\}/$addr}
    cmd=${cmd//\{host\}/$host}
    since=$(( $(date +%s%N) / 1000000 ))
    log "replica $id ($addr): $cmd"
    if ! bash -c "$cmd"; then
        echo "rolling-upgrade: the upgrade command for replica $id failed; stopping here (the cluster still serves)" >&2
        exit 1
    fi
    if ! "$QUORUM" admin wait-replica "$id" --started-after "$since" --timeout "$timeout"; then
        echo "rolling-upgrade: replica $id did not come back; stopping here (the cluster still serves)" >&2
        exit 1
    fi
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
