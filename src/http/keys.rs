//! Client keys from requests: the peer address, `X-Forwarded-For` / `Forwarded` behind trusted
//! proxies, an API key header, an authenticated user, and composites of these.
//!
//! Everything here is a pure function of its inputs (no I/O, no clock), so a fuzz target can
//! drive it with hostile bytes (`fuzz/fuzz_targets/keys.rs`). Nothing panics on any input: a
//! missing or malformed source is a [`KeyError`], and the layer applies the configured
//! [`OnBadKey`] behaviour. Networks are ipnet's; the header parsing and the walk back through
//! trusted proxies are written here, not taken from a crate: they are this layer's trust
//! boundary, fuzzed as one with the walk, and no crate walks from the right, stops at the first
//! untrusted hop and treats a malformed hop as the end of trust.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::HeaderMap;
use ipnet::IpNet;

use crate::error::Error;
use crate::ip::client_ip_key;

/// The longest API key or user id accepted as a key; longer values are malformed (an attacker
/// must not make the limiter store megabyte keys).
pub const MAX_KEY_LEN: usize = 256;

/// Trusted proxies the walk passes at most: a chain with more trusted hops in a row (a loop,
/// or a misconfigured trust list) is malformed. Hops left of the first untrusted one are never
/// read, so a client cannot make a request malformed by prepending hops of its own.
pub const MAX_HOPS: usize = 64;

/// Who a request is from, as far as the limiter is concerned.
///
/// ```
/// use std::net::IpAddr;
/// use tollgate::http::ClientKey;
/// let ip: IpAddr = "192.0.2.7".parse().unwrap();
/// let k = ClientKey::composite([ClientKey::ip(ip), ClientKey::api_key("k1")]);
/// assert_eq!(k.to_string(), "ip:192.0.2.7+api_key:k1");
/// assert_eq!(ClientKey::user(String::from("bob")), ClientKey::User("bob".into()));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ClientKey {
    /// A client address, already folded by [`client_ip_key`] (IPv4-mapped to IPv4, IPv6 to its
    /// prefix).
    Ip(IpAddr),
    /// The value of the API key header.
    ApiKey(Box<str>),
    /// An authenticated user, from the caller's extractor.
    User(Box<str>),
    /// Several sources at once (for example user AND address): one bucket per combination.
    Composite(Box<[ClientKey]>),
    /// Requests that carry no usable key under [`OnBadKey::Shared`]: one bucket for all of them.
    Unidentified,
}

impl ClientKey {
    /// A client address as the layer keys it ([`client_ip_key`] with the default prefix):
    /// IPv4-mapped IPv6 folded to IPv4, IPv6 grouped by its /64.
    ///
    /// ```
    /// use tollgate::http::ClientKey;
    /// let k = ClientKey::ip("2001:db8:1:2::77".parse().unwrap());
    /// assert_eq!(k.to_string(), "ip:2001:db8:1:2::");
    /// ```
    pub fn ip(addr: IpAddr) -> ClientKey {
        ClientKey::Ip(client_ip_key(addr, crate::ip::DEFAULT_V6_PREFIX))
    }
    /// An API key (a `&str`, a `String`, a `Box<str>`), taken as given.
    pub fn api_key(key: impl Into<Box<str>>) -> ClientKey {
        ClientKey::ApiKey(key.into())
    }
    /// An authenticated user's id (a `&str`, a `String`, a `Box<str>`), taken as given.
    pub fn user(id: impl Into<Box<str>>) -> ClientKey {
        ClientKey::User(id.into())
    }
    /// Several keys at once: one bucket per combination.
    pub fn composite(parts: impl IntoIterator<Item = ClientKey>) -> ClientKey {
        ClientKey::Composite(parts.into_iter().collect())
    }
}

impl fmt::Display for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientKey::Ip(ip) => write!(f, "ip:{ip}"),
            ClientKey::ApiKey(k) => write!(f, "api_key:{k}"),
            ClientKey::User(u) => write!(f, "user:{u}"),
            ClientKey::Composite(parts) => {
                for (i, p) in parts.iter().enumerate() {
                    if i > 0 {
                        f.write_str("+")?;
                    }
                    write!(f, "{p}")?;
                }
                Ok(())
            }
            ClientKey::Unidentified => f.write_str("unidentified"),
        }
    }
}

/// Why no key could be taken from a request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The connection's peer address is not in the request's extensions (the server was not set
    /// up with connect info).
    NoPeer,
    /// A forwarding header from a trusted proxy holds a hop that is not an address (garbage,
    /// `unknown`, an obfuscated `_node`) where the walk reads it, or more than [`MAX_HOPS`]
    /// trusted hops in a row.
    MalformedForwarded,
    /// The API key header is missing.
    NoApiKey,
    /// The API key header is empty, longer than [`MAX_KEY_LEN`], or not visible ASCII.
    MalformedApiKey,
    /// The user extractor returned nothing (not authenticated), or a value that is empty or
    /// longer than [`MAX_KEY_LEN`].
    NoUser,
    /// The API key is well formed but neither the `api_keys` table nor the resolver knows it:
    /// it is not a client identity (else rotating made-up keys would bypass the limit).
    UnknownApiKey,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyError::NoPeer => "the peer address is unknown (serve with connect info)",
            KeyError::MalformedForwarded => {
                "a forwarding header from a trusted proxy holds a hop that is not an address"
            }
            KeyError::NoApiKey => "the API key header is missing",
            KeyError::MalformedApiKey => {
                "the API key header is empty, too long or not visible ASCII"
            }
            KeyError::NoUser => "the request carries no authenticated user",
            KeyError::UnknownApiKey => "the API key is not known",
        })
    }
}

impl std::error::Error for KeyError {}

/// What the layer does with a request whose key cannot be taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnBadKey {
    /// Key it by its peer address (folded). The default. With no peer address either (a server
    /// not set up with connect info), the layer answers 500 naming the fix and warns once in
    /// the log: one bucket for every client would let one client deny all the others.
    #[default]
    Peer,
    /// Put every such request in one shared bucket ([`ClientKey::Unidentified`]), including
    /// every request when the server passes no peer address: the explicit choice of one bucket.
    Shared,
    /// Answer 400 Bad Request with a JSON body naming the problem (500 for a missing peer
    /// address, as under [`Peer`](Self::Peer): the server's set-up, not the client's doing).
    Reject,
}

/// Which forwarding header names the client behind trusted proxies. Only one is honoured, so a
/// client cannot pick the header its proxy does not overwrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (the default).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for="[2001:db8::1]:4711"`.
    Forwarded,
    /// Neither: the peer address is the client.
    None,
}

/// The proxies whose forwarding headers are believed: addresses and CIDR networks.
///
/// ```
/// use tollgate::http::TrustedProxies;
/// let t = TrustedProxies::parse(["10.0.0.0/8", "::1", "fd00::/8"]).unwrap();
/// assert!(t.contains("10.1.2.3".parse().unwrap()));
/// assert!(t.contains("::ffff:10.9.9.9".parse().unwrap())); // IPv4-mapped counts as IPv4
/// assert!(!t.contains("192.0.2.1".parse().unwrap()));
/// assert_eq!(
///     TrustedProxies::parse(["10.0.0.0/33"]).unwrap_err().to_string(),
///     "trusted_proxies: '10.0.0.0/33': prefix length 33 is above 32"
/// );
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
}

impl TrustedProxies {
    /// No trusted proxy: forwarding headers are always ignored.
    pub fn none() -> Self {
        Self::default()
    }

    /// Parses addresses (`127.0.0.1`, `::1`) and networks (`10.0.0.0/8`, `fd00::/8`). Host bits
    /// set below the prefix are a mistake (`10.0.0.1/8` is an error), as is anything else that
    /// is not an address.
    pub fn parse<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> Result<Self, Error> {
        let mut nets = Vec::new();
        for item in items {
            nets.push(parse_net(item.as_ref())?);
        }
        Ok(TrustedProxies { nets })
    }

    /// True when `ip` (IPv4-mapped IPv6 folded to IPv4) lies in one of the networks.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = fold(ip);
        self.nets.iter().any(|n| n.contains(&ip))
    }

    /// True when no proxy is trusted.
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }
}

/// One address or network (ipnet's `IpNet`), with the reason in words when it is not one: the
/// address is parsed and folded first (an IPv4-mapped network is an IPv4 one), so the prefix
/// length is checked against the folded address's width.
fn parse_net(text: &str) -> Result<IpNet, Error> {
    let bad = |why: String| Error::Config {
        line: None,
        message: format!("trusted_proxies: '{text}': {why}"),
    };
    let (addr, len) = match text.trim().split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (text.trim(), None),
    };
    let ip: IpAddr = addr
        .parse()
        .map_err(|_| bad("not an IP address or CIDR network".into()))?;
    let ip = fold(ip);
    let width: u32 = if ip.is_ipv4() { 32 } else { 128 };
    let len: u32 = match len {
        None => width,
        Some(l) => l
            .parse()
            .map_err(|_| bad(format!("prefix length '{l}' is not a number")))?,
    };
    let net = u8::try_from(len)
        .ok()
        .and_then(|l| IpNet::new(ip, l).ok())
        .ok_or_else(|| bad(format!("prefix length {len} is above {width}")))?;
    if net.trunc() != net {
        return Err(bad(format!("host bits are set below the /{len} prefix")));
    }
    Ok(net)
}

/// IPv4-mapped IPv6 as IPv4; everything else unchanged.
fn fold(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// One hop of a forwarding header, as written (left to right: client first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hop {
    /// An address (any port stripped).
    Ip(IpAddr),
    /// Anything else: garbage, `unknown`, an obfuscated identifier, an element without `for=`.
    Invalid,
}

/// Parses one `X-Forwarded-For` value: comma-separated addresses, each optionally with a port
/// (`192.0.2.1:80`, `[2001:db8::1]:80`). Empty elements (`a,,b`) are skipped, as list syntax
/// allows; anything else that is not an address is a [`Hop::Invalid`].
///
/// ```
/// use tollgate::http::{Hop, parse_x_forwarded_for};
/// let hops = parse_x_forwarded_for(b"203.0.113.9, [2001:db8::1]:443 ,junk");
/// assert_eq!(hops, [
///     Hop::Ip("203.0.113.9".parse().unwrap()),
///     Hop::Ip("2001:db8::1".parse().unwrap()),
///     Hop::Invalid,
/// ]);
/// ```
pub fn parse_x_forwarded_for(value: &[u8]) -> Vec<Hop> {
    value
        .split(|&b| b == b',')
        .map(trim_ows)
        .filter(|e| !e.is_empty())
        .map(|e| {
            std::str::from_utf8(e)
                .ok()
                .and_then(parse_node)
                .map_or(Hop::Invalid, Hop::Ip)
        })
        .collect()
}

/// Parses one RFC 7239 `Forwarded` value: comma-separated elements of `;`-separated pairs, of
/// which only `for=` is used (quoted strings, with `\` escapes, may hold `,` and `;`). An element
/// without a usable `for=` address (`for=unknown`, `for=_hidden`, no `for` at all) is a
/// [`Hop::Invalid`].
///
/// ```
/// use tollgate::http::{Hop, parse_forwarded};
/// let hops = parse_forwarded(br#"for=192.0.2.60;proto=http, for="[2001:db8:cafe::17]:4711", for=unknown"#);
/// assert_eq!(hops, [
///     Hop::Ip("192.0.2.60".parse().unwrap()),
///     Hop::Ip("2001:db8:cafe::17".parse().unwrap()),
///     Hop::Invalid,
/// ]);
/// ```
pub fn parse_forwarded(value: &[u8]) -> Vec<Hop> {
    /// The state of the element being read.
    #[derive(Default)]
    struct Element {
        /// Its `for=` hop, once seen (the first `for` wins).
        hop: Option<Hop>,
        /// Whether it held anything but whitespace.
        nonempty: bool,
    }
    fn finish_pair(pair: &mut Vec<u8>, element: &mut Element) {
        let p = trim_ows(pair);
        if !p.is_empty() {
            element.nonempty = true;
        }
        if let Some(eq) = p.iter().position(|&b| b == b'=') {
            let (name, val) = (trim_ows(&p[..eq]), trim_ows(&p[eq + 1..]));
            if name.eq_ignore_ascii_case(b"for") && element.hop.is_none() {
                let hop = std::str::from_utf8(val)
                    .ok()
                    .and_then(parse_node)
                    .map_or(Hop::Invalid, Hop::Ip);
                element.hop = Some(hop);
            }
        }
        pair.clear();
    }
    fn finish_element(element: &mut Element, hops: &mut Vec<Hop>) {
        let e = std::mem::take(element);
        if e.nonempty {
            hops.push(e.hop.unwrap_or(Hop::Invalid));
        }
    }
    let mut hops = Vec::new();
    let mut element = Element::default();
    // The current pair, with quotes removed and escapes resolved.
    let mut pair: Vec<u8> = Vec::new();
    let mut in_quotes = false;
    let mut escaped = false;
    for &b in value {
        if in_quotes {
            match (escaped, b) {
                (true, _) => {
                    pair.push(b);
                    escaped = false;
                }
                (false, b'\\') => escaped = true,
                (false, b'"') => in_quotes = false,
                (false, _) => pair.push(b),
            }
            continue;
        }
        match b {
            b'"' => {
                in_quotes = true;
                element.nonempty = true;
            }
            b';' => finish_pair(&mut pair, &mut element),
            b',' => {
                finish_pair(&mut pair, &mut element);
                finish_element(&mut element, &mut hops);
            }
            _ => pair.push(b),
        }
    }
    if in_quotes {
        // An unterminated quoted string: the element is malformed.
        pair.clear();
        element.hop = Some(Hop::Invalid);
        element.nonempty = true;
    }
    finish_pair(&mut pair, &mut element);
    finish_element(&mut element, &mut hops);
    hops
}

fn trim_ows(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|&c| c != b' ' && c != b'\t')
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|&c| c != b' ' && c != b'\t')
        .map_or(start, |i| i + 1);
    &b[start..end.max(start)]
}

/// An address with an optional port: `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`, `[2001:db8::1]`,
/// `[2001:db8::1]:80`.
fn parse_node(text: &str) -> Option<IpAddr> {
    let text = text.trim();
    if let Some(rest) = text.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if !(after.is_empty() || is_port(after.strip_prefix(':')?)) {
            return None;
        }
        return inside.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    let (host, port) = text.rsplit_once(':')?;
    if !is_port(port) {
        return None;
    }
    host.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
}

fn is_port(p: &str) -> bool {
    p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok()
}

/// The client address: walks from the peer leftwards through `hops` (a forwarding header's hops,
/// left to right as written) while the current address is a trusted proxy, and returns the first
/// untrusted one, folded to IPv4 when mapped (not yet grouped by prefix). When every hop is
/// trusted, the leftmost. An untrusted peer's headers are ignored entirely.
///
/// ```
/// use tollgate::http::{Hop, TrustedProxies, client_ip};
/// let trusted = TrustedProxies::parse(["10.0.0.0/8"]).unwrap();
/// let hops = [Hop::Ip("198.51.100.1".parse().unwrap()), Hop::Ip("203.0.113.5".parse().unwrap()), Hop::Ip("10.0.0.2".parse().unwrap())];
/// // From the trusted proxy 10.0.0.1: 10.0.0.2 is trusted too, 203.0.113.5 is the client
/// // (198.51.100.1 was written by the client itself and is not believed).
/// assert_eq!(client_ip("10.0.0.1".parse().unwrap(), &hops, &trusted), Ok("203.0.113.5".parse().unwrap()));
/// // From an untrusted peer the header is ignored.
/// assert_eq!(client_ip("192.0.2.9".parse().unwrap(), &hops, &trusted), Ok("192.0.2.9".parse().unwrap()));
/// ```
pub fn client_ip(peer: IpAddr, hops: &[Hop], trusted: &TrustedProxies) -> Result<IpAddr, KeyError> {
    let mut current = fold(peer);
    // Right to left: each hop was written by the proxy `current` names, so it is believed
    // only while `current` is trusted. What lies left of the first untrusted address was
    // written by the client and is never read, however long or malformed it is.
    for (walked, hop) in hops.iter().rev().enumerate() {
        if !trusted.contains(current) {
            return Ok(current);
        }
        if walked == MAX_HOPS {
            return Err(KeyError::MalformedForwarded);
        }
        match hop {
            Hop::Ip(ip) => current = fold(*ip),
            Hop::Invalid => return Err(KeyError::MalformedForwarded),
        }
    }
    Ok(current)
}

/// [`client_ip`] from a request's headers: every line of the chosen header, in order, forms one
/// list (as HTTP list syntax says). The result is grouped by [`client_ip_key`] with `v6_prefix`.
///
/// ```
/// use axum::http::HeaderMap;
/// use tollgate::http::{ForwardedHeader, TrustedProxies, client_ip_from_headers};
/// let mut headers = HeaderMap::new();
/// headers.append("x-forwarded-for", "2001:db8:1:2::77".parse().unwrap());
/// let trusted = TrustedProxies::parse(["127.0.0.1"]).unwrap();
/// let ip = client_ip_from_headers("127.0.0.1".parse().unwrap(), &headers, ForwardedHeader::XForwardedFor, &trusted, 64);
/// assert_eq!(ip, Ok("2001:db8:1:2::".parse().unwrap()));
/// ```
#[inline]
pub fn client_ip_from_headers(
    peer: IpAddr,
    headers: &HeaderMap,
    header: ForwardedHeader,
    trusted: &TrustedProxies,
    v6_prefix: u8,
) -> Result<IpAddr, KeyError> {
    walk_headers(peer, headers, header, trusted).map(|ip| client_ip_key(ip, v6_prefix))
}

/// [`client_ip_from_headers`] before grouping: the client's own address (IPv4-mapped folded).
#[inline]
pub(crate) fn walk_headers(
    peer: IpAddr,
    headers: &HeaderMap,
    header: ForwardedHeader,
    trusted: &TrustedProxies,
) -> Result<IpAddr, KeyError> {
    if trusted.is_empty() {
        return Ok(fold(peer));
    }
    let name = match header {
        ForwardedHeader::XForwardedFor => "x-forwarded-for",
        ForwardedHeader::Forwarded => "forwarded",
        ForwardedHeader::None => return Ok(fold(peer)),
    };
    if !trusted.contains(peer) {
        return Ok(fold(peer));
    }
    let mut hops = Vec::new();
    for value in headers.get_all(name) {
        let more = match header {
            ForwardedHeader::Forwarded => parse_forwarded(value.as_bytes()),
            _ => parse_x_forwarded_for(value.as_bytes()),
        };
        hops.extend(more);
    }
    client_ip(peer, &hops, trusted)
}

/// The API key from header `name`: visible ASCII, 1 to [`MAX_KEY_LEN`] bytes.
///
/// ```
/// use axum::http::HeaderMap;
/// use tollgate::http::{KeyError, api_key_from_headers};
/// let mut h = HeaderMap::new();
/// assert_eq!(api_key_from_headers(&h, "x-api-key"), Err(KeyError::NoApiKey));
/// h.insert("x-api-key", "k-123".parse().unwrap());
/// assert_eq!(api_key_from_headers(&h, "x-api-key").as_deref(), Ok("k-123"));
/// ```
pub fn api_key_from_headers<'a>(headers: &'a HeaderMap, name: &str) -> Result<&'a str, KeyError> {
    let value = headers.get(name).ok_or(KeyError::NoApiKey)?;
    let bytes = value.as_bytes();
    if bytes.is_empty() || bytes.len() > MAX_KEY_LEN || !bytes.iter().all(|b| b.is_ascii_graphic())
    {
        return Err(KeyError::MalformedApiKey);
    }
    // Visible ASCII is valid UTF-8.
    std::str::from_utf8(bytes).map_err(|_| KeyError::MalformedApiKey)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn x_forwarded_for_elements() {
        use Hop::{Invalid, Ip};
        assert_eq!(parse_x_forwarded_for(b""), []);
        assert_eq!(parse_x_forwarded_for(b" , ,\t"), []);
        assert_eq!(
            parse_x_forwarded_for(b"1.2.3.4:80,[::1]:8080, ::ffff:10.0.0.1 ,2001:db8::7"),
            [
                Ip(ip("1.2.3.4")),
                Ip(ip("::1")),
                Ip(ip("::ffff:10.0.0.1")),
                Ip(ip("2001:db8::7"))
            ]
        );
        for bad in [
            "unknown",
            "1.2.3.4:65536",
            "1.2.3.4:",
            "[::1",
            "[::1]x",
            "::1:80x",
            "1.2.3",
            "[1.2.3.4]",
            "1.2.3.4 5.6.7.8",
            "\u{e9}",
        ] {
            assert_eq!(parse_x_forwarded_for(bad.as_bytes()), [Invalid], "{bad}");
        }
        assert_eq!(parse_x_forwarded_for(&[0xff, 0xfe]), [Invalid]);
    }

    #[test]
    fn forwarded_elements() {
        use Hop::{Invalid, Ip};
        assert_eq!(parse_forwarded(b""), []);
        assert_eq!(
            parse_forwarded(b"FOR=192.0.2.1;by=10.0.0.1, proto=https;for=\"[2001:db8::1]:443\""),
            [Ip(ip("192.0.2.1")), Ip(ip("2001:db8::1"))]
        );
        // Quoted strings may hold separators and escapes; the first `for` of an element wins.
        assert_eq!(
            parse_forwarded(b"host=\"a,b;c\";for=\"1.2.3\\.4\";for=5.6.7.8"),
            [Ip(ip("1.2.3.4"))]
        );
        assert_eq!(
            parse_forwarded(b"for=unknown, for=_hidden, proto=http, for=1.1.1.1,"),
            [Invalid, Invalid, Invalid, Ip(ip("1.1.1.1"))]
        );
        assert_eq!(
            parse_forwarded(b"for=1.1.1.1, for=\"2.2.2.2"),
            [Ip(ip("1.1.1.1")), Invalid]
        );
        assert_eq!(
            parse_forwarded(b"for=1.1.1.1,,for=2.2.2.2"),
            [Ip(ip("1.1.1.1")), Ip(ip("2.2.2.2"))]
        );
    }

    #[test]
    fn trusted_networks() {
        let t = TrustedProxies::parse(["10.0.0.0/8", "192.0.2.7", "2001:db8::/32", "0.0.0.0/0"]);
        let t = t.unwrap();
        assert!(t.contains(ip("8.8.8.8"))); // 0.0.0.0/0
        assert!(!t.contains(ip("2001:db9::1")));
        assert!(t.contains(ip("2001:db8:ffff::1")));
        let none = TrustedProxies::none();
        assert!(none.is_empty() && !none.contains(ip("127.0.0.1")));
        let v6_all = TrustedProxies::parse(["::/0"]).unwrap();
        assert!(v6_all.contains(ip("::1")) && !v6_all.contains(ip("127.0.0.1")));
        for (bad, why) in [
            ("10.0.0.0/x", "prefix length 'x' is not a number"),
            ("::1/129", "prefix length 129 is above 128"),
            ("fe80::1/10", "host bits are set below the /10 prefix"),
            ("localhost", "not an IP address or CIDR network"),
        ] {
            let err = TrustedProxies::parse([bad]).unwrap_err().to_string();
            assert_eq!(err, format!("trusted_proxies: '{bad}': {why}"));
        }
    }

    #[test]
    fn walk_right_to_left() {
        use Hop::{Invalid, Ip};
        let t = TrustedProxies::parse(["10.0.0.0/8"]).unwrap();
        let peer = ip("10.0.0.1");
        // Every hop trusted: the leftmost.
        assert_eq!(
            client_ip(peer, &[Ip(ip("10.9.9.9")), Ip(ip("10.0.0.2"))], &t),
            Ok(ip("10.9.9.9"))
        );
        // No hop at all: the trusted peer itself.
        assert_eq!(client_ip(peer, &[], &t), Ok(peer));
        // A malformed hop where the walk reads it is an error; one left of the client is not.
        assert_eq!(
            client_ip(peer, &[Ip(ip("192.0.2.1")), Invalid], &t),
            Err(KeyError::MalformedForwarded)
        );
        assert_eq!(
            client_ip(peer, &[Invalid, Ip(ip("192.0.2.1"))], &t),
            Ok(ip("192.0.2.1"))
        );
        // Mapped addresses are folded before the trust check and in the answer.
        assert_eq!(
            client_ip(ip("::ffff:10.0.0.1"), &[Ip(ip("::ffff:192.0.2.9"))], &t),
            Ok(ip("192.0.2.9"))
        );
        // Too many trusted hops in a row from a trusted peer.
        let long = vec![Ip(ip("10.0.0.3")); MAX_HOPS + 1];
        assert_eq!(
            client_ip(peer, &long, &t),
            Err(KeyError::MalformedForwarded)
        );
        assert_eq!(client_ip(peer, &long[1..], &t), Ok(ip("10.0.0.3")));
        // Any number of client-written hops left of the client: never read.
        let mut padded = vec![Invalid; MAX_HOPS + 1];
        padded.push(Ip(ip("192.0.2.7")));
        assert_eq!(client_ip(peer, &padded, &t), Ok(ip("192.0.2.7")));
        // An untrusted peer: never an error, whatever the hops.
        assert_eq!(client_ip(ip("192.0.2.5"), &long, &t), Ok(ip("192.0.2.5")));
    }

    #[test]
    fn api_keys() {
        let mut h = HeaderMap::new();
        h.insert("x-api-key", "".parse().unwrap());
        assert_eq!(
            api_key_from_headers(&h, "x-api-key"),
            Err(KeyError::MalformedApiKey)
        );
        h.insert("x-api-key", "has space".parse().unwrap());
        assert_eq!(
            api_key_from_headers(&h, "x-api-key"),
            Err(KeyError::MalformedApiKey)
        );
        h.insert("x-api-key", "k".repeat(MAX_KEY_LEN).parse().unwrap());
        assert!(api_key_from_headers(&h, "x-api-key").is_ok());
        h.insert("x-api-key", "k".repeat(MAX_KEY_LEN + 1).parse().unwrap());
        assert_eq!(
            api_key_from_headers(&h, "x-api-key"),
            Err(KeyError::MalformedApiKey)
        );
    }
}
