//! `Limiter`'s calls: checks, peeks, reservations, plans, resets, penalties. A module of their
//! own because rustdoc lists a type's methods module by module, child modules before their
//! parent: declared right after `builder`, they open the `Limiter` page, before the
//! statistics, Redis and async calls of the modules declared after it.

use super::*;

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limiter<K, C> {
    /// Checks one unit for `key` under the default plan.
    ///
    /// ```
    /// use tollgate::{Limiter, Quota, Reason};
    /// let limiter = Limiter::<u64>::builder().quota(Quota::per_minute(60).burst(2)).build()?;
    /// assert!(limiter.check(&7).is_allowed());
    /// assert!(limiter.check(&7).is_allowed());
    /// let third = limiter.check(&7);
    /// assert_eq!(third.reason(), Reason::Limited);
    /// assert!(third.retry_after().as_millis() > 900); // about one second: 60 a minute
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    // Always inlined: the short path is small (the rest is out of line in `check_general`), and
    // inlined into its caller it drops the work for the decision's fields the caller never
    // reads.
    #[inline(always)]
    pub fn check(&self, key: &K) -> Decision {
        match &self.store {
            Map::Flat(s) => {
                let hash = s.hash(key);
                let now = clamp_now(self.clock.now());
                match self.check_inline(s, hash, now) {
                    Some(d) => d,
                    None => self.check_general(key, hash, now),
                }
            }
            Map::Dash(_) => {
                self.check_general(key, self.key_hash(key), clamp_now(self.clock.now()))
            }
        }
    }

    /// [`check`](Self::check) on the general path (out of line, so the short one stays small).
    #[inline(never)]
    pub(super) fn check_general(&self, key: &K, hash: u64, now: u64) -> Decision {
        // The short path was tried by `check`: do not probe again.
        let req = Request { hash, now, cost: 1 };
        self.decide_at(key, PlanId::DEFAULT, req, Mode::Check, false)
            .unwrap_or_else(|_| Decision::denied(Reason::Limited, 0))
    }

    /// The short path of [`check`](Self::check) and [`check_many`](Self::check_many): one unit
    /// under the default plan at `now` (see [`charge_short`](Self::charge_short)).
    ///
    /// The clock is read before the probe: issued first, the TSC read overlaps the probe's loads.
    #[inline(always)]
    pub(super) fn check_inline(&self, s: &FlatStore<K>, hash: u64, now: u64) -> Option<Decision> {
        let words = self.book.current().default_words.as_ref()?;
        self.charge_short(s, words, hash, now, 1)
    }

    /// A call of `cost` units (a cost the plan can admit, checked by the caller) on the short
    /// path ([`charge_words`](Self::charge_words)), with the plan's strategy and counted: the
    /// same decision, state and count as [`decide_at`](Self::decide_at). `None`, having changed
    /// nothing, where the short path does not apply.
    #[inline(always)]
    pub(super) fn charge_short<const N: usize>(
        &self,
        s: &FlatStore<K>,
        words: &Words<N>,
        hash: u64,
        now: u64,
        cost: u64,
    ) -> Option<Decision> {
        let tally = words.counts.tally();
        let req = Request { hash, now, cost };
        let charged = self.charge_words(s, words, req, false, None)?;
        let mut d = charged.decision;
        // A denial on the short path is over quota (`Reason::Limited`): a new state's
        // table-full denial and a blocked key's are decided on the general path.
        let count = if d.allowed {
            Count::Allowed
        } else if let Some(strategy) = words.lenient.strategy() {
            soften(strategy, &mut d);
            Count::of(&d)
        } else {
            Count::Denied
        };
        debug_assert_eq!(count, Count::of(&d));
        tally.add(count, charged.retries);
        Some(d)
    }

    /// The hash a key's states and penalty are found by: the flat store's (one hash for every
    /// rule of the key), or the penalty table's own on the dash store.
    #[inline]
    pub(crate) fn key_hash(&self, key: &K) -> u64 {
        match &self.store {
            Map::Flat(s) => s.hash(key),
            Map::Dash(_) => self.penalties.hash(key),
        }
    }

    /// Checks `cost` units for `key` under the default plan. A cost above what the plan can ever
    /// admit is an error, not a denial.
    ///
    /// ```
    /// use tollgate::{Error, Limiter, Quota};
    /// let limiter = Limiter::<&str>::builder().quota(Quota::per_second(10)).build()?;
    /// assert_eq!(limiter.check_n(&"upload", 4)?.remaining(), 6);
    /// assert!(matches!(limiter.check_n(&"upload", 11), Err(Error::CostExceedsCapacity { .. })));
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn check_n(&self, key: &K, cost: u64) -> Result<Decision, Error> {
        self.decide(key, PlanId::DEFAULT, cost, Mode::Check)
    }

    /// Checks `cost` units for `key` under `plan` (resolved per request, e.g. from the caller's
    /// account), with that plan's strategy. Each of the plan's quotas is its own state for the
    /// key, shared with every other plan that lists an equal quota. A `plan` another limiter
    /// issued is [`Error::ForeignPlan`].
    ///
    /// ```
    /// use tollgate::{Limiter, Plan, Quota};
    /// let limiter = Limiter::<u64>::builder()
    ///     .plan("free", Plan::new([Quota::per_minute(2)]))
    ///     .plan("pro", Plan::new([Quota::per_minute(100)]))
    ///     .build()?;
    /// let (free, pro) = (limiter.plan("free").unwrap(), limiter.plan("pro").unwrap());
    /// assert!(limiter.check_in(&1, free, 2)?.is_allowed());
    /// assert!(!limiter.check_in(&1, free, 1)?.is_allowed());
    /// // The same key under another plan is another state: free's spending does not count there.
    /// assert_eq!(limiter.check_in(&1, pro, 1)?.remaining(), 99);
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn check_in(&self, key: &K, plan: PlanId, cost: u64) -> Result<Decision, Error> {
        self.decide(key, plan, cost, Mode::Check)
    }

    /// Checks one unit for each of `keys` under the default plan, writing the decision for
    /// `keys[i]` to `out[i]`; returns how many were checked (the shorter of the two lengths).
    ///
    /// The same decisions as calling [`check`](Self::check) in order; for callers holding many
    /// requests at once (a batch from a socket, a queue), whose table lookups can overlap.
    ///
    /// ```
    /// use tollgate::{Decision, FakeClock, Limiter, Quota};
    /// let limiter = Limiter::<u64, _>::builder()
    ///     .quota(Quota::per_second(1))
    ///     .clock(FakeClock::new())
    ///     .build()?;
    /// let keys = [1, 2, 1];
    /// let mut out = [limiter.peek(&0); 3];
    /// assert_eq!(limiter.check_many(&keys, &mut out), 3);
    /// let allowed: Vec<bool> = out.iter().map(Decision::is_allowed).collect();
    /// assert_eq!(allowed, [true, true, false]);
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    ///
    /// With the flat store, a batch hashes a chunk of keys and asks the CPU to fetch each one's
    /// slot before checking the first, so the cache misses of a large table overlap instead of
    /// following one another. Each chunk is checked at one clock reading.
    pub fn check_many(&self, keys: &[K], out: &mut [Decision]) -> usize {
        /// Keys whose slots are in flight at once: enough to cover a DRAM miss with the work of
        /// the checks before it, few enough for the CPU's line fill buffers.
        const CHUNK: usize = 16;
        let n = keys.len().min(out.len());
        let Map::Flat(s) = &self.store else {
            for (key, d) in keys[..n].iter().zip(&mut out[..n]) {
                *d = self.check(key);
            }
            return n;
        };
        let rule = self
            .book
            .current()
            .default_words
            .as_ref()
            .map_or(0, |w| w.ids[0]);
        let mut hashes = [0u64; CHUNK];
        for (keys, out) in keys[..n].chunks(CHUNK).zip(out[..n].chunks_mut(CHUNK)) {
            for (h, key) in hashes.iter_mut().zip(keys) {
                *h = s.hash(key);
                s.prefetch_state(*h, rule);
            }
            let now = clamp_now(self.clock.now());
            for ((key, d), h) in keys.iter().zip(out).zip(hashes) {
                *d = match self.check_inline(s, h, now) {
                    Some(d) => d,
                    None => self.check_general(key, h, now),
                };
            }
        }
        n
    }

    /// What [`check`](Self::check) would answer, charging nothing and inserting nothing (under a
    /// queue strategy, the reservation it would make).
    ///
    /// ```
    /// use tollgate::{Limiter, Quota};
    /// let limiter = Limiter::<u64>::builder().quota(Quota::per_second(1)).build()?;
    /// assert!(limiter.peek(&3).is_allowed());
    /// assert!(limiter.peek(&3).is_allowed()); // nothing was charged
    /// assert!(limiter.check(&3).is_allowed());
    /// assert!(!limiter.peek(&3).is_allowed());
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn peek(&self, key: &K) -> Decision {
        self.decide(key, PlanId::DEFAULT, 1, Mode::Peek)
            .unwrap_or_else(|_| Decision::denied(Reason::Limited, 0))
    }

    /// What [`check_in`](Self::check_in) would answer, charging nothing.
    pub fn peek_in(&self, key: &K, plan: PlanId, cost: u64) -> Result<Decision, Error> {
        self.decide(key, plan, cost, Mode::Peek)
    }

    /// Reserves `cost` units for a moment at most `max_delay` away: the decision's
    /// [`delay`](Decision::delay) says how long to wait before proceeding. Bucket algorithms
    /// schedule ahead; window algorithms admit only what passes now.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{FakeClock, Limiter, Quota};
    /// let limiter = Limiter::<u64, _>::builder()
    ///     .quota(Quota::per_second(10).burst(1))
    ///     .clock(FakeClock::new())
    ///     .build()?;
    /// assert_eq!(limiter.reserve(&1, 1, Duration::from_secs(1))?.delay(), Duration::ZERO);
    /// let later = limiter.reserve(&1, 1, Duration::from_secs(1))?;
    /// assert!(later.is_allowed());
    /// assert_eq!(later.delay(), Duration::from_millis(100)); // go in 100 ms
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn reserve(&self, key: &K, cost: u64, max_delay: Duration) -> Result<Decision, Error> {
        self.decide(key, PlanId::DEFAULT, cost, Mode::Reserve(nanos(max_delay)))
    }

    /// [`reserve`](Self::reserve) under `plan`.
    pub fn reserve_in(
        &self,
        key: &K,
        plan: PlanId,
        cost: u64,
        max_delay: Duration,
    ) -> Result<Decision, Error> {
        self.decide(key, plan, cost, Mode::Reserve(nanos(max_delay)))
    }

    /// Whether every part of `plan` is a bucket, which schedules reservations ahead (windows
    /// admit now or deny).
    #[cfg(feature = "tokio")]
    pub(crate) fn schedules(&self, plan: PlanId) -> Result<bool, Error> {
        let book = self.book.current();
        let plan = book.get(plan)?;
        Ok(plan
            .parts
            .iter()
            .all(|p| p.rule.kind == crate::algo::Kind::Gcra))
    }

    /// The plan called `name`: an id for this limiter's calls (and only this limiter's: see
    /// [`PlanId`]), which stays the plan's when [`set_plan`](Self::set_plan) changes it.
    pub fn plan(&self, name: &str) -> Option<PlanId> {
        self.book.current().by_name.get(name).copied()
    }

    /// This limiter's own id of its default plan: the plan [`PlanId::DEFAULT`] names here, as
    /// [`plan`](Self::plan) gives it (for tables keyed by plan id).
    #[cfg(feature = "http")]
    pub(crate) fn default_plan_id(&self) -> PlanId {
        self.book.current().default_id()
    }

    /// The names of the plans, in [`PlanId`] order.
    pub fn plan_names(&self) -> Vec<String> {
        self.book
            .current()
            .plans
            .iter()
            .map(|p| p.name.clone())
            .collect()
    }

    /// Forgets `key` entirely: its state under every rule and its penalty (back to fresh).
    /// True if anything was tracked. A limiter on Redis forgets only what this process holds:
    /// [`reset_async`](Self::reset_async) forgets the key there too.
    ///
    /// ```
    /// use tollgate::{Limiter, Quota};
    /// let limiter = Limiter::<u64>::builder().quota(Quota::per_hour(1)).build()?;
    /// assert!(limiter.check(&9).is_allowed());
    /// assert!(!limiter.check(&9).is_allowed());
    /// assert!(limiter.reset(&9));
    /// assert!(limiter.check(&9).is_allowed());
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    ///
    /// Contention: one probe per rule the limiter has; the shard's write lock where a removed
    /// state lay outside its home group.
    pub fn reset(&self, key: &K) -> bool {
        let rules = self.book.current().rules.len();
        // AcqRel: a refund that reads the count after this reset (Acquire) sees it, and one
        // whose charge read it before cannot land (see `resets`).
        self.resets.fetch_add(1, crate::sync::Ordering::AcqRel);
        let blocked = self.penalties.remove(key);
        let mut removed = false;
        for id in 0..rules {
            removed |= on_store!(&self.store, s => s.remove(key, id as crate::store::RuleId));
        }
        if removed {
            self.forget_stale_from();
        }
        blocked || removed
    }

    /// A penalty: `key` is denied for `duration` from now under every plan, whatever its
    /// quotas say (an existing longer penalty stays). False when `max_keys` keys are under a
    /// penalty already (penalties that are over do not count, swept or not).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Limiter, Quota, Reason};
    /// let limiter = Limiter::<&str>::builder().quota(Quota::per_second(100)).build()?;
    /// assert!(limiter.block(&"mallory", Duration::from_secs(60)));
    /// assert_eq!(limiter.check(&"mallory").reason(), Reason::Blocked);
    /// assert!(limiter.check(&"alice").is_allowed());
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn block(&self, key: &K, duration: Duration) -> bool {
        let now = clamp_now(self.clock.now());
        let until = now.saturating_add(nanos(duration));
        self.penalties.block(self.key_hash(key), key, now, until)
    }

    /// Adds or replaces the plan called `name` on the live limiter; see the type's docs for what
    /// happens to keys already tracked. `"default"` is the plan [`check`](Self::check) uses.
    ///
    /// ```
    /// use tollgate::{FakeClock, Limiter, Plan, Quota};
    /// let limiter = Limiter::<u64, _>::builder()
    ///     .quota(Quota::per_minute(10))
    ///     .clock(FakeClock::new())
    ///     .build()?;
    /// assert_eq!(limiter.check_n(&1, 8)?.remaining(), 2);
    /// // Raise the limit: key 1 keeps what it spent (8 units of debt), now out of 20.
    /// limiter.set_plan("default", Plan::new([Quota::per_minute(20)]))?;
    /// assert_eq!(limiter.check(&1).remaining(), 11);
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    ///
    /// Contention: serialised with other plan changes; checks are never blocked.
    pub fn set_plan(&self, name: &str, plan: Plan) -> Result<PlanId, Error> {
        self.set_plans([(name, plan)])?;
        self.plan(name)
            .ok_or_else(|| Error::UnknownPlan(name.to_string()))
    }

    /// Adds or replaces several plans at once, all or none: on an error no plan has changed.
    /// Each is replaced as [`set_plan`](Self::set_plan) replaces it; plans not named stay.
    ///
    /// ```
    /// use tollgate::{FakeClock, Limiter, Plan, Quota};
    /// let limiter = Limiter::<u64, _>::builder()
    ///     .plan("free", Plan::new([Quota::per_minute(10)]))
    ///     .clock(FakeClock::new())
    ///     .build()?;
    /// limiter.set_plans([
    ///     ("free", Plan::new([Quota::per_minute(20)])),
    ///     ("pro", Plan::new([Quota::per_minute(100)])),
    /// ])?;
    /// assert_eq!(limiter.plan_names(), ["free", "pro"]);
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn set_plans<'n>(
        &self,
        plans: impl IntoIterator<Item = (&'n str, Plan)>,
    ) -> Result<(), Error> {
        let mut current = crate::sync::lock(&self.plans);
        let mut next = current.clone();
        let mut changed = Vec::new();
        for (name, plan) in plans {
            match next.iter_mut().find(|(n, _)| n == name) {
                Some(slot) => slot.1 = plan,
                None => next.push((name.to_string(), plan)),
            }
            changed.push(name);
        }
        let book = Book::compile(
            &next,
            self.clock.unix_epoch_ns(),
            Some(self.book.current()),
            matches!(self.store, Map::Flat(_)) && !self.is_synced(),
        )?;
        self.backend.plans_changed(&next, &book)?;
        self.book.install(book);
        *current = next;
        #[cfg(feature = "tracing")]
        for plan in changed {
            tracing::info!(target: "tollgate", plan, "plan changed");
        }
        #[cfg(not(feature = "tracing"))]
        let _ = changed;
        Ok(())
    }

    /// The limiter's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Binds `key` (under the default plan) for [`check_all`].
    pub fn key<'a>(&'a self, key: &'a K) -> Bound<'a, K, C> {
        Bound {
            limiter: self,
            key,
            plan: PlanId::DEFAULT,
        }
    }

    /// Binds `key` under `plan` for [`check_all`].
    pub fn key_in<'a>(&'a self, key: &'a K, plan: PlanId) -> Bound<'a, K, C> {
        Bound {
            limiter: self,
            key,
            plan,
        }
    }

    /// The denial of a new state when the table is full.
    pub(super) fn table_full(&self, plan: &Compiled) -> Decision {
        #[cfg(feature = "tracing")]
        tracing::debug!(
            target: "tollgate",
            keys = self.len(),
            "table full: a new state was denied (Reason::TableFull)"
        );
        Decision {
            limit: plan.parts[0].rule.capacity,
            ..Decision::denied(Reason::TableFull, self.full_retry_ns)
        }
    }

    /// The whole decision path: plan, cost, strategy, states, stats.
    #[inline(always)]
    pub(super) fn decide(
        &self,
        key: &K,
        plan: PlanId,
        cost: u64,
        mode: Mode,
    ) -> Result<Decision, Error> {
        let now = clamp_now(self.clock.now());
        let req = Request {
            hash: self.key_hash(key),
            now,
            cost,
        };
        self.decide_at(key, plan, req, mode, true)
    }

    /// [`decide`](Self::decide) of the request `req` (the key's hash, the time, the cost);
    /// `short`: whether to try the short path first (a caller that just tried it passes false).
    #[inline(always)]
    pub(super) fn decide_at(
        &self,
        key: &K,
        plan_id: PlanId,
        req: Request,
        mode: Mode,
        short: bool,
    ) -> Result<Decision, Error> {
        let Request { hash, now, cost } = req;
        let book = self.book.current();
        let plan = book.get(plan_id)?;
        plan.check_cost(cost)?;
        let mode = plan.mode(mode);
        if let (Map::Flat(s), Mode::Check, true) = (&self.store, mode, short) {
            // Known states of a one-part plan (as `check` takes them) or of a two-part one
            // (the semantics of `charge_parts`): the short paths.
            let fast = match &plan.short {
                Short::One(words) => self.charge_short(s, words, hash, now, cost),
                Short::Two(words) => self.charge_short(s, words, hash, now, cost),
                Short::None => None,
            };
            if let Some(d) = fast {
                return Ok(d);
            }
        }
        if let Some(answer) = self.remote_answer(key, plan_id, req, mode) {
            let mut d = answer?;
            self.settle(plan, &mut d, 0, mode);
            return Ok(d);
        }
        let call = Call::new(book, key, req, plan, mode);
        let (mut d, retries) = match self.charge(call, plan) {
            Ok(charged) => charged,
            Err(Full) => (self.table_full(plan), 0),
        };
        self.settle(plan, &mut d, retries, mode);
        Ok(d)
    }

    /// The last step of every decision: the plan's soft or shadow strategy lets a denied
    /// request through (flagged), and the outcome is counted (a peek counts nothing).
    #[inline(always)]
    pub(super) fn settle(&self, plan: &Compiled, d: &mut Decision, retries: u32, mode: Mode) {
        soften(plan.strategy, d);
        if !mode.is_peek() {
            plan.counts.count(Count::of(d), retries);
        }
    }
}
