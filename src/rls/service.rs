//! The decision: a `RateLimitRequest` in, a `RateLimitResponse` out, every descriptor's limit
//! charged on one [`Limiter`] (one plan per configured limit, named by its full key; one key
//! per domain and descriptor values).
//!
//! Counting follows upstream's Redis `INCRBY`, which adds a request's hits even when they are
//! over the limit. The engine's fixed window charges nothing on a denial, so a limit of `L` is
//! a window of `L + 1` units in the engine, the last unit meaning "over": a request whose hits
//! fit in `L` is OK; one that does not takes what is left of the `L + 1` (the window is then
//! over for the rest of its life, as upstream's count past `L` is), and answers OVER_LIMIT.
//! Every answer — codes, `limit_remaining`, the stats — is then upstream's, including a
//! `hits_addend` of 0 (OVER_LIMIT only once a request went over).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;

use super::config::{ConfigError, RateLimit, RlsConfig, Unit};
use super::matching::{Entry, Matched, descriptor_key, plain_key};
use super::stats::{Charge, Registry};
use crate::clock::Clock;
use crate::sync::{AtomicBool, Mutex, Ordering, RwLock, lock, read, write};
use crate::{Algorithm, Error, Limiter, Plan, PlanId, Quota, Reason};

/// Where the engine's state lives.
#[derive(Debug, Clone, Default)]
pub enum Backend {
    /// In this process (the default).
    #[default]
    InProcess,
    /// Shared through Redis, one script per decision ([`Builder::redis_exact`](crate::Builder::redis_exact)).
    RedisExact(crate::redis::RedisConfig),
    /// Local cells reconciled with Redis in rounds ([`Builder::redis_synced`](crate::Builder::redis_synced)).
    RedisSynced(crate::redis::RedisConfig),
}

/// A request the service refuses (upstream answers these with a gRPC error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestError(pub &'static str);

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for RequestError {}

/// The name prefix of a limit override's engine plan (one per override rate).
const OVERRIDE: &str = "(override)#";

/// The most distinct override rates the service takes: each holds one of the limiter's
/// [`MAX_RULES`](crate::store::MAX_RULES) quotas (256) for its life, and the rest stay for
/// the config's reloads.
const MAX_OVERRIDE_RATES: usize = 64;
// The refusal's message names the bound.
const _: () = assert!(MAX_OVERRIDE_RATES == 64);

/// The configuration in force and the engine plan of each of its limits.
#[derive(Debug)]
pub(crate) struct Active {
    config: RlsConfig,
    pub(crate) plans: HashMap<String, PlanId>,
}

/// Envoy's rate limit service on the engine: decisions, reloads, stats.
///
/// ```
/// use tollgate::rls::{RlsConfig, RlsService};
/// let yaml = "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
/// let config = RlsConfig::from_sources(&[("web.yaml".into(), yaml.into())])?;
/// let service = RlsService::new(config)?;
/// let rt = tokio::runtime::Builder::new_current_thread().build()?;
/// let ok = rt.block_on(service.decide_entries("web", &[("user", "ada")], 1))?;
/// assert_eq!(ok.overall_code, 1); // OK
/// let over = rt.block_on(service.decide_entries("web", &[("user", "ada")], 1))?;
/// assert_eq!(over.overall_code, 2); // OVER_LIMIT
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct RlsService {
    pub(crate) limiter: Arc<Limiter<String>>,
    active: RwLock<Arc<Active>>,
    /// Every plan made so far, by name: a reload adds only the plans of new rates.
    quotas: Mutex<HashMap<String, (Quota, PlanId)>>,
    stats: Registry,
    /// False once shutdown began (health checks then fail).
    serving: AtomicBool,
}

/// The engine quota of a limit (`None`: nothing to count).
pub(crate) fn quota_of(limit: &RateLimit) -> Option<Quota> {
    if limit.unlimited {
        return None;
    }
    let l = u64::from(limit.requests_per_unit);
    Some(match limit.algorithm {
        None if !limit.check_all => {
            Quota::new(l + 1, limit.period()).algorithm(Algorithm::FixedWindow)
        }
        a => Quota::new(l, limit.period())
            .algorithm(a.unwrap_or(Algorithm::FixedWindow))
            .burst(limit.burst.unwrap_or(l)),
    })
}

/// The engine plan of a limit: its full key and its quota, so an unchanged limit keeps its plan
/// (and its counters) across reloads and a changed one starts afresh.
fn plan_name(limit: &RateLimit, q: &Quota) -> String {
    format!(
        "{}#{}/{}s/{}/{}",
        limit.full_key,
        q.limit(),
        q.period().as_secs(),
        q.algo().name(),
        q.burst_size()
    )
}

/// Exact Redis mode decides one limit per script: an all-or-nothing domain is refused.
fn exact_refuses_check_all(config: &RlsConfig) -> Result<(), ConfigError> {
    match config
        .domains()
        .into_iter()
        .find(|d| config.is_check_all(d))
    {
        Some(d) => Err(ConfigError {
            file: format!("domain '{d}'"),
            field: "check_all".into(),
            message: "not available in Redis exact mode (use synced mode or leave it out)".into(),
        }),
        None => Ok(()),
    }
}

fn engine_error(limit: &RateLimit, e: Error) -> ConfigError {
    ConfigError {
        file: limit.full_key.clone(),
        field: "rate_limit".into(),
        message: e.to_string(),
    }
}

impl RlsService {
    /// A service answering from memory.
    pub fn new(config: RlsConfig) -> Result<RlsService, ConfigError> {
        RlsService::with_backend(config, Backend::InProcess)
    }

    /// A service whose limits live in `backend` (a Redis backend needs a tokio runtime entered).
    pub fn with_backend(config: RlsConfig, backend: Backend) -> Result<RlsService, ConfigError> {
        if matches!(backend, Backend::RedisExact(_)) {
            exact_refuses_check_all(&config)?;
        }
        let mut builder = Limiter::<String>::builder().quota(Quota::per_second(1));
        let mut quotas = HashMap::new();
        for limit in config.limits() {
            if let Some(q) = quota_of(&limit) {
                let name = plan_name(&limit, &q);
                builder = builder.plan(name.clone(), Plan::new([q]));
                quotas.insert(limit.full_key.clone(), (name, q));
            }
        }
        builder = match backend {
            Backend::InProcess => builder,
            Backend::RedisExact(r) => builder.redis_exact(r),
            Backend::RedisSynced(r) => builder.redis_synced(r),
        };
        let limiter = builder.build_shared().map_err(|e| {
            // Name the limit the engine refused, if one did.
            config
                .limits()
                .iter()
                .find(|l| {
                    quota_of(l).is_some_and(|q| Limiter::<u64>::builder().quota(q).build().is_err())
                })
                .map(|l| engine_error(l, e.clone()))
                .unwrap_or(ConfigError {
                    file: "(engine)".into(),
                    field: String::new(),
                    message: e.to_string(),
                })
        })?;
        let mut plans = HashMap::new();
        let mut with_ids = HashMap::new();
        for (full_key, (name, q)) in quotas {
            let id = limiter.plan(&name).expect("every limit's plan was built");
            plans.insert(full_key, id);
            with_ids.insert(name, (q, id));
        }
        let stats = Registry::default();
        // Relaxed (here and for the other load counters): counters read only for display.
        stats.config_load_success.fetch_add(1, Ordering::Relaxed);
        Ok(RlsService {
            limiter,
            active: RwLock::new(Arc::new(Active { config, plans })),
            quotas: Mutex::new(with_ids),
            stats,
            serving: AtomicBool::new(true),
        })
    }

    /// Puts `config` in force. A limit whose rate (limit, unit, algorithm, burst) is unchanged
    /// keeps its counters; one whose rate changed starts counting afresh. On an error nothing
    /// changes.
    pub fn reload(&self, config: RlsConfig) -> Result<(), ConfigError> {
        let result = self.install(config);
        let counter = if result.is_ok() {
            &self.stats.config_load_success
        } else {
            &self.stats.config_load_error
        };
        counter.fetch_add(1, Ordering::Relaxed);
        result
    }

    /// Counts a config that could not be read or parsed (for the metrics).
    pub fn note_load_error(&self) {
        self.stats.config_load_error.fetch_add(1, Ordering::Relaxed);
    }

    fn install(&self, config: RlsConfig) -> Result<(), ConfigError> {
        if self.limiter.is_exact() {
            exact_refuses_check_all(&config)?;
        }
        let limits = config.limits();
        // Validate every new quota before changing any plan.
        for l in &limits {
            if let Some(q) = quota_of(l) {
                q.compile(0).map_err(|e| engine_error(l, e))?;
            }
        }
        let mut quotas = lock(&self.quotas);
        let mut plans = HashMap::new();
        for l in &limits {
            let Some(q) = quota_of(l) else { continue };
            let name = plan_name(l, &q);
            let id = match quotas.get(&name) {
                Some(&(_, id)) => id,
                None => {
                    let id = self
                        .limiter
                        .set_plan(&name, Plan::new([q]))
                        .map_err(|e| engine_error(l, e))?;
                    quotas.insert(name, (q, id));
                    id
                }
            };
            plans.insert(l.full_key.clone(), id);
        }
        *write(&self.active) = Arc::new(Active { config, plans });
        Ok(())
    }

    /// Whether the health checks pass.
    pub fn is_serving(&self) -> bool {
        // Relaxed: a flag read by health checks, ordered with nothing else.
        self.serving.load(Ordering::Relaxed)
    }

    /// Marks the service as going away (health checks then fail) or back.
    pub fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::Relaxed);
    }

    /// The configuration in force.
    pub fn config(&self) -> RlsConfig {
        read(&self.active).config.clone()
    }

    /// The metrics in the Prometheus text format.
    pub fn metrics_text(&self) -> String {
        self.stats.render()
    }

    /// The counters of a stats key (`domain.key_value.key`), if it was ever counted:
    /// `[total_hits, within_limit, over_limit, near_limit, shadow_mode]`.
    pub fn stats_of(&self, stat_key: &str) -> Option<[u64; 5]> {
        self.stats.find(stat_key).map(|s| s.snapshot())
    }

    /// The engine underneath (for its stats).
    pub fn limiter(&self) -> &Limiter<String> {
        &self.limiter
    }

    /// One descriptor's request, for tests and examples: `entries` in `domain`, `hits` hits.
    pub async fn decide_entries(
        &self,
        domain: &str,
        entries: &[Entry<'_>],
        hits: u32,
    ) -> Result<RateLimitResponse, RequestError> {
        use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry as PbEntry;
        self.decide(&RateLimitRequest {
            domain: domain.into(),
            descriptors: vec![RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| PbEntry {
                        key: (*k).into(),
                        value: (*v).into(),
                    })
                    .collect(),
                ..Default::default()
            }],
            hits_addend: hits,
        })
        .await
    }

    /// Answers a `ShouldRateLimit` request as upstream does.
    pub async fn decide(&self, req: &RateLimitRequest) -> Result<RateLimitResponse, RequestError> {
        if req.domain.is_empty() {
            return Err(RequestError("rate limit domain must not be empty"));
        }
        if req.descriptors.is_empty() {
            return Err(RequestError("rate limit descriptor list must not be empty"));
        }
        let active = read(&self.active).clone();
        let mut matched: Vec<Option<Matched>> = Vec::with_capacity(req.descriptors.len());
        let mut unlimited = vec![false; req.descriptors.len()];
        let mut replacing: HashSet<String> = HashSet::new();
        let mut entries: Vec<Entry<'_>> = Vec::new();
        for (i, d) in req.descriptors.iter().enumerate() {
            entries.clear();
            entries.extend(d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())));
            // Envoy's per-descriptor limit override, for a configured domain (as upstream).
            let m = match &d.limit {
                Some(o) if active.config.has_domain(&req.domain) => Some(self.override_limit(
                    &req.domain,
                    &entries,
                    o,
                    active.config.is_check_all(&req.domain),
                )?),
                _ => active.config.get_limit(&req.domain, &entries),
            };
            if let Some(m) = &m {
                for r in &m.limit.replaces {
                    replacing.insert(r.clone());
                }
                unlimited[i] = m.limit.unlimited;
            }
            matched.push(m.filter(|m| !m.limit.unlimited));
        }
        for m in matched.iter_mut() {
            if m.as_ref()
                .is_some_and(|m| !m.limit.name.is_empty() && replacing.contains(&m.limit.name))
            {
                *m = None;
            }
        }
        let mut charged: Vec<Option<(DescriptorStatus, bool)>> =
            if active.config.is_check_all(&req.domain) {
                if req.descriptors.iter().any(|d| d.hits_addend.is_some()) {
                    return Err(RequestError(
                        "a check_all domain counts the request's hits_addend, not a descriptor's",
                    ));
                }
                self.charge_all(&active, &matched, u64::from(req.hits_addend.max(1)))
            } else {
                let mut out = Vec::with_capacity(matched.len());
                for (m, d) in matched.iter().zip(&req.descriptors) {
                    out.push(match m {
                        None => None,
                        Some(m) => {
                            let hits = d
                                .hits_addend
                                .as_ref()
                                .map_or(u64::from(req.hits_addend.max(1)), |h| h.value);
                            Some(self.charge(&active, m, hits).await)
                        }
                    });
                }
                out
            };
        let mut overall = Code::Ok;
        let mut statuses = Vec::with_capacity(req.descriptors.len());
        for (i, c) in charged.iter_mut().enumerate() {
            statuses.push(match c.take() {
                None if unlimited[i] => DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                },
                None => DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                },
                Some((status, over)) => {
                    if over {
                        overall = Code::OverLimit;
                    }
                    status
                }
            });
        }
        Ok(RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            ..Default::default()
        })
    }

    /// The limit a descriptor's override (`RateLimitDescriptor.limit`) sets: upstream's plain
    /// limit, its stats under the descriptor's own key, one engine plan per override rate.
    fn override_limit(
        &self,
        domain: &str,
        entries: &[Entry<'_>],
        o: &RateLimitOverride,
        check_all: bool,
    ) -> Result<Matched, RequestError> {
        let unit = Unit::from_proto(o.unit).ok_or(RequestError(
            "the descriptor's limit override has no valid unit",
        ))?;
        let stat_key = descriptor_key(domain, entries);
        let limit = RateLimit {
            full_key: stat_key.clone(),
            requests_per_unit: o.requests_per_unit,
            unit: Some(unit),
            unlimited: false,
            shadow_mode: false,
            name: String::new(),
            replaces: Vec::new(),
            detailed_metric: false,
            algorithm: None,
            burst: None,
            check_all,
        };
        if check_all && o.requests_per_unit == 0 {
            return Err(RequestError(
                "a limit override of 0 cannot be checked all-or-nothing",
            ));
        }
        let q = quota_of(&limit).expect("a limited override");
        let name = format!("{OVERRIDE}{}/{}s", q.limit(), q.period().as_secs());
        let plan = {
            let mut quotas = lock(&self.quotas);
            match quotas.get(&name) {
                Some(&(_, id)) => id,
                None => {
                    // Each rate takes one of the limiter's quotas for good: clients' overrides
                    // may not take the ones the config's reloads need.
                    let rates = quotas.keys().filter(|n| n.starts_with(OVERRIDE)).count();
                    if rates >= MAX_OVERRIDE_RATES {
                        return Err(RequestError(
                            "too many distinct limit override rates (at most 64 over the \
                             service's life)",
                        ));
                    }
                    // A quota the engine takes (not too large), then the room for it.
                    q.compile(0).map_err(|_| {
                        RequestError("the descriptor's limit override is too large")
                    })?;
                    let id = self.limiter.set_plan(&name, Plan::new([q])).map_err(|_| {
                        RequestError("no room for another limit override rate in the limiter")
                    })?;
                    quotas.insert(name, (q, id));
                    id
                }
            }
        };
        Ok(Matched {
            limit: Arc::new(limit),
            key: plain_key(domain, entries),
            stat_key,
            plan: Some(plan),
        })
    }

    /// Charges one matched descriptor; its status and whether it is over (shadow mode: never).
    async fn charge(&self, active: &Active, m: &Matched, hits: u64) -> (DescriptorStatus, bool) {
        let limit = &m.limit;
        let l = u64::from(limit.requests_per_unit);
        let plan = m.plan.unwrap_or_else(|| active.plans[&limit.full_key]);
        let key = &m.key;
        let (before, over, remaining) = if limit.algorithm.is_none() {
            self.count_fixed(key, plan, l, hits).await
        } else {
            self.count_engine(key, plan, l, hits).await
        };
        self.count_stats(m, Charge { before, hits, over });
        let over = over && !limit.shadow_mode;
        (status_of(limit, over, remaining, self.unix_s()), over)
    }

    /// Counts hits that another descriptor's denial kept from being charged (total only).
    pub(crate) fn count_unadmitted(&self, m: &Matched, hits: u64) {
        self.stats
            .get(&super::stats::sanitize(&m.stat_key), m.stats_by_client())
            .count_total(hits);
    }

    /// Counts a charge in the stats of `m`'s stats key.
    pub(crate) fn count_stats(&self, m: &Matched, c: Charge) {
        let l = u64::from(m.limit.requests_per_unit);
        self.stats
            .get(&super::stats::sanitize(&m.stat_key), m.stats_by_client())
            .count(l, c, m.limit.shadow_mode);
    }

    /// Upstream's counting on a window of `l + 1`: (count before, over, limit_remaining).
    async fn count_fixed(&self, key: &String, plan: PlanId, l: u64, hits: u64) -> (u64, bool, u32) {
        let cap = l + 1;
        if hits == 0 {
            let left = self.left(key, plan).await;
            let before = cap - left;
            return (before, left == 0, left.saturating_sub(1) as u32);
        }
        match self.limiter.check_in_async(key, plan, hits).await {
            Ok(d) if d.is_allowed() => {
                let left = d.remaining();
                (cap - left - hits, left == 0, left.saturating_sub(1) as u32)
            }
            Ok(d) => {
                let left = if d.reason() == Reason::Limited {
                    d.remaining()
                } else {
                    self.left(key, plan).await
                };
                self.saturate(key, plan, left).await;
                (cap - left, true, 0)
            }
            Err(_) => {
                // More hits than the window holds: over, whatever the count.
                let left = self.left(key, plan).await;
                self.saturate(key, plan, left).await;
                (cap - left, true, 0)
            }
        }
    }

    /// The engine's own algorithm: a denial charges nothing (the option documents it).
    async fn count_engine(
        &self,
        key: &String,
        plan: PlanId,
        l: u64,
        hits: u64,
    ) -> (u64, bool, u32) {
        if hits == 0 {
            // Nothing to charge: ask instead.
            return match self.limiter.peek_in_async(key, plan, 1).await {
                Ok(p) if p.is_allowed() => {
                    let left = p.remaining() + 1;
                    (
                        l.saturating_sub(left),
                        false,
                        left.min(u64::from(u32::MAX)) as u32,
                    )
                }
                _ => (l, true, 0),
            };
        }
        let Ok(d) = self.limiter.check_in_async(key, plan, hits).await else {
            return (l, true, 0);
        };
        let rem = d.remaining().min(u64::from(u32::MAX));
        if d.is_allowed() {
            (l.saturating_sub(rem + hits), false, rem as u32)
        } else {
            (l.saturating_sub(rem), true, 0)
        }
    }

    /// Units left in a key's window, charging nothing.
    async fn left(&self, key: &String, plan: PlanId) -> u64 {
        match self.limiter.peek_in_async(key, plan, 1).await {
            Ok(d) if d.is_allowed() => d.remaining() + 1,
            Ok(d) => d.remaining(),
            Err(_) => 0,
        }
    }

    /// Takes what is left of a window (racing charges may take part of it first: the loop ends
    /// when nothing is left).
    async fn saturate(&self, key: &String, plan: PlanId, mut left: u64) {
        while left > 0 {
            match self.limiter.check_in_async(key, plan, left).await {
                Ok(d) if d.is_allowed() => return,
                Ok(d) if d.reason() == Reason::Limited && d.remaining() < left => {
                    left = d.remaining()
                }
                _ => return,
            }
        }
    }
}

/// A descriptor's status under `limit`: `over` (shadow mode already applied), what is left;
/// `unix_s` is the time in Unix seconds, by the limiter's clock (the one its windows are
/// aligned to).
pub(crate) fn status_of(
    limit: &RateLimit,
    over: bool,
    remaining: u32,
    unix_s: u64,
) -> DescriptorStatus {
    let period = limit.period().as_secs();
    DescriptorStatus {
        code: if over { Code::OverLimit } else { Code::Ok } as i32,
        current_limit: Some(PbRateLimit {
            name: limit.name.clone(),
            requests_per_unit: limit.requests_per_unit,
            unit: limit.unit.map_or(0, |u| u.proto()),
        }),
        limit_remaining: remaining,
        duration_until_reset: Some(PbDuration {
            seconds: (period - unix_s % period) as i64,
            nanos: 0,
        }),
        ..Default::default()
    }
}

impl RlsService {
    /// The time in Unix seconds by the limiter's clock (no system call).
    pub(crate) fn unix_s(&self) -> u64 {
        let clock = self.limiter.clock();
        clock.unix_epoch_ns().saturating_add(clock.now()) / 1_000_000_000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(yaml: &str) -> RlsService {
        RlsService::new(RlsConfig::from_sources(&[("t.yaml".into(), yaml.into())]).unwrap())
            .unwrap()
    }

    fn answer(s: &RlsService, domain: &str, value: &str, hits: u32) -> (i32, u32, u32) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let r = rt
            .block_on(s.decide_entries(domain, &[("k", value)], hits))
            .unwrap();
        let st = &r.statuses[0];
        (
            st.code,
            st.current_limit.as_ref().map_or(0, |l| l.requests_per_unit),
            st.limit_remaining,
        )
    }

    const TWO: &str =
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";
    const FIVE: &str =
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";

    #[test]
    fn exact_mode_refuses_check_all() {
        let c =
            RlsConfig::from_sources(&[("t.yaml".into(), "domain: d\ncheck_all: true\n".into())])
                .unwrap();
        let backend = Backend::RedisExact(crate::redis::RedisConfig::new("redis://127.0.0.1:1/"));
        let e = RlsService::with_backend(c, backend).unwrap_err();
        assert_eq!(
            e.to_string(),
            "domain 'd': check_all: not available in Redis exact mode (use synced mode or leave it out)"
        );
    }

    #[test]
    fn a_reload_keeps_the_counters() {
        let s = service(TWO);
        assert_eq!(answer(&s, "d", "a", 1), (1, 2, 1));
        // Another file added: the unchanged limit keeps its count.
        let other = "domain: e\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1}\n";
        let c = RlsConfig::from_sources(&[
            ("t.yaml".into(), TWO.into()),
            ("u.yaml".into(), other.into()),
        ])
        .unwrap();
        s.reload(c).unwrap();
        assert_eq!(answer(&s, "d", "a", 1), (1, 2, 0));
        assert_eq!(answer(&s, "e", "a", 1), (1, 1, 0));
        // The rate changed: counted afresh under the new one.
        let c = RlsConfig::from_sources(&[("t.yaml".into(), FIVE.into())]).unwrap();
        s.reload(c).unwrap();
        assert_eq!(answer(&s, "d", "a", 1), (1, 5, 4));
        // Back to the old rate: its counters were kept.
        let c = RlsConfig::from_sources(&[("t.yaml".into(), TWO.into())]).unwrap();
        s.reload(c).unwrap();
        assert_eq!(answer(&s, "d", "a", 1), (2, 2, 0));
    }
}
