//! `sshare`: the account tree with shares, usage and fairshare factors, as Slurm's prints it
//! (each account indented under its parent; `-a` adds a line for each user with the user's own
//! shares, usage, effective usage and factor), or `|`-separated with `-P`.

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
    /// A line for each user too.
    #[arg(short = 'a', long = "all")]
    all: bool,
    /// Only these accounts (and what is under them).
    #[arg(short = 'A', long = "accounts", value_delimiter = ',')]
    accounts: Vec<String>,
    /// Only these users' lines (with -a).
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

fn render(r: &SharesResponse, a: &SshareArgs) -> String {
    let mut rows: Vec<[String; 7]> = Vec::new();
    for acct in r.accounts.iter().filter(|x| a.accounts.is_empty() || under(r, x, &a.accounts)) {
        let d = depth(r, acct);
        rows.push([
            format!("{}{}", " ".repeat(d), acct.name),
            String::new(),
            acct.raw_shares.to_string(),
            format!("{:.6}", acct.norm_shares),
            format!("{:.0}", acct.raw_usage),
            format!("{:.6}", acct.norm_usage),
            format!("{:.6}", acct.fairshare),
        ]);
        if a.all {
            let wanted = |u: &str| a.users.is_empty() || a.users.iter().any(|w| w == u);
            let own: Vec<&api::UserShare> = r.users.iter().filter(|u| u.account == acct.name).collect();
            for u in own.iter().filter(|u| wanted(&u.user)) {
                rows.push([
                    format!("{}{}", " ".repeat(d + 1), acct.name),
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
                    format!("{}{}", " ".repeat(d + 1), acct.name),
                    user.clone(),
                    "parent".into(),
                    format!("{:.6}", acct.norm_shares),
                    format!("{:.0}", acct.raw_usage),
                    format!("{:.6}", acct.norm_usage),
                    format!("{:.6}", acct.fairshare),
                ]);
            }
        }
    }
    let mut out = String::new();
    if a.parsable {
        if !a.noheader {
            out.push_str(&HEADERS.map(|(h, _)| h).join("|"));
            out.push('\n');
        }
        for row in rows {
            out.push_str(&row.map(|c| c.trim_start().to_string()).join("|"));
            out.push('\n');
        }
        return out;
    }
    let cell = |i: usize, text: &str| {
        let (_, w) = HEADERS[i];
        let text: String = text.chars().take(w).collect();
        if i == 0 {
            format!("{text:<w$}")
        } else {
            format!("{text:>w$}")
        }
    };
    if !a.noheader {
        out.push_str(&(0..7).map(|i| cell(i, HEADERS[i].0)).collect::<Vec<_>>().join(" "));
        out.push_str(" \n");
        out.push_str(&HEADERS.map(|(_, w)| "-".repeat(w)).join(" "));
        out.push_str(" \n");
    }
    for row in rows {
        out.push_str(&(0..7).map(|i| cell(i, &quorum_client::display::escape(&row[i]))).collect::<Vec<_>>().join(" "));
        out.push_str(" \n");
    }
    out
}

pub async fn run(a: SshareArgs) -> anyhow::Result<u8> {
    let ctx = Context { client: a.controllers.client()?, stale: false };
    let r = ctx.send(api::SharesRequest {}, |mut c, r| async move { c.shares(r).await }).await?;
    print!("{}", render(&r, &a));
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
        let out = render(&r, &args(&["-a"]));
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
        assert_eq!(render(&r, &args(&["-P", "-n", "-A", "physics"])), "physics||1|0.500000|12|0.250000|0.625000\n");
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
        let out = render(&r, &args(&["-a", "-P", "-n", "-A", "physics"]));
        assert_eq!(
            out,
            "physics||1|0.500000|12|0.250000|0.625000\nphysics|alice|3|0.375000|6|0.200000|0.700000\n\
             physics|bob|1|0.125000|6|0.200000|0.200000\n"
        );
    }
}
