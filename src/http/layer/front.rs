//! A request before its charge: its key (the configured sources, a custom extractor, the
//! [`OnBadKey`] fallback), its plan (the API key table or a resolver's name), and whether it is
//! exempt; the 400 and 500 the layer answers when a request has no usable key.

use std::net::{IpAddr, SocketAddr};

use http::StatusCode;

use super::response::reject;
use super::{Answer, RateLimitLayer};
use crate::clock::Clock;
use crate::http::config::KeySource;
use crate::http::grpc;
use crate::http::keys::{
    ClientKey, KeyError, OnBadKey, api_key_from_headers, client_ip_from_headers, walk_headers,
};
use crate::ip::client_ip_key;
use crate::plan::PlanId;

/// The key the layer's limiter is keyed by: which limit (the client's own plan, or a rule) and
/// whose bucket.
///
/// ```
/// use tollgate::http::{ClientKey, HttpKey};
/// let own = HttpKey { rule: None, client: ClientKey::api_key("k1") };
/// let global = HttpKey { rule: Some(0), client: ClientKey::Unidentified };
/// assert_ne!(own, global);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpKey {
    /// `None`: the client's own plan; `Some(i)`: the i-th [`Rule`](crate::http::Rule).
    pub rule: Option<u16>,
    /// Whose bucket: the client, or [`ClientKey::Unidentified`] for a shared rule (one bucket
    /// for everyone).
    pub client: ClientKey,
}

/// One write for the common key, a client's own plan or rule by its IPv4 address (the rule in
/// bits 32-48, the address below); any other key writes a word with bit 63 set (which no such
/// word has) and then the client, so no two keys write the same stream.
impl std::hash::Hash for HttpKey {
    #[inline]
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let rule = self.rule.map_or(1 << 16, u64::from);
        match &self.client {
            ClientKey::Ip(IpAddr::V4(v4)) => state.write_u64(rule << 32 | u64::from(v4.to_bits())),
            client => {
                state.write_u64(1 << 63 | rule);
                client.hash(state);
            }
        }
    }
}

/// How Redis names the key (synced mode): the client for its own plan, `r<i>:` and the client
/// for the i-th rule.
impl std::fmt::Display for HttpKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.rule {
            None => write!(f, "{}", self.client),
            Some(i) => write!(f, "r{i}:{}", self.client),
        }
    }
}

/// The answer to a server that does not pass the peer address, and the fix.
const NO_PEER_FIX: &str = "the server does not pass the client's address to the rate limiter: \
     serve the app with `into_make_service_with_connect_info::<SocketAddr>()` (axum) or put a \
     `SocketAddr` in the request extensions; to key every such request into one shared bucket \
     instead, set `on_bad_key = \"shared\"`";

impl<C: Clock> RateLimitLayer<C> {
    /// The client key of a request head from the configured sources, before any
    /// [`OnBadKey`] fallback: what the layer would key the request by, or why it cannot.
    #[inline]
    pub fn client_key(&self, parts: &http::request::Parts) -> Result<ClientKey, KeyError> {
        match self.shared.core.config.key.as_slice() {
            [one] => self.source_key(parts, *one),
            sources => {
                let keys = sources
                    .iter()
                    .map(|s| self.source_key(parts, *s))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(ClientKey::Composite(keys.into()))
            }
        }
    }

    /// The key of one source.
    #[inline]
    fn source_key(
        &self,
        parts: &http::request::Parts,
        source: KeySource,
    ) -> Result<ClientKey, KeyError> {
        let core = &self.shared.core;
        match source {
            KeySource::Ip => peer_ip(&parts.extensions)
                .ok_or(KeyError::NoPeer)
                .and_then(|peer| {
                    client_ip_from_headers(
                        peer,
                        &parts.headers,
                        core.config.forwarded,
                        &core.config.trusted,
                        core.config.v6_prefix,
                    )
                    .map(ClientKey::Ip)
                }),
            KeySource::ApiKey => api_key_from_headers(&parts.headers, core.api_key_header.as_str())
                .map(|k| ClientKey::ApiKey(k.into())),
            KeySource::User => match self.shared.hooks.user.as_ref() {
                None => {
                    core.warned_no_user.call_once(|| {
                        #[cfg(feature = "tracing")]
                        tracing::warn!(target: "tollgate", "{}", super::warnings::NO_USER_FN);
                    });
                    Err(KeyError::NoUser)
                }
                Some(f) => match f(parts) {
                    Some(u) if !u.is_empty() && u.len() <= crate::http::keys::MAX_KEY_LEN => {
                        Ok(ClientKey::User(u))
                    }
                    _ => Err(KeyError::NoUser),
                },
            },
        }
    }

    /// The request's key: the custom extractor's, or the configured sources' after the
    /// [`OnBadKey`] fallback.
    #[inline]
    fn key_of(&self, parts: &http::request::Parts) -> Result<ClientKey, Rejection> {
        if let Some(extract) = &self.shared.hooks.key {
            return extract(parts).map_err(Rejection::Custom);
        }
        match self.client_key(parts) {
            Ok(k) => Ok(k),
            Err(e) => self.fallback(parts, e).map_err(Rejection::BadKey),
        }
    }

    /// The configured [`OnBadKey`] behaviour for a request without a usable key. A missing
    /// peer address is the server's set-up, not the client's doing: only an explicit
    /// [`OnBadKey::Shared`] puts such requests in one bucket.
    /// A request without the API key or user a key source asks for is anonymous, not bad.
    fn fallback(&self, parts: &http::request::Parts, e: KeyError) -> Result<ClientKey, KeyError> {
        match e {
            KeyError::NoApiKey | KeyError::NoUser => self.shared.core.counters.anonymous(),
            _ => self.shared.core.counters.bad_key(),
        }
        match self.shared.core.config.on_bad_key {
            OnBadKey::Shared => Ok(ClientKey::Unidentified),
            OnBadKey::Reject => Err(e),
            OnBadKey::Peer => self.client_address(parts).ok_or(KeyError::NoPeer),
        }
    }

    /// The client's address as `key = "ip"` takes it: the peer walked back through trusted
    /// proxies; the peer itself when a trusted proxy's header is malformed (what a request
    /// through that proxy without the header gets). `None` without a peer address.
    fn client_address(&self, parts: &http::request::Parts) -> Option<ClientKey> {
        let c = &self.shared.core.config;
        peer_ip(&parts.extensions).map(|peer| {
            let ip =
                client_ip_from_headers(peer, &parts.headers, c.forwarded, &c.trusted, c.v6_prefix)
                    .unwrap_or_else(|_| client_ip_key(peer, c.v6_prefix));
            ClientKey::Ip(ip)
        })
    }

    /// True for a request from an exempt key or network.
    #[inline]
    fn exempt(&self, parts: &http::request::Parts, client: &ClientKey) -> bool {
        let c = &self.shared.core.config;
        if !c.exempt_keys.is_empty() && any_name(client, &|k| c.exempt_keys.contains(k)) {
            return true;
        }
        // Only an address the walk proved: a header the walk cannot read (too many trusted
        // hops, a malformed hop) leaves the trusted proxy as the address, and an exempt proxy
        // must not lend its exemption to whoever sends such a header through it.
        !c.exempt.is_empty()
            && peer_ip(&parts.extensions).is_some_and(|peer| {
                walk_headers(peer, &parts.headers, c.forwarded, &c.trusted)
                    .is_ok_and(|ip| c.exempt.contains(ip))
            })
    }

    /// The request's plan from the API key table (no resolver), and the key to charge.
    #[inline]
    pub(super) fn plan_from_table(
        &self,
        parts: &http::request::Parts,
        client: ClientKey,
    ) -> Result<(ClientKey, PlanId), KeyError> {
        let core = &self.shared.core;
        if !core.api_key_plans.is_empty() {
            let key = match api_key_of(&client) {
                Some(k) => Some(k),
                None => api_key_from_headers(&parts.headers, core.api_key_header.as_str()).ok(),
            };
            if let Some(&plan) = key.and_then(|k| core.api_key_plans.get(k)) {
                return Ok((client, plan));
            }
        }
        if api_key_of(&client).is_none() {
            // No API key to judge (see `plan_named`): the default plan.
            return Ok((client, core.default_plan));
        }
        self.plan_named(parts, client, None)
    }

    /// The request's plan from a name (the resolver's answer; `None`: no plan named, as from a
    /// table that does not list the key) and the key to charge. An API key from the configured
    /// sources that nothing knows is no identity: the request is keyed as one without a key,
    /// under the default plan (or rejected, by [`OnBadKey`]).
    #[inline]
    pub(super) fn plan_named(
        &self,
        parts: &http::request::Parts,
        client: ClientKey,
        name: Option<String>,
    ) -> Result<(ClientKey, PlanId), KeyError> {
        let core = &self.shared.core;
        match name {
            Some(n) => {
                let plan = core.limiter.plan(&n).unwrap_or_else(|| {
                    core.counters.unknown_plan();
                    core.default_plan
                });
                Ok((client, plan))
            }
            None if self.shared.hooks.key.is_none()
                && core.config.key.contains(&KeySource::ApiKey)
                && api_key_of(&client).is_some() =>
            {
                let client = self.fallback(parts, KeyError::UnknownApiKey)?;
                Ok((client, core.default_plan))
            }
            None => Ok((client, core.default_plan)),
        }
    }

    /// Everything before the plan: an exempt path, the key (or the layer's own answer),
    /// exemption, cost.
    // The answer is the response the future returns by value anyway: boxing it would only add
    // an allocation to the denial path.
    #[allow(clippy::result_large_err)]
    pub(super) fn front(&self, parts: &http::request::Parts) -> Result<Front, Answer> {
        let core = &self.shared.core;
        core.counters.request();
        if !core.exempt_paths.is_empty() {
            let path = parts.uri.path();
            if core.exempt_paths.iter().any(|p| p.matches(path)) {
                core.counters.exempt();
                return Ok(Front::Exempt);
            }
        }
        let client = match self.key_of(parts) {
            Ok(k) => k,
            Err(Rejection::BadKey(e)) => return Err(self.bad_key(parts, e)),
            Err(Rejection::Custom(resp)) => {
                core.counters.rejected_bad_key();
                return Err(*resp);
            }
        };
        let cost = self.shared.hooks.cost.as_ref().map_or(1, |f| f(parts));
        if cost == 0 || self.exempt(parts, &client) {
            core.counters.exempt();
            return Ok(Front::Exempt);
        }
        Ok(Front::Charge { client, cost })
    }

    /// The 400 for a request without a usable key; the 500 for a server that does not pass the
    /// peer address (see [`no_peer`](Self::no_peer)).
    pub(super) fn bad_key(&self, parts: &http::request::Parts, e: KeyError) -> Answer {
        if e == KeyError::NoPeer {
            return self.no_peer(parts);
        }
        self.shared.core.counters.rejected_bad_key();
        #[cfg(feature = "tracing")]
        tracing::debug!(target: "tollgate", error = %e, path = parts.uri.path(), "bad client key");
        reject(
            parts,
            StatusCode::BAD_REQUEST,
            grpc::INVALID_ARGUMENT,
            "Bad request",
            &e.to_string(),
        )
    }

    /// The 500 for a request the layer cannot key because the server does not pass the peer
    /// address: keying it anyway would put every client in one bucket, where one client can
    /// deny all the others. Warned about once in the log (feature `tracing`) and counted as an
    /// internal error; [`OnBadKey::Shared`] is the explicit way to want that one bucket.
    fn no_peer(&self, parts: &http::request::Parts) -> Answer {
        let core = &self.shared.core;
        core.counters.internal_error();
        core.warned_no_peer.call_once(|| {
            #[cfg(feature = "tracing")]
            tracing::warn!(target: "tollgate", "{NO_PEER_FIX}");
        });
        reject(
            parts,
            StatusCode::INTERNAL_SERVER_ERROR,
            grpc::INTERNAL,
            "Rate limiter misconfigured",
            NO_PEER_FIX,
        )
    }
}

/// What a request holds before its plan is known.
pub(super) enum Front {
    /// Exempt (or free): forwarded uncharged, with no headers.
    Exempt,
    /// To be charged `cost` for `client`.
    Charge { client: ClientKey, cost: u64 },
}

/// Why the layer answers a request itself before charging it.
enum Rejection {
    /// No usable key, under [`OnBadKey::Reject`].
    BadKey(KeyError),
    /// The custom key extractor's own response (boxed: a response is large).
    Custom(Box<Answer>),
}

/// The API key in a client key, if any (a composite's part).
fn api_key_of(client: &ClientKey) -> Option<&str> {
    match client {
        ClientKey::ApiKey(k) => Some(k),
        ClientKey::Composite(parts) => parts.iter().find_map(api_key_of),
        _ => None,
    }
}

/// True when `f` holds for an API key or user id in `client`.
fn any_name(client: &ClientKey, f: &impl Fn(&str) -> bool) -> bool {
    match client {
        ClientKey::ApiKey(k) | ClientKey::User(k) => f(k),
        ClientKey::Composite(parts) => parts.iter().any(|p| any_name(p, f)),
        _ => false,
    }
}

/// The peer address from axum's `ConnectInfo<SocketAddr>` or a plain `SocketAddr` extension.
#[inline]
pub(super) fn peer_ip(extensions: &http::Extensions) -> Option<IpAddr> {
    if let Some(axum::extract::ConnectInfo(addr)) =
        extensions.get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(addr.ip());
    }
    extensions.get::<SocketAddr>().map(SocketAddr::ip)
}
