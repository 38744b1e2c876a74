//! The tower layer: keys, plans, rules, strategies, headers, 429s.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{Either, Full};

use crate::cell::Mode;
use crate::clock::{Clock, MonotonicClock};
use crate::decision::Reason;
use crate::error::Error;
use crate::http::config::{HttpConfig, KeySource};
use crate::http::format;
use crate::http::keys::{
    ClientKey, KeyError, OnBadKey, api_key_from_headers, client_ip_from_headers,
};
use crate::http::metrics::HttpCounters;
use crate::ip::client_ip_key;
use crate::limiter::{Detailed, Limiter, Part, PlanId};
use crate::quota::Quota;
use crate::sweep::Sweeper;

/// The key the layer's limiter is keyed by: which limit (the client's own plan, or a rule) and
/// whose bucket.
///
/// ```
/// use tollgate::http::{ClientKey, HttpKey};
/// let own = HttpKey { rule: None, client: ClientKey::ApiKey("k1".into()) };
/// let global = HttpKey { rule: Some(0), client: ClientKey::Unidentified };
/// assert_ne!(own, global);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HttpKey {
    /// `None`: the client's own plan; `Some(i)`: the i-th [`Rule`](crate::http::Rule).
    pub rule: Option<u16>,
    /// Whose bucket: the client, or [`ClientKey::Unidentified`] for a shared rule (one bucket
    /// for everyone).
    pub client: ClientKey,
}

/// A resolver's answer: the plan name, or `None` for the default plan.
pub type PlanFuture = Pin<Box<dyn Future<Output = Option<String>> + Send + 'static>>;

type Resolver = dyn Fn(&http::request::Parts, &ClientKey) -> PlanFuture + Send + Sync;
type UserFn = dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync;

/// A plan as the headers and the 429 message describe it.
#[derive(Debug)]
struct PlanInfo {
    quotas: Vec<Quota>,
    /// The plan as a client's own limit (labelled with the plan's name).
    policy: Arc<Policy>,
}

/// The IETF policy items of one limit (a plan under a label), formatted once at construction.
#[derive(Debug)]
struct Policy {
    /// One structured-field string per part: `"free"`, or `"pro.0"`, `"pro.1"`.
    names: Vec<String>,
    /// The `RateLimit-Policy` items, joined: `"pro.0";q=4;w=1, "pro.1";q=100;w=3600`.
    items: String,
    /// `items` as a header value, for the common case of one limit.
    header: Option<HeaderValue>,
}

impl Policy {
    fn new(label: &str, quotas: &[Quota]) -> Policy {
        let many = quotas.len() > 1;
        let mut names = Vec::with_capacity(quotas.len());
        let mut items = String::new();
        for (i, q) in quotas.iter().enumerate() {
            let name = if many {
                format::sf_string(&format!("{label}.{i}"))
            } else {
                format::sf_string(label)
            };
            if i > 0 {
                items.push_str(", ");
            }
            let _ = write!(
                items,
                "{name};q={};w={}",
                q.limit(),
                format::ceil_secs(crate::clock::nanos(q.period())).max(1)
            );
            if q.burst_size() != q.limit() && q.algo().name().ends_with("bucket") {
                let _ = write!(items, ";burst={}", q.burst_size());
            }
            names.push(name);
        }
        let header = HeaderValue::from_str(&items).ok();
        Policy {
            names,
            items,
            header,
        }
    }
}

/// A rule with its plans resolved to ids.
#[derive(Debug)]
struct CompiledRule {
    rule: crate::http::config::Rule,
    plan: PlanId,
    /// Client plan → this rule's plan for that client.
    tiers: HashMap<PlanId, PlanId>,
    /// This rule's policy under each plan it can use.
    policies: HashMap<PlanId, Arc<Policy>>,
}

/// What the layer shares between clones.
struct Core<C: Clock> {
    limiter: Arc<Limiter<HttpKey, C>>,
    config: HttpConfig,
    plans: HashMap<PlanId, PlanInfo>,
    default_plan: PlanId,
    api_key_plans: HashMap<String, PlanId>,
    rules: Vec<CompiledRule>,
    api_key_header: HeaderName,
    counters: HttpCounters,
    /// Stops and joins the background sweeper when the last clone drops.
    _sweeper: Option<Sweeper>,
}

/// A `tower::Layer` that rate-limits HTTP requests (axum 0.8, hyper 1, tonic: anything with
/// `http::Request` in and `http::Response` out).
///
/// Every request is checked against its client's plan (resolved per request) and every matching
/// [`Rule`](crate::http::Rule) (per route, shared, global), all or nothing: when one denies, the
/// others are refunded. Denied requests get a 429 with `Retry-After` and a JSON body; every
/// response gets the configured [`HeaderStyle`](crate::http::HeaderStyle). Each plan's strategy applies: hard (429), soft
/// (passed with a `Warning` header), queue (held until its reservation, at most `max_delay`),
/// priority (a plan's `headroom` on shared rules, with per-tier plans).
///
/// The peer address comes from axum's `ConnectInfo<SocketAddr>` (serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`) or a `SocketAddr` extension (insert
/// it yourself with hyper).
///
/// ```
/// use axum::{Router, routing::get};
/// use tollgate::http::{HttpConfig, RateLimitLayer};
/// let config = HttpConfig::parse("[plans.free]\nlimit = 100\nwindow = \"1h\"\n").unwrap();
/// let layer = RateLimitLayer::new(config).unwrap();
/// let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(layer.clone());
/// assert_eq!(layer.limiter().len(), 0);
/// # let _ = app;
/// ```
pub struct RateLimitLayer<C: Clock = MonotonicClock> {
    core: Arc<Core<C>>,
    resolver: Option<Arc<Resolver>>,
    user: Option<Arc<UserFn>>,
}

impl<C: Clock> Clone for RateLimitLayer<C> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            core: Arc::clone(&self.core),
            resolver: self.resolver.clone(),
            user: self.user.clone(),
        }
    }
}

impl RateLimitLayer<MonotonicClock> {
    /// A layer on the monotonic clock.
    pub fn new(config: HttpConfig) -> Result<Self, Error> {
        Self::with_clock(config, MonotonicClock::new())
    }
}

impl<C: Clock> RateLimitLayer<C> {
    /// A layer on `clock` (a [`FakeClock`](crate::FakeClock) in tests).
    pub fn with_clock(config: HttpConfig, clock: C) -> Result<Self, Error> {
        config.validate()?;
        let mut builder = Limiter::<HttpKey>::builder().clock(clock);
        if let Some(n) = config.max_keys {
            builder = builder.max_keys(n);
        }
        for (name, plan) in &config.plans {
            builder = builder.plan(name.clone(), plan.clone());
        }
        let limiter = Arc::new(builder.build()?);
        let id = |name: &str| {
            limiter
                .plan(name)
                .ok_or_else(|| Error::UnknownPlan(name.to_string()))
        };
        let mut plans = HashMap::new();
        for (name, plan) in &config.plans {
            plans.insert(
                id(name)?,
                PlanInfo {
                    quotas: plan.quotas().to_vec(),
                    policy: Arc::new(Policy::new(name, plan.quotas())),
                },
            );
        }
        let default_plan = match &config.default_plan {
            Some(name) => id(name)?,
            None => PlanId::DEFAULT,
        };
        let mut api_key_plans = HashMap::new();
        for (key, plan) in &config.api_keys {
            api_key_plans.insert(key.clone(), id(plan)?);
        }
        if config.rules.len() > usize::from(u16::MAX) {
            return Err(Error::Config {
                line: None,
                message: format!("http: {} rules; at most {}", config.rules.len(), u16::MAX),
            });
        }
        let mut rules = Vec::new();
        for r in &config.rules {
            let mut tiers = HashMap::new();
            for (client, plan) in &r.tiers {
                tiers.insert(id(client)?, id(plan)?);
            }
            let plan = id(&r.plan)?;
            let mut policies = HashMap::new();
            for p in tiers.values().copied().chain([plan]) {
                let quotas = plans.get(&p).map_or(&[][..], |i: &PlanInfo| &i.quotas[..]);
                policies.insert(p, Arc::new(Policy::new(&r.name, quotas)));
            }
            rules.push(CompiledRule {
                rule: r.clone(),
                plan,
                tiers,
                policies,
            });
        }
        let api_key_header =
            HeaderName::from_bytes(config.api_key_header.as_bytes()).map_err(|_| {
                Error::Config {
                    line: None,
                    message: format!(
                        "http.api_key_header: '{}' is not a header name",
                        config.api_key_header
                    ),
                }
            })?;
        let sweeper = config
            .sweep_interval
            .map(|every| limiter.start_sweeper(every));
        Ok(RateLimitLayer {
            core: Arc::new(Core {
                limiter,
                config,
                plans,
                default_plan,
                api_key_plans,
                rules,
                api_key_header,
                counters: HttpCounters::default(),
                _sweeper: sweeper,
            }),
            resolver: None,
            user: None,
        })
    }

    /// Resolves each request's plan (for example API key → plan from a database). The closure
    /// runs on the request's head and key and returns a `'static` future: copy what it needs
    /// from the request before the `async` block. An unknown plan name falls back to the
    /// default plan (and counts in the metrics). Without a resolver, the config's `api_keys`
    /// table is used.
    ///
    /// ```
    /// use tollgate::http::{ClientKey, HttpConfig, RateLimitLayer};
    /// let config = HttpConfig::parse("[plans.free]\nlimit = 10\nwindow = 60\n[plans.pro]\nlimit = 1000\nwindow = 60\n").unwrap();
    /// let layer = RateLimitLayer::new(config).unwrap().resolver(|parts, _client: &ClientKey| {
    ///     let pro = parts.headers.get("x-api-key").is_some_and(|k| k == "secret");
    ///     Box::pin(async move { pro.then(|| "pro".to_string()) })
    /// });
    /// # let _ = layer;
    /// ```
    pub fn resolver<F>(mut self, resolve: F) -> Self
    where
        F: Fn(&http::request::Parts, &ClientKey) -> PlanFuture + Send + Sync + 'static,
    {
        self.resolver = Some(Arc::new(resolve));
        self
    }

    /// The authenticated user of a request (for [`KeySource::User`]), typically from an
    /// extension your auth layer inserted. `None` means not authenticated.
    pub fn user<F>(mut self, extract: F) -> Self
    where
        F: Fn(&http::request::Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.user = Some(Arc::new(extract));
        self
    }

    /// The limiter behind the layer (for stats, `block`, `reset`, or checks of your own).
    pub fn limiter(&self) -> &Arc<Limiter<HttpKey, C>> {
        &self.core.limiter
    }

    /// The counters in the Prometheus text format (the limiter's and the layer's own).
    pub fn metrics(&self) -> String {
        self.core.counters.render(&self.core.limiter.stats())
    }

    /// The client key of a request head from the configured sources, before any
    /// [`OnBadKey`] fallback: what the layer would key the request by, or why it cannot.
    pub fn client_key(&self, parts: &http::request::Parts) -> Result<ClientKey, KeyError> {
        let core = &self.core;
        let mut keys = Vec::with_capacity(core.config.key.len());
        for source in &core.config.key {
            let key = match source {
                KeySource::Ip => peer_ip(parts).ok_or(KeyError::NoPeer).and_then(|peer| {
                    client_ip_from_headers(
                        peer,
                        &parts.headers,
                        core.config.forwarded,
                        &core.config.trusted,
                        core.config.v6_prefix,
                    )
                    .map(ClientKey::Ip)
                }),
                KeySource::ApiKey => {
                    api_key_from_headers(&parts.headers, core.api_key_header.as_str())
                        .map(|k| ClientKey::ApiKey(k.into()))
                }
                KeySource::User => match self.user.as_ref().and_then(|f| f(parts)) {
                    Some(u) if !u.is_empty() && u.len() <= crate::http::keys::MAX_KEY_LEN => {
                        Ok(ClientKey::User(u.into()))
                    }
                    _ => Err(KeyError::NoUser),
                },
            };
            keys.push(key?);
        }
        Ok(if keys.len() == 1 {
            keys.pop().unwrap_or(ClientKey::Unidentified)
        } else {
            ClientKey::Composite(keys.into())
        })
    }

    /// The key after the configured fallback; `Err` when the request must be rejected.
    fn key_or_fallback(&self, parts: &http::request::Parts) -> Result<ClientKey, KeyError> {
        match self.client_key(parts) {
            Ok(k) => Ok(k),
            Err(e) => {
                self.core.counters.bad_key();
                match self.core.config.on_bad_key {
                    OnBadKey::Reject => Err(e),
                    OnBadKey::Shared => Ok(ClientKey::Unidentified),
                    OnBadKey::Peer => Ok(peer_ip(parts).map_or(ClientKey::Unidentified, |ip| {
                        ClientKey::Ip(client_ip_key(ip, self.core.config.v6_prefix))
                    })),
                }
            }
        }
    }

    /// The request's plan: the resolver's, else the API key table's, else the default.
    async fn plan_of(&self, parts: &http::request::Parts, client: &ClientKey) -> PlanId {
        let core = &self.core;
        let name = match &self.resolver {
            Some(resolve) => resolve(parts, client).await,
            None => {
                if core.api_key_plans.is_empty() {
                    return core.default_plan;
                }
                match api_key_from_headers(&parts.headers, core.api_key_header.as_str()) {
                    Ok(k) => {
                        return core
                            .api_key_plans
                            .get(k)
                            .copied()
                            .unwrap_or(core.default_plan);
                    }
                    Err(_) => return core.default_plan,
                }
            }
        };
        match name {
            None => core.default_plan,
            Some(n) => core.limiter.plan(&n).unwrap_or_else(|| {
                core.counters.unknown_plan();
                core.default_plan
            }),
        }
    }

    /// Charges every limit that applies, all or nothing.
    fn decide(&self, parts: &http::request::Parts, client: ClientKey, plan: PlanId) -> Verdict {
        let core = &self.core;
        let method = parts.method.as_str();
        let path = parts.uri.path();
        let mut checks: Vec<Check> = Vec::with_capacity(1 + core.rules.len());
        let own = core.plans.get(&plan).map(|p| Arc::clone(&p.policy));
        let rules = core.rules.iter().enumerate().filter_map(|(i, r)| {
            if !r.rule.matches(method, path) {
                return None;
            }
            let key = HttpKey {
                rule: Some(i as u16),
                client: if r.rule.shared {
                    ClientKey::Unidentified
                } else {
                    client.clone()
                },
            };
            let rule_plan = r.tiers.get(&plan).copied().unwrap_or(r.plan);
            Some((key, rule_plan, r.policies.get(&rule_plan).cloned()))
        });
        let own_key = HttpKey {
            rule: None,
            client: client.clone(),
        };
        let mut denied = None;
        for (key, plan, policy) in std::iter::once((own_key, plan, own)).chain(rules) {
            // After a denial the remaining limits are only peeked, so the headers still list
            // every policy that applies (as the engine does for the parts of a compound plan).
            let mode = if denied.is_some() {
                Mode::Peek
            } else {
                Mode::Check
            };
            match core.limiter.charge_detailed(&key, plan, 1, mode) {
                Ok(d) => {
                    let denies = denied.is_none() && !d.decision.is_allowed();
                    checks.push(Check {
                        key,
                        plan,
                        policy,
                        detailed: d,
                    });
                    if denies {
                        denied = Some(checks.len() - 1);
                    }
                }
                Err(e) => {
                    undo_all(&core.limiter, &mut checks);
                    return Verdict::Error(e);
                }
            }
        }
        if let Some(at) = denied {
            undo_all(&core.limiter, &mut checks[..at]);
            // Refunded checks report what they hold without this request.
            for c in &mut checks[..at] {
                for d in c.detailed.parts.iter_mut().flatten() {
                    d.remaining = (d.remaining + 1).min(d.limit);
                }
                c.detailed.decision.remaining =
                    (c.detailed.decision.remaining + 1).min(c.detailed.decision.limit);
            }
            return Verdict::Deny { checks, at };
        }
        Verdict::Pass { checks }
    }

    /// Adds the configured headers for `checks` to `headers`.
    fn write_headers(&self, headers: &mut HeaderMap, checks: &[Check]) {
        let style = self.core.config.headers;
        if checks.is_empty() {
            return;
        }
        // One growth of the map at most, instead of one per header.
        headers.reserve(6);
        let now = checks[0].detailed.now;
        let epoch = self.core.limiter.clock().unix_epoch_ns();
        if style.github() {
            let mut merged = checks[0].detailed.decision;
            for c in &checks[1..] {
                merged.merge(&c.detailed.decision);
            }
            insert_num(headers, X_RATELIMIT_LIMIT, merged.limit());
            insert_num(headers, X_RATELIMIT_REMAINING, merged.remaining());
            insert_num(
                headers,
                X_RATELIMIT_RESET,
                format::unix_secs_at(epoch, now, merged.reset_after_ns()),
            );
        }
        if style.ietf() {
            let policy = match checks {
                [one] => one.policy.as_ref().and_then(|p| p.header.clone()),
                _ => {
                    let mut items = String::new();
                    for p in checks.iter().filter_map(|c| c.policy.as_ref()) {
                        if !items.is_empty() {
                            items.push_str(", ");
                        }
                        items.push_str(&p.items);
                    }
                    HeaderValue::from_str(&items).ok()
                }
            };
            if let Some(v) = policy {
                headers.insert(RATELIMIT_POLICY, v);
            }
            let mut state = String::with_capacity(32 * checks.len());
            for c in checks {
                let Some(policy) = &c.policy else { continue };
                for (name, d) in policy.names.iter().zip(c.detailed.parts.iter()) {
                    let Some(d) = d else { continue };
                    if !state.is_empty() {
                        state.push_str(", ");
                    }
                    let _ = write!(
                        state,
                        "{name};r={};t={}",
                        d.remaining(),
                        format::ceil_secs(d.reset_after_ns())
                    );
                }
            }
            if let Ok(v) = HeaderValue::from_str(&state) {
                headers.insert(RATELIMIT, v);
            }
        }
        if checks
            .iter()
            .any(|c| c.detailed.decision.reason() == Reason::SoftLimit)
        {
            headers.insert(
                http::header::WARNING,
                HeaderValue::from_static(
                    "199 tollgate \"rate limit exceeded; passed by the soft limit\"",
                ),
            );
        }
    }

    /// The 429 for a denial at `checks[at]`.
    fn too_many(&self, checks: &[Check], at: usize) -> Response<Full<Bytes>> {
        let c = &checks[at];
        let d = c.detailed.decision;
        let epoch = self.core.limiter.clock().unix_epoch_ns();
        let retry = format::retry_after_secs(d.retry_after_ns());
        let reset_at = format::rfc3339(format::unix_secs_at(
            epoch,
            c.detailed.now,
            d.retry_after_ns(),
        ));
        let message = match d.reason() {
            Reason::Blocked => "You are temporarily blocked".to_string(),
            Reason::TableFull => "Too many clients are being tracked; try again later".to_string(),
            _ => {
                let quotas = self
                    .core
                    .plans
                    .get(&c.plan)
                    .map_or(&[][..], |p| &p.quotas[..]);
                // The part that denied (the first one not allowed).
                let q = quotas
                    .iter()
                    .zip(c.detailed.parts.iter())
                    .find(|(_, d)| d.is_some_and(|d| !d.is_allowed()))
                    .or_else(|| quotas.iter().zip(c.detailed.parts.iter()).next())
                    .map(|(q, _)| *q);
                match q {
                    Some(q) => format!(
                        "You have exceeded your {} requests per {} limit",
                        q.limit(),
                        format::period_words(crate::clock::nanos(q.period()))
                    ),
                    None => "Rate limit exceeded".to_string(),
                }
            }
        };
        let body = format!(
            "{{\"error\":\"Rate limit exceeded\",\"message\":{},\"reset_at\":\"{reset_at}\"}}",
            format::json_string(&message)
        );
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        let h = resp.headers_mut();
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        insert_num(h, http::header::RETRY_AFTER, retry);
        self.write_headers(h, checks);
        resp
    }
}

/// One limit charged for a request.
struct Check {
    key: HttpKey,
    plan: PlanId,
    /// `None` only if the plan vanished from the tables (never, as the layer adds no plans).
    policy: Option<Arc<Policy>>,
    detailed: Detailed,
}

enum Verdict {
    Pass { checks: Vec<Check> },
    Deny { checks: Vec<Check>, at: usize },
    Error(Error),
}

fn undo_all<C: Clock>(limiter: &Limiter<HttpKey, C>, checks: &mut [Check]) {
    for c in checks.iter_mut().rev() {
        if let Some(undo) = c.detailed.undo.take() {
            limiter.key_in(&c.key, c.plan).undo_part(undo);
        }
    }
}

const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

fn insert_num(headers: &mut HeaderMap, name: HeaderName, n: u64) {
    headers.insert(name, HeaderValue::from(n));
}

/// The peer address from axum's `ConnectInfo<SocketAddr>` or a plain `SocketAddr` extension.
fn peer_ip(parts: &http::request::Parts) -> Option<IpAddr> {
    if let Some(axum::extract::ConnectInfo(addr)) = parts
        .extensions
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(addr.ip());
    }
    parts.extensions.get::<SocketAddr>().map(SocketAddr::ip)
}

fn json_response(status: StatusCode, error: &str, message: &str) -> Response<Full<Bytes>> {
    let body = format!(
        "{{\"error\":{},\"message\":{}}}",
        format::json_string(error),
        format::json_string(message)
    );
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

impl<S, C: Clock> tower::Layer<S> for RateLimitLayer<C> {
    type Service = RateLimit<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around an inner service.
pub struct RateLimit<S, C: Clock = MonotonicClock> {
    inner: S,
    layer: RateLimitLayer<C>,
}

impl<S: Clone, C: Clock> Clone for RateLimit<S, C> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

/// The response body: the inner service's, or the layer's own (429, 400).
pub type RateLimitBody<B> = Either<B, Full<Bytes>>;

impl<S, C, ReqBody, ResBody> tower::Service<Request<ReqBody>> for RateLimit<S, C>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    C: Clock,
    ReqBody: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The clone that was driven to readiness serves this request; the fresh clone waits for
        // the next `poll_ready` (the usual tower pattern).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        Box::pin(async move {
            let core = &layer.core;
            core.counters.request();
            let (parts, body) = req.into_parts();
            let client = match layer.key_or_fallback(&parts) {
                Ok(k) => k,
                Err(e) => {
                    core.counters.rejected_bad_key();
                    let resp =
                        json_response(StatusCode::BAD_REQUEST, "Bad request", &e.to_string());
                    return Ok(resp.map(Either::Right));
                }
            };
            let plan = layer.plan_of(&parts, &client).await;
            let checks = match layer.decide(&parts, client, plan) {
                Verdict::Pass { checks } => checks,
                Verdict::Deny { checks, at } => {
                    core.counters.limited();
                    return Ok(layer.too_many(&checks, at).map(Either::Right));
                }
                Verdict::Error(e) => {
                    core.counters.internal_error();
                    let resp = json_response(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "Rate limiter misconfigured",
                        &e.to_string(),
                    );
                    return Ok(resp.map(Either::Right));
                }
            };
            if checks
                .iter()
                .any(|c| c.detailed.decision.reason() == Reason::SoftLimit)
            {
                core.counters.soft_passed();
            }
            let delay = checks
                .iter()
                .map(|c| c.detailed.decision.delay_ns())
                .max()
                .unwrap_or(0);
            if delay > 0 {
                core.counters.queued(delay);
                tokio::time::sleep(std::time::Duration::from_nanos(delay)).await;
            }
            let mut resp = inner.call(Request::from_parts(parts, body)).await?;
            layer.write_headers(resp.headers_mut(), &checks);
            Ok(resp.map(Either::Left))
        })
    }
}

impl<C: Clock + std::fmt::Debug> std::fmt::Debug for RateLimitLayer<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limiter", &self.core.limiter)
            .field("plan_resolver", &self.resolver.is_some())
            .field("user_fn", &self.user.is_some())
            .finish_non_exhaustive()
    }
}

impl<S: std::fmt::Debug, C: Clock + std::fmt::Debug> std::fmt::Debug for RateLimit<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}
