//! `quorum token`: a token that proves who you are where MUNGE cannot (off the cluster, the
//! HTTP API), like `scontrol token`. Use it as `QUORUM_TOKEN=...` or `--token`.

use std::process::ExitCode;

use quorum_model::parse::parse_time_limit;
use quorum_proto::api;

use super::Context;

#[derive(clap::Args)]
pub struct Args {
    /// How long it is valid, with its unit: `90s`, `30m`, `12h`, `7d`, or a duration with
    /// colons (`12:00:00`, `1-00:00:00`). A bare number is refused: seconds or minutes? At most
    /// 30 days; a token may only mint one that ends before it does.
    #[arg(long, default_value = "1d")]
    lifespan: String,
    /// For another user (an admin only).
    #[arg(long)]
    user: Option<String>,
}

pub async fn run(ctx: &Context, Args { lifespan, user }: Args) -> anyhow::Result<ExitCode> {
    let lifespan_s = parse_lifespan(&lifespan).map_err(|e| anyhow::anyhow!("--lifespan '{lifespan}': {e}"))?;
    let req = api::IssueTokenRequest { user: user.unwrap_or_default(), lifespan_s };
    let r = ctx.send(req, |mut c, r| async move { c.issue_token(r).await }).await?;
    println!("QUORUM_TOKEN={}", r.token);
    Ok(ExitCode::SUCCESS)
}

/// Seconds of `--lifespan`: a number with its unit (`s`, `m`, `h`, `d`), or a duration with
/// colons as a time limit is written (`HH:MM:SS`, `D-HH:MM:SS`).
fn parse_lifespan(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if text.contains(':') {
        return parse_time_limit(text).map_err(|e| e.to_string())?.ok_or_else(|| "a token needs an end".to_string());
    }
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().map_err(|_| "give a number with a unit, like 30m, 12h or 7d".to_string())?;
    let scale = match unit.trim() {
        "s" | "sec" | "secs" | "second" | "seconds" => 1,
        "m" | "min" | "mins" | "minute" | "minutes" => 60,
        "h" | "hour" | "hours" => 3600,
        "d" | "day" | "days" => 86_400,
        "" => return Err(format!("a bare number is ambiguous: say {n}s, {n}m, {n}h or {n}d")),
        other => return Err(format!("unknown unit '{other}' (s, m, h or d)")),
    };
    match n.checked_mul(scale) {
        Some(0) | None => Err("give a lifespan above zero and below 30 days".into()),
        Some(s) => Ok(s),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_lifespan;

    #[test]
    fn a_lifespan_says_its_unit() {
        assert_eq!(parse_lifespan("90s"), Ok(90));
        assert_eq!(parse_lifespan("30m"), Ok(1800));
        assert_eq!(parse_lifespan("1h"), Ok(3600));
        assert_eq!(parse_lifespan("7d"), Ok(7 * 86_400));
        assert_eq!(parse_lifespan("12:00:00"), Ok(12 * 3600));
        assert_eq!(parse_lifespan("1-00:00:00"), Ok(86_400));
        assert!(parse_lifespan("3600").unwrap_err().contains("ambiguous: say 3600s, 3600m"));
        assert!(parse_lifespan("5y").unwrap_err().contains("unknown unit 'y'"));
        assert!(parse_lifespan("0h").is_err());
        assert!(parse_lifespan("99999999999999999999d").is_err());
        assert!(parse_lifespan("h").is_err());
    }
}
