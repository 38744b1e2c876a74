//! Client IP keys: parsed addresses, not strings.

use std::net::{IpAddr, Ipv6Addr};

/// The key for a client address: IPv4-mapped IPv6 (`::ffff:a.b.c.d`) folded to IPv4, and IPv6
/// truncated to its first `v6_prefix` bits (default /64: one customer's network is one client).
///
/// ```
/// use std::net::IpAddr;
/// use tollgate::client_ip_key;
/// let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
/// assert_eq!(client_ip_key(mapped, 64), "192.0.2.7".parse::<IpAddr>().unwrap());
/// let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
/// let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
/// assert_eq!(client_ip_key(a, 64), client_ip_key(b, 64));
/// ```
#[inline]
pub fn client_ip_key(ip: IpAddr, v6_prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let bits = u32::from(v6_prefix.min(128));
                let mask = if bits == 0 {
                    0
                } else {
                    u128::MAX << (128 - bits)
                };
                IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
            }
        },
    }
}

/// The default IPv6 grouping prefix.
pub const DEFAULT_V6_PREFIX: u8 = 64;
