//! What a limiter tells about itself: its stats (per plan, per rule), its size and store.

use std::hash::Hash;

use super::{Limiter, Map};
use crate::clock::Clock;
use crate::plan::PlanId;
use crate::stats::{Count, PlanStats, RuleStats, Stats};
use crate::store::{RuleId, Store, StoreKind};

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limiter<K, C> {
    /// Counts under `plan` a request that another limit of the same call denied
    /// (`elsewhere`; see [`PlanStats`]): in place of `counted`, what this plan's own decision
    /// counted on this thread (an admission or a soft pass, taken back), or on its own. With
    /// `elsewhere` false only `counted` is taken back (the call failed: nothing is counted).
    pub(crate) fn recount(&self, plan: PlanId, counted: Option<Count>, elsewhere: bool) {
        // The plan's counts: a plan change meanwhile keeps them (they move to the new book).
        let Ok(plan) = self.book.current().get(plan) else {
            return;
        };
        if let Some(c) = counted {
            plan.counts.uncount(c);
        }
        if elsewhere {
            plan.counts.count(Count::DeniedElsewhere, 0);
        }
    }
    /// Counts a decision made for `plan` elsewhere (exact mode, on Redis) in the plan's stats.
    #[cfg(feature = "redis")]
    pub(crate) fn count_external(&self, plan: PlanId, d: &crate::Decision) {
        if let Ok(p) = self.book.current().get(plan) {
            p.counts.count(Count::of(d), 0);
        }
    }
    /// Whether the limiter is synced through Redis (`Builder::redis_synced`, feature `redis`).
    pub fn is_synced(&self) -> bool {
        self.backend.is_synced()
    }
    /// Which store this limiter runs on: the one asked for, or [`StoreKind::Dash`] where a flat
    /// table for `max_keys` cannot be mapped.
    pub fn store_kind(&self) -> StoreKind {
        match self.store {
            Map::Dash(_) => StoreKind::Dash,
            Map::Flat(_) => StoreKind::Flat,
        }
    }
    /// Bytes the store holds outside the global allocator: the flat store's slot table (mapped
    /// from the operating system, resident only where keys landed); 0 for the dash store. Add it
    /// to what a counting allocator reports for the whole footprint.
    pub fn table_bytes(&self) -> usize {
        match &self.store {
            Map::Dash(_) => 0,
            Map::Flat(s) => s.table_bytes(),
        }
    }
    /// States tracked now: one per (key, rule) in use.
    pub fn len(&self) -> usize {
        on_store!(&self.store, s => s.len())
    }
    /// True when no state is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The counters (cheap: sums a few cache lines).
    pub fn stats(&self) -> Stats {
        let book = self.book.current();
        self.counters
            .snapshot(book.plans.iter().map(|p| &p.counts), self.len())
    }
    /// Each plan's decisions so far, in the order the plans were added (`"default"` first):
    /// exact, and summing to [`stats`](Self::stats)' decision counts. A plan's own calls and
    /// its share of [`check_all`](crate::check_all) count under it, each for what the plan decided: a
    /// [`check_all`](crate::check_all) that another part denied is [`PlanStats::denied_elsewhere`] here, not
    /// `denied`.
    ///
    /// ```
    /// use tollgate::{FakeClock, Limiter, Plan, Quota};
    /// let limiter = Limiter::<u64, _>::builder()
    ///     .quota(Quota::per_minute(2))
    ///     .plan("pro", Plan::new([Quota::per_minute(100)]))
    ///     .clock(FakeClock::new())
    ///     .build()?;
    /// let pro = limiter.plan("pro").unwrap();
    /// for _ in 0..3 {
    ///     let _ = limiter.check(&1);
    ///     let _ = limiter.check_in(&2, pro, 1)?;
    /// }
    /// let stats = limiter.plan_stats();
    /// assert_eq!((stats[0].plan.as_str(), stats[0].allowed, stats[0].denied), ("default", 2, 1));
    /// assert_eq!((stats[1].plan.as_str(), stats[1].allowed, stats[1].denied), ("pro", 3, 0));
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn plan_stats(&self) -> Vec<PlanStats> {
        self.book
            .current()
            .plans
            .iter()
            .map(|p| p.counts.plan_stats(&p.name))
            .collect()
    }
    /// Each rule's states and evictions, for every rule a plan lists now (a rule is one quota,
    /// shared by the plans that list it), in plan order.
    ///
    /// Contention: counts the states by a scan of the whole table, taking each shard's read
    /// lock in turn (about a millisecond a million slots); for a metrics scrape, not a hot path.
    ///
    /// ```
    /// use tollgate::{Limiter, Quota};
    /// let limiter = Limiter::<u64>::builder().quota(Quota::per_second(10)).build()?;
    /// assert!(limiter.check(&1).is_allowed() && limiter.check(&2).is_allowed());
    /// let rules = limiter.rule_stats();
    /// assert_eq!(rules[0].rule, "token_bucket 10/1s");
    /// assert_eq!((rules[0].plans.as_slice(), rules[0].keys), (&["default.0".to_string()][..], 2));
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn rule_stats(&self) -> Vec<RuleStats> {
        let book = self.book.current();
        let mut keys = [0u64; crate::store::MAX_RULES];
        on_store!(&self.store, s => s.count_by_rule(&mut keys));
        let mut out: Vec<(RuleId, RuleStats)> = Vec::new();
        for plan in &book.plans {
            for (i, part) in plan.parts.iter().enumerate() {
                let name = format!("{}.{i}", plan.name);
                match out.iter_mut().find(|(id, _)| *id == part.id) {
                    Some((_, r)) => r.plans.push(name),
                    None => out.push((
                        part.id,
                        RuleStats {
                            rule: part.rule.describe(),
                            plans: vec![name],
                            keys: keys[usize::from(part.id)],
                            evictions: self.counters.evictions_of(part.id),
                        },
                    )),
                }
            }
        }
        out.into_iter().map(|(_, r)| r).collect()
    }
    /// Publishes [`stats`](Self::stats) through the `metrics` facade (feature `metrics`),
    /// labelled `limiter = name` (see [`Stats::publish`]), with each plan's decisions
    /// ([`plan_stats`](Self::plan_stats): counter `tollgate_plan_decisions_total`, labels `plan`
    /// and `outcome`) and each rule's states and evictions ([`rule_stats`](Self::rule_stats):
    /// gauge `tollgate_rule_keys` and counter `tollgate_rule_evictions_total`, label `rule`).
    /// Call it from a timer or a scrape: it scans the table for the states by rule.
    ///
    /// ```
    /// use tollgate::{Limiter, Quota};
    /// let limiter = Limiter::<u64>::builder().quota(Quota::per_second(5)).build()?;
    /// limiter.check(&1);
    /// limiter.publish_metrics("api"); // a no-op until a recorder is installed
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    #[cfg(feature = "metrics")]
    pub fn publish_metrics(&self, name: &str) {
        let base = crate::stats::publish::limiter(name);
        crate::stats::publish::totals(&base, &self.stats());
        crate::stats::publish::breakdown(&base, &self.plan_stats(), &self.rule_stats());
    }
    /// Heap bytes held by state beyond the table's slots (sliding logs, the dash store's cells,
    /// penalties).
    pub fn state_heap_bytes(&self) -> usize {
        on_store!(&self.store, s => s.sum_cells(crate::cell::Cell::heap_bytes))
            + self.penalties.heap_bytes()
    }
}
