//! A request's charge and its verdict: the client's plan alone (`charge_own`, `settle_one`),
//! the plan and every matching rule all or nothing (`decide`, through the engine's routine over
//! [`RequestLimits`]), exact mode's call to Redis (`charge_exact`), and what the verdict means
//! for the request (`answer`: forwarded, held for a queue, or answered).

use http::StatusCode;

use super::response::reject;
use super::{Answer, HttpKey, RateLimitLayer};
use crate::cell::Mode;
use crate::clock::Clock;
use crate::decision::Reason;
use crate::error::Error;
use crate::http::config::HeaderStyle;
use crate::http::grpc;
use crate::http::keys::{ClientKey, KeyError};
use crate::http::metrics::LimitLabels;
use crate::limiter::{Decided, Detailed, Limiter, Limits, Time, all_or_nothing};
use crate::plan::PlanId;
use crate::stats::Count;

impl<C: Clock> RateLimitLayer<C> {
    /// Charges the request once its plan is known: what to forward with, or the layer's answer.
    #[allow(clippy::result_large_err)] // as `front`
    pub(super) fn charge(
        &self,
        parts: &http::request::Parts,
        found: Result<(ClientKey, PlanId), KeyError>,
        cost: u64,
    ) -> Result<Passed, Answer> {
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
    ) -> Result<Passed, Answer> {
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
    /// to answer. `bare` is a value and `carry` has one call site so that `carry` is inlined (a
    /// closure called for both passes stays out of line: a call per request that reads its
    /// argument back from memory). The charge's record is read where the limiter wrote it and
    /// moved only when it is kept; the caller charges first and moves the key in only then (a
    /// key moved just after it was built is read back wider than it was written: a
    /// store-forwarding stall per request).
    #[inline(always)]
    #[allow(clippy::result_large_err)] // inlined: nothing is returned through memory
    pub(super) fn settle_one<T>(
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
                let plain =
                    !matches!(d.reason(), Reason::SoftLimit | Reason::Shadow) && d.delay_ns() == 0;
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

    /// What a charge's verdict means for the request: what to forward with, or the layer's
    /// answer; counted in the layer's counters.
    #[allow(clippy::result_large_err)] // as `front`
    pub(super) fn answer(
        &self,
        parts: &http::request::Parts,
        verdict: Verdict,
        cost: u64,
    ) -> Result<Passed, Answer> {
        let core = &self.shared.core;
        match verdict {
            Verdict::Pass { checks } => {
                let (mut soft, mut shadow, mut delay) = (false, false, 0);
                for c in checks.iter() {
                    let d = &c.detailed.decision;
                    soft |= d.reason() == Reason::SoftLimit;
                    shadow |= d.reason() == Reason::Shadow;
                    delay = delay.max(d.delay_ns());
                }
                if soft {
                    core.counters.soft_passed();
                }
                if shadow {
                    core.counters.shadow_passed();
                }
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
                core.counters.limited(self.denied_by(&checks[at]));
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
                core.counters.limited(LimitLabels::COST);
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
    pub(super) async fn charge_any(
        &self,
        parts: &http::request::Parts,
        found: Result<(ClientKey, PlanId), KeyError>,
        cost: u64,
    ) -> Result<Passed, Answer> {
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
    pub(super) async fn charge_exact(
        &self,
        parts: &http::request::Parts,
        found: Result<(ClientKey, PlanId), KeyError>,
        cost: u64,
    ) -> Result<Passed, Answer> {
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

    /// Charges every limit that applies (the client's plan, then each matching rule; only the
    /// rules where one of them replaces the plan), all or nothing, through the engine's
    /// routine (see [`all_or_nothing`]).
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
        let mut replaced = false;
        let mut limits: Vec<Limit> = Vec::with_capacity(1 + core.rules.len());
        limits.push(Limit::Taken);
        for (i, r) in core.rules.iter().enumerate() {
            if !r.matches(method, path) {
                continue;
            }
            replaced |= r.rule.replaces_plan;
            let key = HttpKey {
                rule: Some(i as u16),
                client: if r.rule.shared {
                    ClientKey::Unidentified
                } else {
                    client.clone()
                },
            };
            let rule_plan = r.tiers.get(&plan).copied().unwrap_or(r.plan);
            limits.push(Limit::Todo(key, rule_plan));
        }
        if replaced {
            // A matching rule replaces the client's plan on this path: only the rules apply.
            limits.remove(0);
        } else {
            let own = HttpKey {
                rule: None,
                client: client.clone(),
            };
            limits[0] = Limit::Todo(own, plan);
        }
        let mut request = RequestLimits {
            limiter: &core.limiter,
            cost,
            time: None,
            limits,
        };
        let outcome = all_or_nothing(&mut request);
        // Every limit has its check once the routine answers (charged, peeked or released).
        let mut checks = Checks::new();
        for limit in request.limits {
            if let Limit::Done(c) = limit {
                checks.push(c);
            }
        }
        match outcome {
            Ok(None) => Verdict::Pass { checks },
            Ok(Some(at)) => Verdict::Deny { checks, at, client },
            Err(e) => Verdict::Error(e),
        }
    }
}

/// One limit charged for a request.
pub(super) struct Check {
    pub(super) key: HttpKey,
    pub(super) plan: PlanId,
    pub(super) detailed: Detailed,
}

pub(super) enum Verdict {
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
pub(super) enum Checks {
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

/// A request that passed: its charges (for the headers and a refund) and how long to hold it.
pub(super) struct Passed {
    pub(super) checks: Checks,
    pub(super) cost: u64,
    pub(super) delay: u64,
}

/// The limits of one request (its plan, then each matching rule) as the engine's
/// all-or-nothing routine drives them: a one-quota plan with no strategy on the flat store
/// decided first and charged on the state it found ([`Limiter::find_in`]); any other limit
/// with [`Limiter::charge_detailed`] (so each reports its parts for the headers). Each limit's
/// check is kept at its index.
struct RequestLimits<'a, C: Clock> {
    limiter: &'a Limiter<HttpKey, C>,
    cost: u64,
    /// The clock reading the limits share.
    time: Time,
    /// Each limit, by index.
    limits: Vec<Limit<'a>>,
}

/// One limit of a request as the routine drives it.
enum Limit<'a> {
    /// Its key and plan, not decided yet.
    Todo(HttpKey, PlanId),
    /// Decided first, on the state found: to be charged or released.
    Found(HttpKey, PlanId, Decided<'a>),
    /// Charged, peeked or released: its check.
    Done(Check),
    /// Moving from one of these to the next.
    Taken,
}

impl Limit<'_> {
    /// The limit's key and plan, while it has no check.
    fn key_plan(&self) -> (&HttpKey, PlanId) {
        match self {
            Limit::Todo(key, plan) | Limit::Found(key, plan, _) => (key, *plan),
            Limit::Done(_) | Limit::Taken => unreachable!("each limit is decided once"),
        }
    }
}

impl<C: Clock> RequestLimits<'_, C> {
    /// Limit `i`'s check, with its key and plan, of `detailed`.
    fn check(&mut self, i: usize, detailed: Detailed) {
        let (key, plan) = match std::mem::replace(&mut self.limits[i], Limit::Taken) {
            Limit::Todo(key, plan) | Limit::Found(key, plan, _) => (key, plan),
            Limit::Done(_) | Limit::Taken => unreachable!("each limit is decided once"),
        };
        self.limits[i] = Limit::Done(Check {
            key,
            plan,
            detailed,
        });
    }
}

impl<C: Clock> Limits for RequestLimits<'_, C> {
    type Error = Error;

    fn len(&self) -> usize {
        self.limits.len()
    }

    fn decide(&mut self, i: usize) -> Result<Option<bool>, Error> {
        let (key, plan) = self.limits[i].key_plan();
        let Some(found) = self.limiter.find_in(key, plan, self.cost, &mut self.time)? else {
            return Ok(None);
        };
        let d = found.decide();
        if !d.is_allowed() {
            found.count_denial(&d);
            self.check(i, Detailed::one(d, None, found.now()));
            return Ok(Some(false));
        }
        let Limit::Todo(key, plan) = std::mem::replace(&mut self.limits[i], Limit::Taken) else {
            unreachable!("a limit is decided before anything else");
        };
        self.limits[i] = Limit::Found(key, plan, found);
        Ok(Some(true))
    }

    fn release(&mut self, i: usize) {
        if let Limit::Found(_, _, found) = &self.limits[i] {
            let detailed = Detailed::one(found.release(), None, found.now());
            self.check(i, detailed);
        }
    }

    fn charge(&mut self, i: usize, peek: bool) -> Result<bool, Error> {
        if let (false, Limit::Found(_, _, found)) = (peek, &mut self.limits[i]) {
            if let Some(d) = found.charge() {
                let detailed = Detailed::one(d, found.undo(), found.now());
                self.check(i, detailed);
                return Ok(d.is_allowed());
            }
            // The state left its slot: charged on the general path.
        }
        let (key, plan) = self.limits[i].key_plan();
        let mode = if peek { Mode::Peek } else { Mode::Check };
        let detailed = self.limiter.charge_detailed(key, plan, self.cost, mode)?;
        if peek {
            // Never charged: its plan counts the request as denied elsewhere.
            self.limiter.recount(plan, None, true);
        }
        let allowed = detailed.decision.is_allowed();
        self.check(i, detailed);
        Ok(allowed)
    }

    fn refund(&mut self, i: usize, report: bool) {
        let Limit::Done(c) = &mut self.limits[i] else {
            unreachable!("a charged limit has its check");
        };
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
pub(super) fn refund_all<C: Clock>(limiter: &Limiter<HttpKey, C>, checks: &mut [Check], cost: u64) {
    undo_all(limiter, checks);
    for c in checks {
        limiter.refunded_detailed(&c.key, c.plan, cost, &mut c.detailed);
    }
}
