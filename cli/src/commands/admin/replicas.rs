//! `quorum admin` for the controller replicas: membership (add, remove), leadership transfer,
//! versions, digests, and waiting for a restarted replica.

use std::process::ExitCode;

use quorum_client::client::Client;
use quorum_client::display;
use quorum_proto::api;

use crate::commands::{current_user, print_json, replica_statuses, status_error, Context};

pub async fn add(ctx: &Context, id: u64, addr: String) -> anyhow::Result<ExitCode> {
    let req = api::MembershipChangeRequest { user: current_user(), id, addr };
    let r = ctx.send(req, |mut c, r| async move { c.add_replica(r).await }).await?;
    println!("replica {id} added; voters: {}", voters_line(&r.members));
    Ok(ExitCode::SUCCESS)
}

pub async fn remove(ctx: &Context, id: u64) -> anyhow::Result<ExitCode> {
    let req = api::MembershipChangeRequest { user: current_user(), id, addr: String::new() };
    let r = ctx.send(req, |mut c, r| async move { c.remove_replica(r).await }).await?;
    println!("replica {id} removed; voters: {}", voters_line(&r.members));
    Ok(ExitCode::SUCCESS)
}

pub async fn transfer_leader(ctx: &Context, id: Option<u64>) -> anyhow::Result<ExitCode> {
    let req = api::TransferLeaderRequest { user: current_user(), to: id.unwrap_or(0) };
    let r = ctx.send(req, |mut c, r| async move { c.transfer_leader(r).await }).await?;
    println!("replica {} leads", r.leader);
    Ok(ExitCode::SUCCESS)
}

pub async fn versions(ctx: &Context, json: bool) -> anyhow::Result<ExitCode> {
    let replicas = replica_statuses(&ctx.client).await?;
    if json {
        print_json(&serde_json::json!({
            "replicas": replicas,
            "cluster_level": display::cluster_level(&replicas),
        }))?;
    } else {
        print!("{}", display::versions_table(&replicas));
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn digest(ctx: &Context, json: bool) -> anyhow::Result<ExitCode> {
    let report = quorum_client::digest::collect(&ctx.client).await.map_err(status_error)?;
    if json {
        let agree = report.agree();
        print_json(&serde_json::json!({ "index": report.index, "replicas": report.replicas, "agree": agree }))?;
    } else {
        print!("{}", report.table());
    }
    if !report.agree() {
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// `quorum admin wait-replica`: polls until replica `id` runs a process started after
/// `started_after`, a leader is known, and the replica has applied what the leader had
/// committed when it was last asked.
pub async fn wait_replica(
    client: &Client,
    id: u64,
    started_after: u64,
    limit: std::time::Duration,
) -> anyhow::Result<ExitCode> {
    let began = std::time::Instant::now();
    loop {
        let replicas = replica_statuses(client).await.unwrap_or_default();
        let me = replicas.iter().find(|r| r.id == id);
        let leader = replicas.iter().find(|r| r.role == "leader");
        let last = match (me, leader) {
            (None, _) if !replicas.is_empty() => anyhow::bail!("replica {id} is not a member of the cluster"),
            (Some(r), _) if !r.reachable => format!("replica {id} does not answer"),
            (Some(r), _) if r.started_at_ms <= started_after => {
                format!("replica {id} still runs the process started at {}", display::utc_time(r.started_at_ms))
            }
            (Some(_), None) => "no leader".into(),
            (Some(r), Some(l)) if r.applied_index < l.committed_index => {
                format!("replica {id} has applied {} of {} committed entries", r.applied_index, l.committed_index)
            }
            (Some(r), Some(_)) => {
                println!(
                    "replica {id} is back ({}, feature level {}) and caught up at index {} after {:.1}s",
                    r.version,
                    r.feature_level,
                    r.applied_index,
                    began.elapsed().as_secs_f64()
                );
                return Ok(ExitCode::SUCCESS);
            }
            (None, _) => "no replica answers".into(),
        };
        if began.elapsed() > limit {
            eprintln!("replica {id} not back within {}s: {last}", limit.as_secs());
            return Ok(ExitCode::from(1));
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

fn voters_line(members: &[api::ReplicaStatus]) -> String {
    members.iter().map(|m| format!("{} ({})", m.id, m.address)).collect::<Vec<_>>().join(", ")
}

/// `quorum admin backup FILE`: streams a replica's backup into FILE (through a temporary file
/// beside it, mode 0600, synced, then renamed), and says what it holds.
pub async fn backup(ctx: &Context, file: &std::path::Path, replica: Option<&str>) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut stream = match replica {
        Some(addr) => ctx.client.replica(addr)?.backup(api::BackupRequest {}).await.map_err(status_error)?.into_inner(),
        None => {
            ctx.client.call(|mut c| async move { c.backup(api::BackupRequest {}).await }).await.map_err(status_error)?
        }
    };
    let name = file.file_name().ok_or_else(|| anyhow::anyhow!("{}: not a file name", file.display()))?;
    let tmp = file.with_file_name(format!(".{}.partial", name.to_string_lossy()));
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| anyhow::anyhow!("{}: {e}", tmp.display()))?;
    let result: anyhow::Result<api::BackupSummary> = async {
        loop {
            match stream.message().await.map_err(status_error)? {
                Some(chunk) => {
                    out.write_all(&chunk.data)?;
                    if let Some(summary) = chunk.summary {
                        return Ok(summary);
                    }
                }
                None => anyhow::bail!("the replica ended the backup before its end"),
            }
        }
    }
    .await;
    let summary = match result.and_then(|s| {
        out.sync_all()?;
        std::fs::rename(&tmp, file)?;
        Ok(s)
    }) {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    println!(
        "backup of replica {} at index {} (feature level {}): {} jobs, {} history records, {} bytes, sha256 {}",
        summary.replica,
        summary.index,
        summary.feature_level,
        summary.jobs,
        summary.history_records,
        summary.bytes,
        summary.sha256
    );
    println!("written to {}", file.display());
    Ok(ExitCode::SUCCESS)
}
