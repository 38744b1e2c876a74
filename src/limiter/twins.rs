//! A limiter without the `redis` feature: every call is decided in process, and the async
//! twins answer at once.

use std::hash::Hash;
use std::time::Duration;

use super::Limiter;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::Error;
use crate::plan::PlanId;

/// The async twins without the `redis` feature, where every limiter is in process: each answers
/// at once with its synchronous call (with the feature they are defined beside exact mode, which
/// awaits Redis), so code written once runs on every backend.
impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limiter<K, C> {
    /// [`check`](Self::check) on every backend (in process: `check` itself).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// use tollgate::{Limiter, Quota};
    /// let limiter = Limiter::<u64>::builder().quota(Quota::per_second(1)).build()?;
    /// assert!(limiter.check_async(&7).await.is_allowed());
    /// assert!(!limiter.check_async(&7).await.is_allowed());
    /// # Ok::<(), tollgate::Error>(()) }).unwrap();
    /// ```
    pub async fn check_async(&self, key: &K) -> Decision {
        self.check(key)
    }

    /// [`check_in`](Self::check_in) on every backend (in process: `check_in` itself).
    pub async fn check_in_async(
        &self,
        key: &K,
        plan: PlanId,
        cost: u64,
    ) -> Result<Decision, Error> {
        self.check_in(key, plan, cost)
    }

    /// [`peek_in`](Self::peek_in) on every backend (in process: `peek_in` itself).
    pub async fn peek_in_async(&self, key: &K, plan: PlanId, cost: u64) -> Result<Decision, Error> {
        self.peek_in(key, plan, cost)
    }

    /// [`reset`](Self::reset) on every backend (in process: `reset` itself).
    pub async fn reset_async(&self, key: &K) -> Result<bool, Error> {
        Ok(self.reset(key))
    }

    /// [`reserve_in`](Self::reserve_in) on every backend (in process: `reserve_in` itself).
    pub async fn reserve_in_async(
        &self,
        key: &K,
        plan: PlanId,
        cost: u64,
        max_delay: Duration,
    ) -> Result<Decision, Error> {
        self.reserve_in(key, plan, cost, max_delay)
    }

    /// In process, the engine decides every call: no remote answer (see exact mode's).
    #[inline(always)]
    pub(crate) fn remote_answer(
        &self,
        _key: &K,
        _plan: PlanId,
        _req: super::engine::Request,
        _mode: crate::cell::Mode,
    ) -> Option<Result<Decision, Error>> {
        None
    }
}
