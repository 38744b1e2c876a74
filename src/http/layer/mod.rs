//! The tower layer: keys, plans, rules, strategies, headers, 429s.
//!
//! This file holds the layer, how it is built, and its hooks. A request goes through
//! `service.rs` (the tower service and its request paths, the plain path among them),
//! `front.rs` (its key, its plan and its exemption), `charge.rs` (its limits charged, and the
//! verdict) and `response.rs` (the headers, the layer's own answers, the response future).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use crate::sync::{AtomicBool, Ordering};

use arc_swap::ArcSwapOption;

use axum::response::IntoResponse;
use http::StatusCode;
use http::header::HeaderName;

use crate::clock::{Clock, MonotonicClock};
use crate::decision::Decision;
use crate::error::Error;
use crate::http::config::{HttpConfig, KeySource, PathPattern, shadow_twin};
use crate::http::headers::HeaderPolicy;
use crate::http::keys::ClientKey;
use crate::http::metrics::{Exposition, HttpCounters, LimitLabels};
use crate::limiter::Limiter;
use crate::plan::{PlanId, Strategy};
use crate::quota::Quota;
use crate::sweep::Sweeper;

mod charge;
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
    /// A layer on `clock` (a [`FakeClock`](crate::FakeClock) in tests).
    pub fn with_clock(config: HttpConfig, clock: C) -> Result<Self, Error> {
        config.validate()?;
        let limiter = build_limiter(&config, clock)?;
        let sweeper = config
            .sweep_interval
            .map(|every| Arc::new(limiter.start_sweeper(every)));
        let kept = Kept {
            limiter,
            counters: None,
            warned_no_peer: Arc::new(std::sync::Once::new()),
            warned_no_user: Arc::new(std::sync::Once::new()),
            exposition: Arc::new(Exposition::new()),
            sweeper,
        };
        let core = Core::compile(config, kept)?;
        let family = Arc::default();
        Ok(RateLimitLayer {
            shared: Shared::joined(Arc::new(core), Hooks::default(), &family),
        })
    }

    /// Puts `config` in effect on the running layer and every clone of it (and the layers made
    /// from it with a hook), keeping what clients spent: each plan is replaced as
    /// [`Limiter::set_plan`] replaces it (an unchanged quota keeps every key's state), and
    /// routes, API keys, exemptions, trusted proxies and headers are the new ones from the next
    /// request on. Requests already being decided finish under the old config.
    ///
    /// What the limiter itself is built with cannot change while it runs: a new `max_keys`,
    /// `sweep_interval` or `[redis]` table is an error, as is any config `new` would refuse;
    /// on an error the running config stays in effect, untouched.
    ///
    /// ```
    /// use tollgate::http::{HttpConfig, RateLimitLayer};
    /// let layer = RateLimitLayer::new(HttpConfig::parse("[plans.free]\nlimit = 10\nwindow = \"1m\"\n")?)?;
    /// layer.reload(HttpConfig::parse("[plans.free]\nlimit = 20\nwindow = \"1m\"\n")?)?;
    /// let bad = HttpConfig::parse("[plans.free]\nlimit = 20\nwindow = \"1m\"\n[http]\nmax_keys = 10\n")?;
    /// assert!(layer.reload(bad).is_err());
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn reload(&self, config: HttpConfig) -> Result<(), Error> {
        // One reload at a time, from its plans to the last member brought up to date.
        let family = Arc::clone(&self.shared.family);
        let mut members = family
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let current = self.current();
        let old = &current.shared.core;
        config.validate()?;
        old.config.same_limiter(&config)?;
        #[cfg(feature = "redis")]
        if config.redis_exact {
            exact_serves(&config)?;
        }
        let limiter = &old.limiter;
        let plans = config.limiter_plans();
        limiter.set_plans(plans.iter().map(|(n, p)| (n.as_str(), p.clone())))?;
        let kept = Kept {
            limiter: Arc::clone(limiter),
            counters: Some(&old.counters),
            warned_no_peer: Arc::clone(&old.warned_no_peer),
            warned_no_user: Arc::clone(&old.warned_no_user),
            exposition: Arc::clone(&old.exposition),
            sweeper: old._sweeper.clone(),
        };
        let core = match Core::compile(config, kept) {
            Ok(core) => Arc::new(core),
            Err(e) => {
                // The running config's plans back (plans only the new config named stay,
                // unused): the running config is in effect as it was.
                let running = old.config.limiter_plans();
                limiter.set_plans(running.iter().map(|(n, p)| (n.as_str(), p.clone())))?;
                return Err(e);
            }
        };
        // Every `Shared` still held (by a handle, a router's service, a request in flight) is
        // pointed at a new one with its hooks over the new core.
        let live: Vec<Arc<Shared<C>>> = members.iter().filter_map(|w| w.upgrade()).collect();
        members.clear();
        for member in live {
            let newest = Arc::new(Shared::new(
                Arc::clone(&core),
                member.hooks.clone(),
                Arc::clone(&member.family),
            ));
            members.push(Arc::downgrade(&newest));
            members.push(Arc::downgrade(&member));
            // Stored first, then flagged: a request that sees the flag finds `newer` set.
            member.newer.store(Some(newest));
            member.stale.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// This layer as the newest reload left it (itself when never reloaded).
    #[inline(always)]
    pub(super) fn current(&self) -> RateLimitLayer<C> {
        match self.refreshed() {
            Some(newer) => newer,
            None => self.clone(),
        }
    }

    /// The newest version of this layer where a reload replaced it, else `None` (one load).
    #[inline(always)]
    pub(super) fn refreshed(&self) -> Option<RateLimitLayer<C>> {
        if !self.shared.stale.load(Ordering::Acquire) {
            return None;
        }
        self.shared
            .newer
            .load_full()
            .map(|shared| RateLimitLayer { shared })
    }
}

/// What a reload carries from the running core to the new one.
struct Kept<'a, C: Clock> {
    limiter: Arc<Limiter<HttpKey, C>>,
    /// The running core's counters, which the new ones go on from (`None`: a new layer).
    counters: Option<&'a HttpCounters>,
    warned_no_peer: Arc<std::sync::Once>,
    warned_no_user: Arc<std::sync::Once>,
    exposition: Arc<Exposition>,
    sweeper: Option<Arc<Sweeper>>,
}

impl<C: Clock> Core<C> {
    /// What `config` compiles to on `kept`'s limiter (whose plans are the config's already).
    fn compile(config: HttpConfig, kept: Kept<'_, C>) -> Result<Self, Error> {
        let limiter = kept.limiter;
        #[cfg(feature = "redis")]
        let exact = limiter.is_exact();
        let id = |name: &str| {
            limiter
                .plan(name)
                .ok_or_else(|| Error::UnknownPlan(name.to_string()))
        };
        let (exempt_paths, paths) = config.rule_paths()?;
        let mut labels = LimitLabels::new();
        let plans = plan_infos(&config, &id, &mut labels)?;
        let default_plan = match &config.default_plan {
            Some(name) => id(name)?,
            None => limiter.default_plan_id(),
        };
        let mut api_key_plans = HashMap::new();
        for (key, plan) in &config.api_keys {
            api_key_plans.insert(key.clone(), id(plan)?);
        }
        let rules = compile_rules(&config, &plans, paths, &id, &mut labels)?;
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
        Ok(Core {
            limiter,
            config,
            plans,
            default_plan,
            api_key_plans,
            rules,
            exempt_paths,
            api_key_header,
            counters: match &kept.counters {
                Some(old) => old.carried(labels),
                None => HttpCounters::new(labels),
            },
            warned_no_peer: kept.warned_no_peer,
            warned_no_user: kept.warned_no_user,
            exposition: kept.exposition,
            #[cfg(feature = "redis")]
            exact,
            _sweeper: kept.sweeper,
        })
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

/// The layer's limiter: the config's plans, `max_keys` and Redis mode, on `clock`.
fn build_limiter<C: Clock>(
    config: &HttpConfig,
    clock: C,
) -> Result<Arc<Limiter<HttpKey, C>>, Error> {
    let mut builder = Limiter::<HttpKey>::builder().clock(clock);
    if let Some(n) = config.max_keys {
        builder = builder.max_keys(n);
    }
    for (name, plan) in config.limiter_plans() {
        builder = builder.plan(name, plan);
    }
    #[cfg(feature = "redis")]
    if let Some(redis) = config.redis.clone() {
        builder = if config.redis_exact {
            exact_serves(config)?;
            builder.redis_exact(redis)
        } else {
            builder.redis_synced(redis)
        };
    }
    builder.build_shared()
}

/// Each configured plan as the headers and the 429 message describe it, by plan id (its index);
/// `id` names a plan's id.
fn plan_infos(
    config: &HttpConfig,
    id: &impl Fn(&str) -> Result<PlanId, Error>,
    labels: &mut LimitLabels,
) -> Result<Vec<Option<PlanInfo>>, Error> {
    let mut plans: Vec<Option<PlanInfo>> = Vec::new();
    for (name, plan) in &config.limiter_plans() {
        let at = id(name)?.index();
        if plans.len() <= at {
            plans.resize_with(at + 1, || None);
        }
        plans[at] = Some(PlanInfo {
            quotas: plan.quotas().to_vec(),
            policy: Limit {
                policy: HeaderPolicy::new(name, plan.quotas()),
                counters: labels.parts("plan", name, plan.quotas().len()),
            },
            shadow: plan.strategy_kind() == Strategy::Shadow,
        });
    }
    Ok(plans)
}

/// The config's rules with their plans resolved to ids (`id`), their paths compiled (`paths`,
/// in the rules' order) and their policies made.
fn compile_rules(
    config: &HttpConfig,
    plans: &[Option<PlanInfo>],
    paths: Vec<Option<PathPattern>>,
    id: &impl Fn(&str) -> Result<PlanId, Error>,
    labels: &mut LimitLabels,
) -> Result<Vec<CompiledRule>, Error> {
    if config.rules.len() > usize::from(u16::MAX) {
        return Err(Error::Config {
            line: None,
            message: format!("http: {} rules; at most {}", config.rules.len(), u16::MAX),
        });
    }
    let mut rules = Vec::new();
    for (r, path) in config.rules.iter().zip(paths) {
        // A rule in shadow mode charges its plans' shadow twins.
        let own = |plan: &str| {
            if r.shadow {
                id(&shadow_twin(plan))
            } else {
                id(plan)
            }
        };
        let mut tiers = HashMap::new();
        for (client, plan) in &r.tiers {
            tiers.insert(id(client)?, own(plan)?);
        }
        let plan = own(&r.plan)?;
        let mut policies = HashMap::new();
        for p in tiers.values().copied().chain([plan]) {
            let quotas = plan_info(plans, p).map_or(&[][..], |i| &i.quotas[..]);
            let limit = Limit {
                policy: HeaderPolicy::new(&r.name, quotas),
                counters: labels.parts("rule", &r.name, quotas.len()),
            };
            policies.insert(p, limit);
        }
        rules.push(CompiledRule {
            rule: r.clone(),
            path,
            plan,
            tiers,
            policies,
        });
    }
    Ok(rules)
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
