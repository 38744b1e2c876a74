//! The HTTP layer's configuration: the engine's `[plans.*]` tables plus an `[http]` table, in one
//! TOML file (see `examples/plans.toml`), or built in code. This file holds [`HttpConfig`] as
//! code builds it and the types it is made of; `parse.rs` reads the TOML file into it.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::error::Error;
use crate::http::keys::{ForwardedHeader, OnBadKey, TrustedProxies};
use crate::ip::DEFAULT_V6_PREFIX;
use crate::plan::{Plan, Strategy};

mod parse;
mod path;

pub(crate) use path::PathPattern;

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
    /// Its name in the config (`ip`, `api_key`, `user`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            KeySource::Ip => "ip",
            KeySource::ApiKey => "api_key",
            KeySource::User => "user",
        }
    }

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
/// it), or global. Every matching rule applies after the client's plan; a rule that
/// [replaces the plan](Self::replaces_plan) applies instead of it.
///
/// ```
/// use tollgate::http::Rule;
/// let login = Rule::route("/login", "login").methods(["POST"]);
/// let search = Rule::route("/search/*", "search").shared();
/// let export = Rule::route("/users/{id}/export", "export").replaces_plan();
/// let global = Rule::global("global").tier("free", "global_free");
/// # let _ = (login, search, export, global);
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
    /// A dry run: decided and counted, never denying, no headers (its plans' shadow twins).
    pub(crate) shadow: bool,
    /// On its paths the client's own plan is not charged: this rule (and any other matching
    /// rule) alone applies.
    pub(crate) replaces_plan: bool,
}

impl Rule {
    /// A per-client limit on requests whose path is `path`, under plan `plan`: exact
    /// (`/login`), a prefix (a trailing `*`: `/api/*`), or axum-style segments (`{id}` is any
    /// one non-empty segment, a trailing `{*rest}` anything non-empty after it:
    /// `/users/{id}/export`, `/files/{*path}`). Its name in headers is the path. A path no
    /// request can have (no leading `/`, a space, `?`, a parameter that is not a whole
    /// segment) is an error when the layer is built.
    pub fn route(path: impl Into<String>, plan: impl Into<String>) -> Self {
        let path = path.into();
        Rule {
            name: path.clone(),
            path: Some(path),
            methods: Vec::new(),
            plan: plan.into(),
            tiers: Vec::new(),
            shared: false,
            shadow: false,
            replaces_plan: false,
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
            shadow: false,
            replaces_plan: false,
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
    /// A dry run of this rule (`shadow = true`): its requests are decided and counted exactly
    /// as when it enforces, but it never denies and adds no headers; what it would have denied
    /// counts as `shadow_passed` (its plan's `tollgate_plan_decisions_total` under the name
    /// `PLAN@shadow`, and `tollgate_http_shadow_passed_total`). Roll a new limit out this way,
    /// then drop the flag.
    pub fn shadow(mut self) -> Self {
        self.shadow = true;
        self
    }
    /// The name used for this rule's policies in the IETF headers.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// On this rule's paths, the client's own plan is not charged: only the matching rules
    /// apply (Envoy's `replaces`). For example an export endpoint with a quota of its own that
    /// should not also spend the client's general plan.
    ///
    /// ```
    /// use tollgate::http::{HttpConfig, RateLimitLayer, Rule};
    /// let config = HttpConfig::parse("[plans.free]\nlimit = 100\nwindow = \"1h\"\n[plans.export]\nlimit = 2\nwindow = \"1d\"\n")?
    ///     .rule(Rule::route("/users/{id}/export", "export").replaces_plan());
    /// # let _ = RateLimitLayer::new(config)?;
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn replaces_plan(mut self) -> Self {
        self.replaces_plan = true;
        self
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
    /// Every limit in shadow mode (`shadow = true` in `[http]`).
    pub(crate) shadow: bool,
    /// Paths never limited (`/health`), as rules name paths.
    pub(crate) exempt_paths: Vec<String>,
    /// Every limit cluster-wide through Redis (the `[redis]` table; feature `redis`).
    #[cfg(feature = "redis")]
    pub(crate) redis: Option<crate::redis::RedisConfig>,
    /// `redis` in exact mode (one script per request) instead of synced mode.
    #[cfg(feature = "redis")]
    pub(crate) redis_exact: bool,
}

/// The end of a shadow twin's name.
const SHADOW_SUFFIX: &str = "@shadow";

/// The name of plan `plan`'s shadow twin (the plan in shadow mode, for rules in shadow mode).
pub(crate) fn shadow_twin(plan: &str) -> String {
    format!("{plan}{SHADOW_SUFFIX}")
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
            shadow: false,
            exempt_paths: Vec::new(),
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
    /// Replaces the API key table (`http.api_keys`): each API key with its plan. An empty
    /// table leaves plans to a [resolver](crate::http::RateLimitLayer::resolver) or the default.
    pub fn api_keys<K: Into<String>, P: Into<String>>(
        mut self,
        table: impl IntoIterator<Item = (K, P)>,
    ) -> Self {
        self.api_keys = table
            .into_iter()
            .map(|(k, p)| (k.into(), p.into()))
            .collect();
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
    /// A dry run of the whole layer (`shadow = true` in `[http]`): every plan and rule decides
    /// and counts as when it enforces ([`Strategy::Shadow`](crate::Strategy::Shadow)), but no
    /// request is denied by a limit and no rate-limit header is added; what would have been
    /// denied counts as `shadow_passed` (`tollgate_http_shadow_passed_total`, and each plan's
    /// `tollgate_plan_decisions_total{outcome="shadow_passed"}`). Compare it with the
    /// `allowed` counts to see what enforcing would do, then turn it off (a
    /// [`reload`](crate::http::RateLimitLayer::reload) keeps the counts).
    pub fn shadow(mut self, on: bool) -> Self {
        self.shadow = on;
        self
    }

    /// The plans the layer's limiter holds: the config's (each in shadow mode when the whole
    /// layer is) and, for each rule in shadow mode, a shadow twin of each plan it uses, named
    /// [`shadow_twin`].
    pub(crate) fn limiter_plans(&self) -> Vec<(String, Plan)> {
        let mut plans: Vec<(String, Plan)> = self
            .plans
            .iter()
            .map(|(name, plan)| {
                let plan = if self.shadow {
                    plan.clone().strategy(Strategy::Shadow)
                } else {
                    plan.clone()
                };
                (name.clone(), plan)
            })
            .collect();
        for rule in self.rules.iter().filter(|r| r.shadow) {
            let used = std::iter::once(&rule.plan).chain(rule.tiers.iter().map(|(_, p)| p));
            for name in used {
                let twin = shadow_twin(name);
                if plans.iter().any(|(n, _)| *n == twin) {
                    continue;
                }
                if let Some((_, plan)) = self.plans.iter().find(|(n, _)| n == name) {
                    plans.push((twin, plan.clone().strategy(Strategy::Shadow)));
                }
            }
        }
        plans
    }

    /// Requests to this path are never limited, whoever sends them (health checks, a
    /// metrics scrape): not keyed, not charged, no rate-limit headers. Paths as a [`Rule`]
    /// names them: exact, `prefix*`, or with `{id}` / `{*rest}` segments.
    ///
    /// ```
    /// use tollgate::http::{HttpConfig, RateLimitLayer};
    /// let config = HttpConfig::parse("[plans.free]\nlimit = 10\nwindow = \"1m\"\n")?
    ///     .exempt_path("/health")
    ///     .exempt_path("/static/*");
    /// # let _ = RateLimitLayer::new(config)?;
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn exempt_path(mut self, path: impl Into<String>) -> Self {
        self.exempt_paths.push(path.into());
        self
    }
    /// The header style.
    pub fn header_style(&self) -> HeaderStyle {
        self.headers
    }

    /// What a reload to `next` cannot change: the settings the limiter is built with.
    pub(crate) fn same_limiter(&self, next: &HttpConfig) -> Result<(), Error> {
        let fixed = |what: &str, same: bool| {
            if same {
                Ok(())
            } else {
                Err(Error::Config {
                    line: None,
                    message: format!(
                        "{what} cannot change while the layer runs (the limiter is built with \
                         it): restart to change it"
                    ),
                })
            }
        };
        fixed("http.max_keys", self.max_keys == next.max_keys)?;
        fixed(
            "http.sweep_interval",
            self.sweep_interval == next.sweep_interval,
        )?;
        #[cfg(feature = "redis")]
        fixed(
            "[redis]",
            self.redis_exact == next.redis_exact
                && match (&self.redis, &next.redis) {
                    (None, None) => true,
                    (Some(a), Some(b)) => a.same_as(b),
                    _ => false,
                },
        )?;
        Ok(())
    }

    /// Checks the names used by rules, API keys and the default plan against the plans.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        if let Some((name, _)) = self.plans.iter().find(|(n, _)| n.ends_with(SHADOW_SUFFIX)) {
            return Err(Error::Config {
                line: None,
                message: format!(
                    "plans.{name}: a name ending in '{SHADOW_SUFFIX}' is kept for the shadow twins \
                     of rules in shadow mode"
                ),
            });
        }
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
        if self.rules.len() > usize::from(u16::MAX) {
            // A rule's index is kept in 16 bits.
            return Err(Error::Config {
                line: None,
                message: format!("http: {} rules; at most {}", self.rules.len(), u16::MAX),
            });
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
        self.rule_paths()?;
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

    /// The exempt paths and each rule's path, compiled: an error for a path no request can
    /// have, a method no request can use, or a rule whose every path is exempt (it could never
    /// apply).
    pub(crate) fn rule_paths(&self) -> Result<(Vec<PathPattern>, Vec<Option<PathPattern>>), Error> {
        let bad = |field: String, why: String| Error::Config {
            line: None,
            message: format!("{field}: {why}"),
        };
        let mut exempt = Vec::with_capacity(self.exempt_paths.len());
        for (i, p) in self.exempt_paths.iter().enumerate() {
            exempt.push(
                PathPattern::parse(p).map_err(|why| bad(format!("http.exempt_paths[{i}]"), why))?,
            );
        }
        let mut rules = Vec::with_capacity(self.rules.len());
        for (i, r) in self.rules.iter().enumerate() {
            for m in &r.methods {
                if http::Method::from_bytes(m.as_bytes()).is_err() {
                    return Err(bad(
                        format!("http.rules[{i}].methods"),
                        format!("'{m}' is not an HTTP method, so the rule could never apply"),
                    ));
                }
            }
            let Some(path) = &r.path else {
                rules.push(None);
                continue;
            };
            let pattern = PathPattern::parse(path)
                .map_err(|why| bad(format!("http.rules[{i}].path"), why))?;
            if let Some(at) = exempt.iter().position(|e| e.covers(&pattern)) {
                return Err(bad(
                    format!("http.rules[{i}].path"),
                    format!(
                        "every request to '{path}' is exempt (exempt_paths[{at}] = '{}'), so the \
                         rule could never apply",
                        self.exempt_paths[at]
                    ),
                ));
            }
            rules.push(Some(pattern));
        }
        Ok((exempt, rules))
    }
}
