//! The HTTP layer's configuration: the engine's `[plans.*]` tables plus an `[http]` table, in one
//! TOML file (see `examples/plans.toml`), or built in code. This file holds [`HttpConfig`] as
//! code builds it and the types it is made of; `parse.rs` reads the TOML file into it.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::error::Error;
use crate::http::keys::{ForwardedHeader, OnBadKey, TrustedProxies};
use crate::ip::DEFAULT_V6_PREFIX;
use crate::plan::Plan;

mod parse;

/// The file's serde type, for the test that holds `docs/config.md` to it.
#[cfg(test)]
pub(crate) use parse::RawFile;

/// Where a client key comes from; several sources make a composite key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeySource {
    /// The client address (the peer, or the first untrusted hop behind trusted proxies).
    Ip,
    /// The API key header (default `x-api-key`).
    ApiKey,
    /// The authenticated user, from the extractor given to
    /// [`RateLimitLayer::user`](crate::http::RateLimitLayer::user).
    User,
}

impl KeySource {
    fn from_name(name: &str) -> Option<KeySource> {
        match name {
            "ip" => Some(KeySource::Ip),
            "api_key" => Some(KeySource::ApiKey),
            "user" => Some(KeySource::User),
            _ => None,
        }
    }
}

/// Which rate-limit headers go on every response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// GitHub style: `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (Unix
    /// seconds), for the binding limit (the one with the least remaining).
    Github,
    /// The IETF draft (draft-ietf-httpapi-ratelimit-headers-10): `RateLimit-Policy` and
    /// `RateLimit` structured fields, one item per part of every limit that applied.
    Ietf,
    /// Both (the default).
    #[default]
    Both,
    /// Neither (the 429's `Retry-After` and body are still sent).
    None,
}

impl HeaderStyle {
    pub(crate) fn github(self) -> bool {
        matches!(self, HeaderStyle::Github | HeaderStyle::Both)
    }
    pub(crate) fn ietf(self) -> bool {
        matches!(self, HeaderStyle::Ietf | HeaderStyle::Both)
    }
}

/// A limit beyond the client's own plan: on one route (per client, or shared by all clients on
/// it), or global.
///
/// ```
/// use tollgate::http::Rule;
/// let login = Rule::route("/login", "login").methods(["POST"]);
/// let search = Rule::route("/search/*", "search").shared();
/// let global = Rule::global("global").tier("free", "global_free");
/// # let _ = (login, search, global);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub(crate) name: String,
    /// `None` for the global rule; a path, exact or a prefix ending in `*`.
    pub(crate) path: Option<String>,
    pub(crate) methods: Vec<String>,
    pub(crate) plan: String,
    /// Client plan name → the plan this rule uses for that client (priority by plan).
    pub(crate) tiers: Vec<(String, String)>,
    /// One bucket for every client (always true for the global rule).
    pub(crate) shared: bool,
}

impl Rule {
    /// A per-client limit on requests whose path is `path` (exact) or starts with it (a trailing
    /// `*`: `/api/*`), under plan `plan`. Its name in headers is the path.
    pub fn route(path: impl Into<String>, plan: impl Into<String>) -> Self {
        let path = path.into();
        Rule {
            name: path.clone(),
            path: Some(path),
            methods: Vec::new(),
            plan: plan.into(),
            tiers: Vec::new(),
            shared: false,
        }
    }
    /// One limit shared by every request, under plan `plan`. Its name in headers is `global`.
    pub fn global(plan: impl Into<String>) -> Self {
        Rule {
            name: "global".into(),
            path: None,
            methods: Vec::new(),
            plan: plan.into(),
            tiers: Vec::new(),
            shared: true,
        }
    }
    /// Only these methods (`GET`, `POST`, ...); all when never called.
    pub fn methods<S: Into<String>>(mut self, methods: impl IntoIterator<Item = S>) -> Self {
        self.methods = methods
            .into_iter()
            .map(|m| m.into().to_ascii_uppercase())
            .collect();
        self
    }
    /// One bucket shared by all clients on this route (instead of one per client).
    pub fn shared(mut self) -> Self {
        self.shared = true;
        self
    }
    /// Requests of clients on plan `client_plan` are checked under `plan` instead: priority by
    /// plan on a shared limit (give the lower tier's plan the same quota and a `headroom`).
    pub fn tier(mut self, client_plan: impl Into<String>, plan: impl Into<String>) -> Self {
        self.tiers.push((client_plan.into(), plan.into()));
        self
    }
    /// The name used for this rule's policies in the IETF headers.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    pub(crate) fn matches(&self, method: &str, path: &str) -> bool {
        let method_ok = self.methods.is_empty() || self.methods.iter().any(|m| m == method);
        let path_ok = match &self.path {
            None => true,
            Some(p) => match p.strip_suffix('*') {
                Some(prefix) => path.starts_with(prefix),
                None => path == p,
            },
        };
        method_ok && path_ok
    }
}

/// Everything the HTTP layer needs: plans, keys, proxies, headers, rules.
///
/// ```
/// use tollgate::http::{HeaderStyle, HttpConfig};
/// let config = HttpConfig::parse(r#"
/// [plans.free]
/// limit = 100
/// window = "1h"
///
/// [plans.pro]
/// limit = 10000
/// window = "1h"
///
/// [http]
/// key = ["api_key", "ip"]
/// trusted_proxies = ["10.0.0.0/8"]
/// headers = "github"
/// api_keys = { "k-pro" = "pro" }
/// "#).unwrap();
/// assert_eq!(config.header_style(), HeaderStyle::Github);
/// let err = HttpConfig::parse("[plans.free]\nlimit = 1\nwindow = 1\n[http]\nheaders = \"fancy\"\n").unwrap_err();
/// assert_eq!(err.to_string(), "line 5: http.headers: unknown style 'fancy' (expected github, ietf, both or none)");
/// ```
///
/// In an app's own config it is a field like any other (`Deserialize`, from any serde format:
/// figment, config-rs, JSON), with the same tables, checks and messages as the file; every key
/// is in `docs/config.md`. Name the default plan with `http.default_plan` when the format may
/// reorder keys (see [`PlanConfig`](crate::PlanConfig)).
///
/// ```
/// use serde::Deserialize;
/// use tollgate::http::{HttpConfig, RateLimitLayer};
///
/// #[derive(Deserialize)]
/// struct AppConfig {
///     listen: String,
///     rate_limits: HttpConfig,
/// }
///
/// let app: AppConfig = serde_json::from_value(serde_json::json!({
///     "listen": "0.0.0.0:8080",
///     "rate_limits": {
///         "plans": {
///             "free": { "limit": 100, "window": "1h" },
///             "pro": { "limits": [ { "limit": 10, "window": "1s" }, { "limit": 10000, "window": "1d" } ] }
///         },
///         "http": { "default_plan": "free", "key": ["api_key", "ip"], "api_keys": { "k-pro": "pro" } }
///     }
/// }))?;
/// let layer = RateLimitLayer::new(app.rate_limits)?;
/// assert_eq!(layer.limiter().plan_names(), ["free", "pro"]);
///
/// let err = serde_json::from_value::<AppConfig>(serde_json::json!({
///     "listen": "x",
///     "rate_limits": { "plans": { "free": { "limit": 1, "window": 1 } }, "http": { "headers": "fancy" } }
/// }))
/// .err()
/// .unwrap();
/// assert_eq!(err.to_string(), "http.headers: unknown style 'fancy' (expected github, ietf, both or none)");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct HttpConfig {
    pub(crate) plans: Vec<(String, Plan)>,
    pub(crate) default_plan: Option<String>,
    pub(crate) key: Vec<KeySource>,
    pub(crate) api_key_header: String,
    pub(crate) forwarded: ForwardedHeader,
    pub(crate) trusted: TrustedProxies,
    pub(crate) v6_prefix: u8,
    pub(crate) on_bad_key: OnBadKey,
    pub(crate) headers: HeaderStyle,
    pub(crate) rules: Vec<Rule>,
    pub(crate) api_keys: HashMap<String, String>,
    pub(crate) max_keys: Option<usize>,
    pub(crate) sweep_interval: Option<Duration>,
    pub(crate) exempt: TrustedProxies,
    pub(crate) exempt_keys: HashSet<String>,
    /// Every limit cluster-wide through Redis (the `[redis]` table; feature `redis`).
    #[cfg(feature = "redis")]
    pub(crate) redis: Option<crate::redis::RedisConfig>,
    /// `redis` in exact mode (one script per request) instead of synced mode.
    #[cfg(feature = "redis")]
    pub(crate) redis_exact: bool,
}

impl HttpConfig {
    /// Plans only, every other setting at its default: clients keyed by peer address (IPv6 by
    /// /64), no trusted proxy, both header styles, the first plan for every client.
    ///
    /// ```
    /// use tollgate::http::{HttpConfig, KeySource, RateLimitLayer, Rule, TrustedProxies};
    /// use tollgate::{Plan, Quota};
    /// let config = HttpConfig::new([
    ///     ("free".to_string(), Plan::new([Quota::per_hour(100)])),
    ///     ("login".to_string(), Plan::new([Quota::per_minute(5)])),
    /// ])
    /// .key([KeySource::ApiKey, KeySource::Ip])
    /// .trusted_proxies(TrustedProxies::parse(["10.0.0.0/8"])?)
    /// .rule(Rule::route("/login", "login").methods(["POST"]));
    /// let layer = RateLimitLayer::new(config)?;
    /// assert_eq!(layer.limiter().plan_names(), ["free", "login"]);
    /// // A rule naming an unknown plan is an error, not a silent no-op.
    /// let bad = HttpConfig::new([("free".to_string(), Plan::new([Quota::per_hour(100)]))])
    ///     .rule(Rule::global("everyone"));
    /// assert_eq!(
    ///     RateLimitLayer::new(bad).err().unwrap().to_string(),
    ///     "http.rules[0].plan: unknown plan 'everyone'"
    /// );
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn new(plans: impl IntoIterator<Item = (String, Plan)>) -> Self {
        HttpConfig {
            plans: plans.into_iter().collect(),
            default_plan: None,
            key: vec![KeySource::Ip],
            api_key_header: "x-api-key".into(),
            forwarded: ForwardedHeader::XForwardedFor,
            trusted: TrustedProxies::none(),
            v6_prefix: DEFAULT_V6_PREFIX,
            on_bad_key: OnBadKey::Peer,
            headers: HeaderStyle::Both,
            rules: Vec::new(),
            api_keys: HashMap::new(),
            max_keys: None,
            sweep_interval: Some(Duration::from_secs(10)),
            exempt: TrustedProxies::none(),
            exempt_keys: HashSet::new(),
            #[cfg(feature = "redis")]
            redis: None,
            #[cfg(feature = "redis")]
            redis_exact: false,
        }
    }

    /// Every plan, rule and tier cluster-wide through Redis, in synced mode (feature `redis`;
    /// the `[redis]` table in TOML): each process decides locally and reconciles every
    /// interval (see [`RedisConfig`](crate::redis::RedisConfig)). The layer is then built inside a
    /// tokio runtime.
    #[cfg(feature = "redis")]
    pub fn redis(mut self, redis: crate::redis::RedisConfig) -> Self {
        self.redis = Some(redis);
        self.redis_exact = false;
        self
    }

    /// Every client's plan cluster-wide through Redis in exact mode (feature `redis`;
    /// `mode = "exact"` in `[redis]`): one Lua script per request on Redis's clock, exactly
    /// the in-process decision (see [`RedisLimiter`](crate::redis::RedisLimiter)), answered by
    /// the failure policy when Redis cannot (the layer's limiter is built with
    /// [`Builder::redis_exact`](crate::Builder::redis_exact)). It serves each client's own
    /// plan, hard, soft or queue, tiers (`headroom`) included, with one Redis key per (client,
    /// quota), so plans that list an equal quota share its state as in process; route and
    /// global rules need synced mode (a construction error here), and a charge is never
    /// refunded (`refund_when` has no effect).
    #[cfg(feature = "redis")]
    pub fn redis_exact(mut self, redis: crate::redis::RedisConfig) -> Self {
        self.redis = Some(redis);
        self.redis_exact = true;
        self
    }

    /// The plan for clients the resolver says nothing about (default: the first plan).
    pub fn default_plan(mut self, name: impl Into<String>) -> Self {
        self.default_plan = Some(name.into());
        self
    }
    /// Where client keys come from; more than one source makes a composite key.
    pub fn key(mut self, sources: impl IntoIterator<Item = KeySource>) -> Self {
        self.key = sources.into_iter().collect();
        self
    }
    /// The API key header (default `x-api-key`).
    pub fn api_key_header(mut self, name: impl Into<String>) -> Self {
        self.api_key_header = name.into().to_ascii_lowercase();
        self
    }
    /// Which forwarding header trusted proxies write (default `X-Forwarded-For`).
    pub fn forwarded_header(mut self, header: ForwardedHeader) -> Self {
        self.forwarded = header;
        self
    }
    /// The proxies whose forwarding headers are believed (default: none).
    pub fn trusted_proxies(mut self, trusted: TrustedProxies) -> Self {
        self.trusted = trusted;
        self
    }
    /// IPv6 clients are grouped by this prefix (default /64).
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.v6_prefix = bits;
        self
    }
    /// What to do when a request's key cannot be taken (default: fall back to the peer address).
    pub fn on_bad_key(mut self, on: OnBadKey) -> Self {
        self.on_bad_key = on;
        self
    }
    /// Which headers go on responses (default both styles).
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.headers = style;
        self
    }
    /// Adds a route or global [`Rule`]. Every matching rule applies, after the client's plan.
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }
    /// Maps an API key to a plan (the built-in resolver, used when no other is set).
    pub fn api_key_plan(mut self, api_key: impl Into<String>, plan: impl Into<String>) -> Self {
        self.api_keys.insert(api_key.into(), plan.into());
        self
    }
    /// The most keys the limiter tracks (default the engine's, 1,000,000).
    pub fn max_keys(mut self, n: usize) -> Self {
        self.max_keys = Some(n);
        self
    }
    /// How often a background thread sweeps keys back to fresh (default 10 s; `None`: never).
    pub fn sweep_interval(mut self, every: Option<Duration>) -> Self {
        self.sweep_interval = every;
        self
    }
    /// Networks whose clients are never limited (the client address after the trusted-proxy
    /// walk): health checks, internal services. Exempt requests are not charged and get no
    /// rate-limit headers.
    ///
    /// ```
    /// use tollgate::http::{HttpConfig, TrustedProxies};
    /// let config = HttpConfig::parse("[plans.free]\nlimit = 10\nwindow = \"1m\"\n")?
    ///     .exempt(TrustedProxies::parse(["10.0.0.0/8", "::1"])?)
    ///     .exempt_key("k-monitoring");
    /// # let _ = config;
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn exempt(mut self, networks: TrustedProxies) -> Self {
        self.exempt = networks;
        self
    }
    /// A client key that is never limited: an API key, or a user id from the user extractor
    /// (matched against every part of a composite key).
    pub fn exempt_key(mut self, key: impl Into<String>) -> Self {
        self.exempt_keys.insert(key.into());
        self
    }
    /// The header style.
    pub fn header_style(&self) -> HeaderStyle {
        self.headers
    }

    /// Checks the names used by rules, API keys and the default plan against the plans.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        let known = |name: &str, what: String| {
            if self.plans.iter().any(|(n, _)| n == name) {
                Ok(())
            } else {
                Err(Error::Config {
                    line: None,
                    message: format!("{what}: unknown plan '{name}'"),
                })
            }
        };
        if self.plans.is_empty() {
            return Err(Error::NoQuota);
        }
        if let Some(d) = &self.default_plan {
            known(d, "http.default_plan".into())?;
        }
        for (key, plan) in &self.api_keys {
            known(plan, format!("http.api_keys.{key}"))?;
        }
        for (i, r) in self.rules.iter().enumerate() {
            known(&r.plan, format!("http.rules[{i}].plan"))?;
            for (client, plan) in &r.tiers {
                known(client, format!("http.rules[{i}].tiers"))?;
                known(plan, format!("http.rules[{i}].tiers.{client}"))?;
            }
        }
        if self.key.is_empty() {
            return Err(Error::Config {
                line: None,
                message: "http.key: at least one key source".into(),
            });
        }
        if self.v6_prefix > 128 {
            return Err(Error::Config {
                line: None,
                message: format!("http.ipv6_prefix: {} is above 128", self.v6_prefix),
            });
        }
        if http::HeaderName::from_bytes(self.api_key_header.as_bytes()).is_err() {
            return Err(Error::Config {
                line: None,
                message: format!(
                    "http.api_key_header: '{}' is not a header name",
                    self.api_key_header
                ),
            });
        }
        Ok(())
    }
}
