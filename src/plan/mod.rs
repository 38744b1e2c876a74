//! Plans: what users configure (quotas, all of which must pass, a strategy over them, a
//! priority headroom) and their TOML ([`config`]). The limiter compiles them once into what its
//! charge engine needs (`limiter::book`); nothing here imports the limiter.

pub(crate) mod config;

use std::time::Duration;

pub use config::PlanConfig;

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
    /// Admit it for a later moment, at most `max_delay` away (the leaky bucket as a queue, nginx
    /// `burst` without `nodelay`); the decision's [`delay`](crate::Decision::delay) says how
    /// long to wait. Window algorithms cannot schedule ahead and admit only what passes now.
    Queue {
        /// The longest wait a request may be given.
        max_delay: Duration,
    },
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
/// [`Limiter::plan`](crate::Limiter::plan).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlanId(pub(crate) u32);

impl PlanId {
    /// The plan that [`Limiter::check`](crate::Limiter::check) uses.
    pub const DEFAULT: PlanId = PlanId(0);
}
