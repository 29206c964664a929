#!/usr/bin/env python3
"""Forecast accuracy live: a slice of a real trace, its times divided by SCALE, submitted through
`quorum submit` by real Unix users (one per trace user) to a real `quorum dev` cluster of
AGENTS x CPUS, each job a `sleep` of its scaled run time with its scaled time limit; then the
same scaled slice replayed by `quorum simulate` on the same machine shape. Prints, for both,
the error of the start each job was shown first (at submit) and last (the one in force when it
started), median / p90 / mean in scaled seconds and in trace seconds (times SCALE), over the jobs
that waited JUDGED_WAIT_S (60) scaled seconds or more, as `/metrics` and the simulator judge.

    benches/forecast-live.py TRACE --from N --count M [--scale 60] [--agents 32 --cpus 32]

Needs root (it adds the users `qlive<N>` and runs the submits as them), and the binaries of
`cargo build --release --bins` (QUORUM=path/to/quorum, default $CARGO_TARGET_DIR/release/quorum).
The live cluster cycles about once a second and forecasts at most every 5 s, scaled seconds:
at SCALE 60 a forecast can be 300 trace seconds late, which the simulator's forecasts (made
after every cycle) never are; the difference between the two rows is what running live costs.
"""

import argparse
import collections
import gzip
import json
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

JUDGED_WAIT_S = 60


def read_slice(path, first, count):
    """The SWF records from the `first`-th (0-based, as `quorum simulate --from` counts) on."""
    records = []
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        for line in f:
            if line.startswith(";") or not line.strip():
                continue
            records.append(line.split())
    # Only jobs with a time limit and a size: a submit needs both (the simulator would run the
    # others too, without a limit, so both sides are given the same jobs).
    return [w for w in records[first:first + count] if int(w[8]) > 0 and max(int(w[4]), int(w[7])) > 0]


def scaled(records, scale):
    """The slice with submit, run and limit divided by `scale` (rounded up, limits at least 1 s),
    submits from 0."""
    t0 = int(records[0][1])
    out = []
    for w in records:
        w = list(w)
        w[1] = str((int(w[1]) - t0) // scale)
        for i in (3, 8):
            v = int(w[i])
            if v > 0:
                w[i] = str(max(1, -(-v // scale)))
        w[2] = "-1"
        out.append(w)
    return out


def stats(errors):
    if not errors:
        return None
    e = sorted(errors)
    return {"jobs": len(e), "median": statistics.median(e), "p90": e[min(len(e) - 1, int(0.9 * len(e)))], "mean": statistics.mean(e)}


def live(records, args, quorum, work):
    users = sorted({w[11] for w in records})
    for u in users:
        name = f"qlive{u}"
        if subprocess.run(["id", name], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "-M", "-N", "-s", "/bin/sh", name], check=True)
    data = work / "data"
    config = work / "controller.toml"
    config.write_text('[scheduler]\nordering = "fifo"\nbackfill = "easy"\n')
    env = dict(os.environ)
    port = args.port
    env["QUORUM_CONTROLLERS"] = ",".join(f"127.0.0.1:{port + i}" for i in range(3))
    env["QUORUM_CA"] = str(data / "security/certs/ca.pem")
    env["QUORUM_MUNGE_SOCKET"] = str(data / "security/munge/munge.socket")
    log = open(work / "dev.log", "w")
    dev = subprocess.Popen(
        [quorum, "dev", "--agents", str(args.agents), "--cpus", str(args.cpus), "--port", str(port),
         "--data", str(data), "--config", str(config), "--min-job-age", "0"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            r = subprocess.run([quorum, "nodes", "--json"], capture_output=True, text=True, env=env)
            if r.returncode == 0:
                try:
                    nodes = json.loads(r.stdout)
                    if len(nodes) >= args.agents:
                        break
                except ValueError:
                    pass
            if time.monotonic() > deadline or dev.poll() is not None:
                sys.exit(f"quorum dev: {args.agents} nodes not up (see {work}/dev.log)")
            time.sleep(1)
        os.chmod(work, 0o755)
        # The users' client: a copy where they can run it (the build may be under root's home).
        client = str(work / "quorum")
        shutil.copy(quorum, client)
        os.chmod(client, 0o755)
        jobdir = work / "jobs"
        jobdir.mkdir(exist_ok=True)
        os.chmod(jobdir, 0o1777)
        start = time.monotonic()
        pending = []
        for w in records:
            at = int(w[1])
            procs = max(int(w[4]), int(w[7]))
            run, limit = max(0, int(w[3])), int(w[8])
            delay = start + at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            m, s = divmod(limit, 60)
            cmd = ["runuser", "-u", f"qlive{w[11]}", "--", client, "submit", "-n", str(procs), "-t", f"{m}:{s:02d}",
                   "-D", str(jobdir), "-o", "/dev/null", "-e", "/dev/null", "-J", f"swf{w[0]}", "--", "sleep", str(run)]
            pending.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
        for p in pending:
            out, err = p.communicate()
            if p.returncode != 0:
                print(f"a submit failed: {err.strip()}", file=sys.stderr)
        while True:
            r = subprocess.run([quorum, "queue", "--all", "--json"], capture_output=True, text=True, env=env, check=True)
            jobs = json.loads(r.stdout)
            if all(j["state"] not in ("PENDING", "RUNNING", "COMPLETING", "SUSPENDED") for j in jobs):
                break
            time.sleep(5)
        wall = time.monotonic() - start
    finally:
        os.killpg(dev.pid, signal.SIGTERM)
        dev.wait(timeout=60)
    judged = [j for j in jobs if j.get("submit_time_ms") and j.get("start_time_ms")
              and (j["start_time_ms"] - j["submit_time_ms"]) / 1000 >= JUDGED_WAIT_S]
    first = [abs(j["shown_first_ms"] - j["start_time_ms"]) / 1000 for j in judged if j.get("shown_first_ms")]
    last = [abs(j["shown_last_ms"] - j["start_time_ms"]) / 1000 for j in judged if j.get("shown_last_ms")]
    return {"jobs": len(jobs), "ended": dict(collections.Counter(j["state"] for j in jobs)), "waited": len(judged),
            "at_submit": stats(first), "last": stats(last), "wall_s": round(wall)}


def simulated(swf, args, quorum):
    r = subprocess.run([quorum, "simulate", str(swf), "--policy", "easy", "--json", "-q", "--estimates",
                        "--nodes", str(args.agents), "--cpus-per-node", str(args.cpus)],
                       capture_output=True, text=True, check=True)
    e = json.loads(r.stdout)["estimates"]
    pick = lambda k: {"jobs": e[k]["jobs"], "median": e[k]["median_abs_s"], "p90": e[k]["p90_abs_s"], "mean": e[k]["mean_abs_s"]}
    return {"at_submit": pick("at_submit"), "last": pick("last")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--from", dest="first", type=int, required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--scale", type=int, default=60)
    ap.add_argument("--agents", type=int, default=32)
    ap.add_argument("--cpus", type=int, default=32)
    ap.add_argument("--port", type=int, default=7401)
    args = ap.parse_args()
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    quorum = os.environ.get("QUORUM", f"{target}/release/quorum")
    work = pathlib.Path(tempfile.mkdtemp(prefix="forecast-live-"))
    records = scaled(read_slice(args.trace, args.first, args.count), args.scale)
    swf = work / "slice.swf"
    swf.write_text(f"; MaxNodes: {args.agents}\n; MaxProcs: {args.agents * args.cpus}\n" + "".join(" ".join(w) + "\n" for w in records))
    sim = simulated(swf, args, quorum)
    got = live(records, args, quorum, work)
    print(f"trace {args.trace}, records {args.first}..{args.first + args.count}, times / {args.scale}, {args.agents} x {args.cpus} CPUs; live: {got['jobs']} jobs, {got['waited']} waited >= {JUDGED_WAIT_S} s, {got['wall_s']} s, ended {got['ended']}")
    print("%-10s %-10s %6s %22s %26s" % ("run", "shown", "jobs", "median/p90/mean (s)", "x scale: median/p90/mean"))
    for label, res in (("simulated", sim), ("live", got)):
        for k in ("at_submit", "last"):
            s = res[k]
            if not s:
                print("%-10s %-10s %6d %22s" % (label, k, 0, "-"))
                continue
            print("%-10s %-10s %6d %22s %26s" % (label, k, s["jobs"], "%.0f/%.0f/%.0f" % (s["median"], s["p90"], s["mean"]),
                                                "%.0f/%.0f/%.0f" % (s["median"] * args.scale, s["p90"] * args.scale, s["mean"] * args.scale)))
    shutil.rmtree(work / "data", ignore_errors=True)


if __name__ == "__main__":
    main()
