//! `until_ready` (feature `tokio`): the queue strategy's waiting, for callers that are not HTTP
//! handlers.

use std::hash::Hash;
use std::time::Duration;

use crate::clock::Clock;
use crate::decision::{Decision, Reason};
use crate::error::Error;
use crate::limiter::Limiter;
use crate::plan::PlanId;

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limiter<K, C> {
    /// Waits until one unit for `key` (default plan) may pass, at most `max_wait`; see
    /// [`until_ready_in`](Self::until_ready_in).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Limiter, Quota};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let limiter = Limiter::<&str>::builder().quota(Quota::per_second(20).burst(1)).build()?;
    /// assert!(limiter.until_ready(&"job", Duration::ZERO).await?.is_allowed());
    /// // The next unit is 50 ms away: with 1 s of patience it waits and passes...
    /// let d = limiter.until_ready(&"job", Duration::from_secs(1)).await?;
    /// assert!(d.is_allowed() && d.delay() > Duration::ZERO);
    /// // ...with none, it is denied at once and nothing is charged.
    /// assert!(!limiter.until_ready(&"job", Duration::ZERO).await?.is_allowed());
    /// # Ok::<(), tollgate::Error>(()) }).unwrap();
    /// ```
    pub async fn until_ready(&self, key: &K, max_wait: Duration) -> Result<Decision, Error> {
        self.until_ready_in(key, PlanId::DEFAULT, 1, max_wait).await
    }

    /// Waits until `cost` units for `key` under `plan` may pass, at most `max_wait`, and returns
    /// the admitting decision (its [`delay`](Decision::delay) is how long the reservation said
    /// to wait), or the denial when that is impossible within `max_wait` (nothing charged).
    ///
    /// Bucket algorithms reserve a slot at once ([`reserve_in`](Self::reserve_in)) and sleep
    /// until it, or are denied at once when the first free slot lies past the deadline (waiting
    /// moves the slot no nearer); window algorithms cannot schedule ahead, so they sleep until
    /// the denial's `retry_after` and try again while the deadline allows (as does a key under a
    /// penalty). Time passes on tokio's timer
    /// (needs a tokio runtime with time enabled); the deadline is measured there too, so a
    /// [`FakeClock`](crate::FakeClock) that never moves cannot make it wait forever.
    /// `Duration::MAX` (or any wait past the timer's range) means no deadline.
    pub async fn until_ready_in(
        &self,
        key: &K,
        plan: PlanId,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        // Every part a bucket: a reservation's denial is final (its slot is past the deadline
        // however long we wait).
        let schedules = self.schedules(plan)?;
        // A wait too long for the timer's instants (`Duration::MAX`) has no deadline.
        let deadline = tokio::time::Instant::now().checked_add(max_wait);
        loop {
            let left = deadline.map_or(Duration::MAX, |d| {
                d.saturating_duration_since(tokio::time::Instant::now())
            });
            let d = self.reserve_in(key, plan, cost, left)?;
            if d.is_allowed() {
                if !d.delay().is_zero() {
                    tokio::time::sleep(d.delay()).await;
                }
                return Ok(d);
            }
            let retry = d.retry_after();
            if retry.is_zero() || retry > left || (schedules && d.reason() == Reason::Limited) {
                return Ok(d);
            }
            tokio::time::sleep(retry).await;
        }
    }
}
