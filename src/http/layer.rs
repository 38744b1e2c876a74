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
use http_body_util::Full;

use crate::cell::Mode;
use crate::clock::{Clock, MonotonicClock};
use crate::decision::{Decision, Reason};
use crate::error::Error;
use crate::http::config::{HeaderStyle, HttpConfig, KeySource};
use crate::http::keys::{
    ClientKey, KeyError, OnBadKey, api_key_from_headers, client_ip_from_headers, walk_headers,
};
use crate::http::metrics::{Exposition, HttpCounters};
use crate::http::{format, grpc};
use crate::ip::client_ip_key;
use crate::limiter::{Detailed, Limiter, Limits, all_or_nothing};
use crate::plan::PlanId;
use crate::quota::Quota;
use crate::stats::Count;
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

/// A resolver's answer: the plan name, or `None` for the default plan.
pub type PlanFuture = Pin<Box<dyn Future<Output = Option<String>> + Send + 'static>>;

type Resolver = dyn Fn(&http::request::Parts, &ClientKey) -> PlanFuture + Send + Sync;
type UserFn = dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync;
type KeyFn =
    dyn Fn(&http::request::Parts) -> Result<ClientKey, Box<Response<Full<Bytes>>>> + Send + Sync;
type DenyFn = dyn Fn(&Denied<'_>) -> Response<Full<Bytes>> + Send + Sync;
type CostFn = dyn Fn(&http::request::Parts) -> u64 + Send + Sync;
type RefundFn = dyn Fn(StatusCode) -> bool + Send + Sync;

/// The caller's functions, shared by the layer's clones.
#[derive(Clone, Default)]
struct Hooks {
    resolver: Option<Arc<Resolver>>,
    user: Option<Arc<UserFn>>,
    key: Option<Arc<KeyFn>>,
    denied: Option<Arc<DenyFn>>,
    cost: Option<Arc<CostFn>>,
    refund: Option<Arc<RefundFn>>,
}

/// A denied request, as a custom denial response ([`RateLimitLayer::on_denied`]) sees it.
#[derive(Debug)]
#[non_exhaustive]
pub struct Denied<'a> {
    /// The request's head.
    pub request: &'a http::request::Parts,
    /// The client the request was keyed by.
    pub client: &'a ClientKey,
    /// The name of the limit that denied: the plan's, or the rule's.
    pub limit: &'a str,
    /// The denying limit's decision (its `retry_after`, `limit`, `reason`).
    pub decision: Decision,
    /// The layer's own message, as its JSON body would say it.
    pub message: &'a str,
}

/// A plan as the headers and the 429 message describe it.
#[derive(Debug)]
struct PlanInfo {
    quotas: Vec<Quota>,
    /// The plan as a client's own limit (labelled with the plan's name).
    policy: Policy,
}

/// The IETF policy items of one limit (a plan under a label), formatted once at construction.
#[derive(Debug)]
struct Policy {
    /// The limit's name: the plan's, or the rule's.
    label: String,
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
            label: label.to_string(),
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
    policies: HashMap<PlanId, Policy>,
}

/// The answer to a server that does not pass the peer address, and the fix.
const NO_PEER_FIX: &str = "the server does not pass the client's address to the rate limiter: \
     serve the app with `into_make_service_with_connect_info::<SocketAddr>()` (axum) or put a \
     `SocketAddr` in the request extensions; to key every such request into one shared bucket \
     instead, set `on_bad_key = \"shared\"`";

/// What the layer shares between clones.
struct Core<C: Clock> {
    limiter: Arc<Limiter<HttpKey, C>>,
    config: HttpConfig,
    /// By plan id (its index): each configured plan.
    plans: Vec<Option<PlanInfo>>,
    default_plan: PlanId,
    api_key_plans: HashMap<String, PlanId>,
    rules: Vec<CompiledRule>,
    api_key_header: HeaderName,
    counters: HttpCounters,
    /// Set by the first request that arrives without a peer address (the one warning).
    warned_no_peer: std::sync::Once,
    /// The recorder `/metrics` renders.
    exposition: Exposition,
    /// Exact mode on Redis (`mode = "exact"`): the limiter decides each plan in one script
    /// there ([`Limiter::check_in_async`]).
    #[cfg(feature = "redis")]
    exact: bool,
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
    /// One `Arc` for everything, so cloning the layer's service (axum clones it for every
    /// request) is one reference count, not one per part.
    shared: Arc<Shared<C>>,
}

/// What a layer's clones share: the core, and the hooks (a clone given a hook of its own gets
/// its own copy of this, still sharing the core).
struct Shared<C: Clock> {
    core: Arc<Core<C>>,
    hooks: Hooks,
    /// Requests can take the plain path ([`RateLimitLayer::plain_key`]).
    plain: bool,
}

impl<C: Clock> Shared<C> {
    fn new(core: Arc<Core<C>>, hooks: Hooks) -> Self {
        // Nothing but the address keys a request, and nothing reads its head: no hook that takes
        // the head (a custom denial and a refund come after the charge), no exempt network, no
        // rule, no Redis call.
        let c = &core.config;
        #[cfg(feature = "redis")]
        let local = !core.exact;
        #[cfg(not(feature = "redis"))]
        let local = true;
        let plain = local
            && c.key == [KeySource::Ip]
            && c.exempt.is_empty()
            && core.rules.is_empty()
            && hooks.resolver.is_none()
            && hooks.key.is_none()
            && hooks.user.is_none()
            && hooks.cost.is_none();
        Shared { core, hooks, plain }
    }
}

impl<C: Clock> Clone for Shared<C> {
    fn clone(&self) -> Self {
        Shared::new(Arc::clone(&self.core), self.hooks.clone())
    }
}

impl<C: Clock> Clone for RateLimitLayer<C> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl RateLimitLayer<MonotonicClock> {
    /// A layer on the monotonic clock; every name the config uses is checked here.
    ///
    /// ```
    /// use tollgate::http::{HttpConfig, RateLimitLayer};
    /// let config = HttpConfig::parse("[plans.free]\nlimit = 60\nwindow = \"1m\"\n[http]\nkey = \"ip\"\n")?;
    /// let layer = RateLimitLayer::new(config)?;
    /// assert_eq!(layer.limiter().plan_names(), ["free"]);
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn new(config: HttpConfig) -> Result<Self, Error> {
        Self::with_clock(config, MonotonicClock::process())
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
        #[cfg(feature = "redis")]
        if let Some(redis) = config.redis.clone() {
            builder = if config.redis_exact {
                exact_serves(&config)?;
                builder.redis_exact(redis)
            } else {
                builder.redis_synced(redis)
            };
        }
        let limiter = builder.build_shared()?;
        #[cfg(feature = "redis")]
        let exact = limiter.is_exact();
        let id = |name: &str| {
            limiter
                .plan(name)
                .ok_or_else(|| Error::UnknownPlan(name.to_string()))
        };
        let mut plans: Vec<Option<PlanInfo>> = Vec::new();
        for (name, plan) in &config.plans {
            let at = id(name)?.index();
            if plans.len() <= at {
                plans.resize_with(at + 1, || None);
            }
            plans[at] = Some(PlanInfo {
                quotas: plan.quotas().to_vec(),
                policy: Policy::new(name, plan.quotas()),
            });
        }
        let default_plan = match &config.default_plan {
            Some(name) => id(name)?,
            None => limiter.default_plan_id(),
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
                let quotas = plan_info(&plans, p).map_or(&[][..], |i| &i.quotas[..]);
                policies.insert(p, Policy::new(&r.name, quotas));
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
            shared: Arc::new(Shared::new(
                Arc::new(Core {
                    limiter,
                    config,
                    plans,
                    default_plan,
                    api_key_plans,
                    rules,
                    api_key_header,
                    counters: HttpCounters::default(),
                    warned_no_peer: std::sync::Once::new(),
                    exposition: Exposition::new(),
                    #[cfg(feature = "redis")]
                    exact,
                    _sweeper: sweeper,
                }),
                Hooks::default(),
            )),
        })
    }

    /// Resolves each request's plan (for example API key → plan from a database). The closure
    /// runs on the request's head and key and returns a `'static` future: copy what it needs
    /// from the request before the `async` block. An unknown plan name falls back to the
    /// default plan (and counts in the metrics). Without a resolver, the config's `api_keys`
    /// table is used.
    ///
    /// With `api_key` among the key sources, `None` for a key means the key is *unknown*: it is
    /// no client identity, and the request is keyed as one without a key ([`OnBadKey`]: by
    /// client address under the default plan, or rejected). Answer the default plan's name for
    /// a known key on the default plan.
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
        self.set_hook(|h| h.resolver = Some(Arc::new(resolve)));
        self
    }

    /// The authenticated user of a request (for [`KeySource::User`]), typically from an
    /// extension your auth layer inserted. `None` means not authenticated.
    pub fn user<F>(mut self, extract: F) -> Self
    where
        F: Fn(&http::request::Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.set_hook(|h| h.user = Some(Arc::new(extract)));
        self
    }

    /// Keys requests by your own function of the request head instead of the configured
    /// sources: a key, or a (boxed) response that rejects the request (counted as a bad-key
    /// rejection). Its keys are taken as given (no [`OnBadKey`] fallback, no unknown-key test).
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::{Response, StatusCode};
    /// use http_body_util::Full;
    /// use tollgate::http::{ClientKey, HttpConfig, RateLimitLayer};
    /// let config = HttpConfig::parse("[plans.free]\nlimit = 10\nwindow = \"1m\"\n")?;
    /// let layer = RateLimitLayer::new(config)?.key_extractor(|parts| {
    ///     match parts.headers.get("x-tenant").and_then(|v| v.to_str().ok()) {
    ///         Some(tenant) => Ok(ClientKey::User(tenant.into())),
    ///         None => {
    ///             let mut no = Response::new(Full::new(Bytes::from("tenant required")));
    ///             *no.status_mut() = StatusCode::UNAUTHORIZED;
    ///             Err(Box::new(no))
    ///         }
    ///     }
    /// });
    /// # let _ = layer;
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn key_extractor<F>(mut self, extract: F) -> Self
    where
        F: Fn(&http::request::Parts) -> Result<ClientKey, Box<Response<Full<Bytes>>>>
            + Send
            + Sync
            + 'static,
    {
        self.set_hook(|h| h.key = Some(Arc::new(extract)));
        self
    }

    /// Answers denials with your own response (status, body, headers) instead of the JSON 429
    /// or the gRPC status. The layer adds `Retry-After` and the configured rate-limit headers
    /// wherever your response does not set them itself.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::{Response, StatusCode};
    /// use http_body_util::Full;
    /// use tollgate::http::{HttpConfig, RateLimitLayer};
    /// let config = HttpConfig::parse("[plans.free]\nlimit = 10\nwindow = \"1m\"\n")?;
    /// let layer = RateLimitLayer::new(config)?.on_denied(|denied| {
    ///     let body = format!("slow down: {} ({} s)", denied.limit, denied.decision.retry_after().as_secs());
    ///     let mut resp = Response::new(Full::new(Bytes::from(body)));
    ///     *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    ///     resp
    /// });
    /// # let _ = layer;
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn on_denied<F>(mut self, respond: F) -> Self
    where
        F: Fn(&Denied<'_>) -> Response<Full<Bytes>> + Send + Sync + 'static,
    {
        self.set_hook(|h| h.denied = Some(Arc::new(respond)));
        self
    }

    /// Charges each request `cost(head)` units instead of one, on the client's plan and on
    /// every rule (a request weight, a batch size). A cost of 0 passes uncharged; a cost no
    /// limit could ever hold is denied with no `Retry-After`.
    ///
    /// ```
    /// use tollgate::http::{HttpConfig, RateLimitLayer};
    /// let config = HttpConfig::parse("[plans.free]\nlimit = 100\nwindow = \"1m\"\n")?;
    /// // A batch endpoint costs one unit per item it asks for.
    /// let layer = RateLimitLayer::new(config)?.cost(|parts| {
    ///     parts.headers.get("x-batch-size")
    ///         .and_then(|v| v.to_str().ok()?.parse().ok())
    ///         .unwrap_or(1)
    /// });
    /// # let _ = layer;
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn cost<F>(mut self, cost: F) -> Self
    where
        F: Fn(&http::request::Parts) -> u64 + Send + Sync + 'static,
    {
        self.set_hook(|h| h.cost = Some(Arc::new(cost)));
        self
    }

    /// Refunds a passed request's charge once the inner service has answered, when `refund`
    /// says so of the status: for example, server errors do not count against the client.
    /// What is refunded is what is left of the charge (a bucket that has drained since gets
    /// back only the rest), and the response's headers count the refund.
    ///
    /// ```
    /// use tollgate::http::{HttpConfig, RateLimitLayer};
    /// let config = HttpConfig::parse("[plans.free]\nlimit = 100\nwindow = \"1m\"\n")?;
    /// let layer = RateLimitLayer::new(config)?.refund_when(|status| status.is_server_error());
    /// # let _ = layer;
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn refund_when<F>(mut self, refund: F) -> Self
    where
        F: Fn(StatusCode) -> bool + Send + Sync + 'static,
    {
        self.set_hook(|h| h.refund = Some(Arc::new(refund)));
        self
    }

    /// Sets a hook on this layer (its clones made before keep theirs).
    fn set_hook(&mut self, set: impl FnOnce(&mut Hooks)) {
        let shared = Arc::make_mut(&mut self.shared);
        set(&mut shared.hooks);
        *shared = Shared::new(Arc::clone(&shared.core), std::mem::take(&mut shared.hooks));
    }

    /// The limiter behind the layer (for stats, `block`, `reset`, or checks of your own).
    pub fn limiter(&self) -> &Arc<Limiter<HttpKey, C>> {
        &self.shared.core.limiter
    }

    /// The counters in the Prometheus text format: the limiter's totals, each plan's decisions
    /// (`tollgate_plan_decisions_total{plan, outcome}`), each rule's states and evictions
    /// (`tollgate_rule_keys{rule}`, `tollgate_rule_evictions_total{rule}`) and the layer's own
    /// `tollgate_http_*` counters, rendered by metrics-exporter-prometheus.
    ///
    /// ```
    /// use tollgate::http::{HttpConfig, RateLimitLayer};
    /// let config = HttpConfig::parse("[plans.free]\nlimit = 10\nwindow = \"1m\"\n")?;
    /// let layer = RateLimitLayer::new(config)?;
    /// let text = layer.metrics();
    /// assert!(text.contains("tollgate_plan_decisions_total{plan=\"free\",outcome=\"allowed\"} 0"));
    /// assert!(text.contains("tollgate_http_requests_total 0"));
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn metrics(&self) -> String {
        self.shared.core.exposition.render(|| self.publish_to(&[]))
    }

    /// Publishes the same counters through the `metrics` facade (feature `metrics`), labelled
    /// `limiter = name`, under the names [`metrics`](Self::metrics) renders.
    pub fn publish_metrics(&self, name: &str) {
        self.publish_to(&crate::stats::publish::limiter(name));
    }

    fn publish_to(&self, base: &[metrics::Label]) {
        let limiter = &self.shared.core.limiter;
        crate::stats::publish::totals(base, &limiter.stats());
        crate::stats::publish::breakdown(base, &limiter.plan_stats(), &limiter.rule_stats());
        self.shared.core.counters.publish(base);
    }

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
            KeySource::User => match self.shared.hooks.user.as_ref().and_then(|f| f(parts)) {
                Some(u) if !u.is_empty() && u.len() <= crate::http::keys::MAX_KEY_LEN => {
                    Ok(ClientKey::User(u.into()))
                }
                _ => Err(KeyError::NoUser),
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
    fn fallback(&self, parts: &http::request::Parts, e: KeyError) -> Result<ClientKey, KeyError> {
        self.shared.core.counters.bad_key();
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
    fn plan_from_table(
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
    fn plan_named(
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

    /// Everything before the plan: the key (or the layer's own answer), exemption, cost.
    // The answer is the response the future returns by value anyway: boxing it would only add
    // an allocation to the denial path.
    #[allow(clippy::result_large_err)]
    fn front(&self, parts: &http::request::Parts) -> Result<Front, Response<Full<Bytes>>> {
        let core = &self.shared.core;
        core.counters.request();
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
    fn bad_key(&self, parts: &http::request::Parts, e: KeyError) -> Response<Full<Bytes>> {
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
    fn no_peer(&self, parts: &http::request::Parts) -> Response<Full<Bytes>> {
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

    /// Charges the request once its plan is known: what to forward with, or the layer's answer.
    #[allow(clippy::result_large_err)] // as `front`
    fn charge(
        &self,
        parts: &http::request::Parts,
        found: Result<(ClientKey, PlanId), KeyError>,
        cost: u64,
    ) -> Result<Passed, Response<Full<Bytes>>> {
        let (client, plan) = found.map_err(|e| self.bad_key(parts, e))?;
        if self.shared.core.rules.is_empty() {
            return self.charge_own(parts, client, plan, cost);
        }
        self.answer(parts, self.decide(parts, client, plan, cost), cost)
    }

    /// [`charge`](Self::charge) of the only limit, the client's plan (no rules).
    #[allow(clippy::result_large_err)] // as `front`
    fn charge_own(
        &self,
        parts: &http::request::Parts,
        client: ClientKey,
        plan: PlanId,
        cost: u64,
    ) -> Result<Passed, Response<Full<Bytes>>> {
        let key = HttpKey { rule: None, client };
        let passed = |checks: Checks| Passed {
            checks,
            cost,
            delay: 0,
        };
        let charged = self
            .shared
            .core
            .limiter
            .charge_detailed(&key, plan, cost, Mode::Check);
        let bare = passed(Checks::None);
        match self.settle_one(key, plan, charged, bare, |check| passed(Checks::One(check))) {
            Ok(passed) => Ok(passed),
            Err(verdict) => self.answer(parts, verdict, cost),
        }
    }

    /// What the charge of `key`'s plan, the request's only limit, means: a plain pass (admitted
    /// now, not by a soft limit) as `bare` when neither headers nor a refund need the charge
    /// after the response, else as `carry` makes it of the charge; anything else as the verdict
    /// to answer (`carry` has one call site, so it is inlined: called for both, it was an
    /// out-of-line call per request that read its argument back from memory). The
    /// charge's record is read where the limiter wrote it and moved only when it is kept; the
    /// caller charges first and moves the key in only then (a key moved just after it was
    /// built is read back wider than it was written: a store-forwarding stall per request).
    #[inline(always)]
    #[allow(clippy::result_large_err)] // inlined: nothing is returned through memory
    fn settle_one<T>(
        &self,
        key: HttpKey,
        plan: PlanId,
        charged: Result<Detailed, Error>,
        bare: T,
        carry: impl FnOnce(Check) -> T,
    ) -> Result<T, Verdict> {
        let shared = &*self.shared;
        // Looked at in place: a plain pass that carries nothing reads only its decision.
        let (allowed, plain) = match &charged {
            Ok(detailed) => {
                let d = &detailed.decision;
                let plain = d.reason() != Reason::SoftLimit && d.delay_ns() == 0;
                (d.is_allowed(), d.is_allowed() && plain)
            }
            Err(_) => (false, false),
        };
        if plain && shared.core.config.headers == HeaderStyle::None && shared.hooks.refund.is_none()
        {
            return Ok(bare);
        }
        let detailed = match charged {
            Ok(detailed) => detailed,
            Err(e) => return Err(Verdict::Error(e)),
        };
        if plain {
            return Ok(carry(Check {
                key,
                plan,
                detailed,
            }));
        }
        let client = (!allowed).then(|| key.client.clone());
        let checks = Checks::One(Check {
            key,
            plan,
            detailed,
        });
        Err(match client {
            None => Verdict::Pass { checks },
            Some(client) => Verdict::Deny {
                checks,
                at: 0,
                client,
            },
        })
    }

    /// What a passed request's response needs, riding along its future: nothing (no headers,
    /// no refund), the headers made now, or with a refund hook the charges and the layer (the
    /// refund decides the headers).
    #[inline(always)]
    fn after(&self, checks: Checks, cost: u64) -> After<C> {
        if checks.is_empty() {
            After::Nothing
        } else if self.shared.hooks.refund.is_some() {
            After::Finish(Box::new((
                self.clone(),
                Passed {
                    checks,
                    cost,
                    delay: 0,
                },
            )))
        } else {
            let made = self.headers_for(&checks);
            if made.is_empty() {
                After::Nothing
            } else {
                After::Made(Box::new(made))
            }
        }
    }

    /// The key and plan of a request that the plain path decides, read from its head as it is
    /// (no `Parts` to split off and put back): when the layer keys by address alone and
    /// nothing else reads the head (no hooks but a refund, no exemptions, no rules, in
    /// process) and the address is there. `None`: the general path decides (it does the same
    /// for these requests, and answers the rest).
    #[inline(always)]
    fn plain_key(
        &self,
        headers: &HeaderMap,
        extensions: &http::Extensions,
    ) -> Option<(HttpKey, PlanId)> {
        let shared = &*self.shared;
        if !shared.plain {
            return None;
        }
        let core = &shared.core;
        let c = &core.config;
        let peer = peer_ip(extensions)?;
        let ip = if c.trusted.is_empty() {
            // No proxy to walk back through (`client_ip_from_headers` without the calls).
            client_ip_key(peer, c.v6_prefix)
        } else {
            client_ip_from_headers(peer, headers, c.forwarded, &c.trusted, c.v6_prefix).ok()?
        };
        // `plan_from_table` for an address key: the API key header's plan, else the default.
        let plan = if core.api_key_plans.is_empty() {
            core.default_plan
        } else {
            api_key_from_headers(headers, core.api_key_header.as_str())
                .ok()
                .and_then(|k| core.api_key_plans.get(k).copied())
                .unwrap_or(core.default_plan)
        };
        let key = HttpKey {
            rule: None,
            client: ClientKey::Ip(ip),
        };
        Some((key, plan))
    }

    /// What a charge's verdict means for the request: what to forward with, or the layer's
    /// answer; counted in the layer's counters.
    #[allow(clippy::result_large_err)] // as `front`
    fn answer(
        &self,
        parts: &http::request::Parts,
        verdict: Verdict,
        cost: u64,
    ) -> Result<Passed, Response<Full<Bytes>>> {
        let core = &self.shared.core;
        match verdict {
            Verdict::Pass { checks } => {
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
                }
                Ok(Passed {
                    checks,
                    cost,
                    delay,
                })
            }
            Verdict::Deny { checks, at, client } => {
                core.counters.limited();
                #[cfg(feature = "tracing")]
                tracing::debug!(
                    target: "tollgate",
                    client = %client,
                    path = parts.uri.path(),
                    retry_after_ms = checks[at].detailed.decision.retry_after_ns() / 1_000_000,
                    "rate limited"
                );
                Err(self.too_many(parts, &client, &checks, at))
            }
            Verdict::Error(Error::CostExceedsCapacity { cost, capacity }) => {
                core.counters.limited();
                Err(reject(
                    parts,
                    StatusCode::TOO_MANY_REQUESTS,
                    grpc::RESOURCE_EXHAUSTED,
                    "Rate limit exceeded",
                    &format!("This request costs {cost}; the limit holds at most {capacity}"),
                ))
            }
            Verdict::Error(e) => {
                core.counters.internal_error();
                Err(reject(
                    parts,
                    StatusCode::INTERNAL_SERVER_ERROR,
                    grpc::INTERNAL,
                    "Rate limiter misconfigured",
                    &e.to_string(),
                ))
            }
        }
    }

    /// [`charge`](Self::charge), or in exact mode [`charge_exact`](Self::charge_exact).
    #[allow(clippy::result_large_err)] // as `front`
    async fn charge_any(
        &self,
        parts: &http::request::Parts,
        found: Result<(ClientKey, PlanId), KeyError>,
        cost: u64,
    ) -> Result<Passed, Response<Full<Bytes>>> {
        #[cfg(feature = "redis")]
        if self.shared.core.exact {
            return self.charge_exact(parts, found, cost).await;
        }
        self.charge(parts, found, cost)
    }

    /// [`charge`](Self::charge) in exact mode: the client's plan decided by one script on
    /// Redis (its strategy applied: soft passes flagged, a queue's reservation held), counted
    /// in the plan's stats; the failure policy answers when Redis cannot.
    #[cfg(feature = "redis")]
    #[allow(clippy::result_large_err)] // as `front`
    async fn charge_exact(
        &self,
        parts: &http::request::Parts,
        found: Result<(ClientKey, PlanId), KeyError>,
        cost: u64,
    ) -> Result<Passed, Response<Full<Bytes>>> {
        let core = &self.shared.core;
        let (client, plan) = found.map_err(|e| self.bad_key(parts, e))?;
        let key = HttpKey { rule: None, client };
        // The plan's strategy and stats are the limiter's (soft passes flagged, a queue's
        // reservation held); the failure policy answers when Redis cannot.
        let d = match core.limiter.check_in_async(&key, plan, cost).await {
            Ok(d) => d,
            Err(e) => return self.answer(parts, Verdict::Error(e), cost),
        };
        let client = key.client.clone();
        let mut checks = Checks::new();
        checks.push(Check {
            key,
            plan,
            detailed: Detailed::external(d, core.limiter.clock().now()),
        });
        let verdict = if d.is_allowed() {
            Verdict::Pass { checks }
        } else {
            Verdict::Deny {
                checks,
                at: 0,
                client,
            }
        };
        self.answer(parts, verdict, cost)
    }

    /// After the inner service answered a passed request: the refund, then the headers.
    fn finish<B>(&self, resp: &mut Response<B>, passed: &mut Passed) {
        // Exact mode's charges are Redis's and cannot be taken back: no refund there.
        #[cfg(feature = "redis")]
        let refunds = !self.shared.core.exact;
        #[cfg(not(feature = "redis"))]
        let refunds = true;
        if refunds
            && self
                .shared
                .hooks
                .refund
                .as_ref()
                .is_some_and(|f| f(resp.status()))
        {
            refund_all(&self.shared.core.limiter, &mut passed.checks, passed.cost);
            self.shared.core.counters.refunded();
        }
        self.write_headers(resp.headers_mut(), &passed.checks);
    }

    /// Charges every limit that applies (the client's plan, then each matching rule), all or
    /// nothing, through the engine's routine (see [`all_or_nothing`]).
    fn decide(
        &self,
        parts: &http::request::Parts,
        client: ClientKey,
        plan: PlanId,
        cost: u64,
    ) -> Verdict {
        let core = &self.shared.core;
        let method = parts.method.as_str();
        let path = parts.uri.path();
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
            Some((key, rule_plan))
        });
        let own = HttpKey {
            rule: None,
            client: client.clone(),
        };
        let mut limits = RequestLimits {
            limiter: &core.limiter,
            cost,
            todo: std::iter::once((own, plan))
                .chain(rules)
                .map(Some)
                .collect(),
            checks: Checks::new(),
        };
        match all_or_nothing(&mut limits) {
            Ok(None) => Verdict::Pass {
                checks: limits.checks,
            },
            Ok(Some(at)) => Verdict::Deny {
                checks: limits.checks,
                at,
                client,
            },
            Err(e) => Verdict::Error(e),
        }
    }

    /// The policy a check is described by: its plan's, or its rule's under that plan. `None`
    /// only if the plan vanished from the tables (never: the layer adds no plans).
    fn policy(&self, c: &Check) -> Option<&Policy> {
        let core = &self.shared.core;
        match c.key.rule {
            None => plan_info(&core.plans, c.plan).map(|p| &p.policy),
            Some(i) => core.rules[usize::from(i)].policies.get(&c.plan),
        }
    }

    /// Adds the configured headers for `checks` to `headers`.
    fn write_headers(&self, headers: &mut HeaderMap, checks: &[Check]) {
        self.headers_for(checks).write(headers);
    }

    /// The configured headers for `checks`, made now (see [`Made`]).
    fn headers_for(&self, checks: &[Check]) -> Made {
        let style = self.shared.core.config.headers;
        let mut made = Made::default();
        let Some(first) = checks.first() else {
            return made;
        };
        made.soft = checks
            .iter()
            .any(|c| c.detailed.decision.reason() == Reason::SoftLimit);
        if style.github() {
            let mut merged = first.detailed.decision;
            for c in &checks[1..] {
                merged.merge(&c.detailed.decision);
            }
            let epoch = self.shared.core.limiter.clock().unix_epoch_ns();
            made.github = Some([
                merged.limit(),
                merged.remaining(),
                format::unix_secs_at(epoch, first.detailed.now, merged.reset_after_ns()),
            ]);
        }
        if style.ietf() {
            let policy = match checks {
                [one] => self.policy(one).and_then(|p| p.header.clone()),
                _ => {
                    let mut items = String::new();
                    for p in checks.iter().filter_map(|c| self.policy(c)) {
                        if !items.is_empty() {
                            items.push_str(", ");
                        }
                        items.push_str(&p.items);
                    }
                    HeaderValue::from_str(&items).ok()
                }
            };
            let mut state = String::with_capacity(32 * checks.len());
            for c in checks {
                let Some(policy) = self.policy(c) else {
                    continue;
                };
                for (name, d) in policy.names.iter().zip(c.detailed.parts()) {
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
            made.ietf = Some(Ietf {
                policy,
                state: HeaderValue::from_str(&state).ok(),
            });
        }
        made
    }

    /// The answer to a denial at `checks[at]`: the custom response, the gRPC status, or the
    /// JSON 429.
    fn too_many(
        &self,
        parts: &http::request::Parts,
        client: &ClientKey,
        checks: &[Check],
        at: usize,
    ) -> Response<Full<Bytes>> {
        let c = &checks[at];
        let d = c.detailed.decision;
        let message = match d.reason() {
            Reason::Blocked => "You are temporarily blocked".to_string(),
            Reason::TableFull => "Too many clients are being tracked; try again later".to_string(),
            _ => {
                let quotas =
                    plan_info(&self.shared.core.plans, c.plan).map_or(&[][..], |p| &p.quotas[..]);
                // The part that denied (the first one not allowed).
                let q = quotas
                    .iter()
                    .zip(c.detailed.parts())
                    .find(|(_, d)| !d.is_allowed())
                    .or_else(|| quotas.iter().zip(c.detailed.parts()).next())
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
        let mut ours = HeaderMap::new();
        insert_num(
            &mut ours,
            http::header::RETRY_AFTER,
            format::retry_after_secs(d.retry_after_ns()),
        );
        self.write_headers(&mut ours, checks);
        if let Some(respond) = &self.shared.hooks.denied {
            let label = self.policy(c).map_or("", |p| p.label.as_str());
            let mut resp = respond(&Denied {
                request: parts,
                client,
                limit: label,
                decision: d,
                message: &message,
            });
            let h = resp.headers_mut();
            for (name, value) in &ours {
                if !h.contains_key(name) {
                    h.insert(name, value.clone());
                }
            }
            return resp;
        }
        let mut resp = if grpc::is_grpc(parts) {
            grpc::status(grpc::RESOURCE_EXHAUSTED, &message, Some(d.retry_after_ns()))
        } else {
            let epoch = self.shared.core.limiter.clock().unix_epoch_ns();
            let reset_at = format::rfc3339(format::unix_secs_at(
                epoch,
                c.detailed.now,
                d.retry_after_ns(),
            ));
            let body = serde_json::json!({
                "error": "Rate limit exceeded",
                "message": message,
                "reset_at": reset_at,
            })
            .to_string();
            let mut resp = Response::new(Full::new(Bytes::from(body)));
            *resp.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            resp
        };
        resp.headers_mut().extend(ours);
        resp
    }
}

/// What exact mode serves: each client's own plan (tiers and strategies included); route and
/// global rules are synced mode's, an error here.
#[cfg(feature = "redis")]
fn exact_serves(config: &HttpConfig) -> Result<(), Error> {
    if config.rules.is_empty() {
        return Ok(());
    }
    Err(Error::Config {
        line: None,
        message: "redis: mode = \"exact\" serves each client's own plan; route and global rules \
                  need mode = \"synced\""
            .into(),
    })
}

/// The layer's view of plan `id`.
fn plan_info(plans: &[Option<PlanInfo>], id: PlanId) -> Option<&PlanInfo> {
    plans.get(id.index()).and_then(Option::as_ref)
}

/// One limit charged for a request.
struct Check {
    key: HttpKey,
    plan: PlanId,
    detailed: Detailed,
}

enum Verdict {
    Pass {
        checks: Checks,
    },
    Deny {
        checks: Checks,
        at: usize,
        client: ClientKey,
    },
    Error(Error),
}

/// The limits charged for one request: one inline (a plan and no rule, the common case), more
/// in a `Vec`.
enum Checks {
    None,
    One(Check),
    Many(Vec<Check>),
}

impl Checks {
    fn new() -> Self {
        Checks::None
    }

    fn push(&mut self, c: Check) {
        *self = match std::mem::replace(self, Checks::None) {
            Checks::None => Checks::One(c),
            Checks::One(first) => Checks::Many(vec![first, c]),
            Checks::Many(mut v) => {
                v.push(c);
                Checks::Many(v)
            }
        };
    }
}

impl std::ops::Deref for Checks {
    type Target = [Check];
    fn deref(&self) -> &[Check] {
        match self {
            Checks::None => &[],
            Checks::One(c) => std::slice::from_ref(c),
            Checks::Many(v) => v,
        }
    }
}

impl std::ops::DerefMut for Checks {
    fn deref_mut(&mut self) -> &mut [Check] {
        match self {
            Checks::None => &mut [],
            Checks::One(c) => std::slice::from_mut(c),
            Checks::Many(v) => v,
        }
    }
}

/// What a request holds before its plan is known.
enum Front {
    /// Exempt (or free): forwarded uncharged, with no headers.
    Exempt,
    /// To be charged `cost` for `client`.
    Charge { client: ClientKey, cost: u64 },
}

/// The rate-limit headers of a response, made from its charges: `X-RateLimit-*` (limit,
/// remaining, reset as Unix seconds), the IETF `RateLimit-Policy` and `RateLimit`, and whether a
/// soft limit passed it (`Warning`). Made when the request is charged, so a passed request
/// without a refund hook carries these few values to its response instead of its charges and
/// the layer.
#[derive(Default)]
struct Made {
    github: Option<[u64; 3]>,
    ietf: Option<Ietf>,
    soft: bool,
}

/// The IETF headers: `RateLimit-Policy` and `RateLimit`.
struct Ietf {
    policy: Option<HeaderValue>,
    state: Option<HeaderValue>,
}

impl Made {
    /// True when there is nothing to add.
    fn is_empty(&self) -> bool {
        self.github.is_none() && self.ietf.is_none() && !self.soft
    }

    /// Adds the headers to `headers`.
    fn write(self, headers: &mut HeaderMap) {
        // One growth of the map at most, instead of one per header.
        let n = 3 * usize::from(self.github.is_some())
            + 2 * usize::from(self.ietf.is_some())
            + usize::from(self.soft);
        if n == 0 {
            return;
        }
        headers.reserve(n);
        if let Some([limit, remaining, reset]) = self.github {
            insert_num(headers, X_RATELIMIT_LIMIT, limit);
            insert_num(headers, X_RATELIMIT_REMAINING, remaining);
            insert_num(headers, X_RATELIMIT_RESET, reset);
        }
        if let Some(ietf) = self.ietf {
            if let Some(v) = ietf.policy {
                headers.insert(RATELIMIT_POLICY, v);
            }
            if let Some(v) = ietf.state {
                headers.insert(RATELIMIT, v);
            }
        }
        if self.soft {
            headers.insert(
                http::header::WARNING,
                HeaderValue::from_static(
                    "199 tollgate \"rate limit exceeded; passed by the soft limit\"",
                ),
            );
        }
    }
}

/// A request that passed: its charges (for the headers and a refund) and how long to hold it.
struct Passed {
    checks: Checks,
    cost: u64,
    delay: u64,
}

/// The limits of one request (its plan, then each matching rule) as the engine's
/// all-or-nothing routine drives them: each decided with [`Limiter::charge_detailed`] (so each
/// reports its parts for the headers), in order, its check kept at its index.
struct RequestLimits<'a, C: Clock> {
    limiter: &'a Limiter<HttpKey, C>,
    cost: u64,
    /// Each limit's key and plan, taken when it is decided.
    todo: Vec<Option<(HttpKey, PlanId)>>,
    checks: Checks,
}

impl<C: Clock> Limits for RequestLimits<'_, C> {
    type Error = Error;

    fn len(&self) -> usize {
        self.todo.len()
    }

    fn charge(&mut self, i: usize, peek: bool) -> Result<bool, Error> {
        let (key, plan) = self.todo[i].take().expect("each limit is decided once");
        let mode = if peek { Mode::Peek } else { Mode::Check };
        let detailed = self.limiter.charge_detailed(&key, plan, self.cost, mode)?;
        if peek {
            // Never charged: its plan counts the request as denied elsewhere.
            self.limiter.recount(plan, None, true);
        }
        let allowed = detailed.decision.is_allowed();
        self.checks.push(Check {
            key,
            plan,
            detailed,
        });
        Ok(allowed)
    }

    fn refund(&mut self, i: usize, report: bool) {
        let c = &mut self.checks[i];
        // The admission is counted as denied elsewhere (`report`), or nowhere (a failure).
        let counted = Count::of(&c.detailed.decision);
        self.limiter.recount(c.plan, Some(counted), report);
        if let Some(undo) = c.detailed.undo.take() {
            self.limiter
                .take_back(&c.key, undo, self.limiter.clock().now());
        }
        if report {
            self.limiter
                .refunded_detailed(&c.key, c.plan, self.cost, &mut c.detailed);
        }
    }
}

fn undo_all<C: Clock>(limiter: &Limiter<HttpKey, C>, checks: &mut [Check]) {
    for c in checks.iter_mut().rev() {
        if let Some(undo) = c.detailed.undo.take() {
            limiter.take_back(&c.key, undo, limiter.clock().now());
        }
    }
}

/// Refunds `checks` of `cost` each; their decisions then report what the keys hold without
/// the request.
fn refund_all<C: Clock>(limiter: &Limiter<HttpKey, C>, checks: &mut [Check], cost: u64) {
    undo_all(limiter, checks);
    for c in checks {
        limiter.refunded_detailed(&c.key, c.plan, cost, &mut c.detailed);
    }
}

/// Why the layer answers a request itself before charging it.
enum Rejection {
    /// No usable key, under [`OnBadKey::Reject`].
    BadKey(KeyError),
    /// The custom key extractor's own response (boxed: a response is large).
    Custom(Box<Response<Full<Bytes>>>),
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

const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

fn insert_num(headers: &mut HeaderMap, name: HeaderName, n: u64) {
    headers.insert(name, format::header_num(n));
}

/// The peer address from axum's `ConnectInfo<SocketAddr>` or a plain `SocketAddr` extension.
#[inline]
fn peer_ip(extensions: &http::Extensions) -> Option<IpAddr> {
    if let Some(axum::extract::ConnectInfo(addr)) =
        extensions.get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(addr.ip());
    }
    extensions.get::<SocketAddr>().map(SocketAddr::ip)
}

/// The layer's own answer that is not a denial: JSON with `status`, or for a gRPC request the
/// gRPC status `grpc_code`.
fn reject(
    parts: &http::request::Parts,
    status: StatusCode,
    grpc_code: u32,
    error: &str,
    message: &str,
) -> Response<Full<Bytes>> {
    if grpc::is_grpc(parts) {
        return grpc::status(grpc_code, &format!("{error}: {message}"), None);
    }
    let body = serde_json::json!({ "error": error, "message": message }).to_string();
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

/// The response body: axum's [`Body`](axum::body::Body), for every inner service. An inner
/// body that is axum's own passes through as it is (no allocation: axum, which boxes any other
/// body type a layer answers with, finds nothing to do); any other (hyper's, tonic's, a
/// `Full<Bytes>`) is boxed once, as axum and tonic would box it; the layer's own answers (429,
/// 400, gRPC statuses) are carried in it too.
pub type RateLimitBody = axum::body::Body;

impl<S, C, ReqBody, ResBody> tower::Service<Request<ReqBody>> for RateLimit<S, C>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    C: Clock,
    ReqBody: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Response<RateLimitBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, S::Error, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The inner service is called here, while it is ready, on every path but the boxed
        // ones; those take the ready service along and leave a clone for the next
        // `poll_ready` (the usual tower pattern).
        let inner = &mut self.inner;
        let layer = &self.layer;
        if let Some((key, plan)) = layer.plain_key(req.headers(), req.extensions()) {
            // The common request (see `plain_key`): decided from its head as it is.
            layer.shared.core.counters.request();
            let carry = |check: Check| layer.after(Checks::One(check), 1);
            let charged = layer
                .shared
                .core
                .limiter
                .charge_detailed(&key, plan, 1, Mode::Check);
            let after = match layer.settle_one(key, plan, charged, After::Nothing, carry) {
                Ok(after) => after,
                Err(verdict) => {
                    // Not a plain pass: the answer reads the head's parts.
                    let (parts, body) = req.into_parts();
                    match layer.answer(&parts, verdict, 1) {
                        Ok(passed) => {
                            return forward_passed(
                                layer,
                                inner,
                                Request::from_parts(parts, body),
                                passed,
                            );
                        }
                        Err(resp) => return ResponseFuture::answer(resp),
                    }
                }
            };
            return ResponseFuture::forward(inner.call(req), after);
        }
        let (parts, body) = req.into_parts();
        let (client, cost) = match layer.front(&parts) {
            Err(resp) => return ResponseFuture::answer(resp),
            Ok(Front::Exempt) => {
                return ResponseFuture::forward(
                    inner.call(Request::from_parts(parts, body)),
                    After::Nothing,
                );
            }
            Ok(Front::Charge { client, cost }) => (client, cost),
        };
        if let Some(resolve) = &layer.shared.hooks.resolver {
            // An async plan lookup: the rest runs in a boxed future of its own.
            let resolving = resolve(&parts, &client);
            let layer = layer.clone();
            let inner = taken(inner);
            return ResponseFuture::boxed(async move {
                let name = resolving.await;
                let found = layer.plan_named(&parts, client, name);
                let passed = match layer.charge_any(&parts, found, cost).await {
                    Ok(p) => p,
                    Err(resp) => return Ok(resp.map(RateLimitBody::new)),
                };
                forward_after(layer, inner, Request::from_parts(parts, body), passed).await
            });
        }
        let found = layer.plan_from_table(&parts, client);
        #[cfg(feature = "redis")]
        if layer.shared.core.exact {
            // Exact mode: the charge is a Redis call, awaited in a boxed future of its own.
            let layer = layer.clone();
            let inner = taken(inner);
            return ResponseFuture::boxed(async move {
                let passed = match layer.charge_exact(&parts, found, cost).await {
                    Ok(p) => p,
                    Err(resp) => return Ok(resp.map(RateLimitBody::new)),
                };
                forward_after(layer, inner, Request::from_parts(parts, body), passed).await
            });
        }
        match layer.charge(&parts, found, cost) {
            Ok(passed) => forward_passed(layer, inner, Request::from_parts(parts, body), passed),
            Err(resp) => ResponseFuture::answer(resp),
        }
    }
}

/// The ready inner service, taken for a boxed future; a clone stays for the next `poll_ready`.
fn taken<S: Clone>(inner: &mut S) -> S {
    let clone = inner.clone();
    std::mem::replace(inner, clone)
}

/// Forwards a request that passed: held first for a queue's delay (in a boxed future), with
/// what its response needs riding along ([`RateLimitLayer::after`]).
#[inline(always)]
fn forward_passed<S, C, ReqBody, ResBody>(
    layer: &RateLimitLayer<C>,
    inner: &mut S,
    req: Request<ReqBody>,
    passed: Passed,
) -> ResponseFuture<S::Future, S::Error, C>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    C: Clock,
    ReqBody: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if passed.delay > 0 {
        // The queue strategy: held until the reservation's moment.
        let layer = layer.clone();
        return ResponseFuture::boxed(forward_after(layer, taken(inner), req, passed));
    }
    let after = layer.after(passed.checks, passed.cost);
    ResponseFuture::forward(inner.call(req), after)
}

/// Holds a passed request for its delay, forwards it, then finishes the response.
async fn forward_after<S, C, ReqBody, ResBody>(
    layer: RateLimitLayer<C>,
    mut inner: S,
    req: Request<ReqBody>,
    mut passed: Passed,
) -> Result<Response<RateLimitBody>, S::Error>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    C: Clock,
{
    if passed.delay > 0 {
        tokio::time::sleep(std::time::Duration::from_nanos(passed.delay)).await;
    }
    let mut resp = inner.call(req).await?;
    layer.finish(&mut resp, &mut passed);
    Ok(resp.map(RateLimitBody::new))
}

pin_project_lite::pin_project! {
    /// The response future of [`RateLimit`]: the inner service's future with the headers added
    /// when it completes (no allocation of its own), the layer's own answer, or, with an async
    /// plan resolver or a queued request, a boxed future.
    pub struct ResponseFuture<F, E, C: Clock> {
        #[pin]
        state: State<F, E, C>,
    }
}

/// What a forwarded request adds to its response once the inner service answered.
enum After<C: Clock> {
    /// Nothing (no headers, no refund hook; an exempt request).
    Nothing,
    /// The headers, made when the request was charged (boxed: the response future of every
    /// request, headers or not, stays one word larger than the inner one's, not five).
    Made(Box<Made>),
    /// With a refund hook: the charges and the layer, to refund and then make the headers.
    Finish(Box<(RateLimitLayer<C>, Passed)>),
}

type BoxedResponse<E> = Pin<Box<dyn Future<Output = Result<Response<RateLimitBody>, E>> + Send>>;

pin_project_lite::pin_project! {
    #[project = Projected]
    enum State<F, E, C: Clock> {
        // Forwarded; `after` finishes the response (none for an exempt request).
        Forward {
            #[pin]
            inner: F,
            after: After<C>,
        },
        // The layer answers itself (a 429, a 400, a gRPC status).
        Answer { response: Option<Response<Full<Bytes>>> },
        // An async resolver or a queue delay.
        Boxed { future: BoxedResponse<E> },
    }
}

impl<F, E, C: Clock> ResponseFuture<F, E, C> {
    #[inline(always)]
    fn answer(response: Response<Full<Bytes>>) -> Self {
        ResponseFuture {
            state: State::Answer {
                response: Some(response),
            },
        }
    }
    #[inline(always)]
    fn forward(inner: F, after: After<C>) -> Self {
        ResponseFuture {
            state: State::Forward { inner, after },
        }
    }
    fn boxed(
        future: impl Future<Output = Result<Response<RateLimitBody>, E>> + Send + 'static,
    ) -> Self {
        ResponseFuture {
            state: State::Boxed {
                future: Box::pin(future),
            },
        }
    }
}

impl<F, B, E, C> Future for ResponseFuture<F, E, C>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    C: Clock,
{
    type Output = Result<Response<RateLimitBody>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            Projected::Forward { inner, after } => {
                let mut resp = std::task::ready!(inner.poll(cx))?;
                if !matches!(after, After::Nothing) {
                    match std::mem::replace(after, After::Nothing) {
                        After::Nothing => {}
                        After::Made(made) => made.write(resp.headers_mut()),
                        After::Finish(f) => {
                            let (layer, mut passed) = *f;
                            layer.finish(&mut resp, &mut passed);
                        }
                    }
                }
                Poll::Ready(Ok(resp.map(RateLimitBody::new)))
            }
            Projected::Answer { response } => Poll::Ready(Ok(response
                .take()
                .expect("a ResponseFuture polled after it completed")
                .map(RateLimitBody::new))),
            Projected::Boxed { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, E, C: Clock> std::fmt::Debug for ResponseFuture<F, E, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match &self.state {
            State::Forward { .. } => "ResponseFuture::Forward",
            State::Answer { .. } => "ResponseFuture::Answer",
            State::Boxed { .. } => "ResponseFuture::Boxed",
        })
    }
}

impl<C: Clock + std::fmt::Debug> std::fmt::Debug for RateLimitLayer<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limiter", &self.shared.core.limiter)
            .field("plan_resolver", &self.shared.hooks.resolver.is_some())
            .field("user_fn", &self.shared.hooks.user.is_some())
            .field("key_extractor", &self.shared.hooks.key.is_some())
            .field("on_denied", &self.shared.hooks.denied.is_some())
            .field("cost_fn", &self.shared.hooks.cost.is_some())
            .field("refund_when", &self.shared.hooks.refund.is_some())
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
