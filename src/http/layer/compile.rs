//! What a config compiles to (the core the layer's requests read), and how a reload puts a new
//! one in place: the limiter is built once and kept, its plans changed as `set_plans` changes
//! them, and every `Shared` of the layer's family pointed at the new core.

use std::collections::HashMap;
use std::sync::Arc;

use http::header::HeaderName;

use super::{
    CompiledRule, Core, Hooks, HttpKey, Limit, PlanInfo, RateLimitLayer, Shared, plan_info,
};
use crate::clock::Clock;
use crate::error::Error;
use crate::http::config::{HttpConfig, PathPattern, shadow_twin};
use crate::http::headers::HeaderPolicy;
use crate::http::metrics::{Exposition, HttpCounters, LimitLabels};
use crate::limiter::Limiter;
use crate::plan::{PlanId, Strategy};
use crate::sweep::Sweeper;
use crate::sync::Ordering;

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
    // At most u16::MAX rules: `HttpConfig::validate`.
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
