//! Loopback ports for the clusters this crate starts when no port is given.
//!
//! A port the kernel picks (`bind(":0")`) comes from its ephemeral range, the same range every
//! outgoing connection takes its source port from. A replica stopped and started again on its
//! old address then races every client in the process: one connection that happens to take the
//! freed port as its source makes the restart fail with "address already in use". The ports
//! handed out here lie below that range, where no outgoing connection lands, and one process
//! never hands out the same port twice while others are left.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Lowest port handed out; below it lie the well-known and registered services.
const FLOOR: u16 = 10_000;
/// Where this process's next search starts, as an offset from [`FLOOR`]; `usize::MAX` until the
/// first call picks a start from the process id and the clock, so that parallel test processes
/// start in different places.
static NEXT: AtomicUsize = AtomicUsize::new(usize::MAX);

/// A loopback port that is free now and lies outside the kernel's ephemeral range; a port from
/// that range when the range leaves too little room below it.
pub fn free_port() -> std::io::Result<u16> {
    let low = ephemeral_low().unwrap_or(32_768);
    let Some(span) = low.checked_sub(FLOOR).filter(|s| *s >= 1_000) else {
        return Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port());
    };
    let span = usize::from(span);
    if NEXT.load(Ordering::Relaxed) == usize::MAX {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let seed = (std::process::id() as usize).wrapping_mul(7_919).wrapping_add(nanos as usize) % span;
        // Only the first caller's seed counts; a caller racing it goes on from the winner's.
        let _ = NEXT.compare_exchange(usize::MAX, seed, Ordering::Relaxed, Ordering::Relaxed);
    }
    for _ in 0..span {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed) % span;
        let port = FLOOR + offset as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, format!("no free loopback port in {FLOOR}..{low}")))
}

/// The first port of the kernel's ephemeral range (`net.ipv4.ip_local_port_range`).
fn ephemeral_low() -> Option<u16> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_free_distinct_and_below_the_ephemeral_range() {
        let low = ephemeral_low().unwrap_or(32_768);
        let ports: Vec<u16> = (0..50).map(|_| free_port().unwrap()).collect();
        let distinct: std::collections::BTreeSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "a port handed out twice: {ports:?}");
        for p in &ports {
            if low >= FLOOR + 1_000 {
                assert!((FLOOR..low).contains(p), "{p} is not in {FLOOR}..{low}");
            }
            std::net::TcpListener::bind(("127.0.0.1", *p)).expect("a port handed out is free");
        }
    }
}
