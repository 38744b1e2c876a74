//! The HTTP layer's configuration: the engine's `[plans.*]` tables plus an `[http]` table, in one
//! TOML file (see `examples/plans.toml`), or built in code.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::error::Error;
use crate::http::keys::{ForwardedHeader, OnBadKey, TrustedProxies};
use crate::ip::DEFAULT_V6_PREFIX;
use crate::plan::config::{Ctx, line_of};
use crate::plan::{Plan, PlanConfig};

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

    /// Parses `[plans.*]` (as [`PlanConfig`]) and an optional `[http]` table; every mistake is an
    /// [`Error::Config`] naming the field and its line.
    pub fn parse(src: &str) -> Result<HttpConfig, Error> {
        let plans = PlanConfig::parse_plans_section(src)?;
        let file: RawFile = crate::plan::config::from_toml(src)?;
        let mut config = HttpConfig::new(plans.into_plans());
        if let Some(http) = file.http {
            Ctx { src }.apply(&mut config, http)?;
        }
        if let Some(redis) = file.redis {
            Ctx { src }.apply_redis(&mut config, redis)?;
        }
        config.validate()?;
        Ok(config)
    }

    /// Reads and parses a file.
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<HttpConfig, Error> {
        let path = path.as_ref();
        let src = std::fs::read_to_string(path).map_err(|e| Error::Config {
            line: None,
            message: format!("{}: {e}", path.display()),
        })?;
        Self::parse(&src)
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[allow(dead_code)]
    plans: serde::de::IgnoredAny,
    // Not `Spanned`: toml cannot span a table that only dotted headers create
    // (`[[http.routes]]` or `[http.global]` with no `[http]` line), and the fields carry their own.
    http: Option<RawHttp>,
    redis: Option<Spanned<RawRedis>>,
}

/// The `[redis]` table: every plan, rule and tier cluster-wide.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
struct RawRedis {
    url: Option<Spanned<String>>,
    nodes: Option<Spanned<Vec<String>>>,
    mode: Option<Spanned<String>>,
    interval: Option<Spanned<String>>,
    on_failure: Option<Spanned<String>>,
    local_share_nodes: Option<Spanned<i64>>,
    deadline: Option<Spanned<String>>,
    prefix: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    default_plan: Option<Spanned<String>>,
    key: Option<Spanned<OneOrMany>>,
    api_key_header: Option<Spanned<String>>,
    forwarded_header: Option<Spanned<String>>,
    trusted_proxies: Option<Spanned<Vec<String>>>,
    ipv6_prefix: Option<Spanned<i64>>,
    on_bad_key: Option<Spanned<String>>,
    headers: Option<Spanned<String>>,
    max_keys: Option<Spanned<i64>>,
    sweep_interval: Option<Spanned<String>>,
    api_keys: Option<Spanned<HashMap<String, String>>>,
    exempt: Option<Spanned<Vec<String>>>,
    exempt_keys: Option<Vec<String>>,
    routes: Option<Vec<Spanned<RawRule>>>,
    global: Option<Spanned<RawRule>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: Option<String>,
    path: Option<Spanned<String>>,
    methods: Option<Vec<String>>,
    plan: Spanned<String>,
    #[serde(default)]
    shared: bool,
    #[serde(default)]
    tiers: HashMap<String, String>,
}

impl Ctx<'_> {
    /// The `[redis]` table: `url` or `nodes`, `mode = "synced"` (the default, with `interval`)
    /// or `"exact"`, `on_failure`, `deadline`, `prefix`.
    fn apply_redis(&self, c: &mut HttpConfig, raw: Spanned<RawRedis>) -> Result<(), Error> {
        let at = raw.span().start;
        let raw = raw.into_inner();
        let mut exact = false;
        if let Some(m) = &raw.mode {
            match m.get_ref().as_str() {
                "synced" => {}
                "exact" => exact = true,
                other => {
                    return self.err(
                        m.span().start,
                        "redis.mode",
                        format!("unknown mode '{other}' (expected synced or exact)"),
                    );
                }
            }
        }
        #[cfg(not(feature = "redis"))]
        {
            let _ = (c, exact);
            self.err(
                at,
                "redis",
                "this build has no Redis support (feature `redis`)",
            )
        }
        #[cfg(feature = "redis")]
        {
            use crate::redis::{FailurePolicy, RedisConfig};
            let mut sync = match (&raw.url, &raw.nodes) {
                (Some(u), None) => RedisConfig::new(u.get_ref()),
                (None, Some(n)) => {
                    let nodes: Vec<&str> = n.get_ref().iter().map(String::as_str).collect();
                    RedisConfig::cluster(&nodes)
                }
                _ => return self.err(at, "redis", "exactly one of `url` or `nodes`"),
            };
            let duration =
                |v: &Spanned<String>, field: &str| match crate::plan::config::parse_duration(
                    v.get_ref(),
                ) {
                    Some(d) if !d.is_zero() => Ok(d),
                    _ => self.err(v.span().start, field, "a positive duration like \"50ms\""),
                };
            if let Some(i) = &raw.interval {
                sync = sync.interval(duration(i, "redis.interval")?);
            }
            if let Some(d) = &raw.deadline {
                sync = sync.deadline(duration(d, "redis.deadline")?);
            }
            if let Some(p) = raw.prefix {
                sync = sync.prefix(p);
            }
            if let Some(f) = &raw.on_failure {
                let policy = match f.get_ref().as_str() {
                    "closed" => FailurePolicy::Closed,
                    "open" => FailurePolicy::Open,
                    "local_share" => {
                        let nodes = raw.local_share_nodes.as_ref().map_or(Ok(1), |n| {
                            u64::try_from(*n.get_ref())
                                .ok()
                                .filter(|&n| n > 0)
                                .map_or_else(
                                    || {
                                        self.err(
                                            n.span().start,
                                            "redis.local_share_nodes",
                                            "a positive number of processes",
                                        )
                                    },
                                    Ok,
                                )
                        })?;
                        FailurePolicy::LocalShare { nodes }
                    }
                    other => {
                        return self.err(
                            f.span().start,
                            "redis.on_failure",
                            format!(
                                "unknown policy '{other}' (expected closed, open or local_share)"
                            ),
                        );
                    }
                };
                sync = sync.on_failure(policy);
            }
            sync.validate()
                .or_else(|e| self.err(at, "redis", e.to_string()))?;
            c.redis = Some(sync);
            c.redis_exact = exact;
            Ok(())
        }
    }

    fn known_plan(
        &self,
        config: &HttpConfig,
        v: &Spanned<String>,
        field: &str,
    ) -> Result<(), Error> {
        if config.plans.iter().any(|(n, _)| n == v.get_ref()) {
            Ok(())
        } else {
            self.err(
                v.span().start,
                field,
                format!("unknown plan '{}'", v.get_ref()),
            )
        }
    }

    fn apply(&self, c: &mut HttpConfig, raw: RawHttp) -> Result<(), Error> {
        if let Some(d) = raw.default_plan {
            self.known_plan(c, &d, "http.default_plan")?;
            c.default_plan = Some(d.into_inner());
        }
        if let Some(k) = raw.key {
            let at = k.span().start;
            let names = match k.into_inner() {
                OneOrMany::One(n) => vec![n],
                OneOrMany::Many(v) => v,
            };
            if names.is_empty() {
                return self.err(at, "http.key", "at least one of ip, api_key, user");
            }
            let mut key = Vec::new();
            for n in names {
                match KeySource::from_name(&n) {
                    Some(s) => key.push(s),
                    None => {
                        return self.err(
                            at,
                            "http.key",
                            format!("unknown key source '{n}' (expected ip, api_key or user)"),
                        );
                    }
                }
            }
            c.key = key;
        }
        if let Some(h) = raw.api_key_header {
            if http::HeaderName::from_bytes(h.get_ref().as_bytes()).is_err() {
                return self.err(h.span().start, "http.api_key_header", "not a header name");
            }
            c.api_key_header = h.into_inner().to_ascii_lowercase();
        }
        if let Some(f) = raw.forwarded_header {
            c.forwarded = match f.get_ref().to_ascii_lowercase().as_str() {
                "x-forwarded-for" => ForwardedHeader::XForwardedFor,
                "forwarded" => ForwardedHeader::Forwarded,
                "none" => ForwardedHeader::None,
                other => {
                    return self.err(
                        f.span().start,
                        "http.forwarded_header",
                        format!(
                            "unknown header '{other}' (expected x-forwarded-for, forwarded or none)"
                        ),
                    );
                }
            };
        }
        if let Some(t) = raw.trusted_proxies {
            let at = t.span().start;
            c.trusted = match TrustedProxies::parse(t.into_inner()) {
                Ok(t) => t,
                Err(Error::Config { message, .. }) => {
                    return Err(Error::Config {
                        line: Some(line_of(self.src, at)),
                        message: format!("http.{message}"),
                    });
                }
                Err(e) => return Err(e),
            };
        }
        if let Some(p) = raw.ipv6_prefix {
            match u8::try_from(*p.get_ref()) {
                Ok(bits) if bits <= 128 => c.v6_prefix = bits,
                _ => {
                    return self.err(
                        p.span().start,
                        "http.ipv6_prefix",
                        format!("must be 0..=128, got {}", p.get_ref()),
                    );
                }
            }
        }
        if let Some(o) = raw.on_bad_key {
            c.on_bad_key = match o.get_ref().as_str() {
                "peer" => OnBadKey::Peer,
                "shared" => OnBadKey::Shared,
                "reject" => OnBadKey::Reject,
                other => {
                    return self.err(
                        o.span().start,
                        "http.on_bad_key",
                        format!("unknown behaviour '{other}' (expected peer, shared or reject)"),
                    );
                }
            };
        }
        if let Some(h) = raw.headers {
            c.headers = match h.get_ref().as_str() {
                "github" => HeaderStyle::Github,
                "ietf" => HeaderStyle::Ietf,
                "both" => HeaderStyle::Both,
                "none" => HeaderStyle::None,
                other => {
                    return self.err(
                        h.span().start,
                        "http.headers",
                        format!("unknown style '{other}' (expected github, ietf, both or none)"),
                    );
                }
            };
        }
        if let Some(m) = raw.max_keys {
            match usize::try_from(*m.get_ref()) {
                Ok(n) if n >= 1 => c.max_keys = Some(n),
                _ => {
                    return self.err(
                        m.span().start,
                        "http.max_keys",
                        format!("must be at least 1, got {}", m.get_ref()),
                    );
                }
            }
        }
        if let Some(s) = raw.sweep_interval {
            c.sweep_interval = if s.get_ref() == "never" {
                None
            } else {
                match crate::plan::config::parse_duration(s.get_ref()) {
                    Some(d) if !d.is_zero() => Some(d),
                    _ => {
                        return self.err(
                            s.span().start,
                            "http.sweep_interval",
                            "a positive duration like \"10s\", or \"never\"",
                        );
                    }
                }
            };
        }
        if let Some(t) = raw.exempt {
            let at = t.span().start;
            c.exempt = TrustedProxies::parse(t.into_inner()).map_err(|e| match e {
                Error::Config { message, .. } => Error::Config {
                    line: Some(line_of(self.src, at)),
                    message: format!(
                        "http.exempt{}",
                        message.strip_prefix("trusted_proxies").unwrap_or(&message)
                    ),
                },
                e => e,
            })?;
        }
        c.exempt_keys.extend(raw.exempt_keys.into_iter().flatten());
        if let Some(keys) = raw.api_keys {
            let at = keys.span().start;
            for (key, plan) in keys.into_inner() {
                if !c.plans.iter().any(|(n, _)| *n == plan) {
                    return self.err(
                        at,
                        &format!("http.api_keys.{key}"),
                        format!("unknown plan '{plan}'"),
                    );
                }
                c.api_keys.insert(key, plan);
            }
        }
        for (i, r) in raw.routes.into_iter().flatten().enumerate() {
            let at = r.span().start;
            let field = format!("http.routes[{i}]");
            let mut r = r.into_inner();
            let Some(path) = r.path.take() else {
                return self.err(at, &field, "missing field `path`");
            };
            if !path.get_ref().starts_with('/') {
                return self.err(
                    path.span().start,
                    &format!("{field}.path"),
                    "must start with '/'",
                );
            }
            let rule = self.rule(
                c,
                &field,
                Rule::route(path.into_inner(), r.plan.get_ref().clone()),
                r,
            )?;
            c.rules.push(rule);
        }
        if let Some(g) = raw.global {
            let at = g.span().start;
            let g = g.into_inner();
            if g.path.is_some() {
                return self.err(
                    at,
                    "http.global.path",
                    "the global rule applies to every path",
                );
            }
            let rule = self.rule(c, "http.global", Rule::global(g.plan.get_ref().clone()), g)?;
            c.rules.push(rule);
        }
        Ok(())
    }

    fn rule(
        &self,
        c: &HttpConfig,
        field: &str,
        mut rule: Rule,
        raw: RawRule,
    ) -> Result<Rule, Error> {
        self.known_plan(c, &raw.plan, &format!("{field}.plan"))?;
        for (client, plan) in &raw.tiers {
            if !c.plans.iter().any(|(n, _)| n == client) || !c.plans.iter().any(|(n, _)| n == plan)
            {
                return self.err(
                    raw.plan.span().start,
                    &format!("{field}.tiers"),
                    format!("'{client}' = '{plan}' names an unknown plan"),
                );
            }
        }
        let mut tiers: Vec<(String, String)> = raw.tiers.into_iter().collect();
        tiers.sort();
        rule.tiers = tiers;
        if let Some(m) = raw.methods {
            rule = rule.methods(m);
        }
        if raw.shared {
            rule.shared = true;
        }
        if let Some(n) = raw.name {
            rule.name = n;
        }
        Ok(rule)
    }
}
