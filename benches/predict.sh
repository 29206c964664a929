#!/usr/bin/env bash
# Backfill on limits against backfill on predicted run times (issue 29), on the real traces in
# ../shared/traces, each in queue order and shortest planned run time first (SJBF; with
# predictions, EASY++): EASY with the users' time limits, then with predictions. Prints one
# line per run: trace, slice, planning, mean bounded slowdown, mean and p99 wait, utilization,
# the start estimates' median and mean absolute error (at submit and the last before the
# start) and the share within ten minutes, and the wall time.
#
#   benches/predict.sh [TRACE_DIR] [estimates|whole|forecasts|order]
#
# `estimates` (default): KTH-SP2 and LANL-CM5 whole and RICC's first 10,000 jobs, with start
# estimates. `whole`: RICC whole (447,000 jobs), without start estimates (estimating every
# waiting job's start after every cycle of the whole of RICC takes hours on two cores).
# `forecasts` (issue 62): the same three, schedules on limits, estimates on limits against the
# leader's forecasts (`--estimates`), in queue order and shortest limit first. `order`: RICC
# whole and its jobs 260,000-319,999, on limits, in queue order and shortest limit first,
# without estimates (the tail of the default order).
set -euo pipefail
cd "$(dirname "$0")/.."
traces=${1:-../shared/traces}
part=${2:-estimates}
[[ -n ${NO_BUILD:-} ]] || cargo build --release --bin quorum --bin quorum-dev >&2
bin=${CARGO_TARGET_DIR:-target}/release/quorum
printf '%-30s %-16s %-20s %8s %9s %9s %6s %22s %22s %9s %7s\n' trace slice planning bsld wait_mean \
  wait_p99 util 'submit med/mean/10min' 'last med/mean/10min' jobs_est wall_s
run() {
  local trace=$1 slice=$2 label=$3
  shift 3
  local out
  out=$(mktemp)
  /usr/bin/time -f '%e' -o "$out.time" "$bin" simulate "$traces/$trace" --policy easy --json -q "$@" >"$out"
  python3 - "$out" "$(cat "$out.time")" "$trace" "$slice" "$label" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
wall, trace, slc, label = sys.argv[2:6]
e = r.get("estimates")
fmt = lambda k: "%d/%d/%.0f%%" % (k["median_abs_s"], round(k["mean_abs_s"]), 100 * k["within_10_min"])
print("%-30s %-16s %-20s %8.2f %9.0f %9d %5.1f%% %22s %22s %9s %7s" % (
    trace, slc, label, r["bsld_mean"], r["wait_mean_s"], r["wait_p99_s"], 100 * r["utilization"],
    fmt(e["at_submit"]) if e else "-", fmt(e["last"]) if e else "-", e["last"]["jobs"] if e else "-", wall))
PY
  rm -f "$out" "$out.time"
}
three=("KTH-SP2-1996-2.1-cln.swf.gz whole" "LANL-CM5-1994-4.1-cln.swf.gz whole" "RICC-2010-2.swf.gz --count=10000")
case $part in
  estimates) specs=("${three[@]}") ;;
  whole) specs=("RICC-2010-2.swf.gz whole") ;;
  forecasts) specs=("${three[@]}") ;;
  order) specs=("RICC-2010-2.swf.gz whole" "RICC-2010-2.swf.gz --from=260000,--count=60000") ;;
  *) echo "usage: $0 [TRACE_DIR] [estimates|whole|forecasts|order]" >&2; exit 2 ;;
esac
for spec in "${specs[@]}"; do
  read -r trace slice <<<"$spec"
  args=()
  [[ $slice != whole ]] && IFS=, read -ra args <<<"$slice"
  case $part in
    forecasts)
      run "$trace" "$slice" "limits, est. limits" --backfill-order priority --estimates=schedule "${args[@]}"
      run "$trace" "$slice" "limits, forecasts" --backfill-order priority --estimates "${args[@]}"
      run "$trace" "$slice" "shortest, forecasts" --backfill-order shortest --estimates "${args[@]}"
      continue ;;
    order)
      run "$trace" "$slice" limits --backfill-order priority "${args[@]}"
      run "$trace" "$slice" limits,shortest --backfill-order shortest "${args[@]}"
      continue ;;
    estimates) args+=(--estimates=schedule) ;;
  esac
  run "$trace" "$slice" limits "${args[@]}"
  run "$trace" "$slice" limits,shortest --backfill-order shortest "${args[@]}"
  run "$trace" "$slice" predicted --predict "${args[@]}"
  run "$trace" "$slice" predicted,shortest --predict --backfill-order shortest "${args[@]}"
done
