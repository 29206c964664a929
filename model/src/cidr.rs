//! Address ranges (`10.0.0.0/8`, `fd00::/8`): who may read a controller's or an agent's metrics
//! without a credential.

/// An address range, like `10.0.0.0/8` or `fd00::/8`; a bare address is a range of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    net: std::net::IpAddr,
    bits: u8,
}

impl Cidr {
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let (addr, bits) = match text.trim().split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (text.trim(), None),
        };
        let net: std::net::IpAddr = addr.parse().map_err(|_| format!("'{addr}' is not an IP address"))?;
        let most = if net.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => most,
            Some(b) => {
                b.parse::<u8>().ok().filter(|b| *b <= most).ok_or_else(|| format!("'/{b}' is not 0 to {most}"))?
            }
        };
        Ok(Cidr { net, bits })
    }

    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        // An IPv4 client on an IPv6 socket arrives as ::ffff:a.b.c.d.
        let ip = match ip {
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
            v4 => v4,
        };
        let mask = |len: u32| if self.bits == 0 { 0 } else { u128::MAX << (len - u32::from(self.bits)) };
        match (self.net, ip) {
            (std::net::IpAddr::V4(n), std::net::IpAddr::V4(a)) => {
                let m = mask(32) as u32;
                u32::from(n) & m == u32::from(a) & m
            }
            (std::net::IpAddr::V6(n), std::net::IpAddr::V6(a)) => {
                let m = mask(128);
                u128::from(n) & m == u128::from(a) & m
            }
            _ => false,
        }
    }
}
