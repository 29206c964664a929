//! `sshare`: the account tree with shares, usage and fairshare factors, as Slurm's prints it
//! (each account indented under its parent, with a line for the caller under each account they
//! belong to; `-a` a line for every user, `-U` the users' lines alone), or `|`-separated with
//! `-P`; `-o` picks the fields (`Account%256`).

use clap::Parser;
use quorum_client::client::ControllersArg;
use quorum_proto::api::{self, AccountShare, SharesResponse};

use crate::commands::Context;

#[derive(Parser, Debug)]
#[command(
    name = "sshare",
    no_binary_name = true,
    infer_long_args = true,
    about = "Fairshare by account (Quorum's sshare)"
)]
pub struct SshareArgs {
    #[command(flatten)]
    controllers: ControllersArg,
    /// A line for every user (by default, only yours).
    #[arg(short = 'a', long = "all")]
    all: bool,
    /// The users' lines alone, without the accounts' (`-U`).
    #[arg(short = 'U', long = "Users")]
    users_only: bool,
    /// Fields, comma-separated (Account, User, RawShares, NormShares, RawUsage, EffectvUsage,
    /// FairShare; `Account%256` for a width).
    #[arg(short = 'o', long = "format", value_delimiter = ',')]
    format: Vec<String>,
    /// Only these accounts (and what is under them).
    #[arg(short = 'A', long = "accounts", value_delimiter = ',')]
    accounts: Vec<String>,
    /// Only these users' lines.
    #[arg(short = 'u', long = "users", value_delimiter = ',')]
    users: Vec<String>,
    /// No header lines.
    #[arg(short = 'n', long = "noheader")]
    noheader: bool,
    /// `|` between fields, no padding.
    #[arg(short = 'P', long = "parsable2")]
    parsable: bool,
}

pub fn main(args: &[String]) -> std::process::ExitCode {
    crate::entry::main_of::<SshareArgs, _, _>("sshare", crate::entry::Threads::One, args, run)
}

const HEADERS: [(&str, usize); 7] = [
    ("Account", 20),
    ("User", 10),
    ("RawShares", 10),
    ("NormShares", 11),
    ("RawUsage", 11),
    ("EffectvUsage", 13),
    ("FairShare", 10),
];

fn depth(r: &SharesResponse, a: &AccountShare) -> usize {
    let mut d = 0;
    let mut cur = Some(a);
    while let Some(p) = cur.filter(|a| !a.parent.is_empty()) {
        d += 1;
        cur = r.accounts.iter().find(|x| x.name == p.parent);
        if d > 64 {
            break;
        }
    }
    d
}

/// Whether `a` is one of `names` or under one.
fn under(r: &SharesResponse, a: &AccountShare, names: &[String]) -> bool {
    let mut cur = Some(a);
    for _ in 0..=64 {
        let Some(x) = cur else { return false };
        if names.contains(&x.name) {
            return true;
        }
        cur = r.accounts.iter().find(|p| p.name == x.parent);
    }
    false
}

/// The fields `-o` names, each with its width (`Account%256`; a negative width leans left).
fn fields(format: &[String]) -> Result<Vec<(usize, usize, bool)>, String> {
    if format.is_empty() {
        return Ok((0..HEADERS.len()).map(|i| (i, HEADERS[i].1, i == 0)).collect());
    }
    format
        .iter()
        .map(|f| f.trim())
        .filter(|f| !f.is_empty())
        .map(|f| {
            let (name, width) = f.split_once('%').map_or((f, None), |(n, w)| (n, Some(w)));
            let i = HEADERS.iter().position(|(h, _)| h.eq_ignore_ascii_case(name)).ok_or_else(|| {
                let names: Vec<&str> = HEADERS.iter().map(|(h, _)| *h).collect();
                format!("invalid --format field '{name}' (known: {})", names.join(", "))
            })?;
            let (width, left) = match width {
                None => (HEADERS[i].1, i == 0),
                Some(w) => {
                    let n = crate::sacct::width(w)
                        .ok_or_else(|| format!("invalid width in --format field '{f}' (at most 1024)"))?;
                    (n.unsigned_abs(), n < 0)
                }
            };
            Ok((i, width, left))
        })
        .collect()
}

fn render(r: &SharesResponse, a: &SshareArgs, me: &str) -> Result<String, String> {
    let fields = fields(&a.format)?;
    let wanted = |u: &str| {
        if a.users.is_empty() {
            a.all || u == me
        } else {
            a.users.iter().any(|w| w == u)
        }
    };
    let mut rows: Vec<[String; 7]> = Vec::new();
    for acct in r.accounts.iter().filter(|x| a.accounts.is_empty() || under(r, x, &a.accounts)) {
        let d = depth(r, acct);
        if !a.users_only {
            rows.push([
                format!("{}{}", " ".repeat(d), acct.name),
                String::new(),
                acct.raw_shares.to_string(),
                format!("{:.6}", acct.norm_shares),
                format!("{:.0}", acct.raw_usage),
                format!("{:.6}", acct.norm_usage),
                format!("{:.6}", acct.fairshare),
            ]);
        }
        let indent = if a.users_only { String::new() } else { " ".repeat(d + 1) };
        let own: Vec<&api::UserShare> = r.users.iter().filter(|u| u.account == acct.name).collect();
        for u in own.iter().filter(|u| wanted(&u.user)) {
            rows.push([
                format!("{indent}{}", acct.name),
                u.user.clone(),
                u.raw_shares.to_string(),
                format!("{:.6}", u.norm_shares),
                format!("{:.0}", u.raw_usage),
                format!("{:.6}", u.effective_usage),
                format!("{:.6}", u.fairshare),
            ]);
        }
        // A controller from before user shares sends none: its users share the account's.
        let before = own.is_empty();
        for user in acct.users.iter().filter(|u| before && wanted(u)) {
            rows.push([
                format!("{indent}{}", acct.name),
                user.clone(),
                "parent".into(),
                format!("{:.6}", acct.norm_shares),
                format!("{:.0}", acct.raw_usage),
                format!("{:.6}", acct.norm_usage),
                format!("{:.6}", acct.fairshare),
            ]);
        }
    }
    let mut out = String::new();
    if a.parsable {
        if !a.noheader {
            out.push_str(&fields.iter().map(|(i, _, _)| HEADERS[*i].0).collect::<Vec<_>>().join("|"));
            out.push('\n');
        }
        for row in rows {
            out.push_str(&fields.iter().map(|(i, _, _)| row[*i].trim_start()).collect::<Vec<_>>().join("|"));
            out.push('\n');
        }
        return Ok(out);
    }
    let cell = |(_, w, left): &(usize, usize, bool), text: &str| {
        let w = *w;
        let text: String = text.chars().take(w).collect();
        if *left {
            format!("{text:<w$}")
        } else {
            format!("{text:>w$}")
        }
    };
    if !a.noheader {
        out.push_str(&fields.iter().map(|f| cell(f, HEADERS[f.0].0)).collect::<Vec<_>>().join(" "));
        out.push_str(" \n");
        out.push_str(&fields.iter().map(|(_, w, _)| "-".repeat(*w)).collect::<Vec<_>>().join(" "));
        out.push_str(" \n");
    }
    for row in rows {
        let line: Vec<String> = fields.iter().map(|f| cell(f, &quorum_client::display::escape(&row[f.0]))).collect();
        out.push_str(&line.join(" "));
        out.push_str(" \n");
    }
    Ok(out)
}

pub async fn run(a: SshareArgs) -> anyhow::Result<u8> {
    let ctx = Context { client: a.controllers.client()?, stale: false };
    let r = ctx.send(api::SharesRequest {}, |mut c, r| async move { c.shares(r).await }).await?;
    print!("{}", render(&r, &a, &crate::commands::current_user()).map_err(anyhow::Error::msg)?);
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_prints_as_slurms_does() {
        let acct = |name: &str, parent: &str, users: &[&str]| AccountShare {
            name: name.into(),
            parent: parent.into(),
            raw_shares: 1,
            norm_shares: 0.5,
            raw_usage: 12.0,
            norm_usage: 0.25,
            fairshare: 0.625,
            users: users.iter().map(|u| u.to_string()).collect(),
        };
        let r = SharesResponse {
            accounts: vec![acct("root", "", &[]), acct("physics", "root", &["alice"])],
            users: Vec::new(),
        };
        let args = |extra: &[&str]| SshareArgs::try_parse_from(extra).unwrap();
        let out = render(&r, &args(&["-a"]), "root").unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0],
            "Account                    User  RawShares  NormShares    RawUsage  EffectvUsage  FairShare "
        );
        assert_eq!(
            lines[1],
            "-------------------- ---------- ---------- ----------- ----------- ------------- ---------- "
        );
        assert_eq!(
            lines[3],
            " physics                                 1    0.500000          12      0.250000   0.625000 "
        );
        assert_eq!(
            lines[4],
            "  physics                 alice     parent    0.500000          12      0.250000   0.625000 "
        );
        assert_eq!(
            render(&r, &args(&["-P", "-n", "-A", "physics"]), "root").unwrap(),
            "physics||1|0.500000|12|0.250000|0.625000\n"
        );
        // Without -a, the caller's own line under each of their accounts.
        assert_eq!(
            render(&r, &args(&["-P", "-n", "-A", "physics"]), "alice").unwrap(),
            "physics||1|0.500000|12|0.250000|0.625000\nphysics|alice|parent|0.500000|12|0.250000|0.625000\n"
        );
        // What Snakemake asks: the caller's accounts, one a line, in a wide column.
        let out = render(&r, &args(&["-U", "--format", "Account%256", "--noheader"]), "alice").unwrap();
        assert_eq!(out, format!("{:>256} \n", "physics"));
        let out = render(&r, &args(&["-U", "-o", "Account%-12,User", "-n"]), "alice").unwrap();
        assert_eq!(out, "physics           alice \n");
        assert!(render(&r, &args(&["-o", "Bogus"]), "alice").unwrap_err().contains("'Bogus'"));
        // A controller that sends users' own rows: each with its shares and factor.
        let user = |name: &str, shares: u32, fairshare: f64| api::UserShare {
            account: "physics".into(),
            user: name.into(),
            raw_shares: shares,
            norm_shares: 0.5 * f64::from(shares) / 4.0,
            raw_usage: 6.0,
            effective_usage: 0.2,
            fairshare,
        };
        let r = SharesResponse { users: vec![user("alice", 3, 0.7), user("bob", 1, 0.2)], ..r };
        let out = render(&r, &args(&["-a", "-P", "-n", "-A", "physics"]), "root").unwrap();
        assert_eq!(
            out,
            "physics||1|0.500000|12|0.250000|0.625000\nphysics|alice|3|0.375000|6|0.200000|0.700000\n\
             physics|bob|1|0.125000|6|0.200000|0.200000\n"
        );
    }
}
