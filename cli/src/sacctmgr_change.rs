//! `sacctmgr add|modify|delete` with Slurm's syntax (`sacctmgr -i add account lab parent=root
//! fairshare=10`, `sacctmgr modify user where name=alice account=lab set fairshare=3`), worked
//! out against the accounts and QOS the cluster has into the same upserts `quorum admin
//! account|qos` sends. Pure: [`plan`] says what would change; the caller asks, then sends.
//! What Quorum keeps no place for is refused by name, never dropped.

use quorum_proto::api::{self, AccountSpec, QosSpec};

/// One change to send.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    Account(AccountSpec),
    Qos(QosSpec),
}

/// What a command changes, and how sacctmgr says so before it commits.
#[derive(Debug, PartialEq)]
pub struct Plan {
    pub changes: Vec<Change>,
    pub said: Vec<String>,
}

fn list(values: &str) -> Vec<String> {
    values.split(',').map(str::trim).filter(|v| !v.is_empty()).map(String::from).collect()
}

fn number(key: &str, value: &str) -> Result<Option<u32>, String> {
    // Slurm clears a limit with -1.
    if value == "-1" {
        return Ok(None);
    }
    value.parse::<u32>().map(Some).map_err(|_| format!("{key}={value}: a whole number (or -1 for none)"))
}

fn wall(value: &str) -> Result<Option<u64>, String> {
    if value == "-1" {
        return Ok(None);
    }
    quorum_model::parse::parse_time_limit(value).map_err(|e| format!("maxwall={value}: {e}"))
}

fn tres(key: &str, value: &str) -> Result<Option<api::TresLimit>, String> {
    if value == "-1" {
        return Ok(None);
    }
    let t = quorum_model::TresLimit::parse(value).map_err(|e| format!("{key}={value}: {e}"))?;
    Ok(Some(api::TresLimit { cpus: t.cpus, gpus: t.gpus, mem_mb: t.mem_mb, nodes: t.nodes }))
}

fn tres_mins(key: &str, value: &str) -> Result<Option<api::TresMins>, String> {
    if value == "-1" {
        return Ok(None);
    }
    let t = quorum_model::TresMins::parse(value).map_err(|e| format!("{key}={value}: {e}"))?;
    Ok(Some(api::TresMins { cpu: t.cpu, gpu: t.gpu }))
}

/// Keys Slurm takes that Quorum keeps no place for: refused by name.
const NOT_KEPT: &[&str] = &[
    "cluster",
    "clusters",
    "wckey",
    "wckeys",
    "grpwall",
    "maxtresmins",
    "maxtresminsperjob",
    "grptresrunmins",
    "maxnodes",
    "maxnodesperjob",
    "adminlevel",
    "coordinator",
    "partition",
    "partitions",
    "preempt",
    "preemptmode",
    "usagefactor",
    "gracetime",
];

/// An account's setting `key=value` (lower-case key) applied to `a`.
fn set_account(a: &mut AccountSpec, key: &str, value: &str) -> Result<(), String> {
    match key {
        "parent" | "parentname" => a.parent = value.to_string(),
        "fairshare" | "share" | "shares" => {
            a.shares = value.parse().map_err(|_| format!("fairshare={value}: a whole number"))?
        }
        "maxjobs" => a.max_jobs = number(key, value)?,
        "maxsubmitjobs" | "maxsubmit" => a.max_submit_jobs = number(key, value)?,
        "maxwall" | "maxwalldurationperjob" => a.max_wall_s = wall(value)?,
        "maxtres" | "maxtresperjob" => a.max_tres_per_job = tres(key, value)?,
        "grptresmins" => a.grp_tres_mins = tres_mins(key, value)?,
        "grptres" => {
            let t = tres(key, value)?.unwrap_or_default();
            (a.grp_cpus, a.grp_gpus, a.grp_mem_mb, a.grp_nodes) = (t.cpus, t.gpus, t.mem_mb, t.nodes);
        }
        "qos" | "qoslevel" => {
            a.qos = match value.strip_prefix('+') {
                Some(more) => a.qos.iter().cloned().chain(list(more)).collect(),
                None => match value.strip_prefix('-') {
                    Some(less) => {
                        let less = list(less);
                        a.qos.iter().filter(|q| !less.contains(q)).cloned().collect()
                    }
                    None => list(value),
                },
            };
            a.qos.dedup();
        }
        "defaultqos" => a.default_qos = value.to_string(),
        _ => return Err(unknown(key, "an account")),
    }
    Ok(())
}

/// A QOS's setting.
fn set_qos(q: &mut QosSpec, key: &str, value: &str) -> Result<(), String> {
    match key {
        "priority" => q.priority = value.parse().map_err(|_| format!("priority={value}: a whole number"))?,
        "maxwall" | "maxwalldurationperjob" => q.max_wall_s = wall(value)?,
        "maxjobsperuser" | "maxjobspu" => q.max_jobs_per_user = number(key, value)?,
        "maxsubmitjobsperuser" | "maxsubmitjobspu" | "maxsubmitpu" => q.max_submit_jobs_per_user = number(key, value)?,
        "maxtresperjob" | "maxtres" => q.max_tres_per_job = tres(key, value)?,
        "maxtresperuser" | "maxtrespu" => q.max_tres_per_user = tres(key, value)?,
        "grptres" => q.grp_tres = tres(key, value)?,
        "grpjobs" => q.grp_jobs = number(key, value)?,
        "grptresmins" => q.grp_tres_mins = tres_mins(key, value)?,
        "flags" => {
            for flag in list(value) {
                match flag.trim_start_matches(['+', '-']).to_ascii_lowercase().as_str() {
                    "nodecay" => q.no_decay = !flag.starts_with('-'),
                    other => return Err(format!("flags={other}: this cluster keeps only NoDecay")),
                }
            }
        }
        _ => return Err(unknown(key, "a QOS")),
    }
    Ok(())
}

/// Slurm's tree has an account `root` at its top; here the top accounts have no parent, unless
/// a site made one named root. A parent named must exist.
fn top_level(a: &mut AccountSpec, have: &api::ListAccountsResponse) -> Result<(), String> {
    let exists = |n: &str| have.accounts.iter().any(|x| x.name == n);
    if a.parent == "root" && !exists("root") {
        a.parent.clear();
    }
    if !a.parent.is_empty() && !exists(&a.parent) {
        return Err(format!("account {}: its parent {} does not exist", a.name, a.parent));
    }
    Ok(())
}

fn unknown(key: &str, of: &str) -> String {
    if NOT_KEPT.contains(&key) {
        format!("{key}= is not kept for {of} here: refused rather than dropped")
    } else {
        format!("unknown setting '{key}=' for {of}")
    }
}

/// The words of a command after its entity: the names (bare words or `name=`), the `where`
/// conditions and the `set` settings (for add, every `key=value` is a setting).
#[derive(Default, Debug)]
struct Words {
    names: Vec<String>,
    accounts: Vec<String>,
    set: Vec<(String, String)>,
}

fn words_of(rest: &[String], adding: bool) -> Result<Words, String> {
    let mut w = Words::default();
    let mut setting = adding;
    for word in rest {
        let lower = word.to_ascii_lowercase();
        match lower.as_str() {
            "where" => {
                setting = false;
                continue;
            }
            "set" => {
                setting = true;
                continue;
            }
            _ => {}
        }
        match word.split_once('=') {
            None => w.names.extend(list(word)),
            Some((k, v)) => {
                let k = k.to_ascii_lowercase();
                match k.as_str() {
                    "name" | "names" | "user" | "users" if !setting || adding => w.names.extend(list(v)),
                    "account" | "accounts" | "acct" if adding || !setting => w.accounts.extend(list(v)),
                    "cluster" | "clusters" if list(v).iter().all(|c| c == "quorum" || c == "all") => {}
                    _ => w.set.push((k, v.to_string())),
                }
            }
        }
    }
    Ok(w)
}

/// What `command entity rest...` changes, against the cluster's accounts and QOS.
pub fn plan(command: &str, entity: &str, rest: &[String], have: &api::ListAccountsResponse) -> Result<Plan, String> {
    let command = match command.to_ascii_lowercase().as_str() {
        "add" | "create" => "add",
        "modify" | "update" => "modify",
        "delete" | "remove" => "delete",
        other => return Err(format!("'{other}' is not done by sacctmgr here")),
    };
    let entity = entity.to_ascii_lowercase();
    let entity = entity.trim_end_matches('s');
    let w = words_of(rest, command == "add")?;
    let account = |name: &str| have.accounts.iter().find(|a| a.name == name).cloned();
    let mut plan = Plan { changes: Vec::new(), said: Vec::new() };
    match (command, entity) {
        ("add", "account") => {
            if w.names.is_empty() {
                return Err("add account: name the account (sacctmgr add account NAME ...)".into());
            }
            plan.said.push(" Adding Account(s)".into());
            for name in &w.names {
                if account(name).is_some() {
                    return Err(format!("account {name} already exists: use sacctmgr modify account"));
                }
                let mut a = AccountSpec { name: name.clone(), shares: 1, ..Default::default() };
                for (k, v) in &w.set {
                    match k.as_str() {
                        // Recorded by Slurm for people; nothing here reads them.
                        "description" | "organization" => {}
                        _ => set_account(&mut a, k, v)?,
                    }
                }
                top_level(&mut a, have)?;
                plan.said.push(format!("  {name}"));
                plan.changes.push(Change::Account(a));
            }
        }
        ("add", "user") | ("modify", "user") | ("delete", "user") => {
            if w.names.is_empty() {
                return Err(format!("{command} user: name the user (sacctmgr {command} user NAME account=ACCOUNT)"));
            }
            let targets: Vec<AccountSpec> = if w.accounts.is_empty() {
                match command {
                    "add" => return Err("add user: name its account (account=ACCOUNT)".into()),
                    // Every account the users are in.
                    _ => have.accounts.iter().filter(|a| a.users.iter().any(|u| w.names.contains(u))).cloned().collect(),
                }
            } else {
                w.accounts
                    .iter()
                    .map(|n| account(n).ok_or_else(|| format!("account {n} does not exist")))
                    .collect::<Result<_, _>>()?
            };
            if targets.is_empty() {
                return Err(format!("no association of {} to {command}", w.names.join(",")));
            }
            plan.said.push(
                match command {
                    "add" => " Adding User(s)",
                    "modify" => " Modified user associations...",
                    _ => " Deleting user associations...",
                }
                .into(),
            );
            for mut a in targets {
                for user in &w.names {
                    match command {
                        "add" if !a.users.contains(user) => a.users.push(user.clone()),
                        "add" => {}
                        "delete" => {
                            a.users.retain(|u| u != user);
                            a.user_shares.remove(user);
                        }
                        _ if !a.users.contains(user) => continue,
                        _ => {}
                    }
                    for (k, v) in &w.set {
                        match k.as_str() {
                            "fairshare" | "share" | "shares" => {
                                let n = v.parse().map_err(|_| format!("fairshare={v}: a whole number"))?;
                                a.user_shares.insert(user.clone(), n);
                            }
                            // Quorum's default account of a user is the first that names them.
                            "defaultaccount" if *v == a.name => {}
                            _ => return Err(unknown(k, "a user")),
                        }
                    }
                    plan.said.push(format!("  C = quorum     A = {:<10} U = {user}", a.name));
                }
                plan.changes.push(Change::Account(a));
            }
        }
        ("modify", "account") => {
            if w.names.is_empty() || w.set.is_empty() {
                return Err("modify account: name it and what to set (modify account NAME set KEY=VALUE)".into());
            }
            plan.said.push(" Modified account associations...".into());
            for name in &w.names {
                let mut a = account(name).ok_or_else(|| format!("account {name} does not exist"))?;
                for (k, v) in &w.set {
                    set_account(&mut a, k, v)?;
                }
                top_level(&mut a, have)?;
                plan.said.push(format!("  C = quorum     A = {name}"));
                plan.changes.push(Change::Account(a));
            }
        }
        ("add", "qo") | ("modify", "qo") => {
            if w.names.is_empty() {
                return Err(format!("{command} qos: name the QOS"));
            }
            plan.said.push(if command == "add" { " Adding QOS(s)" } else { " Modified qos..." }.into());
            for name in &w.names {
                let known = have.qos.iter().find(|q| q.name == *name).cloned();
                let mut q = match (command, known) {
                    ("add", Some(_)) => return Err(format!("QOS {name} already exists: use sacctmgr modify qos")),
                    ("add", None) => QosSpec { name: name.clone(), ..Default::default() },
                    (_, Some(q)) => q,
                    (_, None) => return Err(format!("QOS {name} does not exist")),
                };
                for (k, v) in &w.set {
                    match k.as_str() {
                        "description" => {}
                        _ => set_qos(&mut q, k, v)?,
                    }
                }
                plan.said.push(format!("  {name}"));
                plan.changes.push(Change::Qos(q));
            }
        }
        ("delete", "account") | ("delete", "qo") => {
            return Err(format!(
                "deleting {entity}s is not done here: jobs and the job history go on naming them; remove an account's users with 'sacctmgr delete user NAME account=ACCOUNT', or limit it (maxjobs=0)"
            ))
        }
        (_, other) => return Err(format!("{command} {other}: this sacctmgr changes accounts, users and qos")),
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn have() -> api::ListAccountsResponse {
        api::ListAccountsResponse {
            accounts: vec![
                AccountSpec { name: "root".into(), shares: 1, ..Default::default() },
                AccountSpec {
                    name: "lab".into(),
                    parent: "root".into(),
                    shares: 2,
                    users: vec!["alice".into()],
                    ..Default::default()
                },
            ],
            qos: vec![QosSpec { name: "high".into(), priority: 10, ..Default::default() }],
        }
    }

    fn plan_of(words: &str) -> Result<Plan, String> {
        let w: Vec<String> = words.split_whitespace().map(String::from).collect();
        plan(&w[0], &w[1], &w[2..], &have())
    }

    fn account(p: &Plan) -> &AccountSpec {
        match &p.changes[0] {
            Change::Account(a) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn slurms_add_modify_and_delete_become_upserts() {
        let p = plan_of("add account bio parent=lab fairshare=10 maxjobs=4 grptres=cpu=64,gres/gpu=8 description=x")
            .unwrap();
        let a = account(&p);
        assert_eq!((a.name.as_str(), a.parent.as_str(), a.shares, a.max_jobs), ("bio", "lab", 10, Some(4)));
        assert_eq!((a.grp_cpus, a.grp_gpus), (Some(64), Some(8)));
        assert_eq!(p.said, [" Adding Account(s)", "  bio"]);

        // Slurm's root is the top of the tree where no account is named so.
        let mut no_root = have();
        no_root.accounts.remove(0);
        no_root.accounts[0].parent.clear();
        let w: Vec<String> = ["parent=root".to_string()].to_vec();
        let p =
            plan("add", "account", &["x".to_string()].iter().cloned().chain(w).collect::<Vec<_>>(), &no_root).unwrap();
        assert_eq!(account(&p).parent, "");

        let p = plan_of("add user bob account=lab fairshare=3").unwrap();
        let a = account(&p);
        assert_eq!(a.users, ["alice", "bob"]);
        assert_eq!(a.user_shares.get("bob"), Some(&3));

        let p = plan_of("modify user where name=alice set fairshare=5").unwrap();
        assert_eq!(account(&p).user_shares.get("alice"), Some(&5));
        let p = plan_of("modify account where name=lab set maxjobs=-1 qos=+high maxwall=2:00:00").unwrap();
        let a = account(&p);
        assert_eq!(
            (a.max_jobs, a.qos.clone(), a.max_wall_s, a.users.len()),
            (None, vec!["high".to_string()], Some(7200), 1)
        );
        let p = plan_of("delete user alice account=lab").unwrap();
        assert!(account(&p).users.is_empty());

        let p = plan_of("add qos urgent priority=100 maxjobsperuser=2 flags=NoDecay").unwrap();
        match &p.changes[0] {
            Change::Qos(q) => assert_eq!((q.priority, q.max_jobs_per_user, q.no_decay), (100, Some(2), true)),
            other => panic!("{other:?}"),
        }
        let p = plan_of("modify qos high set priority=20").unwrap();
        assert!(matches!(&p.changes[0], Change::Qos(q) if q.priority == 20));
    }

    #[test]
    fn what_cannot_be_kept_or_makes_no_sense_is_refused_by_name() {
        assert!(plan_of("add account lab").unwrap_err().contains("already exists"));
        assert!(plan_of("add account x parent=nowhere").unwrap_err().contains("nowhere"));
        assert!(plan_of("add account x wckey=a").unwrap_err().contains("wckey= is not kept"));
        assert!(plan_of("add account x color=red").unwrap_err().contains("'color='"));
        assert!(plan_of("add user bob").unwrap_err().contains("account=ACCOUNT"));
        assert!(plan_of("add user bob account=nope").unwrap_err().contains("nope"));
        assert!(plan_of("delete account lab").unwrap_err().contains("not done here"));
        assert!(plan_of("modify qos nope set priority=1").unwrap_err().contains("does not exist"));
        assert!(plan_of("add qos q flags=DenyOnLimit").unwrap_err().contains("NoDecay"));
        assert!(plan_of("add account x maxjobs=lots").unwrap_err().contains("maxjobs=lots"));
    }
}
