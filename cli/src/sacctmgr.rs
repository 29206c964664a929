//! `sacctmgr`: the account tree, users, associations and QOS as Slurm's sacctmgr lists them
//! (`sacctmgr -n -s list user alice format=account%256`, `sacctmgr -P show assoc`,
//! `sacctmgr show qos`). Quorum keeps associations as accounts with their users: each account is
//! an association of its own, and each of its users another, under it. `add`, `modify` and
//! `delete` ([`crate::sacctmgr_change`]) send what `quorum admin account|qos` sends.

use clap::Parser;
use quorum_client::client::ControllersArg;
use quorum_proto::api::{self, AccountSpec, QosSpec};

use crate::commands::Context;
use crate::sacct::{hms, table, FormArgs};

#[derive(Parser, Debug)]
#[command(
    name = "sacctmgr",
    no_binary_name = true,
    about = "Accounts, users, associations and QOS (Quorum's sacctmgr)",
    after_help = "Commands: show|list ENTITY [where] [SPEC...] [format=FIELD[%WIDTH],...]\n\
                  Entities: account, user, association, qos, cluster (plural forms too).\n\
                  Specs: names=, accounts=, users=, clusters=, parent=, withassoc.\n\
                  Changes: add|modify|delete account|user|qos NAME [where SPEC...] [set KEY=VALUE...]\n\
                  (add account lab parent=root fairshare=10; add user alice account=lab;\n\
                  modify qos high set priority=100); asked to commit unless -i."
)]
pub struct SacctmgrArgs {
    #[command(flatten)]
    controllers: ControllersArg,
    #[command(flatten)]
    form: FormArgs,
    /// With users and accounts, a line for each of their associations (`withassoc`).
    #[arg(short = 's', long = "associations")]
    associations: bool,
    /// Commit changes without asking.
    #[arg(short = 'i', long)]
    immediate: bool,
    /// Print no messages but errors (accepted).
    #[arg(short = 'Q', long)]
    quiet: bool,
    /// The command, the entity, and its specifications.
    #[arg(num_args = 0.., allow_hyphen_values = true)]
    words: Vec<String>,
}

pub fn main(args: &[String]) -> std::process::ExitCode {
    crate::entry::main_of::<SacctmgrArgs, _, _>("sacctmgr", crate::entry::Threads::One, args, run)
}

/// What is listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entity {
    Account,
    User,
    Association,
    Qos,
    Cluster,
}

impl Entity {
    fn parse(word: &str) -> Option<Entity> {
        let w = word.to_ascii_lowercase();
        Some(match w.as_str() {
            "account" | "accounts" | "acct" | "accts" => Entity::Account,
            "user" | "users" => Entity::User,
            "association" | "associations" | "assoc" | "assocs" => Entity::Association,
            "qos" | "qoses" => Entity::Qos,
            "cluster" | "clusters" => Entity::Cluster,
            _ => return None,
        })
    }

    /// The fields shown when `format=` names none, as Slurm 22.05's.
    fn default_fields(self, withassoc: bool) -> &'static [&'static str] {
        match (self, withassoc) {
            (Entity::User, false) => &["User", "Def Acct"],
            (Entity::User, true) => &[
                "User",
                "Def Acct",
                "Cluster",
                "Account",
                "Partition",
                "Share",
                "MaxJobs",
                "MaxSubmit",
                "MaxWall",
                "QOS",
                "Def QOS",
            ],
            (Entity::Account, false) => &["Account", "Descr", "Org"],
            (Entity::Account, true) => &[
                "Account",
                "Descr",
                "Org",
                "Cluster",
                "Par Name",
                "User",
                "Share",
                "GrpTRES",
                "MaxJobs",
                "MaxSubmit",
                "MaxWall",
                "MaxTRES",
                "QOS",
                "Def QOS",
            ],
            (Entity::Association, _) => &[
                "Cluster",
                "Account",
                "User",
                "Partition",
                "Share",
                "GrpTRES",
                "GrpTRESMins",
                "MaxJobs",
                "MaxTRES",
                "MaxSubmit",
                "MaxWall",
                "QOS",
                "Def QOS",
            ],
            (Entity::Qos, _) => &[
                "Name",
                "Priority",
                "Flags",
                "GrpTRES",
                "GrpTRESMins",
                "GrpJobs",
                "MaxTRES",
                "MaxWall",
                "MaxTRESPU",
                "MaxJobsPU",
                "MaxSubmitPU",
            ],
            (Entity::Cluster, _) => &["Cluster"],
        }
    }
}

/// Every field, its header and width, with the names `format=` may also call it by.
const FIELDS: &[(&str, isize, &[&str])] = &[
    ("Cluster", 10, &[]),
    ("Account", 10, &[]),
    ("User", 10, &["login"]),
    ("Partition", 10, &[]),
    ("Par Name", 10, &["parentname", "parent"]),
    ("Def Acct", 10, &["defaultaccount", "defacct"]),
    ("Descr", 20, &["description"]),
    ("Org", 20, &["organization"]),
    ("Share", 9, &["fairshare", "shares"]),
    ("GrpTRES", 13, &[]),
    ("GrpTRESMins", 13, &[]),
    ("GrpJobs", 7, &[]),
    ("MaxJobs", 7, &[]),
    ("MaxSubmit", 9, &["maxsubmitjobs"]),
    ("MaxWall", 11, &["maxwalldurationperjob"]),
    ("MaxTRES", 13, &["maxtresperjob"]),
    ("QOS", 20, &[]),
    ("Def QOS", 9, &["defaultqos", "defqos"]),
    ("Name", 10, &[]),
    ("Priority", 10, &[]),
    ("Flags", 10, &[]),
    ("MaxTRESPU", 13, &["maxtresperuser"]),
    ("MaxJobsPU", 9, &["maxjobsperuser"]),
    ("MaxSubmitPU", 11, &["maxsubmitjobsperuser"]),
];

fn field(name: &str) -> Option<(&'static str, isize)> {
    let squashed: String = name.chars().filter(|c| !c.is_whitespace()).collect::<String>().to_ascii_lowercase();
    FIELDS
        .iter()
        .find(|(h, _, aka)| {
            h.chars().filter(|c| !c.is_whitespace()).collect::<String>().eq_ignore_ascii_case(&squashed)
                || aka.contains(&squashed.as_str())
        })
        .map(|(h, w, _)| (*h, *w))
}

/// `format=Account%256,User`: the fields with their widths (negative leans left).
fn parse_format(text: &str) -> Result<Vec<(&'static str, isize)>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(|f| {
            let (name, width) = f.split_once('%').map_or((f, None), |(n, w)| (n, Some(w)));
            let (header, own) = field(name).ok_or_else(|| {
                let names: Vec<&str> = FIELDS.iter().map(|(h, _, _)| *h).collect();
                format!("invalid format field '{name}' (known: {})", names.join(", "))
            })?;
            let width = match width {
                None => own,
                Some(w) => crate::sacct::width(w).ok_or_else(|| format!("invalid width in format field '{f}'"))?,
            };
            Ok((header, width))
        })
        .collect()
}

/// What a command asks: the entity, the names it is limited to, and the fields.
#[derive(Debug, Default)]
struct Query {
    names: Vec<String>,
    accounts: Vec<String>,
    users: Vec<String>,
    parents: Vec<String>,
    withassoc: bool,
    format: Option<String>,
}

fn list(values: &str) -> Vec<String> {
    values.split(',').map(str::trim).filter(|v| !v.is_empty()).map(String::from).collect()
}

/// Reads `show ENTITY [where] [SPEC...]`.
fn parse(words: &[String]) -> Result<(Entity, Query), String> {
    let usage = "give a command such as: sacctmgr show user alice withassoc format=account";
    let Some(command) = words.first() else { return Err(format!("no command: {usage}")) };
    match command.to_ascii_lowercase().as_str() {
        "show" | "list" => {}
        "archive" | "load" | "dump" => {
            return Err(format!(
                "'{command}' is not done by sacctmgr here: the job history is kept by the controllers (sacct reads it)"
            ))
        }
        other => return Err(format!("unknown command '{other}': {usage}")),
    }
    let entity_word = words.get(1).ok_or_else(|| format!("show what? {usage}"))?;
    let entity = Entity::parse(entity_word)
        .ok_or_else(|| format!("unknown entity '{entity_word}': account, user, association, qos or cluster"))?;
    let mut q = Query::default();
    for w in &words[2..] {
        let lower = w.to_ascii_lowercase();
        if lower == "where" || lower == "set" {
            if lower == "set" {
                return Err("'set' changes an entity: use 'quorum admin account' or 'quorum admin qos'".into());
            }
            continue;
        }
        if lower == "withassoc" || lower == "withassocs" {
            q.withassoc = true;
            continue;
        }
        if lower == "withcoord" || lower == "withdeleted" || lower == "withsubaccounts" || lower == "wopl" {
            continue;
        }
        let Some((key, value)) = w.split_once('=') else {
            // A bare word names the entity (`show user alice`).
            q.names.extend(list(w));
            continue;
        };
        match key.to_ascii_lowercase().as_str() {
            "name" | "names" => q.names.extend(list(value)),
            "account" | "accounts" | "acct" | "accts" => q.accounts.extend(list(value)),
            "user" | "users" => q.users.extend(list(value)),
            "parent" | "parentname" => q.parents.extend(list(value)),
            "format" => q.format = Some(value.to_string()),
            "cluster" | "clusters" => {
                if let Some(other) = list(value).into_iter().find(|c| c != "quorum" && c != "all") {
                    return Err(format!("unknown cluster '{other}': this is cluster 'quorum'"));
                }
            }
            other => return Err(format!("unknown specification '{other}=' for {entity_word}")),
        }
    }
    Ok((entity, q))
}

/// One association: an account's own (`user` empty) or a user's in it.
struct Assoc<'a> {
    account: &'a AccountSpec,
    user: Option<&'a str>,
}

/// The account's QOS (its own, or the nearest ancestor's that names some) and default QOS.
fn inherited<'a>(accounts: &'a [AccountSpec], a: &'a AccountSpec) -> (String, String) {
    let mut cur = Some(a);
    let (mut qos, mut def) = (None, None);
    for _ in 0..=64 {
        let Some(x) = cur else { break };
        if qos.is_none() && !x.qos.is_empty() {
            qos = Some(x.qos.join(","));
        }
        if def.is_none() && !x.default_qos.is_empty() {
            def = Some(x.default_qos.clone());
        }
        cur = accounts.iter().find(|p| p.name == x.parent && !x.parent.is_empty());
    }
    (qos.unwrap_or_else(|| "normal".into()), def.unwrap_or_default())
}

fn tres(t: Option<&api::TresLimit>, gpus: Option<u32>, by_type: &[(String, u32)]) -> String {
    let t = t.cloned().unwrap_or_default();
    let limit = quorum_model::TresLimit { cpus: t.cpus, gpus: t.gpus.or(gpus), mem_mb: t.mem_mb, nodes: t.nodes };
    let mut parts: Vec<String> = vec![limit.to_slurm()];
    parts.extend(by_type.iter().map(|(k, n)| format!("gres/gpu:{k}={n}")));
    parts.retain(|p| !p.is_empty());
    parts.join(",")
}

fn tres_mins(t: Option<&api::TresMins>) -> String {
    t.map(|t| quorum_model::TresMins { cpu: t.cpu, gpu: t.gpu }.to_slurm()).unwrap_or_default()
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

/// An association's field (the account's limits on its own line; a user's line has the shares,
/// the QOS and the default account).
fn assoc_value(field: &str, a: &Assoc, all: &[AccountSpec], default_account: &dyn Fn(&str) -> String) -> String {
    let acct = a.account;
    let own = a.user.is_none();
    let (qos, def_qos) = inherited(all, acct);
    match field {
        "Cluster" => "quorum".into(),
        "Account" => acct.name.clone(),
        "User" => a.user.unwrap_or_default().to_string(),
        "Partition" => String::new(),
        "Par Name" if own => acct.parent.clone(),
        "Def Acct" => a.user.map(default_account).unwrap_or_default(),
        "Descr" if own => acct.name.clone(),
        "Org" if own => {
            if acct.parent.is_empty() {
                acct.name.clone()
            } else {
                acct.parent.clone()
            }
        }
        "Share" => match a.user {
            None => acct.shares.to_string(),
            Some(u) => acct.user_shares.get(u).copied().unwrap_or(1).to_string(),
        },
        "GrpTRES" if own => {
            let grp = api::TresLimit {
                cpus: acct.grp_cpus,
                gpus: acct.grp_gpus,
                mem_mb: acct.grp_mem_mb,
                nodes: acct.grp_nodes,
            };
            let by_type: Vec<(String, u32)> = acct.grp_gpus_by_type.iter().map(|(k, v)| (k.clone(), *v)).collect();
            tres(Some(&grp), None, &by_type)
        }
        "GrpTRESMins" if own => tres_mins(acct.grp_tres_mins.as_ref()),
        "MaxJobs" if own => opt(acct.max_jobs),
        "MaxSubmit" if own => opt(acct.max_submit_jobs),
        "MaxWall" if own => acct.max_wall_s.map(hms).unwrap_or_default(),
        "MaxTRES" if own => tres(acct.max_tres_per_job.as_ref(), None, &[]),
        "QOS" => qos,
        "Def QOS" => def_qos,
        _ => String::new(),
    }
}

fn qos_value(field: &str, q: &QosSpec) -> String {
    match field {
        "Name" => q.name.clone(),
        "Priority" => q.priority.to_string(),
        "Flags" if q.no_decay => "NoDecay".into(),
        "GrpTRES" => tres(q.grp_tres.as_ref(), None, &[]),
        "GrpTRESMins" => tres_mins(q.grp_tres_mins.as_ref()),
        "GrpJobs" => opt(q.grp_jobs),
        "MaxTRES" => tres(q.max_tres_per_job.as_ref(), None, &[]),
        "MaxWall" => q.max_wall_s.map(hms).unwrap_or_default(),
        "MaxTRESPU" => tres(q.max_tres_per_user.as_ref(), q.max_gpus_per_user, &[]),
        "MaxJobsPU" => opt(q.max_jobs_per_user),
        "MaxSubmitPU" => opt(q.max_submit_jobs_per_user),
        _ => String::new(),
    }
}

/// The rows `query` asks for, each a value per field.
fn rows(
    entity: Entity,
    q: &Query,
    withassoc: bool,
    r: &api::ListAccountsResponse,
    fields: &[(&'static str, isize)],
) -> Vec<Vec<String>> {
    let accounts = &r.accounts;
    let default_account = |user: &str| {
        let mut mine: Vec<&AccountSpec> = accounts.iter().filter(|a| a.users.iter().any(|u| u == user)).collect();
        mine.sort_by(|a, b| a.name.cmp(&b.name));
        mine.first().map(|a| a.name.clone()).unwrap_or_default()
    };
    let named = |list: &[String], v: &str| list.is_empty() || list.iter().any(|n| n == v);
    let account_ok = |a: &AccountSpec| named(&q.accounts, &a.name) && named(&q.parents, &a.parent);
    let line = |a: &Assoc| fields.iter().map(|(f, _)| assoc_value(f, a, accounts, &default_account)).collect();
    match entity {
        Entity::Cluster => {
            vec![fields.iter().map(|(f, _)| if *f == "Cluster" { "quorum".into() } else { String::new() }).collect()]
        }
        Entity::Qos => r
            .qos
            .iter()
            .filter(|x| named(&q.names, &x.name))
            .map(|x| fields.iter().map(|(f, _)| qos_value(f, x)).collect())
            .collect(),
        Entity::Account => {
            let mut out = Vec::new();
            for a in accounts.iter().filter(|a| named(&q.names, &a.name) && account_ok(a)) {
                out.push(line(&Assoc { account: a, user: None }));
                if withassoc {
                    for u in a.users.iter().filter(|u| named(&q.users, u)) {
                        out.push(line(&Assoc { account: a, user: Some(u) }));
                    }
                }
            }
            out
        }
        Entity::User => {
            let mut users: Vec<&str> = accounts.iter().flat_map(|a| a.users.iter().map(String::as_str)).collect();
            users.sort_unstable();
            users.dedup();
            let wanted: Vec<String> = q.names.iter().chain(&q.users).cloned().collect();
            let mut out = Vec::new();
            for user in users.into_iter().filter(|u| named(&wanted, u)) {
                if withassoc {
                    for a in accounts.iter().filter(|a| account_ok(a) && a.users.iter().any(|x| x == user)) {
                        out.push(line(&Assoc { account: a, user: Some(user) }));
                    }
                } else {
                    let first = accounts.iter().find(|a| a.users.iter().any(|x| x == user));
                    if let Some(a) = first.filter(|_| q.accounts.is_empty()) {
                        out.push(line(&Assoc { account: a, user: Some(user) }));
                    }
                }
            }
            out
        }
        Entity::Association => {
            let mut out = Vec::new();
            for a in accounts.iter().filter(|a| account_ok(a)) {
                if q.users.is_empty() {
                    out.push(line(&Assoc { account: a, user: None }));
                }
                for u in a.users.iter().filter(|u| named(&q.users, u)) {
                    out.push(line(&Assoc { account: a, user: Some(u) }));
                }
            }
            out
        }
    }
}

/// Whether the command changes something.
fn changes(words: &[String]) -> bool {
    words.first().is_some_and(|w| {
        matches!(w.to_ascii_lowercase().as_str(), "add" | "create" | "modify" | "update" | "delete" | "remove")
    })
}

/// `add|modify|delete`: says what would change, asks unless `-i`, then sends it.
async fn change(a: &SacctmgrArgs) -> anyhow::Result<u8> {
    use std::io::Write;
    let entity = a.words.get(1).ok_or_else(|| anyhow::anyhow!("{} what? account, user or qos", a.words[0]))?;
    let ctx = Context { client: a.controllers.client()?, stale: false };
    let have = ctx.send(api::ListAccountsRequest {}, |mut c, r| async move { c.list_accounts(r).await }).await?;
    let plan = crate::sacctmgr_change::plan(&a.words[0], entity, &a.words[2..], &have).map_err(anyhow::Error::msg)?;
    if !a.quiet {
        for line in &plan.said {
            println!("{line}");
        }
    }
    if !a.immediate {
        print!("Would you like to commit changes? (You have 30 seconds to decide)\n(N/y): ");
        std::io::stdout().flush()?;
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        if !matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
            println!(" Changes Discarded");
            return Ok(1);
        }
    }
    for c in plan.changes {
        match c {
            crate::sacctmgr_change::Change::Account(account) => {
                let req = api::UpsertAccountRequest { account: Some(account), user: crate::commands::current_user() };
                ctx.send(req, |mut c, r| async move { c.upsert_account(r).await }).await?;
            }
            crate::sacctmgr_change::Change::Qos(qos) => {
                let req = api::UpsertQosRequest { qos: Some(qos), user: crate::commands::current_user() };
                ctx.send(req, |mut c, r| async move { c.upsert_qos(r).await }).await?;
            }
        }
    }
    Ok(0)
}

pub async fn run(a: SacctmgrArgs) -> anyhow::Result<u8> {
    if changes(&a.words) {
        return change(&a).await;
    }
    let (entity, q) = parse(&a.words).map_err(anyhow::Error::msg)?;
    let withassoc = a.associations || q.withassoc;
    let fields = match &q.format {
        Some(f) => parse_format(f).map_err(anyhow::Error::msg)?,
        None => entity.default_fields(withassoc).iter().filter_map(|f| field(f)).collect(),
    };
    let ctx = Context { client: a.controllers.client()?, stale: false };
    let r = ctx.send(api::ListAccountsRequest {}, |mut c, r| async move { c.list_accounts(r).await }).await?;
    let rows = rows(entity, &q, withassoc, &r, &fields);
    print!("{}", table(&fields, rows.into_iter(), a.form.parsable(), !a.form.noheader));
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> api::ListAccountsResponse {
        let account = |name: &str, parent: &str, users: &[&str]| AccountSpec {
            name: name.into(),
            parent: parent.into(),
            shares: 2,
            users: users.iter().map(|u| u.to_string()).collect(),
            ..Default::default()
        };
        let mut lab = account("lab", "root", &["alice", "bob"]);
        lab.max_jobs = Some(4);
        lab.grp_gpus = Some(8);
        lab.qos = vec!["normal".into(), "high".into()];
        lab.user_shares.insert("alice".into(), 3);
        api::ListAccountsResponse {
            accounts: vec![account("root", "", &[]), lab, account("zoo", "root", &["alice"])],
            qos: vec![QosSpec { name: "high".into(), priority: 100, max_jobs_per_user: Some(2), ..Default::default() }],
        }
    }

    fn show(words: &[&str], assoc: bool, parsable: bool) -> String {
        let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
        let (entity, q) = parse(&words).unwrap();
        let withassoc = assoc || q.withassoc;
        let fields = match &q.format {
            Some(f) => parse_format(f).unwrap(),
            None => entity.default_fields(withassoc).iter().filter_map(|f| field(f)).collect(),
        };
        let rows = rows(entity, &q, withassoc, &tree(), &fields);
        table(&fields, rows.into_iter(), parsable.then_some(false), parsable)
    }

    #[test]
    fn what_snakemake_and_sites_ask_reads_as_slurms() {
        // Snakemake's account check: every account of the user, one a line.
        let out = show(&["list", "user", "alice", "format=account%256"], true, false);
        assert_eq!(out, format!("{:>256} \n{:>256} \n", "lab", "zoo"));
        assert_eq!(
            show(&["show", "user", "format=User,DefaultAccount"], false, true),
            "User|Def Acct\nalice|lab\nbob|lab\n"
        );
        assert_eq!(
            show(
                &["show", "assoc", "where", "account=lab", "format=Account,User,Share,MaxJobs,GrpTRES,QOS"],
                false,
                true
            ),
            "Account|User|Share|MaxJobs|GrpTRES|QOS\nlab||2|4|gres/gpu=8|normal,high\nlab|alice|3||\
             |normal,high\nlab|bob|1|||normal,high\n"
        );
        // A sub-account with no QOS of its own has its parent's, and at the top `normal`.
        assert_eq!(
            show(&["show", "account", "zoo", "format=account,qos,parentname"], false, true),
            "Account|QOS|Par Name\nzoo|normal|root\n"
        );
        assert_eq!(
            show(&["list", "qos", "format=Name,Priority,MaxJobsPU"], false, true),
            "Name|Priority|MaxJobsPU\nhigh|100|2\n"
        );
        assert_eq!(show(&["show", "cluster", "format=cluster"], false, true), "Cluster\nquorum\n");
    }

    #[test]
    fn what_it_cannot_do_is_named() {
        let words = |w: &[&str]| w.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(parse(&words(&["dump", "cluster"])).unwrap_err().contains("'dump'"));
        assert!(changes(&words(&["add", "account", "x"])) && !changes(&words(&["show", "account"])));
        assert!(parse(&words(&["show", "bogus"])).unwrap_err().contains("'bogus'"));
        assert!(parse(&words(&["show", "user", "color=red"])).unwrap_err().contains("'color='"));
        assert!(parse(&words(&["show", "user", "cluster=other"])).unwrap_err().contains("'other'"));
        assert!(parse(&words(&[])).unwrap_err().contains("no command"));
        assert!(parse_format("Bogus").unwrap_err().contains("'Bogus'"));
        assert!(parse_format("account%x").unwrap_err().contains("width"));
        let args = SacctmgrArgs::try_parse_from(["-n", "-s", "list", "user", "alice", "format=account%256"]).unwrap();
        assert!(args.form.noheader && args.associations);
        assert_eq!(args.words, ["list", "user", "alice", "format=account%256"]);
    }
}
