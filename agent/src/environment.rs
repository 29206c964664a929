//! The environment a job runs in: what it was submitted with, then Quorum's variables under
//! their `QUORUM_*` and `SLURM_*` names (the job, its allocation, its array task), so that Slurm
//! scripts read what they expect.

use quorum_model::step::tasks_per_node;
use quorum_proto::agent::Launch;
use quorum_proto::api::JobSpec;

/// The job's environment: the submit environment, then Quorum's variables under their
/// `QUORUM_*` and `SLURM_*` names; `slurm_commands` (where the node has `scontrol` and the other
/// Slurm names linked) first on its `PATH`.
pub fn job_environment(
    launch: &Launch,
    spec: &JobSpec,
    node: &str,
    slurm_commands: Option<&std::path::Path>,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = spec.env.iter().map(|e| (e.name.clone(), e.value.clone())).collect();
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.push(("PATH".into(), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()));
    }
    if let (Some(dir), Some((_, path))) = (slurm_commands, env.iter_mut().find(|(k, _)| k == "PATH")) {
        *path = format!("{}:{path}", dir.display());
    }
    let first_node = quorum_first_host(&launch.nodelist).unwrap_or_else(|| node.to_string());
    let gpus = launch.gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(",");
    let vars: [(&str, String); 12] = [
        ("JOB_ID", launch.job_id.to_string()),
        ("JOB_NAME", spec.name.clone()),
        ("JOB_NODELIST", launch.nodelist.clone()),
        ("JOB_NUM_NODES", launch.num_nodes.to_string()),
        ("NNODES", launch.num_nodes.to_string()),
        ("NODEID", launch.node_rank.to_string()),
        ("NTASKS", spec.ntasks.to_string()),
        ("CPUS_PER_TASK", spec.cpus_per_task.to_string()),
        ("GPUS_PER_NODE", launch.gpus.len().to_string()),
        ("SUBMIT_DIR", spec.submit_dir.clone()),
        ("JOB_PARTITION", spec.partition.clone()),
        ("JOB_USER", launch.user.clone()),
    ];
    for (suffix, value) in vars {
        set_both(&mut env, suffix, value);
    }
    let nodes = launch.num_nodes.max(1);
    let mut more: Vec<(&str, String)> = vec![
        ("JOBID", launch.job_id.to_string()),
        ("NODELIST", launch.nodelist.clone()),
        // Each node's copy of the job is the task of its rank.
        ("PROCID", launch.node_rank.to_string()),
        ("LOCALID", "0".into()),
        ("CPUS_ON_NODE", launch.cpus.to_string()),
        ("JOB_CPUS_PER_NODE", launch.cpus.to_string()),
        ("GPUS_ON_NODE", launch.gpus.len().to_string()),
        ("MEM_PER_NODE", launch.mem_mb.to_string()),
        ("TASKS_PER_NODE", tasks_per_node(spec.ntasks, nodes)),
        ("CLUSTER_NAME", "quorum".into()),
    ];
    if spec.ntasks.is_multiple_of(nodes) {
        more.push(("NTASKS_PER_NODE", (spec.ntasks / nodes).to_string()));
    }
    if launch.restart_count > 0 {
        more.push(("RESTART_COUNT", launch.restart_count.to_string()));
    }
    // `--overcommit`: its steps overcommit too, as srun reads it.
    if spec.overcommit {
        more.push(("OVERCOMMIT", "1".into()));
    }
    more.extend(
        [("JOB_ACCOUNT", &spec.account), ("JOB_QOS", &spec.qos)]
            .into_iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| (k, v.clone())),
    );
    for (suffix, value) in more {
        set_both(&mut env, suffix, value);
    }
    if !spec.het.is_empty() {
        // A heterogeneous job's own variables are its component 0's, as Slurm sets them; the
        // leader sent each component's under `_HET_GROUP_K`.
        let group0 = |name: &str| {
            let key = format!("SLURM_{name}_HET_GROUP_0");
            env.iter().find(|(k, _)| *k == key).map(|(_, v)| v.clone())
        };
        let nodes = group0("JOB_NUM_NODES").unwrap_or_else(|| "1".into());
        let overrides: Vec<(&str, String)> = [
            ("JOB_NODELIST", group0("JOB_NODELIST")),
            ("NODELIST", group0("JOB_NODELIST")),
            ("JOB_NUM_NODES", Some(nodes.clone())),
            ("NNODES", Some(nodes.clone())),
            ("TASKS_PER_NODE", group0("TASKS_PER_NODE")),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect();
        for (suffix, value) in overrides {
            set_both(&mut env, suffix, value);
        }
        let per_node = nodes.parse::<u32>().ok().filter(|n| *n > 0 && spec.ntasks.is_multiple_of(*n));
        env.retain(|(k, _)| k != "QUORUM_NTASKS_PER_NODE" && k != "SLURM_NTASKS_PER_NODE");
        if let Some(n) = per_node {
            set_both(&mut env, "NTASKS_PER_NODE", (spec.ntasks / n).to_string());
        }
    }
    if let Some(a) = &launch.array {
        let vars: [(&str, String); 5] = [
            ("ARRAY_JOB_ID", a.array_job_id.to_string()),
            ("ARRAY_TASK_ID", a.task_id.to_string()),
            ("ARRAY_TASK_COUNT", a.count.to_string()),
            ("ARRAY_TASK_MIN", a.min.to_string()),
            ("ARRAY_TASK_MAX", a.max.to_string()),
        ];
        for (suffix, value) in vars {
            set_both(&mut env, suffix, value);
        }
    }
    env.retain(|(k, _)| {
        !matches!(k.as_str(), "QUORUM_MASTER_ADDR" | "CUDA_VISIBLE_DEVICES" | "GPU_DEVICE_ORDINAL" | "SLURMD_NODENAME")
    });
    env.push(("QUORUM_MASTER_ADDR".into(), first_node));
    env.push(("SLURMD_NODENAME".into(), node.to_string()));
    if !gpus.is_empty() {
        env.push(("GPU_DEVICE_ORDINAL".into(), gpus.clone()));
    }
    env.push(("CUDA_VISIBLE_DEVICES".into(), gpus));
    env
}

/// Takes `SLURM_UMASK` (the submitting process's umask, in octal, as `sbatch` and `srun` send it)
/// out of `env` and returns it; `None` when it is missing or not a mask (the job then gets
/// [`crate::supervisor::DEFAULT_UMASK`]). As Slurm's step daemon does, the job runs with it and
/// does not see the variable.
pub fn take_umask(env: &mut Vec<(String, String)>) -> Option<u32> {
    let mut mask = None;
    env.retain(|(k, v)| {
        if k != "SLURM_UMASK" {
            return true;
        }
        match u32::from_str_radix(v.trim(), 8) {
            Ok(m) if m <= 0o777 && !v.trim().is_empty() => mask = Some(m),
            _ => tracing::debug!(value = %v, "SLURM_UMASK is not an octal mask; the default is used"),
        }
        false
    });
    mask
}

/// Sets `QUORUM_<suffix>` and `SLURM_<suffix>` to `value`, replacing what the submit
/// environment had under either name.
fn set_both(env: &mut Vec<(String, String)>, suffix: &str, value: String) {
    // (Compared in place: a job's environment is the submitter's whole one, and this runs for
    // each of some twenty names at every launch.)
    env.retain(|(k, _)| k.strip_prefix("QUORUM_").or_else(|| k.strip_prefix("SLURM_")) != Some(suffix));
    env.push((format!("QUORUM_{suffix}"), value.clone()));
    env.push((format!("SLURM_{suffix}"), value));
}

/// The first name of a compressed hostlist, without pulling in the controller's parser.
fn quorum_first_host(nodelist: &str) -> Option<String> {
    let first = nodelist.split(',').next()?;
    match first.find('[') {
        None => Some(first.to_string()),
        Some(open) => {
            let inner = &nodelist[open + 1..];
            let lo = inner.split(['-', ',', ']']).next()?;
            Some(format!("{}{}", &first[..open], lo))
        }
    }
}

#[cfg(test)]
mod umask_tests {
    use super::*;

    #[test]
    fn the_submitters_umask_is_taken_out_of_the_environment() {
        let env = |v: &str| vec![("A".to_string(), "1".to_string()), ("SLURM_UMASK".to_string(), v.to_string())];
        for (given, want) in [("0027", 0o027), ("077", 0o077), ("0", 0), ("0777", 0o777)] {
            let mut e = env(given);
            assert_eq!(take_umask(&mut e), Some(want), "{given}");
            assert_eq!(e, [("A".to_string(), "1".to_string())], "the job does not see it");
        }
        for bad in ["", "8", "01000", "abc", "-1"] {
            assert_eq!(take_umask(&mut env(bad)), None, "{bad:?}");
        }
        assert_eq!(take_umask(&mut vec![]), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::testing::{array_task, launch};

    #[test]
    fn an_array_task_is_told_its_array() {
        let task = array_task();
        let env = job_environment(&task, task.spec.as_ref().unwrap(), "n", None);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("SLURM_ARRAY_JOB_ID"), Some("40"));
        assert_eq!(get("QUORUM_ARRAY_TASK_ID"), Some("7"));
        assert_eq!((get("SLURM_ARRAY_TASK_COUNT"), get("SLURM_ARRAY_TASK_MAX")), (Some("8"), Some("7")));
        assert_eq!(get("SLURM_JOB_ID"), Some("45"));
    }

    #[test]
    fn environment_names_the_allocation() {
        let l = launch();
        let env = job_environment(&l, l.spec.as_ref().unwrap(), "gpu04", Some(std::path::Path::new("/opt/q/slurm")));
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("QUORUM_JOB_ID"), Some("42"));
        assert_eq!(get("SLURM_JOB_ID"), Some("42"));
        assert_eq!(get("SLURM_JOB_NODELIST"), Some("gpu[03-04]"));
        assert_eq!(get("QUORUM_NODEID"), Some("1"));
        assert_eq!(get("QUORUM_MASTER_ADDR"), Some("gpu03"));
        assert_eq!(get("CUDA_VISIBLE_DEVICES"), Some("2,5"));
        assert_eq!(get("GPU_DEVICE_ORDINAL"), Some("2,5"));
        assert_eq!(get("SLURM_CPUS_PER_TASK"), Some("3"));
        assert_eq!(get("SLURM_JOBID"), Some("42"));
        assert_eq!(get("SLURM_NODELIST"), Some("gpu[03-04]"));
        assert_eq!((get("SLURM_PROCID"), get("SLURM_LOCALID")), (Some("1"), Some("0")));
        assert_eq!(get("SLURM_CPUS_ON_NODE"), Some(l.cpus.to_string().as_str()));
        assert_eq!(get("SLURM_GPUS_ON_NODE"), Some("2"));
        assert_eq!(get("SLURM_CLUSTER_NAME"), Some("quorum"));
        assert!(get("PATH").unwrap().starts_with("/opt/q/slurm:"), "{:?}", get("PATH"));
    }

    /// A job submitted from inside another (sbatch from a batch script) carries the outer job's
    /// variables: the job's own replace them under both names, and nothing else goes.
    #[test]
    fn the_submitters_slurm_variables_are_replaced_not_kept() {
        let mut l = launch();
        let spec = l.spec.as_mut().unwrap();
        for (name, value) in [("SLURM_JOB_ID", "7"), ("QUORUM_JOB_ID", "7"), ("SLURM_JOB_IDS", "x"), ("JOB_ID", "y")] {
            spec.env.push(quorum_proto::api::EnvVar { name: name.into(), value: value.into() });
        }
        let env = job_environment(&l, l.spec.as_ref().unwrap(), "gpu04", None);
        let all = |k: &str| env.iter().filter(|(n, _)| n == k).map(|(_, v)| v.as_str()).collect::<Vec<_>>();
        assert_eq!((all("SLURM_JOB_ID"), all("QUORUM_JOB_ID")), (vec!["42"], vec!["42"]));
        assert_eq!((all("SLURM_JOB_IDS"), all("JOB_ID")), (vec!["x"], vec!["y"]));
    }

    #[test]
    fn tasks_per_node_is_written_as_slurm_writes_it() {
        assert_eq!(tasks_per_node(6, 3), "2(x3)");
        assert_eq!(tasks_per_node(7, 3), "3,2(x2)");
        assert_eq!(tasks_per_node(5, 3), "2(x2),1");
        assert_eq!(tasks_per_node(1, 1), "1");
        assert_eq!(tasks_per_node(2, 4), "1(x2),0(x2)");
    }
}
