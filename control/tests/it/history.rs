//! The job history's order of entry (what quorum-dbd follows), in a real RocksDB: jobs come in
//! the order of the entries that moved them, a record copied from a peer keeps its place, a
//! forgotten job leaves the order, and a history written before the order existed gets it.

use std::sync::Arc;

use quorum_control::replica::history::{History, CF_HISTORY};
use quorum_model::{Job, JobSpec, Shared};

fn job(id: u64, end: u64) -> Shared<Job> {
    submitted(id, 1, end)
}

fn submitted(id: u64, submit: u64, end: u64) -> Shared<Job> {
    let v = serde_json::json!({
        "id": id, "spec": serde_json::to_value(JobSpec::default()).unwrap(), "user": "alice",
        "partition": "batch", "state": "Completed", "reason": "None", "submit_time": submit, "start_time": submit,
        "end_time": end, "exit_code": 0, "signal": null, "allocation": null, "alloc_index": 0,
        "cancel_requested": false, "rank_outcomes": [], "request_id": format!("request-{id}"),
    });
    Shared::new(serde_json::from_value(v).expect("a job"))
}

fn open(dir: &std::path::Path) -> (Arc<rocksdb::DB>, History) {
    let db = quorum_raft::open_db(&dir.join("db"), &[CF_HISTORY]).expect("open rocksdb");
    let history = History::new(db.clone(), Default::default()).expect("open the history");
    (db, history)
}

fn order(history: &History, after: (u64, u64), limit: usize) -> (Vec<(u64, u64)>, bool) {
    let (records, done) = history.entered_after(after, limit, 1 << 20).expect("read");
    for (_, id, record) in &records {
        let job: Job = serde_json::from_slice(record).expect("a record is a job");
        assert_eq!(job.id, *id);
    }
    (records.iter().map(|(index, id, _)| (*index, *id)).collect(), done)
}

#[test]
fn jobs_come_in_the_order_of_the_entries_that_moved_them() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, history) = open(dir.path());
    history.write(&[job(3, 100), job(1, 200)], 10).unwrap();
    history.write(&[job(2, 300)], 12).unwrap();
    history.write(&[job(5, 400), job(4, 500)], 11).unwrap();
    let all = vec![(10, 1), (10, 3), (11, 4), (11, 5), (12, 2)];
    assert_eq!(order(&history, (0, 0), 100), (all.clone(), true));
    // Page by page, each after the last one given.
    assert_eq!(order(&history, (0, 0), 2), (all[..2].to_vec(), false));
    assert_eq!(order(&history, (10, 3), 2), (all[2..4].to_vec(), false));
    assert_eq!(order(&history, (11, 5), 2), (all[4..].to_vec(), true));
    assert_eq!(order(&history, (12, 2), 2), (vec![], true));
    assert_eq!(order(&history, (12, u64::MAX), 2), (vec![], true));
    assert_eq!(order(&history, (u64::MAX, u64::MAX), 2), (vec![], true));

    // A job written again (a replayed entry) keeps its one place.
    history.write(&[job(2, 300)], 12).unwrap();
    assert_eq!(order(&history, (0, 0), 100).0, all);

    // Forgotten (purge_job_after_s): gone from the order too.
    assert_eq!(history.forget(250, 10).unwrap(), (2, false));
    assert_eq!(order(&history, (0, 0), 100).0, vec![(11, 4), (11, 5), (12, 2)]);

    // Copied to a replica that installed a snapshot: each record keeps its place.
    let other = tempfile::tempdir().unwrap();
    let (_db2, copy) = open(other.path());
    let (records, _, done) = history.page_after(0, 100, 1 << 20).unwrap();
    assert!(done);
    copy.write_records(&records).unwrap();
    assert_eq!(order(&copy, (0, 0), 100).0, vec![(11, 4), (11, 5), (12, 2)]);
}

#[test]
fn a_history_written_before_the_order_existed_gets_it_on_opening() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (db, history) = open(dir.path());
        history.write(&[job(7, 100)], 20).unwrap();
        // What an older release left: the record alone, without its place, and no layout version.
        let cf = db.cf_handle(CF_HISTORY).unwrap();
        let mut key = vec![b'j'];
        key.extend_from_slice(&8u64.to_be_bytes());
        db.put_cf(cf, key, serde_json::to_vec(&*job(8, 150)).unwrap()).unwrap();
        db.delete_cf(cf, b"v").unwrap();
        db.flush_cf(cf).unwrap();
    }
    let (_db, history) = open(dir.path());
    assert_eq!(order(&history, (0, 0), 100).0, vec![(0, 8), (20, 7)]);
}

#[test]
fn a_window_reads_as_far_as_a_job_submitted_in_it_can_have_ended() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (_db, history) = open(dir.path());
        // A short job, a long one submitted beside it, and one submitted after the window.
        history.write(&[submitted(1, 1_000, 2_000), submitted(3, 50_000, 51_000)], 5).unwrap();
        history.write(&[submitted(2, 1_500, 40_000)], 6).unwrap();
        assert_eq!(history.ended_since(Some("alice"), 0, 1_600).unwrap(), vec![1, 2]);
        assert_eq!(history.ended_since(Some("alice"), 2_500, 60_000).unwrap(), vec![2, 3]);
        history.flush().unwrap();
    }
    // The longest a job took (38.5 s) is kept: reopened, the long job is still found.
    let (_db, history) = open(dir.path());
    assert_eq!(history.ended_since(Some("alice"), 0, 1_600).unwrap(), vec![1, 2]);
    assert_eq!(history.ended_since(None, 0, 1_000).unwrap(), vec![1]);
}

/// A user's window as the server lists it: each job's listing from the user's index alone.
fn listed(
    history: &History,
    user: &str,
    window: (u64, u64),
    after: u64,
    limit: usize,
    max_bytes: usize,
) -> (Vec<u64>, Option<u64>) {
    let (page, more) = history.listed_since(user, window.0, window.1, after, limit, max_bytes).expect("listings");
    let ids = page
        .iter()
        .map(|(id, bytes)| {
            let info = <quorum_proto::api::JobInfo as prost::Message>::decode(&bytes[..]).expect("a listing");
            assert_eq!((info.id, info.user.as_str(), info.state.as_str()), (*id, user, "COMPLETED"));
            *id
        })
        .collect();
    (ids, more)
}

#[test]
fn a_users_window_lists_from_its_index_page_by_page_in_id_order() {
    let dir = tempfile::tempdir().unwrap();
    let (db, history) = open(dir.path());
    // Ended in an order unlike their ids'; job 9 is someone else's; job 6 was submitted after
    // the window and job 1 ended before it.
    let mut jobs: Vec<Shared<Job>> =
        [(5, 1_000), (2, 3_000), (7, 2_000), (3, 4_000), (4, 2_500), (1, 500)].map(|(id, end)| job(id, end)).to_vec();
    jobs.push(submitted(6, 9_000, 9_500));
    let mut bob = (*job(9, 2_000)).clone();
    bob.user = "bob".into();
    jobs.push(Shared::new(bob));
    history.write(&jobs, 3).unwrap();
    let window = (1_000, 5_000);
    assert_eq!(listed(&history, "alice", window, 0, 100, 1 << 20), (vec![2, 3, 4, 5, 7], None));
    assert_eq!(listed(&history, "bob", window, 0, 100, 1 << 20), (vec![9], None));
    assert_eq!(listed(&history, "carol", window, 0, 100, 1 << 20), (vec![], None));
    // Pages of two: the lowest ids first, each page after the last id given.
    assert_eq!(listed(&history, "alice", window, 0, 2, 1 << 20), (vec![2, 3], Some(3)));
    assert_eq!(listed(&history, "alice", window, 3, 2, 1 << 20), (vec![4, 5], Some(5)));
    assert_eq!(listed(&history, "alice", window, 5, 2, 1 << 20), (vec![7], None));
    // A page of a few bytes still holds one.
    assert_eq!(listed(&history, "alice", window, 0, 100, 1), (vec![2], Some(2)));
    // The listing is the job as listings show it: its script's first line, no environment.
    let (page, _) = history.listed_since("alice", 9_000, u64::MAX, 0, 1, 1 << 20).unwrap();
    let info = <quorum_proto::api::JobInfo as prost::Message>::decode(&page[0].1[..]).unwrap();
    assert_eq!((info.id, info.submit_time_ms, info.end_time_ms, info.partition.as_str()), (6, 9_000, 9_500, "batch"));
    assert!(info.spec.is_some_and(|s| s.env.is_empty()));

    // A history of layout 1 (a user's index held the submit time alone) gets the listings on
    // opening.
    let cf = db.cf_handle(CF_HISTORY).unwrap();
    let mut key = vec![b'u'];
    key.extend_from_slice(b"alice\0");
    key.extend_from_slice(&3_000u64.to_be_bytes());
    key.extend_from_slice(&2u64.to_be_bytes());
    db.put_cf(cf, &key, 1u64.to_be_bytes()).unwrap();
    db.put_cf(cf, b"v", 1u64.to_be_bytes()).unwrap();
    db.flush_cf(cf).unwrap();
    drop(history);
    drop(db);
    let (_db, history) = open(dir.path());
    assert_eq!(listed(&history, "alice", window, 0, 100, 1 << 20), (vec![2, 3, 4, 5, 7], None));
}
