//! Loopback ports for the clusters this crate starts when no port is given.
//!
//! A port the kernel picks (`bind(":0")`) comes from its ephemeral range, the same range every
//! outgoing connection takes its source port from. A replica stopped and started again on its
//! old address then races every client in the process: one connection that happens to take the
//! freed port as its source makes the restart fail with "address already in use". The ports
//! handed out here lie below that range, where no outgoing connection lands, and one process
//! never hands out the same port twice while others are left.

use std::net::TcpListener;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// Lowest port handed out; below it lie the well-known and registered services.
const FLOOR: u16 = 10_000;
/// Where this process's next search starts, as an offset from [`FLOOR`]; `usize::MAX` until the
/// first call picks a start from the process id and the clock, so that parallel test processes
/// start in different places.
static NEXT: AtomicUsize = AtomicUsize::new(usize::MAX);

/// The ports handed out: from [`FLOOR`] to the start of the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`), read once; `None` when that leaves fewer than 1,000.
fn below_ephemeral() -> Option<Range<u16>> {
    static RANGE: OnceLock<Option<Range<u16>>> = OnceLock::new();
    RANGE
        .get_or_init(|| {
            let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok();
            let low = text.and_then(|t| t.split_whitespace().next()?.parse().ok()).unwrap_or(32_768u16);
            (low >= FLOOR + 1_000).then_some(FLOOR..low)
        })
        .clone()
}

/// A listener on a loopback port outside the kernel's ephemeral range; on a port from that
/// range when the range leaves too little room below it.
pub fn listener() -> std::io::Result<TcpListener> {
    let Some(range) = below_ephemeral() else {
        return TcpListener::bind("127.0.0.1:0");
    };
    let span = usize::from(range.end - range.start);
    if NEXT.load(Ordering::Relaxed) == usize::MAX {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let seed = (std::process::id() as usize).wrapping_mul(7_919).wrapping_add(nanos as usize) % span;
        // Only the first caller's seed counts; a caller racing it goes on from the winner's.
        let _ = NEXT.compare_exchange(usize::MAX, seed, Ordering::Relaxed, Ordering::Relaxed);
    }
    for _ in 0..span {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed) % span;
        if let Ok(l) = TcpListener::bind(("127.0.0.1", range.start + offset as u16)) {
            return Ok(l);
        }
    }
    let why = format!("no free loopback port in {}..{}", range.start, range.end);
    Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, why))
}

/// A loopback port that is free now, from [`listener`], for a process started later to bind.
pub fn free_port() -> std::io::Result<u16> {
    Ok(listener()?.local_addr()?.port())
}

/// A listener on `addr` again, for a replica that stopped there: a socket still in the port
/// (a connection of this process's own clients, closing) lets it go within moments, so "address
/// in use" is tried again for up to `patience` before it is an error.
pub async fn bind_again(addr: &str, patience: Duration) -> anyhow::Result<tokio::net::TcpListener> {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => return Err(anyhow::anyhow!("binding {addr} again: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_free_distinct_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..50).map(|_| free_port().expect("a free port")).collect();
        let distinct: std::collections::BTreeSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "a port handed out twice: {ports:?}");
        for p in &ports {
            if let Some(range) = below_ephemeral() {
                assert!(range.contains(p), "{p} is not in {range:?}");
            }
            TcpListener::bind(("127.0.0.1", *p)).expect("a port handed out is free");
        }
    }

    /// A port still held when the replica starts again is waited for: let go while it waits,
    /// it is bound; held past the patience, the error names the address.
    #[tokio::test]
    async fn a_port_in_use_is_bound_again_once_it_is_let_go() {
        let held = listener().expect("a free port");
        let addr = held.local_addr().expect("its address").to_string();
        let err = bind_again(&addr, Duration::from_millis(200)).await.expect_err("held throughout");
        assert!(err.to_string().contains(&addr), "{err}");
        // Let go a moment after the first attempt has failed: the retry is what binds it.
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(held);
        });
        let l = bind_again(&addr, Duration::from_secs(30)).await.expect("bound once let go");
        assert_eq!(l.local_addr().expect("its address").to_string(), addr);
        release.join().expect("released");
    }
}
