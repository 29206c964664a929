//! Partitions and nodes changed at run time, through Raft like every change (`scontrol
//! create|update|delete partition`, `scontrol update nodename=... weight|features|state=down`),
//! and the replicated settings printed as TOML (`quorum admin config`).

use quorum_auth::Caller;
use quorum_proto::api::*;
use tonic::Status;

use super::api::{read_barrier, rejection_status, write_status, Api};
use crate::config::PartitionConfig;
use crate::model::{Partition, Rejection};
use crate::replica::now_ms;
use crate::site::partition_config;
use quorum_state::{Command, NodeUpdate, Response, LIVE_CONFIG_LEVEL};

/// How often a change made from a partition that another change overtook is made again.
const PUT_TRIES: usize = 5;
/// The longest partition, node or feature name accepted (as a submit's words).
const MAX_NAME_BYTES: usize = 256;
/// The most settings one partition change may carry, and the longest value of one.
const MAX_SETTINGS: usize = 64;
const MAX_VALUE_BYTES: usize = 64 * 1024;
/// The most features one node update may set.
const MAX_FEATURES: usize = 64;

/// `what` is a name of at most [`MAX_NAME_BYTES`] without control characters.
fn check_name(what: &str, name: &str) -> Result<(), Status> {
    if name.len() > MAX_NAME_BYTES || name.chars().any(char::is_control) {
        return Err(Status::invalid_argument(format!(
            "{what}: at most {MAX_NAME_BYTES} bytes without control characters"
        )));
    }
    Ok(())
}

/// A partition's settings after Slurm's `Key=Value` words, checked as its TOML section is.
pub fn partition_after(
    name: &str,
    base: Option<&Partition>,
    settings: &[(String, String)],
) -> Result<Partition, String> {
    let mut c = match base {
        Some(p) => partition_config(p),
        None => PartitionConfig { name: name.to_string(), ..Default::default() },
    };
    let list = |v: &str| -> Vec<String> {
        if v.eq_ignore_ascii_case("all") {
            return Vec::new();
        }
        v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect()
    };
    let unlimited = |v: &str| ["unlimited", "infinite", "none", ""].iter().any(|u| v.eq_ignore_ascii_case(u));
    let yes_no = |k: &str, v: &str| match v.to_ascii_uppercase().as_str() {
        "YES" => Ok(true),
        "NO" => Ok(false),
        _ => Err(format!("{k}={v}: YES or NO")),
    };
    let number = |k: &str, v: &str| v.parse::<u64>().map_err(|_| format!("{k}={v}: not a number"));
    for (key, value) in settings {
        let v = value.trim();
        match key.to_ascii_lowercase().as_str() {
            "nodes" => {
                if v.eq_ignore_ascii_case("all") {
                    return Err("Nodes=ALL: name the nodes (a host list such as node[01-10])".into());
                }
                c.nodes = v.to_string();
            }
            "default" => c.default = yes_no(key, v)?,
            "state" => {
                crate::model::PartitionState::parse(v)?;
                c.state = Some(v.to_ascii_uppercase());
            }
            "maxtime" => c.max_time = (!unlimited(v)).then(|| v.to_string()),
            "defaulttime" => c.default_time = (!unlimited(v)).then(|| v.to_string()),
            "defmempercpu" => c.default_mem_per_cpu = Some(v.to_string()),
            "prioritytier" => {
                c.priority_tier = u32::try_from(number(key, v)?).map_err(|_| format!("{key}={v}: too large"))?
            }
            "maxnodes" => {
                c.max_nodes = match unlimited(v) {
                    true => None,
                    false => Some(u32::try_from(number(key, v)?).map_err(|_| format!("{key}={v}: too large"))?),
                }
            }
            "oversubscribe" | "shared" => {
                c.exclusive = false;
                c.oversubscribe = Some(v.to_string());
            }
            "preemptmode" => c.preempt_mode = Some(v.to_string()),
            "gracetime" => c.grace_time = Some(number(key, v)?),
            "allowaccounts" => c.allow_accounts = list(v),
            "denyaccounts" => c.deny_accounts = list(v),
            "allowqos" => c.allow_qos = list(v),
            "denyqos" => c.deny_qos = list(v),
            _ => return Err(format!("Update of this parameter is not supported: {key}={value}")),
        }
    }
    c.to_partition().map_err(|e| e.to_string().trim_start_matches("invalid configuration: ").to_string())
}

fn settings_of(r: &PutPartitionRequest) -> Vec<(String, String)> {
    r.settings.iter().map(|e| (e.key.clone(), e.value.clone())).collect()
}

fn level_check(api: &Api) -> Result<(), Status> {
    let level = api.replica.shared.read().state.cluster_level();
    if level < LIVE_CONFIG_LEVEL {
        return Err(Status::failed_precondition(format!(
            "partitions and nodes change at run time once every replica runs a release of feature level \
             {LIVE_CONFIG_LEVEL} (the cluster is at {level}); until then they follow the leader's configuration"
        )));
    }
    Ok(())
}

pub(super) async fn put_partition(
    api: &Api,
    _caller: &Caller,
    r: PutPartitionRequest,
) -> Result<AdminResponse, Status> {
    level_check(api)?;
    let name = r.name.trim().to_string();
    if name.is_empty() {
        return Err(Status::invalid_argument("name the partition (PartitionName=NAME)"));
    }
    check_name("PartitionName", &name)?;
    if r.settings.len() > MAX_SETTINGS {
        return Err(Status::invalid_argument(format!("{} settings: at most {MAX_SETTINGS}", r.settings.len())));
    }
    if let Some(e) = r.settings.iter().find(|e| e.key.len() > MAX_NAME_BYTES || e.value.len() > MAX_VALUE_BYTES) {
        return Err(Status::invalid_argument(format!(
            "a setting's key is at most {MAX_NAME_BYTES} bytes and its value {MAX_VALUE_BYTES}: '{}' is longer",
            e.key.chars().take(64).collect::<String>()
        )));
    }
    let settings = settings_of(&r);
    for _ in 0..PUT_TRIES {
        let previous = api.replica.shared.read().state.partitions.get(&name).cloned();
        match (&previous, r.create) {
            (Some(_), true) => {
                return Err(Status::already_exists(format!("partition '{name}' exists already: update it")))
            }
            (None, false) => return Err(Status::not_found(format!("there is no partition '{name}'"))),
            _ => {}
        }
        let partition = partition_after(&name, previous.as_ref(), &settings)
            .map_err(|e| Status::invalid_argument(format!("partition '{name}': {e}")))?;
        let command = Command::PutPartition { partition, previous, now: now_ms() };
        match api.replica.write(command).await.map_err(write_status)?.1 {
            Response::Ok => return Ok(AdminResponse {}),
            // Another change came between the read and the write: made again from it.
            Response::Rejected(Rejection::Partition { reason, .. }) if reason.contains("changed meanwhile") => continue,
            Response::Rejected(r) => return Err(rejection_status(&r)),
            other => return Err(Status::internal(format!("unexpected answer to a partition change: {other:?}"))),
        }
    }
    Err(Status::aborted(format!("partition '{name}' kept changing under this change; try again")))
}

pub(super) async fn delete_partition(
    api: &Api,
    _caller: &Caller,
    r: DeletePartitionRequest,
) -> Result<AdminResponse, Status> {
    level_check(api)?;
    let name = r.name.trim().to_string();
    check_name("PartitionName", &name)?;
    match api.replica.write(Command::DeletePartition { name, now: now_ms() }).await.map_err(write_status)?.1 {
        Response::Ok => Ok(AdminResponse {}),
        Response::Rejected(r) => Err(rejection_status(&r)),
        other => Err(Status::internal(format!("unexpected answer to a partition's delete: {other:?}"))),
    }
}

pub(super) async fn update_nodes(
    api: &Api,
    _caller: &Caller,
    r: UpdateNodesRequest,
) -> Result<UpdateNodesResponse, Status> {
    level_check(api)?;
    let nodes: Vec<String> = r.nodes.iter().map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect();
    if nodes.is_empty() {
        return Err(Status::invalid_argument("name at least one node"));
    }
    if nodes.len() > crate::model::hostlist::MAX_EXPANDED {
        return Err(Status::invalid_argument(format!(
            "{} nodes: at most {}",
            nodes.len(),
            crate::model::hostlist::MAX_EXPANDED
        )));
    }
    for n in &nodes {
        check_name("NodeName", n)?;
    }
    if r.down_reason.as_ref().is_some_and(|d| d.len() > MAX_VALUE_BYTES) {
        return Err(Status::invalid_argument(format!("Reason: at most {MAX_VALUE_BYTES} bytes")));
    }
    let down = match r.down_reason.as_deref().map(str::trim) {
        Some("") => return Err(Status::invalid_argument("you must specify a reason when DOWNING a node")),
        other => other.map(String::from),
    };
    let features = r
        .features
        .as_deref()
        .map(|f| f.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect::<Vec<_>>());
    if features.as_ref().is_some_and(|f| f.len() > MAX_FEATURES) {
        return Err(Status::invalid_argument(format!("Features: at most {MAX_FEATURES}")));
    }
    if let Some(bad) = features
        .iter()
        .flatten()
        .find(|f| f.len() > MAX_NAME_BYTES || !f.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c)))
    {
        return Err(Status::invalid_argument(format!(
            "'{bad}' is not a feature name (at most {MAX_NAME_BYTES} of letters, digits, _ - .)"
        )));
    }
    if r.weight.is_none() && features.is_none() && down.is_none() {
        return Err(Status::invalid_argument("nothing to change: Weight=, Features= or State=DOWN"));
    }
    let update = NodeUpdate { weight: r.weight, features, down };
    match api.replica.write(Command::UpdateNodes { nodes, update, now: now_ms() }).await.map_err(write_status)?.1 {
        Response::Ok => Ok(UpdateNodesResponse::default()),
        Response::NodeDowned { ended, requeued } => Ok(UpdateNodesResponse { ended, requeued }),
        Response::Rejected(r) => Err(rejection_status(&r)),
        other => Err(Status::internal(format!("unexpected answer to a node change: {other:?}"))),
    }
}

pub(super) async fn cluster_config(
    api: &Api,
    _caller: &Caller,
    _r: ClusterConfigRequest,
) -> Result<ClusterConfigResponse, Status> {
    read_barrier(api, false).await?;
    let applied = api.replica.shared.read();
    Ok(ClusterConfigResponse { toml: crate::site::site_toml(&applied.state, applied.applied_index()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[(&str, &str)]) -> Vec<(String, String)> {
        w.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn names_are_bounded_and_free_of_control_characters() {
        assert!(check_name("PartitionName", "gpu-a100").is_ok());
        assert!(check_name("PartitionName", &"p".repeat(MAX_NAME_BYTES)).is_ok());
        for bad in ["p".repeat(MAX_NAME_BYTES + 1), "a\nb".to_string(), "x\u{7}".to_string()] {
            let e = check_name("NodeName", &bad).unwrap_err();
            assert!(e.message().contains("NodeName: at most 256 bytes without control characters"), "{e:?}");
        }
    }

    #[test]
    fn slurms_partition_settings_make_a_partition_and_change_one() {
        let p = partition_after(
            "live",
            None,
            &words(&[
                ("Nodes", "n[1-2]"),
                ("MaxTime", "1:00:00"),
                ("State", "drain"),
                ("AllowAccounts", "lab,chem"),
                ("OverSubscribe", "FORCE:2"),
                ("PriorityTier", "3"),
                ("Default", "YES"),
            ]),
        )
        .unwrap();
        assert_eq!(p.node_names.iter().cloned().collect::<Vec<_>>(), ["n1", "n2"]);
        assert_eq!(p.max_time_s, Some(3600));
        assert_eq!(p.state, crate::model::PartitionState::Drain);
        assert_eq!(p.access.allow_accounts, ["lab", "chem"]);
        assert_eq!(p.oversubscribe.to_string(), "FORCE:2");
        assert!(p.default && p.priority_tier == 3);
        assert_eq!(p.default_mem_per_cpu_mb, 1024, "the configuration's default");
        // A change keeps what it does not name, and Slurm's words for "no limit" clear one.
        let q = partition_after(
            "live",
            Some(&p),
            &words(&[
                ("MaxTime", "UNLIMITED"),
                ("State", "UP"),
                ("AllowAccounts", "ALL"),
                ("OverSubscribe", "EXCLUSIVE"),
            ]),
        )
        .unwrap();
        assert_eq!(q.max_time_s, None);
        assert!(q.state.is_up() && q.access.is_open() && q.exclusive && q.oversubscribe.is_no());
        assert_eq!((q.nodes.as_str(), q.priority_tier, q.default), ("n[1-2]", 3, true));
        // A partition written out and read back is the same partition.
        assert_eq!(partition_after("live", Some(&p), &[]).unwrap(), p);
        for (bad, says) in [
            (("AllowGroups", "wheel"), "not supported: AllowGroups=wheel"),
            (("State", "SLEEPY"), "not a partition state"),
            (("MaxTime", "soon"), "soon"),
            (("Nodes", "n[1-"), "n[1-"),
            (("Default", "maybe"), "YES or NO"),
            (("Nodes", "ALL"), "name the nodes"),
        ] {
            let e = partition_after("live", Some(&p), &words(&[bad])).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        let e = partition_after("live", Some(&p), &words(&[("DenyAccounts", "x")])).unwrap_err();
        assert!(e.contains("allow and deny accounts both given"), "{e}");
    }
}
