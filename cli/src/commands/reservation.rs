//! `quorum reservation create|update|delete|show`: advance reservations, with the keys of
//! `scontrol create reservation` (`ReservationName=maint StartTime=now+1hour Duration=120
//! Nodes=n[1-4] Users=root Flags=MAINT`), which `scontrol` also answers to.

use std::process::ExitCode;

use quorum_client::display::{self, null_or};
use quorum_model::reservation::{ResvEnd, ResvRequest};
use quorum_proto::api::{self, ReservationInfo, ReservationRequest};

use super::Context;

#[derive(clap::Subcommand)]
#[command(defer = true)] // built when invoked, as `quorum`'s own subcommands are
pub enum Args {
    /// Make one: ReservationName=NAME StartTime=now|now+1hour|2026-12-01T08:00 Duration=MINUTES|
    /// [D-]H:M:S|UNLIMITED (or EndTime=TIME) Nodes=LIST (or NodeCnt=N [PartitionName=P])
    /// Users=a,b and/or Accounts=x,y [Flags=MAINT,IGNORE_JOBS,DAILY,WEEKLY] (operators).
    Create {
        /// KEY=VALUE words, as scontrol takes them.
        #[arg(required = true)]
        words: Vec<String>,
    },
    /// Change one: ReservationName=NAME and what changes, as for create (operators).
    Update {
        /// ReservationName=NAME and the KEY=VALUE words to change.
        #[arg(required = true)]
        words: Vec<String>,
    },
    /// Delete one, refused while a job is in it (operators).
    Delete {
        /// The reservation's name.
        name: String,
    },
    /// The reservations not yet over (or one), as scontrol show reservation prints them.
    Show {
        /// Only this reservation.
        name: Option<String>,
        /// One line each.
        #[arg(short = 'o', long)]
        oneliner: bool,
    },
}

pub async fn run(ctx: &Context, args: Args) -> anyhow::Result<ExitCode> {
    let out = match args {
        Args::Create { words } => create(ctx, &words, false).await,
        Args::Update { words } => create(ctx, &words, true).await,
        Args::Delete { name } => delete(ctx, &name).await,
        Args::Show { name, oneliner } => show(ctx, name.as_deref(), oneliner).await,
    };
    match out {
        Ok(text) => {
            print!("{text}");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("quorum: error: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// The request that scontrol's `KEY=VALUE` words make (keys in any case), times read in local
/// time as of `now_ms`.
pub fn request(words: &[String], now_ms: u64) -> Result<ReservationRequest, String> {
    let time = |key: &str, value: &str| {
        quorum_client::submit::parse_begin(value, now_ms).map_err(|e| e.replace("--begin", key))
    };
    let r = ResvRequest::from_words(words, &time)?;
    let names = |l: &Vec<String>| l.join(",");
    Ok(ReservationRequest {
        name: r.name,
        start_ms: r.start_ms,
        end_ms: match r.end {
            Some(ResvEnd::At(t)) => Some(t),
            _ => None,
        },
        duration_s: match r.end {
            Some(ResvEnd::After(s)) => Some(s),
            _ => None,
        },
        unlimited: r.end == Some(ResvEnd::Unlimited),
        nodes: r
            .nodes
            .as_ref()
            .map(|n| quorum_model::hostlist::compress(&n.iter().map(String::as_str).collect::<Vec<_>>())),
        node_count: r.node_count,
        users: r.users.as_ref().map(names),
        accounts: r.accounts.as_ref().map(names),
        partition: r.partition,
        flags: r.flags.map(|f| f.names().join(",")),
    })
}

/// Creates (or updates) the reservation the words describe; what Slurm prints.
pub async fn create(ctx: &Context, words: &[String], update: bool) -> Result<String, String> {
    let req = request(words, crate::format::now_ms())?;
    let answer = match update {
        false => ctx.send(req, |mut c, r| async move { c.create_reservation(r).await }).await,
        true => ctx.send(req, |mut c, r| async move { c.update_reservation(r).await }).await,
    };
    let r = answer.map_err(|e| format!("{e:#}"))?.reservation.unwrap_or_default();
    Ok(match update {
        false => format!("Reservation created: {}\n", r.name),
        true => "Reservation updated.\n".to_string(),
    })
}

pub async fn delete(ctx: &Context, name: &str) -> Result<String, String> {
    let req = api::DeleteReservationRequest { name: name.to_string() };
    ctx.send(req, |mut c, r| async move { c.delete_reservation(r).await }).await.map_err(|e| format!("{e:#}"))?;
    Ok(String::new())
}

/// The nodes and the reservations, as `ListNodes` answers them.
pub async fn list(ctx: &Context) -> Result<api::ListNodesResponse, String> {
    let req = api::ListNodesRequest { stale: ctx.stale };
    ctx.send(req, |mut c, r| async move { c.list_nodes(r).await }).await.map_err(|e| format!("{e:#}"))
}

/// What `scontrol show reservation [NAME]` prints.
pub async fn show(ctx: &Context, name: Option<&str>, one_line: bool) -> Result<String, String> {
    let all = list(ctx).await?;
    let chosen: Vec<&ReservationInfo> = all.reservations.iter().filter(|r| name.is_none_or(|n| r.name == n)).collect();
    match (name, chosen.is_empty()) {
        (Some(n), true) => Err(format!("Reservation {n} not found")),
        (None, true) => Ok("No reservations in the system\n".to_string()),
        _ => Ok(chosen.into_iter().map(|r| show_text(r, &all.nodes, one_line)).collect()),
    }
}

/// As Slurm writes a reservation's duration: `[D-]HH:MM:SS`, or `UNLIMITED`.
fn duration_text(r: &ReservationInfo) -> String {
    let secs = match r.end_ms {
        0 => return "UNLIMITED".to_string(),
        end => end.saturating_sub(r.start_ms) / 1000,
    };
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let clock = format!("{:02}:{:02}:{:02}", rest / 3600, rest / 60 % 60, rest % 60);
    if days > 0 {
        format!("{days}-{clock}")
    } else {
        clock
    }
}

fn end_text(r: &ReservationInfo) -> String {
    match r.end_ms {
        0 => "Unknown".to_string(),
        end => display::local_time(end),
    }
}

/// One reservation as `scontrol show reservation` prints it (`nodes`: the cluster's, for its
/// CPU count).
pub fn show_text(r: &ReservationInfo, nodes: &[api::NodeInfo], one_line: bool) -> String {
    let names = quorum_model::hostlist::expand(&r.nodes).unwrap_or_default();
    let cpus: u32 = nodes.iter().filter(|n| names.contains(&n.name)).map(|n| n.cpus).sum();
    let lines = [
        format!(
            "ReservationName={} StartTime={} EndTime={} Duration={}",
            r.name,
            display::local_time(r.start_ms),
            end_text(r),
            duration_text(r)
        ),
        format!(
            "Nodes={} NodeCnt={} CoreCnt={cpus} Features=(null) PartitionName={} Flags={}",
            r.nodes,
            r.node_count,
            null_or(&r.partition),
            null_or(&r.flags.join(","))
        ),
        format!("TRES=cpu={cpus}"),
        format!(
            "Users={} Groups=(null) Accounts={} Licenses=(null) State={} BurstBuffer=(null) Watts=n/a",
            null_or(&r.users.join(",")),
            null_or(&r.accounts.join(",")),
            r.state
        ),
        "MaxStartDelay=(null)".to_string(),
    ];
    if one_line {
        format!("{}\n", lines.join(" "))
    } else {
        format!("{}\n\n", lines.join("\n   "))
    }
}

/// `sinfo -T`: a line per reservation.
pub fn table(reservations: &[ReservationInfo]) -> String {
    let rows: Vec<Vec<String>> = reservations
        .iter()
        .map(|r| {
            vec![
                r.name.clone(),
                r.state.clone(),
                display::local_time(r.start_ms),
                end_text(r),
                duration_text(r),
                r.nodes.clone(),
            ]
        })
        .collect();
    display::table(&["RESV_NAME", "STATE", "START_TIME", "END_TIME", "DURATION", "NODELIST"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scontrol_words_make_a_request() {
        let now = 1_800_000_000_000;
        let words: Vec<String> = [
            "ReservationName=maint",
            "StartTime=now+1hour",
            "Duration=1-00:00:00",
            "Nodes=n[1-4]",
            "Users=root",
            "Flags=MAINT,IGNORE_JOBS",
        ]
        .map(String::from)
        .to_vec();
        let r = request(&words, now).unwrap();
        assert_eq!((r.name.as_str(), r.start_ms, r.duration_s), ("maint", Some(now + 3_600_000), Some(86_400)));
        assert_eq!((r.nodes.as_deref(), r.users.as_deref()), (Some("n[1-4]"), Some("root")));
        assert_eq!(r.flags.as_deref(), Some("MAINT,IGNORE_JOBS"));
        let r = request(&["resv=x".into(), "duration=UNLIMITED".into(), "NodeCnt=2".into()], now).unwrap();
        assert!(r.unlimited && r.node_count == Some(2));
        for (bad, says) in [
            ("Flags=SOMETIMES", "unknown reservation flag 'SOMETIMES'"),
            ("Flags=MAGNETIC", "'MAGNETIC' is not supported yet"),
            ("StartTime=soon", "invalid StartTime 'soon'"),
            ("Duration=forever", "invalid Duration='forever'"),
            ("NodeCnt=many", "invalid NodeCnt='many'"),
            ("Features=x", "'Features' is not supported"),
            ("Nodes", "is not KEY=VALUE"),
        ] {
            let e = request(&["ReservationName=r".into(), bad.into()], now).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        assert!(request(&["Duration=10".into()], now).unwrap_err().contains("ReservationName=NAME"));
        let bad_nodes = request(&["ReservationName=r".into(), "Nodes=n[1-".into()], now).unwrap_err();
        assert!(bad_nodes.contains("invalid Nodes='n[1-'"), "{bad_nodes}");
    }
}
