//! `quorum simulate` as a user runs it: a trace file in, a table or JSON and pictures out.

use std::io::Write;
use std::path::Path;
use std::process::Command;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn simulate(dir: &Path, args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_quorum"))
        .arg("simulate")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run quorum simulate");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Four single-CPU nodes; EASY lets job 3 pass the blocked job 2, FCFS does not. Field 3
/// holds waits "recorded" on a real machine.
const TRACE: &str = "\
; Version: 2.2
; Computer: a test machine
; MaxNodes: 4
; MaxProcs: 4
; UnixStartTime: 843480031
    1   0  0 100 2 -1 -1 2 100 -1 1 1 1 -1 -1 -1 -1 -1
    2   1 99  50 4 -1 -1 4  50 -1 1 1 1 -1 -1 -1 -1 -1
    3   2 10  50 2 -1 -1 2  50 -1 1 2 2 -1 -1 -1 -1 -1
    4   3 200 200 1 -1 -1 1 200 -1 1 2 2 -1 -1 -1 -1 -1
";

fn write_gz(path: &Path, text: &str) {
    let mut enc = flate2::write::GzEncoder::new(std::fs::File::create(path).unwrap(), flate2::Compression::default());
    enc.write_all(text.as_bytes()).unwrap();
    enc.finish().unwrap();
}

#[test]
fn replays_a_trace_to_json_table_and_pictures() {
    let dir = tempfile::tempdir().unwrap();
    write_gz(&dir.path().join("t.swf.gz"), TRACE);
    let easy = simulate(dir.path(), &["t.swf.gz", "--json", "--policy", "easy"]);
    assert_eq!(easy.code, 0, "{}", easy.stderr);
    let v: serde_json::Value = serde_json::from_str(&easy.stdout).unwrap();
    for key in ["jobs", "makespan_s", "utilization", "wait_mean_s", "wait_median_s", "wait_p95_s", "bsld_mean"] {
        assert!(v[key].is_number(), "{key} in {v}");
        assert!(v["recorded"][key].is_number(), "recorded.{key} in {v}");
    }
    // EASY: starts 0, 100, 2, 150 → waits 0, 99, 0, 147.
    assert_eq!(v["jobs"], 4);
    assert_eq!(v["wait_mean_s"], (0.0 + 99.0 + 0.0 + 147.0) / 4.0);
    assert_eq!(v["makespan_s"], 350, "job 4 ends at 150 + 200");
    assert_eq!(v["recorded"]["wait_mean_s"], (0.0 + 99.0 + 10.0 + 200.0) / 4.0);
    assert_eq!(v["policy"], "easy");
    let fcfs = simulate(dir.path(), &["t.swf.gz", "--json", "--policy", "fcfs"]);
    let f: serde_json::Value = serde_json::from_str(&fcfs.stdout).unwrap();
    assert_eq!(f["wait_mean_s"], (0.0 + 99.0 + 148.0 + 147.0) / 4.0, "FCFS holds job 3 back");

    // The same run twice prints the same bytes.
    let again = simulate(dir.path(), &["t.swf.gz", "--json", "--policy", "easy"]);
    assert_eq!(again.stdout, easy.stdout);

    let table = simulate(dir.path(), &["t.swf.gz", "--gantt", "g.svg", "--plot", "p.svg", "--jobs", "j.csv"]);
    assert_eq!(table.code, 0, "{}", table.stderr);
    for want in ["4 nodes × 1 CPUs", "policy       easy", "simulated", "recorded", "bsld mean", "u1"] {
        assert!(table.stdout.contains(want), "'{want}' in\n{}", table.stdout);
    }
    assert!(table.stderr.contains("simulate: 4 jobs replayed"), "{}", table.stderr);
    let gantt = std::fs::read_to_string(dir.path().join("g.svg")).unwrap();
    assert!(gantt.starts_with("<svg"));
    for id in 1..=4 {
        assert!(gantt.contains(&format!("<title>job {id} (trace #{id})")), "job {id} drawn");
    }
    // The schedule job by job: EASY's starts 0, 100, 2 and 150.
    let csv = std::fs::read_to_string(dir.path().join("j.csv")).unwrap();
    let rows: Vec<Vec<&str>> = csv.lines().map(|l| l.split(',').collect()).collect();
    assert_eq!(rows[0][..8], ["number", "user", "procs", "submit_s", "start_s", "end_s", "wait_s", "run_s"]);
    let starts: Vec<(&str, &str, &str)> = rows[1..].iter().map(|r| (r[0], r[4], r[6])).collect();
    assert_eq!(starts, [("1", "0", "0"), ("2", "100", "99"), ("3", "2", "0"), ("4", "150", "147")], "{csv}");
    let plot = std::fs::read_to_string(dir.path().join("p.svg")).unwrap();
    assert!(plot.contains("utilization") && plot.matches("<polyline").count() == 2);
}

#[test]
fn bad_input_is_named() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ok.swf"), TRACE).unwrap();
    std::fs::write(dir.path().join("short.swf"), format!("{TRACE}    5 4 0 1 1 -1 -1 1 1 -1 1 1 1\n")).unwrap();
    std::fs::write(dir.path().join("word.swf"), TRACE.replace("    3   2 10  50", "    3   2 ten  50")).unwrap();
    std::fs::write(dir.path().join("bare.swf"), "1 0 0 10 1 -1 -1 1 10 -1 1 1 1 -1 -1 -1 -1 -1\n").unwrap();
    std::fs::write(dir.path().join("bad.toml"), "[[partitions]]\nname = \"p\"\nnodes = \"n[1-2\"\n").unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["missing.swf"], "missing.swf: No such file"),
        (&["short.swf"], "short.swf:10: expected 18 fields, found 13"),
        (&["word.swf"], "word.swf:8: field 3 (wait time) is 'ten', not a number"),
        (&["bare.swf"], "the machine's size is unknown"),
        (&["ok.swf", "--policy", "lifo"], "unknown policy 'lifo'"),
        (&["ok.swf", "--from", "77"], "no job numbered 77"),
        (&["ok.swf", "--count", "0"], "--count must be at least 1"),
        (&["ok.swf", "--config", "bad.toml"], "partition 'p'"),
        (&["ok.swf", "--config", "none.toml"], "none.toml"),
        (&["ok.swf", "--gantt-span", "soon"], "--gantt-span"),
        (
            &["ok.swf", "--reserve", "ReservationName=m Duration=soon"],
            "--reserve 'ReservationName=m Duration=soon': invalid Duration='soon'",
        ),
        (
            &["ok.swf", "--reserve", "ReservationName=m Duration=10 NodeCnt=9 Users=root"],
            "--reserve: reservation 'm': only 4 of the 9 nodes asked for are free over its window",
        ),
    ];
    for (args, want) in cases {
        let r = simulate(dir.path(), args);
        assert_ne!(r.code, 0, "{args:?} should fail: {}", r.stdout);
        assert!(r.stderr.contains(want), "{args:?}: '{}' lacks '{want}'", r.stderr);
        assert!(r.stdout.is_empty(), "{args:?} printed a result");
    }
}

/// A maintenance window on two of the four nodes over [20 s, 220 s): job 2 (all four nodes) runs
/// after it, and nothing crosses it.
#[test]
fn a_maintenance_window_is_replayed() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.swf"), TRACE).unwrap();
    let maint = "ReservationName=maint StartTime=now+20 Duration=0:03:20 NodeCnt=2 Users=root Flags=MAINT";
    let r = simulate(dir.path(), &["t.swf", "--reserve", maint, "--json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    // Starts 0, 220, 100 and 270 (submitted at 0, 1, 2, 3); 4 ends at 270 + 200.
    assert_eq!(v["wait_mean_s"], (0.0 + 219.0 + 98.0 + 267.0) / 4.0, "{v}");
    assert_eq!(v["makespan_s"], 470, "{v}");
    assert_eq!(v["reservations"], serde_json::json!(["maint"]));
    let r = simulate(dir.path(), &["t.swf", "--reserve", maint]);
    assert!(r.stdout.contains("reserved     maint: n[0001-0002] from 0:20 for 3:20 (MAINT)"), "{}", r.stdout);
}

#[test]
fn a_config_gives_partitions_and_weights() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.swf"), TRACE).unwrap();
    // Only the cluster sections: the replica's own fields may be left out.
    std::fs::write(
        dir.path().join("c.toml"),
        "[[partitions]]\nname = \"batch\"\nnodes = \"cn[1-4]\"\ndefault = true\nmax_time = \"2:00\"\n\n\
         [scheduler]\nordering = \"fifo\"\nbackfill = \"none\"\n",
    )
    .unwrap();
    let r = simulate(dir.path(), &["t.swf", "--config", "c.toml", "--json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["policy"], "config");
    // The partition's 2-minute limit refuses job 4 (200 s); the config's strict FIFO keeps
    // job 3 behind job 2.
    assert_eq!(v["jobs"], 3);
    assert_eq!(v["rejected"][0]["job"], 4);
    assert!(v["rejected"][0]["reason"].as_str().unwrap().contains("time limit"), "{v}");
    assert_eq!(v["wait_mean_s"], (0.0 + 99.0 + 148.0) / 3.0);
    assert_eq!(v["machine"]["nodes"], 4);
}
