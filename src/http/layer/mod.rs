//! The tower layer: keys, plans, rules, strategies, headers, 429s.
//!
//! This file holds the layer and its hooks; `compile.rs` what a config compiles to and how a
//! reload replaces it, `warnings.rs` the settings that cannot take effect. A request goes through
//! `service.rs` (the tower service and its request paths, the plain path among them),
//! `front.rs` (its key, its plan and its exemption), `charge.rs` (its limits charged, and the
//! verdict) and `response.rs` (the headers, the layer's own answers, the response future).

use crate::sync::AtomicBool;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use arc_swap::ArcSwapOption;

use axum::response::IntoResponse;
use http::StatusCode;
use http::header::HeaderName;

use crate::clock::{Clock, MonotonicClock};
use crate::decision::Decision;
use crate::error::Error;
use crate::http::config::{HttpConfig, KeySource, PathPattern};
use crate::http::headers::HeaderPolicy;
use crate::http::keys::ClientKey;
use crate::http::metrics::{Exposition, HttpCounters};
use crate::limiter::Limiter;
use crate::plan::PlanId;
use crate::quota::Quota;
use crate::sweep::Sweeper;

mod charge;
mod compile;
mod front;
mod response;
mod service;
mod warnings;

pub use front::HttpKey;
pub use response::{RateLimitBody, ResponseFuture};
pub use service::RateLimit;

/// A resolver's answer, boxed: the plan name, or `None` for the default plan.
/// [`RateLimitLayer::resolver`] takes any such future (an `async` block); this is the form the
/// layer keeps it in.
pub type PlanFuture = Pin<Box<dyn Future<Output = Option<String>> + Send + 'static>>;

/// A response the layer answers with itself: axum's [`Response`](axum::response::Response),
/// whatever a hook returned that implements [`IntoResponse`].
pub(crate) type Answer = axum::response::Response;

type Resolver = dyn Fn(&http::request::Parts, &ClientKey) -> PlanFuture + Send + Sync;
type UserFn = dyn Fn(&http::request::Parts) -> Option<Box<str>> + Send + Sync;
/// A key, or the rejection (boxed: a response is large, and a key is the common answer).
type KeyFn = dyn Fn(&http::request::Parts) -> Result<ClientKey, Box<Answer>> + Send + Sync;
type DenyFn = dyn Fn(&Denied<'_>) -> Answer + Send + Sync;
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

/// One limit (a plan as a client's own, or a rule under one of its plans) as the headers and
/// the metrics name it.
#[derive(Debug)]
struct Limit {
    /// Its IETF policy (labelled with the plan's or the rule's name).
    policy: HeaderPolicy,
    /// The `tollgate_http_limited_total` counter of each part.
    counters: Vec<usize>,
}

/// A plan as the headers and the 429 message describe it.
#[derive(Debug)]
struct PlanInfo {
    quotas: Vec<Quota>,
    /// The plan as a client's own limit.
    policy: Limit,
    /// In shadow mode: its decisions add no headers.
    shadow: bool,
}

/// A rule with its plans resolved to ids and its path compiled.
#[derive(Debug)]
struct CompiledRule {
    rule: crate::http::config::Rule,
    /// `None` for the global rule.
    path: Option<PathPattern>,
    plan: PlanId,
    /// Client plan → this rule's plan for that client.
    tiers: HashMap<PlanId, PlanId>,
    /// This rule's limit under each plan it can use.
    policies: HashMap<PlanId, Limit>,
}

impl CompiledRule {
    /// True when the rule applies to a request with `method` and `path`.
    fn matches(&self, method: &str, path: &str) -> bool {
        let methods = &self.rule.methods;
        (methods.is_empty() || methods.iter().any(|m| m == method))
            && self.path.as_ref().is_none_or(|p| p.matches(path))
    }
}

/// What the layer shares between clones: the limiter and the counters, which a reload keeps,
/// and what the config compiles to, which a reload replaces.
struct Core<C: Clock> {
    limiter: Arc<Limiter<HttpKey, C>>,
    config: HttpConfig,
    /// By plan id (its index): each configured plan.
    plans: Vec<Option<PlanInfo>>,
    default_plan: PlanId,
    api_key_plans: HashMap<String, PlanId>,
    rules: Vec<CompiledRule>,
    /// Paths never limited.
    exempt_paths: Vec<PathPattern>,
    api_key_header: HeaderName,
    counters: HttpCounters,
    /// Set by the first request that arrives without a peer address (the one warning).
    warned_no_peer: Arc<std::sync::Once>,
    /// Set by the first request keyed by `user` on a layer without a user extractor.
    warned_no_user: Arc<std::sync::Once>,
    /// The recorder `/metrics` renders.
    exposition: Arc<Exposition>,
    /// Exact mode on Redis (`mode = "exact"`): the limiter decides each plan in one script
    /// there ([`Limiter::check_in_async`]).
    #[cfg(feature = "redis")]
    exact: bool,
    /// Stops and joins the background sweeper when the last clone drops.
    _sweeper: Option<Arc<Sweeper>>,
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
    /// Set by [`RateLimitLayer::reload`]: this is out of date, requests go to `newer`. Looked
    /// at first (one load of a line that is written only by a reload), so a layer never
    /// reloaded pays nothing more.
    stale: AtomicBool,
    /// The same hooks over the newest core, once a reload happened.
    newer: ArcSwapOption<Shared<C>>,
    /// Every `Shared` of this layer and of the layers made from it (hooks added), so a reload
    /// brings each up to date, whichever of them a service still holds.
    family: Arc<Family<C>>,
}

/// The `Shared`s a reload updates, weakly held (a newer one never points back at an older
/// one, so nothing here keeps a dropped layer alive).
type Family<C> = std::sync::Mutex<Vec<std::sync::Weak<Shared<C>>>>;

impl<C: Clock> Shared<C> {
    /// A `Shared` of `family` (a member from now on).
    fn joined(core: Arc<Core<C>>, hooks: Hooks, family: &Arc<Family<C>>) -> Arc<Self> {
        let shared = Arc::new(Shared::new(core, hooks, Arc::clone(family)));
        family
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Arc::downgrade(&shared));
        shared
    }

    fn new(core: Arc<Core<C>>, hooks: Hooks, family: Arc<Family<C>>) -> Self {
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
            && c.exempt_paths.is_empty()
            && core.rules.is_empty()
            && hooks.resolver.is_none()
            && hooks.key.is_none()
            && hooks.user.is_none()
            && hooks.cost.is_none();
        Shared {
            core,
            hooks,
            plain,
            stale: AtomicBool::new(false),
            newer: ArcSwapOption::empty(),
            family,
        }
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
    /// Resolves each request's plan (for example API key → plan from a database). The closure
    /// runs on the request's head and key and returns a `'static` future (an `async move`
    /// block): copy what it needs from the request before the block. An unknown plan name
    /// falls back to the default plan (and counts in the metrics). It replaces the config's
    /// `api_keys` table (a layer with both warns, see [`warnings`](Self::warnings)).
    ///
    /// With `api_key` among the key sources, `None` for a key means the key is *unknown*: it is
    /// no client identity, and the request is keyed as one without a key ([`OnBadKey`]: by
    /// client address under the default plan, or rejected). Answer the default plan's name for
    /// a known key on the default plan.
    ///
    /// [`OnBadKey`]: crate::http::OnBadKey
    ///
    /// ```
    /// use tollgate::http::{ClientKey, HttpConfig, RateLimitLayer};
    /// let config = HttpConfig::parse("[plans.free]\nlimit = 10\nwindow = 60\n[plans.pro]\nlimit = 1000\nwindow = 60\n").unwrap();
    /// let layer = RateLimitLayer::new(config).unwrap().resolver(|parts, _client: &ClientKey| {
    ///     let pro = parts.headers.get("x-api-key").is_some_and(|k| k == "secret");
    ///     async move { pro.then(|| "pro".to_string()) }
    /// });
    /// # let _ = layer;
    /// ```
    pub fn resolver<F, Fut>(mut self, resolve: F) -> Self
    where
        F: Fn(&http::request::Parts, &ClientKey) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Option<String>> + Send + 'static,
    {
        let boxed = move |parts: &http::request::Parts, client: &ClientKey| -> PlanFuture {
            Box::pin(resolve(parts, client))
        };
        self.set_hook(|h| h.resolver = Some(Arc::new(boxed)));
        self.warn_new("resolver");
        self
    }

    /// The authenticated user of a request (for [`KeySource::User`]), typically from an
    /// extension your auth layer inserted: a `String`, a `&'static str`, a `Box<str>`. `None`
    /// means not authenticated. A layer whose key sources do not include `user` never calls it
    /// (it warns, see [`warnings`](Self::warnings)).
    ///
    /// ```
    /// use tollgate::http::{HttpConfig, KeySource, RateLimitLayer};
    /// #[derive(Clone)]
    /// struct User(String); // what your auth layer puts in the request's extensions
    /// let config = HttpConfig::parse("[plans.free]\nlimit = 10\nwindow = \"1m\"\n")?.key([KeySource::User]);
    /// let layer = RateLimitLayer::new(config)?
    ///     .user(|parts| parts.extensions.get::<User>().map(|u| u.0.clone()));
    /// assert!(layer.warnings().is_empty());
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn user<F, U>(mut self, extract: F) -> Self
    where
        F: Fn(&http::request::Parts) -> Option<U> + Send + Sync + 'static,
        U: Into<Box<str>>,
    {
        let boxed = move |parts: &http::request::Parts| extract(parts).map(Into::into);
        self.set_hook(|h| h.user = Some(Arc::new(boxed)));
        self.warn_new("user");
        self
    }

    /// Keys requests by your own function of the request head instead of the configured
    /// sources: a key, or any response that rejects the request (anything that implements
    /// axum's [`IntoResponse`]: a status, a `(StatusCode, &str)` pair, a `Response`; counted
    /// as a bad-key rejection). Its keys are taken as given (no [`OnBadKey`] fallback, no
    /// unknown-key test).
    ///
    /// [`OnBadKey`]: crate::http::OnBadKey
    ///
    /// ```
    /// use axum::http::StatusCode;
    /// use tollgate::http::{ClientKey, HttpConfig, RateLimitLayer};
    /// let config = HttpConfig::parse("[plans.free]\nlimit = 10\nwindow = \"1m\"\n")?;
    /// let layer = RateLimitLayer::new(config)?.key_extractor(|parts| {
    ///     match parts.headers.get("x-tenant").and_then(|v| v.to_str().ok()) {
    ///         Some(tenant) => Ok(ClientKey::user(tenant)),
    ///         None => Err((StatusCode::UNAUTHORIZED, "tenant required")),
    ///     }
    /// });
    /// # let _ = layer;
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn key_extractor<F, R>(mut self, extract: F) -> Self
    where
        F: Fn(&http::request::Parts) -> Result<ClientKey, R> + Send + Sync + 'static,
        R: IntoResponse,
    {
        let boxed = move |parts: &http::request::Parts| {
            extract(parts).map_err(|r| Box::new(r.into_response()))
        };
        self.set_hook(|h| h.key = Some(Arc::new(boxed)));
        self.warn_new("key_extractor");
        self
    }

    /// Answers denials with your own response instead of the JSON 429 or the gRPC status:
    /// anything that implements axum's [`IntoResponse`] (a `(StatusCode, String)` pair, a
    /// `Json`, a `Response`). The layer adds `Retry-After` and the configured rate-limit
    /// headers wherever your response does not set them itself.
    ///
    /// ```
    /// use axum::http::StatusCode;
    /// use tollgate::http::{HttpConfig, RateLimitLayer};
    /// let config = HttpConfig::parse("[plans.free]\nlimit = 10\nwindow = \"1m\"\n")?;
    /// let layer = RateLimitLayer::new(config)?.on_denied(|denied| {
    ///     let body = format!("slow down: {} ({} s)", denied.limit, denied.decision.retry_after().as_secs());
    ///     (StatusCode::SERVICE_UNAVAILABLE, body)
    /// });
    /// # let _ = layer;
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn on_denied<F, R>(mut self, respond: F) -> Self
    where
        F: Fn(&Denied<'_>) -> R + Send + Sync + 'static,
        R: IntoResponse,
    {
        let boxed = move |denied: &Denied<'_>| respond(denied).into_response();
        self.set_hook(|h| h.denied = Some(Arc::new(boxed)));
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
        let current = self.current();
        let mut hooks = current.shared.hooks.clone();
        set(&mut hooks);
        self.shared = Shared::joined(
            Arc::clone(&current.shared.core),
            hooks,
            &current.shared.family,
        );
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
        let current = self.current();
        current
            .shared
            .core
            .exposition
            .render(|| current.publish_to(&[]))
    }

    /// Publishes the same counters through the `metrics` facade (feature `metrics`), labelled
    /// `limiter = name`, under the names [`metrics`](Self::metrics) renders.
    pub fn publish_metrics(&self, name: &str) {
        self.current()
            .publish_to(&crate::stats::publish::limiter(name));
    }

    fn publish_to(&self, base: &[metrics::Label]) {
        let limiter = &self.shared.core.limiter;
        crate::stats::publish::totals(base, &limiter.stats());
        crate::stats::publish::breakdown(base, &limiter.plan_stats(), &limiter.rule_stats());
        self.shared.core.counters.publish(base);
    }
}

/// The layer's view of plan `id`.
fn plan_info(plans: &[Option<PlanInfo>], id: PlanId) -> Option<&PlanInfo> {
    plans.get(id.index()).and_then(Option::as_ref)
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
