//! The layer's TOML file: [`HttpConfig::parse`] reads the engine's `[plans.*]` tables, then the
//! `[http]` table and the `[redis]` table into an [`HttpConfig`], each mistake an
//! [`Error::Config`] naming the field and its line.

use std::collections::HashMap;

use serde::Deserialize;
use toml::Spanned;

use super::{HeaderStyle, HttpConfig, KeySource, Rule};
use crate::error::Error;
use crate::http::keys::{ForwardedHeader, OnBadKey, TrustedProxies};
use crate::plan::PlanConfig;
use crate::plan::config::{Ctx, line_of};

impl HttpConfig {
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
        Self::parse(&crate::plan::config::read_source(path.as_ref())?)
    }
}

/// An `HttpConfig` inside an app's own config, from any serde format: the same tables as the
/// file (`plans`, `http`, `redis`), the same checks and messages (each naming the dotted field,
/// with no line: the line belongs to the app's parser).
impl<'de> Deserialize<'de> for HttpConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::plan::config::deserialize_via(d, HttpConfig::parse)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFile {
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
    // Wider than the table can be, so a too-large value is named with the maximum.
    max_keys: Option<Spanned<i128>>,
    sweep_interval: Option<Spanned<String>>,
    api_keys: Option<Spanned<HashMap<String, String>>>,
    exempt: Option<Spanned<Vec<String>>>,
    exempt_keys: Option<Vec<String>>,
    #[serde(default)]
    shadow: bool,
    exempt_paths: Option<Vec<String>>,
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
    shadow: bool,
    #[serde(default)]
    replaces_plan: bool,
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

    /// The `[http]` table, in the order its fields are checked: the default plan, then each
    /// step below.
    fn apply(&self, c: &mut HttpConfig, mut raw: RawHttp) -> Result<(), Error> {
        if let Some(d) = raw.default_plan.take() {
            self.known_plan(c, &d, "http.default_plan")?;
            c.default_plan = Some(d.into_inner());
        }
        self.apply_client_keys(c, &mut raw)?;
        self.apply_headers_and_table(c, &mut raw)?;
        self.apply_exemptions(c, &mut raw)?;
        self.apply_plans_and_rules(c, &mut raw)?;
        Ok(())
    }

    /// How clients are keyed: `key`, `api_key_header`, `forwarded_header`, `trusted_proxies`,
    /// `ipv6_prefix`, `on_bad_key`.
    fn apply_client_keys(&self, c: &mut HttpConfig, raw: &mut RawHttp) -> Result<(), Error> {
        if let Some(k) = raw.key.take() {
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
        if let Some(h) = raw.api_key_header.take() {
            if http::HeaderName::from_bytes(h.get_ref().as_bytes()).is_err() {
                return self.err(h.span().start, "http.api_key_header", "not a header name");
            }
            c.api_key_header = h.into_inner().to_ascii_lowercase();
        }
        if let Some(f) = raw.forwarded_header.take() {
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
        if let Some(t) = raw.trusted_proxies.take() {
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
        if let Some(p) = raw.ipv6_prefix.take() {
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
        if let Some(o) = raw.on_bad_key.take() {
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
        Ok(())
    }

    /// The response headers (`headers`) and the limiter's table (`max_keys`, `sweep_interval`).
    fn apply_headers_and_table(&self, c: &mut HttpConfig, raw: &mut RawHttp) -> Result<(), Error> {
        if let Some(h) = raw.headers.take() {
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
        if let Some(m) = raw.max_keys.take() {
            match usize::try_from(*m.get_ref()) {
                Ok(n) if n >= 1 => c.max_keys = Some(n),
                _ if *m.get_ref() >= 1 => {
                    return self.err(
                        m.span().start,
                        "http.max_keys",
                        format!("{} is too large (at most {})", m.get_ref(), usize::MAX),
                    );
                }
                _ => {
                    return self.err(
                        m.span().start,
                        "http.max_keys",
                        format!("must be at least 1, got {}", m.get_ref()),
                    );
                }
            }
        }
        if let Some(s) = raw.sweep_interval.take() {
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
        Ok(())
    }

    /// Who is never limited: `exempt` networks, `exempt_keys` and `exempt_paths`.
    fn apply_exemptions(&self, c: &mut HttpConfig, raw: &mut RawHttp) -> Result<(), Error> {
        if let Some(t) = raw.exempt.take() {
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
        c.exempt_keys
            .extend(raw.exempt_keys.take().into_iter().flatten());
        c.shadow = raw.shadow;
        c.exempt_paths
            .extend(raw.exempt_paths.take().into_iter().flatten());
        Ok(())
    }

    /// Plans by API key (`api_keys`), then the rules: `routes`, then `global`.
    fn apply_plans_and_rules(&self, c: &mut HttpConfig, raw: &mut RawHttp) -> Result<(), Error> {
        if let Some(keys) = raw.api_keys.take() {
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
        for (i, r) in raw.routes.take().into_iter().flatten().enumerate() {
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
        if let Some(g) = raw.global.take() {
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
        if raw.shadow {
            rule.shadow = true;
        }
        if raw.replaces_plan {
            rule.replaces_plan = true;
        }
        if let Some(n) = raw.name {
            rule.name = n;
        }
        Ok(rule)
    }
}
