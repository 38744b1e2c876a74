//! Hostile bytes into the client-key parsers (X-Forwarded-For, Forwarded, trusted proxies, API
//! key): never a panic, and the answer is always an address the request really named.
//!
//! Input layout: byte 0 picks the peer's family and whether it is trusted; then 16 bytes of
//! peer address; the rest is split on 0x00 into header values, alternately X-Forwarded-For
//! and Forwarded lines.
#![no_main]
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use tollgate::client_ip_key;
use tollgate::http::{
    ForwardedHeader, Hop, TrustedProxies, api_key_from_headers, client_ip, client_ip_from_headers,
    parse_forwarded, parse_x_forwarded_for,
};

fn fold(ip: IpAddr) -> IpAddr {
    client_ip_key(ip, 128)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 17 {
        return;
    }
    let mode = data[0];
    let raw: [u8; 16] = data[1..17].try_into().unwrap();
    let peer = if mode & 1 == 0 {
        IpAddr::V4(Ipv4Addr::new(raw[0], raw[1], raw[2], raw[3]))
    } else {
        IpAddr::V6(Ipv6Addr::from(raw))
    };
    let rest = &data[17..];
    // Trust the peer itself (or not), plus some networks hops may fall into.
    let mut nets = vec!["10.0.0.0/8".to_string(), "fd00::/8".to_string()];
    if mode & 2 != 0 {
        nets.push(peer.to_string());
    }
    let trusted = TrustedProxies::parse(&nets).expect("valid networks parse");
    // The trusted-proxy parser itself, on hostile text.
    if let Ok(text) = std::str::from_utf8(rest) {
        let _ = TrustedProxies::parse(text.split(['\n', ',']));
    }

    let mut headers = HeaderMap::new();
    let mut xff_hops: Vec<Hop> = Vec::new();
    let mut fwd_hops: Vec<Hop> = Vec::new();
    for (i, value) in rest.split(|&b| b == 0).enumerate() {
        let Ok(v) = HeaderValue::from_bytes(value) else {
            continue;
        };
        let (name, hops) = if i % 2 == 0 {
            ("x-forwarded-for", parse_x_forwarded_for(value))
        } else {
            ("forwarded", parse_forwarded(value))
        };
        // A hop is made of at least one input byte.
        assert!(hops.len() <= value.len());
        if i % 2 == 0 {
            xff_hops.extend(hops);
        } else {
            fwd_hops.extend(hops);
        }
        headers.append(name, v.clone());
        headers.append("x-api-key", v);
    }

    for (header, hops) in [
        (ForwardedHeader::XForwardedFor, &xff_hops),
        (ForwardedHeader::Forwarded, &fwd_hops),
    ] {
        let named: Vec<IpAddr> = hops
            .iter()
            .filter_map(|h| match h {
                Hop::Ip(ip) => Some(fold(*ip)),
                Hop::Invalid => None,
            })
            .chain([fold(peer)])
            .collect();
        match client_ip(peer, hops, &trusted) {
            Ok(ip) => {
                assert!(named.contains(&ip), "{ip} was never named");
                if !trusted.contains(peer) {
                    assert_eq!(ip, fold(peer), "an untrusted peer's headers were believed");
                }
            }
            Err(_) => assert!(trusted.contains(peer), "an untrusted peer cannot fail"),
        }
        // The header path agrees with the hop path, grouped by /64.
        let via_headers = client_ip_from_headers(peer, &headers, header, &trusted, 64);
        if hops.len() <= tollgate::http::MAX_HOPS {
            assert_eq!(
                via_headers,
                client_ip(peer, hops, &trusted).map(|ip| client_ip_key(ip, 64))
            );
        }
    }

    // Well-formed chains round-trip through the X-Forwarded-For parser.
    let ips: Vec<IpAddr> = xff_hops
        .iter()
        .filter_map(|h| match h {
            Hop::Ip(ip) => Some(*ip),
            Hop::Invalid => None,
        })
        .collect();
    let text = ips
        .iter()
        .map(|ip| ip.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let back = parse_x_forwarded_for(text.as_bytes());
    assert_eq!(back, ips.iter().map(|ip| Hop::Ip(*ip)).collect::<Vec<_>>());

    if let Ok(key) = api_key_from_headers(&headers, "x-api-key") {
        assert!(!key.is_empty() && key.len() <= tollgate::http::MAX_KEY_LEN);
    }
});
