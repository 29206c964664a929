#!/usr/bin/env bash
# compare-slurm.sh — the same workloads against real Slurm and against Quorum on this machine, in
# one run, alternating, and each figure for both with the ratio.
#
#   sudo ../shared/peers/slurm/setup.sh     # once: installs and starts Slurm 22.05 (see its README)
#   cargo build --release --bin quorum --bin quorum-dev
#   sudo benches/compare-slurm.sh           # ~25 min with the defaults
#
# Every workload is driven by the same shell code for both systems, through each system's own
# command-line client (sbatch/squeue against `quorum submit`/`quorum queue`): what a user or a
# workflow manager submitting jobs one command at a time gets. Each run starts on a fresh cluster:
# Slurm through the peer's cluster_start (empty state, job ids from 1), Quorum as `quorum dev`
# with a new data directory on disk (/var/tmp, like Slurm's StateSaveLocation). Same shape on
# both: 4 nodes of 2 CPUs (Slurm: 4 slurmd; Quorum: 4 agents), so 8 one-CPU jobs at once.
#
#   a  submit throughput: SUBMIT_JOBS held jobs from SUBMITTERS parallel loops of the CLI; jobs/s.
#      Quorum's submits are acknowledged once committed by a quorum and fsynced on each replica;
#      Slurm's once in slurmctld's memory (it saves its state every few seconds).
#      Also, Quorum only: `quorum bench submit --external` with SUBMITTERS long-lived API clients
#      (no process per submit), against the same fresh cluster: API_JOBS held jobs (default
#      SUBMIT_JOBS; at thousands a second a few thousand jobs last under a second, so the clients'
#      start-up weighs on the figure, and API_JOBS=20000 measures the steady rate).
#   b  submit to start: LAT_JOBS jobs one at a time on an idle cluster, each `date +%s.%N` into a
#      file; the time from the submit command returning to the time the job wrote (as
#      ../shared/peers/slurm/measure.sh b measures it).
#   c  1,000 trivial jobs: EXEC_JOBS x `true` from SUBMITTERS parallel submitters, from the first
#      submission until none is pending or running; all must be COMPLETED; jobs/s.
#   f  the floor under a and c: what the disk takes to sync a small write (each replica syncs
#      its log for every Raft append; Slurm syncs nothing before answering), the CPU one submit
#      costs each side (the client: perf stat over FLOOR_SUBMITS held submits one at a time; the
#      servers: their CPU in /proc over the same submits), and the CPU of a trivial job from
#      submit to COMPLETED on the whole machine (/proc/stat over EXEC_JOBS jobs from SUBMITTERS
#      loops, clients included). The table then says how many submits and jobs a second the
#      machine's cores could give at that cost, against what the targets need. Not in the
#      default SECTIONS.
#
# Slurm runs with its default SchedulerParameters and with SLURM_TUNED (its high-throughput
# guide's scheduling settings); the ratio is taken against the better of the two. Each figure is
# the median of REPS runs; the runs alternate Slurm default, Slurm tuned, Quorum.
# Env: REPS=3 SUBMIT_JOBS=2000 API_JOBS=$SUBMIT_JOBS SUBMITTERS=8 LAT_JOBS=20 EXEC_JOBS=1000 SECTIONS="a b c"
#      FLOOR_SUBMITS=200 (section f)
#      QUORUM=<repo>/target/release/quorum (or $CARGO_TARGET_DIR/release/quorum)
#      QUORUM_CGROUPS=1 (0: the agents give jobs rlimits only, as the Slurm peer runs task/none)
#      QUORUM_PORT=7301
#      SYSTEMS="slurm slurm-tuned quorum" (the systems to run, in this order)
#      QUORUM_CLI=quorum (sbatch: Quorum's submits go through its Slurm-named sbatch, with the
#      same arguments as Slurm's)
# The table goes to stdout and to $RUN/compare-<time>.txt.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PEER=${SLURM_PEER_DIR:-$REPO/../shared/peers/slurm}
[[ -f $PEER/lib.sh ]] || { echo "compare-slurm.sh: no Slurm peer at $PEER (set SLURM_PEER_DIR)" >&2; exit 1; }
# shellcheck source=/dev/null
source "$PEER/lib.sh"

SECTIONS=${SECTIONS:-a b c}
REPS=${REPS:-3}
SUBMIT_JOBS=${SUBMIT_JOBS:-2000}
API_JOBS=${API_JOBS:-$SUBMIT_JOBS}
SUBMITTERS=${SUBMITTERS:-8}
LAT_JOBS=${LAT_JOBS:-20}
EXEC_JOBS=${EXEC_JOBS:-1000}
FLOOR_SUBMITS=${FLOOR_SUBMITS:-200}
SLURM_TUNED=${SLURM_TUNED:-batch_sched_delay=0,sched_min_interval=0}
QUORUM_PORT=${QUORUM_PORT:-7301}
QUORUM_CGROUPS=${QUORUM_CGROUPS:-1}
if [[ -z ${QUORUM:-} ]]; then
    for QUORUM in "${CARGO_TARGET_DIR:-$REPO/target}/release/quorum" "$HOME/.cache/quorum-target/release/quorum"; do
        [[ -x $QUORUM ]] && break
    done
fi
[[ -x $QUORUM ]] || die "no quorum binary at $QUORUM: run cargo build --release --bin quorum --bin quorum-dev, or set QUORUM"
[[ -s $RUN/nnodes ]] || die "the Slurm peer is not set up: run $PEER/setup.sh first"
[[ $(nnodes) -eq 4 ]] || log "note: the Slurm peer has $(nnodes) node(s), not 4; Quorum still gets 4 agents"
export QUORUM_CONTROLLERS="127.0.0.1:$QUORUM_PORT,127.0.0.1:$((QUORUM_PORT + 1)),127.0.0.1:$((QUORUM_PORT + 2))"
QRUN=$RUN/quorum
# quorum dev makes its CA and runs its munged in its data directory.
export QUORUM_CA=$QRUN/data/security/certs/ca.pem QUORUM_MUNGE_SOCKET=$QRUN/data/security/munge/munge.socket
mkdir -p "$RUN/jobs" "$QRUN"
cd "$RUN/jobs"

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else printf "%.6f\n", (v[NR/2]+v[NR/2+1])/2}'; }
calc() { awk "BEGIN {printf \"%.6f\", $1}"; }
fmt() { awk -v v="$1" -v d="${2:-1}" 'BEGIN {printf "%.*f", d, v}'; }
has() { [[ " $SECTIONS " == *" $1 "* ]]; }

# The tuned Slurm also logs errors only (the high-throughput guide: less logging in the daemons);
# the rest of slurm.conf is the peer's.
eval "$(declare -f write_conf | sed '1s/^write_conf/peer_write_conf/')"
write_conf() {
    peer_write_conf
    if [[ -n ${SCHED_PARAMS:-} ]]; then
        sed -i 's/^SlurmctldDebug=.*/SlurmctldDebug=error/; s/^SlurmdDebug=.*/SlurmdDebug=error/' "$CONF"
    fi
}

# ---------------------------------------------------------------- the two systems
# start SYSTEM: a fresh cluster. SYSTEM is slurm, slurm-tuned or quorum.
QPID=""
start() {
    case $1 in
        slurm) SCHED_PARAMS="" WITH_BACKUP=0 CTLD_TIMEOUT="" cluster_start; sleep 1 ;;
        slurm-tuned) SCHED_PARAMS=$SLURM_TUNED WITH_BACKUP=0 CTLD_TIMEOUT="" cluster_start; sleep 1 ;;
        quorum) quorum_start ;;
    esac
}
stop() { if [[ $1 == quorum ]]; then quorum_stop; else cluster_stop; fi; }

quorum_start() {
    quorum_stop
    rm -rf "$QRUN/data"
    local cg=() i
    [[ $QUORUM_CGROUPS == 1 ]] || cg=(--no-cgroups)
    setsid "$QUORUM" dev --agents 4 --cpus 2 --port "$QUORUM_PORT" --data "$QRUN/data" "${cg[@]}" \
        </dev/null >>"$QRUN/dev.log" 2>&1 &
    QPID=$!
    for i in $(seq 300); do
        if [[ $("$QUORUM" nodes 2>/dev/null | awk '$3=="idle"' | wc -l) -eq 4 ]]; then return 0; fi
        kill -0 "$QPID" 2>/dev/null || die "quorum dev exited (see $QRUN/dev.log)"
        sleep 0.1
    done
    die "quorum dev: 4 idle nodes not seen within 30 s (see $QRUN/dev.log)"
}
quorum_stop() {
    [[ -n $QPID ]] || return 0
    kill -INT "$QPID" 2>/dev/null || true
    local i
    for i in $(seq 100); do kill -0 "$QPID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$QPID" 2>/dev/null || true
    wait "$QPID" 2>/dev/null || true
    QPID=""
}
trap 'quorum_stop; hosts_remove_backup' EXIT
# Quorum's sbatch: the quorum program under that name.
QSBATCH=$(mktemp -d)/sbatch
ln -s "$QUORUM" "$QSBATCH"
QSCANCEL=$(dirname "$QSBATCH")/scancel
ln -s "$QUORUM" "$QSCANCEL"

# submit_cmd SYSTEM HOLD NAME CMD: one submission through the system's CLI
submit_cmd() {
    local sys=$1 hold=$2 name=$3 cmd=$4
    if [[ $sys == quorum && ${QUORUM_CLI:-quorum} == sbatch ]]; then
        # shellcheck disable=SC2086
        "$QSBATCH" -Q $hold -o /dev/null -J "$name" --wrap="$cmd" >/dev/null
    elif [[ $sys == quorum ]]; then
        # shellcheck disable=SC2086
        "$QUORUM" submit $hold -o /dev/null -J "$name" -- sh -c "$cmd" >/dev/null
    else
        # shellcheck disable=SC2086
        sbatch -Q $hold -o /dev/null -J "$name" --wrap="$cmd" >/dev/null
    fi
}

# active SYSTEM: how many jobs are pending or running
active() {
    if [[ $1 == quorum ]]; then
        "$QUORUM" queue 2>/dev/null | tail -n +2 | wc -l
    else
        squeue -h -t PD,R,CG,CF,S -o %i 2>/dev/null | wc -l
    fi
}
idle() { [[ $(active "$1") -eq 0 ]]; }
# completed SYSTEM: how many jobs ended COMPLETED
completed() {
    if [[ $1 == quorum ]]; then
        "$QUORUM" queue --all --json | grep -c '"state": "COMPLETED"' || true
    else
        squeue -h -t CD -o %i | wc -l
    fi
}
held() {
    if [[ $1 == quorum ]]; then "$QUORUM" queue | grep -c 'JobHeldUser' || true
    else squeue -h -t PD -o %i | wc -l; fi
}

# parallel_submit SYSTEM TOTAL NSUB HOLD: TOTAL submissions from NSUB parallel loops; prints the
# elapsed seconds; dies if any failed
parallel_submit() {
    local sys=$1 total=$2 nsub=$3 hold=$4 p t0 t1 fails
    rm -f "$RUN"/jobs/submit-fail.*
    t0=$(now)
    for p in $(seq "$nsub"); do
        (
            f=0
            # submitter p sends every nsub-th of the total
            for _ in $(seq "$p" "$nsub" "$total"); do
                submit_cmd "$sys" "$hold" tp true 2>>"$RUN/log/compare-submit.err" || f=$((f + 1))
            done
            echo "$f" >"$RUN/jobs/submit-fail.$p"
        ) &
    done
    wait
    t1=$(now)
    fails=$(cat "$RUN"/jobs/submit-fail.* | awk '{s+=$1} END {print s+0}')
    [[ $fails -eq 0 ]] || die "$sys: $fails of $total submissions failed (see $RUN/log/compare-submit.err)"
    calc "$t1 - $t0"
}

# ---------------------------------------------------------------- workloads (one run each)
run_a() {
    local sys=$1 el n
    el=$(parallel_submit "$sys" "$SUBMIT_JOBS" "$SUBMITTERS" --hold)
    n=$(held "$sys")
    [[ $n -eq $SUBMIT_JOBS ]] || die "a: $sys: expected $SUBMIT_JOBS held jobs, found $n"
    calc "$n / $el"
}
run_a_api() {
    "$QUORUM" bench submit --external --clients "$SUBMITTERS" --jobs "$API_JOBS" --json 2>/dev/null \
        | grep -o '"per_second":[0-9.e+]*' | cut -d: -f2
}

wait_file() { local f=$1 i; for i in $(seq 3000); do [[ -s $f ]] && return 0; sleep 0.01; done; return 1; }
run_b() {
    local sys=$1 i f t0 ts lats=()
    for i in $(seq 0 "$LAT_JOBS"); do
        f=$RUN/jobs/lat-$sys-$i
        rm -f "$f" "$f.tmp"
        submit_cmd "$sys" "" lat "date +%s.%N > $f.tmp && mv $f.tmp $f"
        t0=$(now)
        wait_file "$f" || die "b: $sys: job $i did not start within 30 s"
        ts=$(cat "$f")
        [[ $i -eq 0 ]] || lats+=("$(calc "($ts - $t0) * 1000")")
        wait_for 30 "" idle "$sys" || die "b: $sys: job $i did not finish"
        # a random 0-1 s gap keeps the submissions out of phase with any periodic loop
        sleep "0.$(printf '%03d' $((RANDOM % 1000)))"
    done
    log "b: $sys: latencies (ms): ${lats[*]}"
    median "${lats[@]}"
}

run_c() {
    local sys=$1 t0 el n deadline
    t0=$(now)
    deadline=$(($(date +%s) + 1800))
    parallel_submit "$sys" "$EXEC_JOBS" "$SUBMITTERS" "" >/dev/null
    until [[ $(active "$sys") -eq 0 ]]; do
        [[ $(date +%s) -lt $deadline ]] || die "c: $sys: jobs still queued after 1800 s"
        sleep 0.25
    done
    el=$(calc "$(now) - $t0")
    n=$(completed "$sys")
    [[ $n -eq $EXEC_JOBS ]] || die "c: $sys: expected $EXEC_JOBS COMPLETED, found $n"
    calc "$EXEC_JOBS / $el"
}

# ---------------------------------------------------------------- f: the floor
# server_pids SYSTEM: the processes that serve submits (Slurm: slurmctld, the slurmds and munged,
# as the peer recorded them; Quorum: everything in quorum dev's session, its munged included)
server_pids() {
    if [[ $1 == quorum ]]; then ps -s "$QPID" -o pid= | tr -d ' '
    else cat "$RUN"/pids/*.pid 2>/dev/null; fi
}
# cpu_ticks PID...: their user+system CPU so far, in clock ticks
cpu_ticks() { local p; for p in "$@"; do awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null; done | awk '{s += $1} END {print s + 0}'; }
# busy_ticks: the whole machine's busy CPU so far (/proc/stat: all but idle and iowait)
busy_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }
HZ=$(getconf CLK_TCK)
# run_f_fsync: milliseconds per 4 KiB write synced (O_DSYNC) where the clusters keep their data
run_f_fsync() {
    local el
    el=$( { dd if=/dev/zero of="$RUN/fsync-probe" bs=4k count=500 oflag=dsync 2>&1 >/dev/null || true; } \
        | awk '/copied/ {for (i = 1; i <= NF; i++) if ($i == "s," || $i ~ /^s,/) print $(i - 1)}')
    rm -f "$RUN/fsync-probe"
    calc "$el * 1000 / 500"
}
# run_f SYSTEM: "client_ms server_ms job_ms", each CPU per submit or per job
run_f() {
    local sys=$1 pids c0 c1 client t0 t1 b0 b1 deadline
    mapfile -t pids < <(server_pids "$sys")
    # the client alone, one submit at a time (perf stat counts the process and its children)
    client=$(perf stat -x, -e task-clock -r "$FLOOR_SUBMITS" \
        bash -c "$(declare -f submit_cmd); QSBATCH=$QSBATCH QUORUM=$QUORUM QUORUM_CLI=${QUORUM_CLI:-quorum} submit_cmd $sys -H floor true" \
        2>&1 >/dev/null | awk -F, '/task-clock/ {print $1}')
    # perf counted bash too: take off what bash -c true costs
    local bare
    bare=$(perf stat -x, -e task-clock -r 50 bash -c true 2>&1 >/dev/null | awk -F, '/task-clock/ {print $1}')
    client=$(calc "$client - $bare")
    # the servers over the same number of held submits
    c0=$(cpu_ticks "${pids[@]}")
    for _ in $(seq "$FLOOR_SUBMITS"); do submit_cmd "$sys" -H floor true; done
    c1=$(cpu_ticks "${pids[@]}")
    # the held jobs go first, so that the trivial jobs meet an empty queue
    if [[ $sys == quorum ]]; then "$QSCANCEL" -t PENDING; else scancel -t PENDING; fi
    wait_for 60 "" idle "$sys" || die "f: $sys: the held jobs were not cancelled"
    # a trivial job, submit to COMPLETED, on the whole machine
    b0=$(busy_ticks)
    t0=$(now)
    deadline=$(($(date +%s) + 1800))
    parallel_submit "$sys" "$EXEC_JOBS" "$SUBMITTERS" "" >/dev/null
    until [[ $(active "$sys") -eq 0 ]]; do
        [[ $(date +%s) -lt $deadline ]] || die "f: $sys: jobs still queued after 1800 s"
        sleep 0.25
    done
    b1=$(busy_ticks)
    t1=$(now)
    log "f: $sys: $EXEC_JOBS jobs in $(calc "$t1 - $t0") s"
    echo "$client $(calc "($c1 - $c0) * 1000 / $HZ / $FLOOR_SUBMITS") $(calc "($b1 - $b0) * 1000 / $HZ / $EXEC_JOBS")"
}

# ---------------------------------------------------------------- run, alternating
declare -A RES
record() { RES[$1]="${RES[$1]:-} $2"; log "  $1: $2"; }
read -ra SYSTEMS <<<"${SYSTEMS:-slurm slurm-tuned quorum}"
START=$(date -u +%FT%TZ)
LOAD0=$(cut -d' ' -f1 /proc/loadavg)
for r in $(seq "$REPS"); do
    for sec in a b c f; do
        has "$sec" || continue
        for sys in "${SYSTEMS[@]}"; do
            # Slurm's submission path does not depend on its scheduling parameters: a once
            [[ $sec == a && $sys == slurm-tuned ]] && continue
            log "run $r/$REPS, $sec, $sys"
            start "$sys"
            v=$(run_"$sec" "$sys") || exit 1
            if [[ $sec == f ]]; then
                read -r fc fs fj <<<"$v"
                record "f-client/$sys" "$fc"
                record "f-server/$sys" "$fs"
                record "f-job/$sys" "$fj"
                v=$(run_f_fsync)
                record "f-fsync/$sys" "$v"
            else
                record "$sec/$sys" "$v"
            fi
            if [[ $sec == a && $sys == quorum ]]; then
                v=$(run_a_api) && [[ -n $v ]] || die "a: quorum bench submit --external failed"
                record "a-api/quorum" "$v"
            fi
            stop "$sys"
        done
    done
done
cluster_stop

# ---------------------------------------------------------------- table
# row LABEL UNIT DEC HIGHER_IS_BETTER KEY...: "label | slurm | slurm tuned | quorum | ratio"
med() { local v=(); [[ -z $1 ]] || read -ra v <<<"${RES[$1]:-}"; if [[ ${#v[@]} -gt 0 ]]; then median "${v[@]}"; fi; }
runs() { local v=() out="" x; [[ -z $1 ]] || read -ra v <<<"${RES[$1]:-}"; for x in "${v[@]}"; do out+="$(fmt "$x" "$2") "; done; echo "${out% }"; }
row() {
    local label=$1 unit=$2 dec=$3 higher=$4 skey=$5 tkey=$6 qkey=$7 s t q best ratio
    s=$(med "$skey"); t=$(med "$tkey"); q=$(med "$qkey")
    best=$s
    if [[ -n $t ]]; then
        if [[ $higher == 1 ]]; then best=$(awk -v a="$s" -v b="$t" 'BEGIN {print (b > a) ? b : a}')
        else best=$(awk -v a="$s" -v b="$t" 'BEGIN {print (b < a) ? b : a}'); fi
    fi
    if [[ $higher == 1 ]]; then ratio=$(awk -v q="$q" -v b="$best" 'BEGIN {printf "%.2fx", q / b}')
    else ratio=$(awk -v q="$q" -v b="$best" 'BEGIN {printf "%.2fx lower", b / q}'); fi
    printf '| %s | %s %s (%s) | %s | %s %s (%s) | %s |\n' "$label" \
        "$(fmt "$s" "$dec")" "$unit" "$(runs "$skey" "$dec")" \
        "$([[ -n $t ]] && echo "$(fmt "$t" "$dec") $unit ($(runs "$tkey" "$dec"))" || echo "same as default")" \
        "$(fmt "$q" "$dec")" "$unit" "$(runs "$qkey" "$dec")" "$ratio"
}
OUT=$RUN/compare-$(date +%Y%m%d-%H%M%S).txt
{
    echo "Quorum against Slurm on this machine, started $START, finished $(date -u +%FT%TZ); median of $REPS runs (the runs in brackets)"
    echo
    echo "| workload | Slurm, defaults | Slurm, tuned | Quorum | Quorum against Slurm's better |"
    echo "|---|---|---|---|---|"
    has a && row "a. submit throughput, $SUBMITTERS parallel CLI submitters, $SUBMIT_JOBS held jobs" "jobs/s" 0 1 a/slurm "" a/quorum
    has a && row "a. submit throughput, $SUBMITTERS API clients (quorum bench submit), $API_JOBS held jobs, against sbatch" "jobs/s" 0 1 a/slurm "" a-api/quorum
    has b && row "b. submit to start, idle cluster (median of $LAT_JOBS)" "ms" 1 0 b/slurm b/slurm-tuned b/quorum
    has c && row "c. $EXEC_JOBS x true on 8 CPUs, first submit to all COMPLETED" "jobs/s" 1 1 c/slurm c/slurm-tuned c/quorum
    if has f; then
        echo
        echo "The floor (section f; CPU in ms, median of $REPS runs):"
        echo
        echo "| per submit or job | Slurm, defaults | Slurm, tuned | Quorum |"
        echo "|---|---|---|---|"
        for k in "f-fsync:4 KiB write synced where the data is (ms)" "f-client:client CPU per held submit" \
            "f-server:servers' CPU per held submit" "f-job:CPU per trivial job, submit to COMPLETED, whole machine"; do
            printf '| %s | %s | %s | %s |\n' "${k#*:}" "$(fmt "$(med "${k%%:*}/slurm")" 2)" \
                "$(fmt "$(med "${k%%:*}/slurm-tuned")" 2)" "$(fmt "$(med "${k%%:*}/quorum")" 2)"
        done
        cores=$(nproc)
        for sys in "${SYSTEMS[@]}"; do
            sub=$(calc "$(med "f-client/$sys") + $(med "f-server/$sys")")
            echo "- $sys: a submit costs $(fmt "$sub" 2) ms of CPU in all, so $cores cores give at most $(fmt "$(calc "$cores * 1000 / $sub")" 0) submits/s; a trivial job costs $(fmt "$(med "f-job/$sys")" 2) ms, so at most $(fmt "$(calc "$cores * 1000 / $(med "f-job/$sys")")" 0) jobs/s"
        done
    fi
    echo
    echo "- machine: $(nproc) CPUs, $((MEM_TOTAL_MB / 1024)) GiB; $(slurmctld -V); quorum $("$QUORUM" --version | awk '{print $2}') ($(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo '?'))"
    echo "- Slurm tuned: SchedulerParameters=$SLURM_TUNED, SlurmctldDebug=error, SlurmdDebug=error"
    echo "- Quorum: quorum dev --agents 4 --cpus 2, cgroups $([[ $QUORUM_CGROUPS == 1 ]] && echo on || echo off); Slurm: 4 slurmd x 2 CPUs, task/none"
    echo "- load average at start $LOAD0, at end $(cut -d' ' -f1 /proc/loadavg)"
} | tee "$OUT"
log "saved to $OUT"
