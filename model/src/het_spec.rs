//! What a heterogeneous job's spec answers (see [`crate::het`]): its components as specs of
//! their own, what a heterogeneous job may not be, and what its processes are told.

use crate::het::{HetComponent, MAX_COMPONENTS};
use crate::{JobSpec, Rejection};

impl HetComponent {
    /// What `spec` asks for, as a component.
    pub fn of(spec: &JobSpec) -> HetComponent {
        HetComponent {
            nodes: spec.nodes,
            ntasks: spec.ntasks,
            cpus_per_task: spec.cpus_per_task,
            mem_per_node_mb: spec.mem_per_node_mb,
            gpus_per_node: spec.gpus_per_node,
            gpu_type: spec.gpu_type.clone(),
            constraint: spec.constraint.clone(),
            constraint_any: spec.constraint_any,
            constraint_same: spec.constraint_same,
            constraint_counts: spec.constraint_counts.clone(),
            exclusive: spec.exclusive,
            exclude: spec.exclude.clone(),
            nodelist: spec.nodelist.clone(),
            partition: spec.partition.clone(),
        }
    }

    fn put_into(&self, spec: &mut JobSpec) {
        spec.nodes = self.nodes;
        spec.ntasks = self.ntasks;
        spec.cpus_per_task = self.cpus_per_task;
        spec.mem_per_node_mb = self.mem_per_node_mb;
        spec.gpus_per_node = self.gpus_per_node;
        spec.gpu_type = self.gpu_type.clone();
        spec.constraint = self.constraint.clone();
        spec.constraint_any = self.constraint_any;
        spec.constraint_same = self.constraint_same;
        spec.constraint_counts = self.constraint_counts.clone();
        spec.exclusive = self.exclusive;
        spec.exclude = self.exclude.clone();
        spec.nodelist = self.nodelist.clone();
        if self.partition.is_some() {
            spec.partition = self.partition.clone();
        }
    }
}

impl JobSpec {
    /// How many components the job has: 1 unless it is heterogeneous.
    pub fn components(&self) -> usize {
        1 + self.het.len()
    }

    /// Component `k`'s spec: the job's, with component `k`'s resources (`k` = 0: its own), and
    /// no components of its own. `None` past the last.
    pub fn component(&self, k: usize) -> Option<JobSpec> {
        let mut spec = JobSpec { het: Vec::new(), env: Default::default(), ..self.clone() };
        if k > 0 {
            self.het.get(k - 1)?.put_into(&mut spec);
        }
        Some(spec)
    }

    /// Replaces component `k`'s resources with `spec`'s (as admission resolves them). A
    /// component's partition is kept only where it is not the job's.
    pub fn set_component(&mut self, k: usize, spec: &JobSpec) {
        match k {
            0 => {
                let het = std::mem::take(&mut self.het);
                HetComponent::of(spec).put_into(self);
                self.het = het;
            }
            k => {
                let job = self.partition.clone();
                if let Some(c) = self.het.get_mut(k - 1) {
                    *c = HetComponent::of(spec);
                    if c.partition == job {
                        c.partition = None;
                    }
                }
            }
        }
    }

    /// Component `k`'s partition: its own, or the job's.
    pub fn partition_of(&self, k: usize) -> Option<&str> {
        match k {
            0 => self.partition.as_deref(),
            k => self.het.get(k - 1).and_then(|c| c.partition.as_deref()).or(self.partition.as_deref()),
        }
    }

    /// Whether a component runs in a partition of its own (not the job's).
    pub fn spans_partitions(&self) -> bool {
        self.het.iter().any(|c| c.partition.as_ref().is_some_and(|p| Some(p) != self.partition.as_ref()))
    }

    /// What a heterogeneous job may not be, checked at admission beside each component's own
    /// shape: too many components, an array, interactive, in a reservation, or running its
    /// program on every node.
    pub fn check_het(&self) -> Result<(), Rejection> {
        if self.het.is_empty() {
            return Ok(());
        }
        let invalid = |reason: String| Err(Rejection::InvalidSpec { field: "het".into(), reason });
        if self.components() > MAX_COMPONENTS {
            return invalid(format!("{} components, more than the {MAX_COMPONENTS} a job may have", self.components()));
        }
        if self.array.is_some() {
            return invalid("a heterogeneous job cannot be a job array".into());
        }
        if self.interactive {
            return invalid("an allocation (salloc, srun) cannot be heterogeneous here; submit it with sbatch".into());
        }
        if self.reservation.is_some() {
            return invalid("a heterogeneous job cannot run in an advance reservation here".into());
        }
        if !self.batch_step {
            return invalid("a heterogeneous job runs its script once, on its first node (not --every-node)".into());
        }
        let total: u64 = (0..self.components()).map(|k| u64::from(self.node_count_of(k))).sum();
        if total > u64::from(crate::limits::MAX_NODES) {
            return invalid(format!(
                "its components ask for {total} nodes together, more than {}",
                crate::limits::MAX_NODES
            ));
        }
        Ok(())
    }

    /// How many nodes component `k` asks for (0 past the last).
    pub fn node_count_of(&self, k: usize) -> u32 {
        match k {
            0 => self.nodes,
            k => self.het.get(k - 1).map_or(0, |c| c.nodes),
        }
    }

    /// The nodes of all components together.
    pub fn total_nodes(&self) -> u32 {
        (0..self.components()).map(|k| self.node_count_of(k)).fold(0u32, u32::saturating_add)
    }
}

impl JobSpec {
    /// What a heterogeneous job's processes are told of its components, as Slurm tells them:
    /// `SLURM_HET_SIZE`, and each component's job variables with `_HET_GROUP_K` appended (and
    /// under Slurm's older `PACK` names too). Empty for any other job.
    pub fn het_environment(
        &self,
        job_id: crate::JobId,
        partition: &str,
        allocation: &crate::Allocation,
    ) -> Vec<(String, String)> {
        let spec = self;
        if spec.het.is_empty() {
            return Vec::new();
        }
        let size = spec.components().to_string();
        let mut out = vec![("SLURM_HET_SIZE".to_string(), size.clone()), ("SLURM_PACK_SIZE".to_string(), size)];
        for k in 0..spec.components() {
            let Some(c) = spec.component(k) else { continue };
            let group = k as u32;
            let nodes = allocation.group(group).count() as u32;
            let vars: [(&str, String); 11] = [
                ("JOB_ID", (job_id + k as u64).to_string()),
                ("JOB_NAME", spec.name.clone()),
                ("JOB_NODELIST", allocation.group_nodelist(group)),
                ("JOB_NUM_NODES", nodes.to_string()),
                ("JOB_PARTITION", c.partition.clone().filter(|_| k > 0).unwrap_or_else(|| partition.to_string())),
                ("NTASKS", c.ntasks.to_string()),
                ("NPROCS", c.ntasks.to_string()),
                ("CPUS_PER_TASK", c.cpus_per_task.to_string()),
                ("JOB_CPUS_PER_NODE", crate::step::run_lengths(allocation.group(group).map(|n| n.cpus))),
                ("MEM_PER_NODE", c.mem_per_node_mb.unwrap_or(0).to_string()),
                ("TASKS_PER_NODE", crate::step::tasks_per_node(c.ntasks, nodes)),
            ];
            for (name, value) in vars {
                out.push((format!("SLURM_{name}_HET_GROUP_{k}"), value.clone()));
                out.push((format!("SLURM_{name}_PACK_GROUP_{k}"), value));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::het::{HetComponent, MAX_COMPONENTS};

    fn het_spec() -> JobSpec {
        let mut spec = JobSpec {
            nodes: 1,
            ntasks: 1,
            cpus_per_task: 1,
            batch_step: true,
            program: crate::Program::Script("#!/bin/sh\ntrue\n".into()),
            ..Default::default()
        };
        spec.het.push(HetComponent { nodes: 2, ntasks: 4, cpus_per_task: 2, gpus_per_node: 1, ..Default::default() });
        spec
    }

    #[test]
    fn a_component_is_the_jobs_spec_with_its_own_resources() {
        let spec = het_spec();
        assert_eq!(spec.components(), 2);
        let c1 = spec.component(1).unwrap();
        assert_eq!((c1.nodes, c1.ntasks, c1.cpus_per_task, c1.gpus_per_node), (2, 4, 2, 1));
        assert_eq!(c1.cpus_per_node(), 4);
        assert!(c1.het.is_empty());
        assert_eq!(c1.program, spec.program);
        assert_eq!(spec.component(0).unwrap().nodes, 1);
        assert!(spec.component(2).is_none());
        assert_eq!(spec.total_nodes(), 3);
        let mut s = spec.clone();
        let mut resolved = c1.clone();
        resolved.mem_per_node_mb = Some(512);
        s.set_component(1, &resolved);
        assert_eq!(s.het[0].mem_per_node_mb, Some(512));
        s.set_component(0, &resolved);
        assert_eq!((s.nodes, s.het.len()), (2, 1));
    }

    #[test]
    fn what_a_heterogeneous_job_may_not_be_is_refused_by_name() {
        assert!(het_spec().check_het().is_ok());
        let refused = |f: fn(&mut JobSpec)| {
            let mut s = het_spec();
            f(&mut s);
            match s.check_het() {
                Err(Rejection::InvalidSpec { field, reason }) => format!("{field}: {reason}"),
                other => panic!("expected a refusal, got {other:?}"),
            }
        };
        assert!(refused(|s| s.batch_step = false).contains("not --every-node"));
        assert!(refused(|s| s.interactive = true).contains("salloc"));
        assert!(refused(|s| s.reservation = Some("maint".into())).contains("reservation"));
        assert!(
            refused(|s| s.array = Some(crate::array::ArraySpec { ranges: Vec::new(), throttle: 0 })).contains("array")
        );
        assert!(refused(|s| s.het = vec![HetComponent::default(); MAX_COMPONENTS]).contains("129 components"));
    }

    #[test]
    fn each_component_is_told_its_own_nodes_tasks_and_cpus() {
        let spec = het_spec();
        let on = |node: &str, cpus, het_group| crate::NodeAllocation {
            node: node.into(),
            cpus,
            mem_mb: 100,
            gpus: vec![],
            het_group,
        };
        let a = crate::Allocation { nodes: vec![on("n3", 1, 0), on("n1", 4, 1), on("n2", 4, 1)], cpu_ways: None };
        let env: std::collections::BTreeMap<String, String> =
            spec.het_environment(7, "batch", &a).into_iter().collect();
        let get = |k: &str| env.get(k).map(String::as_str);
        assert_eq!(get("SLURM_HET_SIZE"), Some("2"));
        assert_eq!(get("SLURM_JOB_ID_HET_GROUP_1"), Some("8"));
        assert_eq!(get("SLURM_JOB_NODELIST_HET_GROUP_0"), Some("n3"));
        assert_eq!(get("SLURM_JOB_NODELIST_HET_GROUP_1"), Some("n[1-2]"));
        assert_eq!(get("SLURM_JOB_NUM_NODES_HET_GROUP_1"), Some("2"));
        assert_eq!(get("SLURM_NTASKS_HET_GROUP_1"), Some("4"));
        assert_eq!(get("SLURM_CPUS_PER_TASK_HET_GROUP_1"), Some("2"));
        assert_eq!(get("SLURM_JOB_CPUS_PER_NODE_HET_GROUP_1"), Some("4(x2)"));
        assert_eq!(get("SLURM_TASKS_PER_NODE_HET_GROUP_1"), Some("2(x2)"));
        assert_eq!(get("SLURM_NTASKS_PACK_GROUP_0"), Some("1"));
        let plain = JobSpec { het: Vec::new(), ..spec };
        assert!(plain.het_environment(7, "batch", &a).is_empty());
    }
}
