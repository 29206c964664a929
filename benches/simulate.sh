#!/usr/bin/env bash
# Replay speed of `quorum simulate` on the real traces in ../shared/traces (issue targets: all of
# KTH-SP2 with EASY backfill under 10 s; all of RICC under 5 minutes). Prints one line per run:
# trace, policy, jobs, cycles, wall seconds, peak resident memory.
#
#   benches/simulate.sh [TRACE_DIR] [POLICY...]
set -euo pipefail
cd "$(dirname "$0")/.."
traces=${1:-../shared/traces}
shift || true
policies=("${@:-easy}")
cargo build --release --bin quorum --bin quorum-dev >&2
bin=${CARGO_TARGET_DIR:-target}/release/quorum
printf '%-32s %-13s %8s %9s %9s %9s\n' trace policy jobs cycles wall_s peak_MB
for trace in KTH-SP2-1996-2.1-cln.swf.gz RICC-2010-2.swf.gz; do
  for policy in "${policies[@]}"; do
    out=$(mktemp)
    /usr/bin/time -f '%e %M' -o "$out.time" "$bin" simulate "$traces/$trace" --policy "$policy" --json -q >"$out"
    read -r wall kb <"$out.time"
    jobs=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["jobs"])' "$out")
    cycles=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["cycles"])' "$out")
    printf '%-32s %-13s %8s %9s %9s %9s\n' "$trace" "$policy" "$jobs" "$cycles" "$wall" "$((kb / 1024))"
    rm -f "$out" "$out.time"
  done
done
