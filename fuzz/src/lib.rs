//! What each fuzz target does with its input, kept apart from libFuzzer so that the project's
//! own tests replay the kept corpus through the same code (`cli/tests/it/fuzz_corpus.rs`, which
//! includes this file): a crash found here becomes a file in `corpus/<target>/` and so a
//! regression test.
//!
//! Each target feeds arbitrary bytes (as text where the parser takes text) to what a user or a
//! peer can send, and checks what must hold of any input: no panic, no overflow, no unbounded
//! allocation, and the round trips that the parsers promise.

use quorum_model::{hostlist, parse};

// The controller's config file and its proto <-> model conversions live in `quorum-control`,
// which links RocksDB. Under `cargo fuzz` (which sets `--cfg fuzzing`) their two source files
// are compiled into this crate, beside the `model` name they import from their crate's root;
// the project's own test of the corpus (`cli/tests/it/fuzz_corpus.rs`) takes them from
// `quorum-control` itself.
#[cfg(fuzzing)]
pub use quorum_model as model;
#[cfg(fuzzing)]
#[path = "../../control/src/config.rs"]
pub mod config;
#[cfg(fuzzing)]
#[path = "../../control/src/wire.rs"]
pub mod wire;
#[cfg(not(fuzzing))]
use quorum_control::{config, wire};

/// The input as text, where the parser takes text (invalid UTF-8 never reaches one).
fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

/// Hostlist expressions (`--nodelist`, `--exclude`, partitions in the config): expanding any
/// text either fails or gives at most the bound's names, and names that are plain node names
/// compress into an expression that expands to the same set. The bound is 1,000 names here
/// rather than a million: the same code, and each input costs microseconds, not a second.
pub fn hostlist(data: &[u8]) {
    const BOUND: usize = 1_000;
    let Some(expr) = text(data) else { return };
    let Ok(names) = hostlist::expand_at_most(expr, BOUND) else { return };
    assert!(names.len() <= BOUND, "{expr:?}: {} names", names.len());
    let plain = |n: &String| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if names.iter().all(plain) {
        let compressed = hostlist::compress(&names);
        let again = hostlist::expand_at_most(&compressed, BOUND)
            .unwrap_or_else(|e| panic!("{expr:?} compressed to {compressed:?}, which does not expand: {e}"));
        let set = |v: &[String]| v.iter().cloned().collect::<std::collections::BTreeSet<_>>();
        assert_eq!(set(&again), set(&names), "{expr:?} compressed to {compressed:?}");
    }
}

/// Time limits and memory sizes (`--time`, `--mem`, the config's limits): any text parses or
/// is refused, and a time limit prints back as one that parses to itself.
pub fn times_and_sizes(data: &[u8]) {
    let Some(value) = text(data) else { return };
    if let Ok(Some(secs)) = parse::parse_time_limit(value) {
        let printed = parse::format_duration(secs);
        let again = parse::parse_time_limit(&printed)
            .unwrap_or_else(|e| panic!("{value:?} is {secs} s, printed {printed:?}, which does not parse: {e}"));
        assert_eq!(again, Some(secs), "{value:?} printed as {printed:?}");
    }
    if let Ok(mb) = parse::parse_mem_mb(value) {
        let printed = parse::format_mem_mb(mb);
        let again = parse::parse_mem_mb(&printed).unwrap_or_else(|e| panic!("{mb}M printed as {printed:?}: {e}"));
        assert!(again >= mb, "{value:?} is {mb}M, printed {printed:?}, which is {again}M");
    }
    let _ = quorum_client::submit::parse_begin(value, 1_800_000_000_000);
}

/// The job options a user gives as text: arrays, dependencies, signals, mail types and
/// licenses. An array prints back as one with the same tasks.
pub fn job_options(data: &[u8]) {
    let Some(value) = text(data) else { return };
    if let Ok(array) = quorum_model::ArraySpec::parse(value) {
        if array.check().is_ok() {
            let tasks = array.tasks();
            assert!(tasks.len() <= quorum_model::array::MAX_ARRAY_TASKS, "{value:?}: {} tasks", tasks.len());
            let printed = array.to_spec();
            let again = quorum_model::ArraySpec::parse(&printed)
                .unwrap_or_else(|e| panic!("{value:?} printed as {printed:?}, which does not parse: {e}"));
            assert_eq!(again.tasks(), tasks, "{value:?} printed as {printed:?}");
        }
    }
    let _ = quorum_model::parse_dependencies(value);
    let _ = quorum_model::parse_signal(value);
    if let Ok(warn) = quorum_model::WarnSignal::parse(value) {
        let printed = warn.to_spec();
        let again = quorum_model::WarnSignal::parse(&printed)
            .unwrap_or_else(|e| panic!("{value:?} printed as {printed:?}, which does not parse: {e}"));
        assert_eq!(again.to_spec(), printed);
    }
    let _ = quorum_model::MailTypes::parse(value);
    let _ = quorum_model::parse_licenses(value);
}

/// A batch script's `#SBATCH` lines, as `sbatch` and `quorum submit` read them.
pub fn batch_script(data: &[u8]) {
    let Some(script) = text(data) else { return };
    let _ = quorum_client::submit::script_options("job.sh", script);
}

/// A Raft entry's command, as a replica decodes and applies it: any bytes are refused or
/// applied to a small cluster without a panic, and applying is deterministic (two replicas
/// applying the same entry reach the same digest).
pub fn raft_command(data: &[u8]) {
    let Ok(command) = serde_json::from_slice::<quorum_state::Command>(data) else { return };
    let mut one = quorum_state::testing::cluster();
    let mut two = one.clone();
    quorum_state::apply(&mut one, 100, command.clone());
    quorum_state::apply(&mut two, 100, command);
    assert_eq!(quorum_state::digest(&one), quorum_state::digest(&two), "the same entry, two states");
}

/// A workload trace in the Standard Workload Format (`quorum simulate --trace`): any bytes
/// parse or are refused with the line named, and every job read names its line.
pub fn swf(data: &[u8]) {
    if let Ok(trace) = quorum_model::swf::Trace::parse("fuzz.swf", data) {
        assert!(trace.jobs.iter().all(|j| j.line > 0), "a job without its line");
    }
}

/// The controller's configuration file (`quorum-controller --config`, and the cluster-wide
/// sections `quorum simulate --config` reads): any text is refused with a reason or validated,
/// and a validated config yields its partitions and settings.
pub fn controller_config(data: &[u8]) {
    let Some(text) = text(data) else { return };
    if let Ok(c) = config::ControllerConfig::parse("fuzz.toml", text) {
        let settings = c.settings().unwrap_or_else(|e| panic!("validated, yet its settings fail: {e}"));
        assert_eq!(settings.partitions.len(), c.partitions.len());
        assert!(c.liveness().agent_lease < c.liveness().node_timeout);
    }
    let _ = config::ClusterSettings::parse("fuzz.toml", text);
}

/// A submit as it arrives over gRPC (protobuf bytes of `SubmitJobRequest`), through everything
/// the controller checks before it proposes it: the conversion to the model, the spec's shape,
/// the admission limits, and the state's admission (partition, account, QOS). A submit that
/// passes is applied to two replicas, which agree, and the scheduler plans it without a panic.
pub fn submit_request(data: &[u8]) {
    use prost::Message as _;
    let Ok(request) = quorum_proto::api::SubmitJobRequest::decode(data) else { return };
    let Some(spec) = request.spec else { return };
    let Ok(spec) = wire::spec_from_proto(spec) else { return };
    if spec.check_shape().is_err() || config::AdmissionLimits::default().check(&spec).is_err() {
        return;
    }
    // What a reply or a listing shows converts back to the same spec.
    let shown = wire::spec_to_proto(&spec, true);
    let mut again = wire::spec_from_proto(shown.clone()).unwrap_or_else(|e| panic!("{shown:?} converts back to {e:?}"));
    // An array shows as its tasks (`1-10,2` as `1-10`): the same tasks, the same throttle.
    let tasks = |s: &quorum_model::JobSpec| s.array.as_ref().map(|a| (a.tasks(), a.throttle));
    assert_eq!(tasks(&again), tasks(&spec), "an array shown and read back");
    again.array.clone_from(&spec.array);
    assert_eq!(again, spec, "a spec shown and read back");
    let mut one = quorum_state::testing::cluster();
    if quorum_state::check_submit(&one, spec.clone(), "alice").is_err() {
        return;
    }
    let mut two = one.clone();
    let answer = quorum_state::testing::submit(&mut one, 10, spec.clone(), &request.request_id);
    quorum_state::testing::submit(&mut two, 10, spec, &request.request_id);
    assert_eq!(quorum_state::digest(&one), quorum_state::digest(&two), "the same submit, two states");
    assert!(matches!(answer, quorum_state::Response::Submitted { .. }), "admitted, then {answer:?}");
    let view = quorum_sched::ClusterView::from_state(&one);
    let plan = quorum_sched::schedule(&view, 20_000, &one.policy);
    for start in &plan.starts {
        assert!(one.jobs.contains_key(&start.job_id), "the plan starts job {} that is not there", start.job_id);
    }
}
