//! Plans: what users configure (quotas, all of which must pass, a strategy over them, a
//! priority headroom) and their TOML ([`config`]). The limiter compiles them once into what its
//! charge engine needs (`limiter::book`); nothing here imports the limiter.

pub(crate) mod config;
mod duration;

use std::time::Duration;

pub use config::PlanConfig;

use crate::decision::Reason;
use crate::quota::Quota;

/// The most quotas one plan may combine (10/s AND 1000/day is two).
pub const MAX_PARTS: usize = 4;

/// What happens to a request over its quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Strategy {
    /// Deny it (HTTP 429).
    #[default]
    Hard,
    /// Let it through, flagged as [`Reason::SoftLimit`](crate::Reason::SoftLimit), charging
    /// nothing.
    Soft,
    /// Dry run (Envoy's `shadow_mode`, nginx `limit_req_dry_run`): decide and count exactly as
    /// [`Hard`](Self::Hard) would, but never deny: a request the limit would deny (over quota,
    /// or a new key at a full table) passes as [`Reason::Shadow`](crate::Reason::Shadow),
    /// charging nothing, and is counted as `shadow_passed`. The HTTP layer adds no headers
    /// for such a limit. A penalty set with [`Limiter::block`](crate::Limiter::block) is the
    /// application's own order and still denies.
    Shadow,
    /// Admit it for a later moment, at most `max_delay` away (the leaky bucket as a queue, nginx
    /// `burst` without `nodelay`); the decision's [`delay`](crate::Decision::delay) says how
    /// long to wait. Window algorithms cannot schedule ahead and admit only what passes now.
    Queue {
        /// The longest wait a request may be given.
        max_delay: Duration,
    },
}

impl Strategy {
    /// What a denial of this strategy's limit becomes: `Some` reason for a request let through
    /// anyway (soft: over quota only; shadow: a full table too), `None` where it stays denied.
    #[inline(always)]
    pub(crate) fn passes(self, denial: Reason) -> Option<Reason> {
        match (self, denial) {
            (Strategy::Soft, Reason::Limited) => Some(Reason::SoftLimit),
            (Strategy::Shadow, Reason::Limited | Reason::TableFull) => Some(Reason::Shadow),
            _ => None,
        }
    }
}

/// A named tier: its quotas (all must pass), what happens over them, and its priority headroom.
///
/// ```
/// use tollgate::{Plan, Quota, Strategy};
/// let pro = Plan::new([Quota::per_second(10), Quota::per_day(1000)]).strategy(Strategy::Soft);
/// assert_eq!(pro.quotas().len(), 2);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    quotas: Vec<Quota>,
    strategy: Strategy,
    headroom: u64,
}

impl Plan {
    /// A plan whose requests must pass every one of `quotas`.
    pub fn new(quotas: impl IntoIterator<Item = Quota>) -> Self {
        Plan {
            quotas: quotas.into_iter().collect(),
            strategy: Strategy::Hard,
            headroom: 0,
        }
    }
    /// What happens over the quota.
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }
    /// Priority: this plan's requests are denied while fewer than `units` would remain, keeping
    /// that much of a shared key's quota for higher tiers (give lower tiers larger headroom).
    pub fn headroom(mut self, units: u64) -> Self {
        self.headroom = units;
        self
    }
    /// The quotas.
    pub fn quotas(&self) -> &[Quota] {
        &self.quotas
    }
    /// The strategy.
    pub fn strategy_kind(&self) -> Strategy {
        self.strategy
    }
    /// The headroom.
    pub fn headroom_units(&self) -> u64 {
        self.headroom
    }
}

/// A handle to one of a limiter's plans, resolved once by name with
/// [`Limiter::plan`](crate::Limiter::plan). It belongs to the limiter that issued it: another
/// limiter refuses it with [`Error::ForeignPlan`](crate::Error::ForeignPlan) (it never charges one of its own plans
/// instead). [`PlanId::DEFAULT`] alone is every limiter's: their default plan.
///
/// ```
/// use tollgate::{Error, Limiter, Plan, PlanId, Quota};
/// let a = Limiter::<u64>::builder().quota(Quota::per_second(5)).plan("pro", Plan::new([Quota::per_second(50)])).build()?;
/// let b = Limiter::<u64>::builder().quota(Quota::per_second(5)).plan("pro", Plan::new([Quota::per_second(50)])).build()?;
/// let pro = a.plan("pro").unwrap();
/// assert!(a.check_in(&1, pro, 1)?.is_allowed());
/// assert_eq!(b.check_in(&1, pro, 1), Err(Error::ForeignPlan(pro)));
/// assert!(b.check_in(&1, PlanId::DEFAULT, 1)?.is_allowed());
/// # Ok::<(), tollgate::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlanId {
    /// The plan's place in its limiter's books.
    pub(crate) index: u32,
    /// The issuing limiter's tag (its books' owner); 0 only in [`PlanId::DEFAULT`].
    pub(crate) owner: u32,
}

impl PlanId {
    /// The plan that [`Limiter::check`](crate::Limiter::check) uses, of whichever limiter it is
    /// given to. Not equal to the id [`Limiter::plan`](crate::Limiter::plan) returns for that
    /// plan, which names one limiter's.
    pub const DEFAULT: PlanId = PlanId { index: 0, owner: 0 };

    /// The plan's place in its limiter's books (and in tables kept beside them).
    #[inline]
    pub(crate) fn index(self) -> usize {
        self.index as usize
    }
}
