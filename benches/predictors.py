#!/usr/bin/env python3
"""How close run-time predictors come to the run times of a real trace, job by job, outside the
scheduler: each job's prediction is made at its submit from the runs that had ended by then,
as the replicated state would know them.

    benches/predictors.py ../shared/traces/LANL-CM5-1994-4.1-cln.swf.gz [more traces]

Predictors (each capped by the job's time limit, at least 1 s; with no history, the limit):
  limit        the time limit itself (what a schedule on limits plans);
  user         the mean of the user's last two runs (Tsafrir et al.; what Quorum keeps today);
  user+limit   the mean of the user's last two runs that asked the same limit, else `user`;
  user+procs   the mean of the user's last two runs of the same size, else `user`;
  user+limit/N `user+limit` keeping only the N limits each user asked for last (Quorum keeps
               8: quorum_model::predict::LIMITS_KEPT), for N in 2, 4, 8, 16.
A run is counted up to the limit (a job killed at its limit ran its limit).
"""

import gzip
import heapq
import statistics
import sys


def read(path):
    jobs = []
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        for line in f:
            if line.startswith(";") or not line.strip():
                continue
            w = line.split()
            submit, run, procs, limit, user = int(w[1]), int(w[3]), int(w[4]), int(w[8]), w[11]
            if procs <= 0:
                procs = int(w[7])
            if run < 0 or limit <= 0:
                continue
            jobs.append((submit, run, limit, user, procs))
    jobs.sort()
    return jobs


def mean_of(runs, limit):
    if not runs:
        return None
    return min(limit, max(1, -(-sum(runs) // len(runs))))


KEPT = (2, 4, 8, 16)


def replay(jobs):
    ended = []  # (end, user, limit, procs, counted run)
    last_two = {}  # key -> [latest, before]
    by_limit = {n: {} for n in KEPT}  # N -> user -> [(limit, [latest, before])], latest limit first
    names = ("limit", "user", "user+limit", "user+procs") + tuple("user+limit/%d" % n for n in KEPT)
    errors = {name: [] for name in names}
    for submit, run, limit, user, procs in jobs:
        while ended and ended[0][0] <= submit:
            _, u, l, p, r = heapq.heappop(ended)
            for key in (("u", u), ("ul", u, l), ("up", u, p)):
                last_two[key] = [r] + last_two.get(key, [])[:1]
            for n, users in by_limit.items():
                kept = users.setdefault(u, [])
                previous = next((runs for lim, runs in kept if lim == l), [])
                kept[:] = [(l, [r] + previous[:1])] + [k for k in kept if k[0] != l][: n - 1]
        by_user = mean_of(last_two.get(("u", user)), limit)
        predictions = {
            "limit": limit,
            "user": by_user or limit,
            "user+limit": mean_of(last_two.get(("ul", user, limit)), limit) or by_user or limit,
            "user+procs": mean_of(last_two.get(("up", user, procs)), limit) or by_user or limit,
        }
        for n, users in by_limit.items():
            kept = next((runs for lim, runs in users.get(user, []) if lim == limit), None)
            predictions["user+limit/%d" % n] = mean_of(kept, limit) or by_user or limit
        counted = min(run, limit)
        for name, p in predictions.items():
            errors[name].append(abs(p - counted))
        heapq.heappush(ended, (submit + run, user, limit, procs, counted))
    return errors


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print("%-34s %-13s %9s %9s %9s" % ("trace", "predictor", "median_s", "mean_s", "jobs"))
    for path in sys.argv[1:]:
        jobs = read(path)
        for name, e in replay(jobs).items():
            print("%-34s %-13s %9d %9d %9d" % (path.split("/")[-1][:34], name, statistics.median(e), statistics.mean(e), len(e)))


if __name__ == "__main__":
    main()
