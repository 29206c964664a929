#!/usr/bin/env bash
# Backfill on limits against backfill on predicted run times (issue 29), on the real traces in
# ../shared/traces: EASY with the users' time limits, then EASY with predictions, each with
# start estimates. Prints one line per run: trace, slice, planning, mean bounded slowdown, mean
# and p99 wait, utilization, the start estimates' median and mean absolute error (at submit and
# the last before the start) and the share within ten minutes, and the wall time.
#
#   benches/predict.sh [TRACE_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
traces=${1:-../shared/traces}
cargo build --release --bin quorum --bin quorum-dev >&2
bin=${CARGO_TARGET_DIR:-target}/release/quorum
printf '%-30s %-16s %-9s %8s %9s %9s %6s %22s %22s %9s %7s\n' trace slice planning bsld wait_mean \
  wait_p99 util 'submit med/mean/10min' 'last med/mean/10min' jobs_est wall_s
run() {
  local trace=$1 slice=$2 label=$3
  shift 3
  local out
  out=$(mktemp)
  /usr/bin/time -f '%e' -o "$out.time" "$bin" simulate "$traces/$trace" --policy easy --estimates --json -q "$@" >"$out"
  python3 - "$out" "$(cat "$out.time")" "$trace" "$slice" "$label" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
wall, trace, slc, label = sys.argv[2:6]
e = r["estimates"]
fmt = lambda k: "%d/%d/%.0f%%" % (k["median_abs_s"], round(k["mean_abs_s"]), 100 * k["within_10_min"])
print("%-30s %-16s %-9s %8.2f %9.0f %9d %5.1f%% %22s %22s %9d %7s" % (
    trace, slc, label, r["bsld_mean"], r["wait_mean_s"], r["wait_p99_s"], 100 * r["utilization"],
    fmt(e["at_submit"]), fmt(e["last"]), e["last"]["jobs"], wall))
PY
  rm -f "$out" "$out.time"
}
for spec in "KTH-SP2-1996-2.1-cln.swf.gz whole" "LANL-CM5-1994-4.1-cln.swf.gz whole" \
  "RICC-2010-2.swf.gz --count=10000"; do
  read -r trace slice <<<"$spec"
  args=()
  [[ $slice != whole ]] && args=("$slice")
  run "$trace" "$slice" limits "${args[@]}"
  run "$trace" "$slice" predicted --predict "${args[@]}"
done
