//! Per-limiter counters, striped so that counting on the hot path does not bounce one cache line
//! between cores: each thread adds to its own stripe, and a read sums the stripes.
//!
//! A thread's stripe is the one at its index, an index no other live thread holds, so it is the
//! stripe's only writer and counts there with a plain load and store (no locked instruction: a
//! `lock xadd` was a quarter of a denial's cost). A thread whose index is past the stripes (more
//! live threads than twice the cores) counts with `fetch_add` on the shared stripe. A thread's
//! index (and with it its stripes) passes to the next thread started after it exited (after its
//! thread-local destructors ran).

use std::sync::Arc;

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicU64, Ordering, StaticMutex};

/// A snapshot of a limiter's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Requests admitted (including those admitted after a delay).
    pub allowed: u64,
    /// Requests this limiter denied (over quota, blocked, or a full table).
    pub denied: u64,
    /// Requests over quota let through by a soft strategy.
    pub soft_passed: u64,
    /// Requests a limit in shadow mode would have denied, let through unmarked
    /// ([`Strategy::Shadow`](crate::Strategy::Shadow)); not in `allowed`, `denied` or
    /// `table_full`.
    pub shadow_passed: u64,
    /// Denials of new keys because the table was at `max_keys`.
    pub table_full: u64,
    /// Requests this limiter did not deny that another limit of the same call did (a later or
    /// earlier part of [`check_all`](crate::check_all), another rule of the HTTP layer), so
    /// nothing of them stays charged here: not in `allowed`, not in `denied`.
    pub denied_elsewhere: u64,
    /// Keys in the table now.
    pub keys: u64,
    /// Keys evicted to make room for new ones (only ever fresh ones).
    pub evictions: u64,
    /// Sweep steps run: calls of [`Limiter::sweep_once`](crate::Limiter::sweep_once) (and
    /// `sweep_now`, the sweeper's steps, housekeeping's, and the walks of new states at the
    /// cap), whatever number of shards each visits.
    pub sweeps: u64,
    /// Keys removed by sweeping.
    pub swept: u64,
    /// Compare-and-swap attempts lost to another thread (a measure of contention).
    pub cas_retries: u64,
}

#[cfg(feature = "metrics")]
impl Stats {
    /// Publishes these figures through the [`metrics`] facade, each labelled `limiter = name`:
    /// counters `tollgate_decisions_total` (label `outcome`: allowed, denied, soft_passed, shadow_passed,
    /// table_full, denied_elsewhere), `tollgate_evictions_total`, `tollgate_sweeps_total`,
    /// `tollgate_swept_keys_total`, `tollgate_cas_retries_total` (set to their totals, so calling
    /// again never counts twice) and the gauge `tollgate_keys`. The same names as the HTTP
    /// layer's Prometheus text.
    pub fn publish(&self, name: &str) {
        publish::totals(&publish::limiter(name), self);
    }
}

/// Publishing through the `metrics` facade: one place for every name, used by
/// [`Stats::publish`], `Limiter::publish_metrics` and the HTTP layer (whose `/metrics` text is
/// these same calls rendered by metrics-exporter-prometheus).
#[cfg(feature = "metrics")]
pub(crate) mod publish {
    use metrics::{Label, counter, describe_counter, describe_gauge, gauge};

    use super::{PlanStats, RuleStats, Stats};

    /// The labels of limiter `name`.
    pub(crate) fn limiter(name: &str) -> Vec<Label> {
        vec![Label::new("limiter", name.to_string())]
    }

    /// `base` and more.
    fn with(base: &[Label], more: &[(&'static str, &str)]) -> Vec<Label> {
        let mut labels = base.to_vec();
        labels.extend(more.iter().map(|(k, v)| Label::new(*k, v.to_string())));
        labels
    }

    /// The descriptions (`# HELP` lines) of every name published here.
    pub(crate) fn describe() {
        describe_counter!(
            "tollgate_decisions_total",
            "Limiter decisions by outcome (one per limit checked)."
        );
        describe_gauge!("tollgate_keys", "States tracked now, one per (key, rule).");
        describe_counter!(
            "tollgate_evictions_total",
            "Fresh states evicted to make room."
        );
        describe_counter!("tollgate_sweeps_total", "Sweep steps run.");
        describe_counter!("tollgate_swept_keys_total", "States removed by sweeping.");
        describe_counter!(
            "tollgate_cas_retries_total",
            "Compare-and-swap attempts lost to another thread."
        );
        describe_counter!(
            "tollgate_plan_decisions_total",
            "Decisions under each plan, by outcome."
        );
        describe_gauge!("tollgate_rule_keys", "States of each rule held now.");
        describe_counter!(
            "tollgate_rule_evictions_total",
            "States of each rule evicted to make room."
        );
    }

    /// The limiter's totals.
    pub(crate) fn totals(base: &[Label], st: &Stats) {
        for (outcome, v) in [
            ("allowed", st.allowed),
            ("denied", st.denied),
            ("soft_passed", st.soft_passed),
            ("shadow_passed", st.shadow_passed),
            ("table_full", st.table_full),
            ("denied_elsewhere", st.denied_elsewhere),
        ] {
            counter!(
                "tollgate_decisions_total",
                with(base, &[("outcome", outcome)])
            )
            .absolute(v);
        }
        for (metric, v) in [
            ("tollgate_evictions_total", st.evictions),
            ("tollgate_sweeps_total", st.sweeps),
            ("tollgate_swept_keys_total", st.swept),
            ("tollgate_cas_retries_total", st.cas_retries),
        ] {
            counter!(metric, base.to_vec()).absolute(v);
        }
        gauge!("tollgate_keys", base.to_vec()).set(st.keys as f64);
    }

    /// Each plan's decisions (label `plan`) and each rule's states and evictions (label
    /// `rule`, the rule in words).
    pub(crate) fn breakdown(base: &[Label], plans: &[PlanStats], rules: &[RuleStats]) {
        for p in plans {
            for (outcome, v) in [
                ("allowed", p.allowed),
                ("denied", p.denied),
                ("soft_passed", p.soft_passed),
                ("shadow_passed", p.shadow_passed),
                ("table_full", p.table_full),
                ("denied_elsewhere", p.denied_elsewhere),
            ] {
                let labels = with(base, &[("plan", &p.plan), ("outcome", outcome)]);
                counter!("tollgate_plan_decisions_total", labels).absolute(v);
            }
        }
        for r in rules {
            let labels = with(base, &[("rule", &r.rule)]);
            gauge!("tollgate_rule_keys", labels.clone()).set(r.keys as f64);
            counter!("tollgate_rule_evictions_total", labels).absolute(r.evictions);
        }
    }
}

/// One plan's decisions so far ([`Limiter::plan_stats`](crate::Limiter::plan_stats)): exact
/// per plan, and together the decision counts of [`Stats`]. A plan replaced by
/// [`set_plan`](crate::Limiter::set_plan) keeps counting under its name.
///
/// Each request under the plan counts once, for what the plan itself decided: `allowed`,
/// `denied` (with `table_full` among them) or `soft_passed`, or, when another limit of the same
/// call denied it ([`check_all`](crate::check_all)'s other parts, the HTTP layer's other
/// rules), `denied_elsewhere`. So a request that a per-user plan admitted and a global limit
/// denied is `denied_elsewhere` for the user's plan (its charge refunded) and `denied` for the
/// global limit's.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PlanStats {
    /// The plan's name (`"default"` for the quota of [`Builder::quota`](crate::Builder::quota)).
    pub plan: String,
    /// Requests admitted under the plan.
    pub allowed: u64,
    /// Requests the plan denied (over quota, blocked, or a full table).
    pub denied: u64,
    /// Requests over quota let through by the plan's soft strategy.
    pub soft_passed: u64,
    /// Requests the plan in shadow mode would have denied, let through unmarked.
    pub shadow_passed: u64,
    /// Denials of new states under the plan because the table was at `max_keys`.
    pub table_full: u64,
    /// Requests the plan did not deny that another limit of the same call did: admitted here
    /// and refunded, or never decided here (a part after the one that denied).
    pub denied_elsewhere: u64,
}

/// One rule's states ([`Limiter::rule_stats`](crate::Limiter::rule_stats)): a rule is one
/// quota (algorithm, limit, period, burst), whichever plans list it; each key it is checked
/// for holds one state of it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RuleStats {
    /// The rule in words: `token_bucket 100/1m burst 20`.
    pub rule: String,
    /// The plans that list it now, as `plan.part` (`pro.0`), in plan order.
    pub plans: Vec<String>,
    /// States of the rule held now.
    pub keys: u64,
    /// States of the rule evicted (only ever fresh ones) to make room for new ones.
    pub evictions: u64,
}

/// Counters a thread bumps on the hot path.
#[derive(Default)]
struct Stripe {
    /// One counter per [`Count`], indexed by it (a table-full denial also counts as denied).
    counts: [AtomicU64; Count::KINDS],
    cas_retries: AtomicU64,
}

/// What a check adds to the counters (the index of its counter in a stripe).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Count {
    Allowed = 0,
    Denied = 1,
    SoftPassed = 2,
    TableFull = 3,
    /// Another limit of the same call denied the request (see [`PlanStats::denied_elsewhere`]).
    DeniedElsewhere = 4,
    ShadowPassed = 5,
}

impl Count {
    /// How many kinds of count there are (the length of a stripe's `counts`).
    const KINDS: usize = Count::ShadowPassed as usize + 1;

    /// The counter a decision adds to.
    pub(crate) fn of(d: &crate::Decision) -> Count {
        match d.reason {
            crate::Reason::SoftLimit => Count::SoftPassed,
            crate::Reason::Shadow => Count::ShadowPassed,
            crate::Reason::TableFull => Count::TableFull,
            _ if d.allowed => Count::Allowed,
            _ => Count::Denied,
        }
    }
}

/// The stripe a thread counts on (see [`Counters::tally`]).
pub(crate) struct Tally<'a> {
    stripe: &'a Stripe,
    /// `stripe` is the thread's own: it is the only writer.
    owned: bool,
}

impl Tally<'_> {
    #[inline(always)]
    pub(crate) fn add(&self, what: Count, retries: u32) {
        let s = self.stripe;
        // Relaxed (all counters): statistics, read as an approximate snapshot. An owned stripe
        // has one writer, so a load and a store lose nothing; the shared stripe takes one RMW
        // per add.
        let add = |c: &AtomicU64, n: u64| bump(c, n, self.owned);
        if what == Count::TableFull {
            add(&s.counts[Count::Denied as usize], 1);
        }
        add(&s.counts[what as usize], 1);
        if retries > 0 {
            add(&s.cas_retries, u64::from(retries));
        }
    }
}

/// One plan's decision counts, striped (see the module docs): the stripes then the shared
/// stripe, last. Shared by every book that has the plan, so a plan change keeps its counts.
#[derive(Clone)]
pub(crate) struct Counts(Arc<[CachePadded<Stripe>]>);

impl std::fmt::Debug for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut st = Stats::default();
        self.add_to(&mut st);
        f.debug_struct("Counts")
            .field("allowed", &st.allowed)
            .field("denied", &st.denied)
            .finish_non_exhaustive()
    }
}

/// What a limiter counts outside its plans: evictions (in all and by rule) and sweeps.
pub(crate) struct Counters {
    evictions: AtomicU64,
    /// Evictions by the evicted state's rule id (a limiter has at most 256 rules in its life).
    evictions_by_rule: Box<[AtomicU64]>,
    sweeps: AtomicU64,
    swept: AtomicU64,
}

/// Stripes per limiter: enough that threads up to twice the core count each get their own.
fn stripe_count() -> usize {
    let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
    (cores * 2).next_power_of_two().min(256)
}

/// The calling thread's index, which picks its stripe: the smallest index no live thread holds,
/// taken on first use and given back when the thread exits. A thread started after another one
/// ended inherits its index and so its stripes, so a program that replaces its threads, a pool
/// or a benchmark that spawns new ones per run, keeps counting on its own stripes instead of
/// piling onto the shared one. [`GIVEN_BACK`] once the thread has given its index back (a check
/// from another thread-local's destructor): larger than any stripe count, so it counts on the
/// shared stripe.
#[inline(always)]
fn stripe_index() -> usize {
    let held = INDEX.with(std::cell::Cell::get);
    if held == UNSET { take_index() } else { held }
}

/// Adds `n` to `c`: with a plain load and store when the caller's stripe is its own (`owned`:
/// the only writer), with one RMW on the shared stripe. Relaxed: statistics, read as an
/// approximate snapshot; a stripe's single writer loses nothing with a load and a store.
#[inline(always)]
fn bump(c: &AtomicU64, n: u64, owned: bool) {
    if owned {
        c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    } else {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// `N` counters striped as a plan's counts are (see the module docs): each thread adds to its
/// own stripe with a plain load and store, a read sums the stripes. For counters bumped on every
/// request outside the plans (the HTTP layer's), where a `lock xadd` per request was a tenth of
/// the layer's cost.
#[cfg(feature = "http")]
pub(crate) struct Striped<const N: usize>(Box<[CachePadded<[AtomicU64; N]>]>);

#[cfg(feature = "http")]
impl<const N: usize> Striped<N> {
    pub(crate) fn new() -> Self {
        Striped(
            (0..=stripe_count())
                .map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        )
    }

    /// Adds `n` to counter `i` on the calling thread's stripe (the shared one, last, for a
    /// thread past the stripes; always under loom, as [`Counts::tally`]).
    #[inline(always)]
    pub(crate) fn add(&self, i: usize, n: u64) {
        let shared = self.0.len() - 1;
        let at = stripe_index();
        let owned = at < shared && !cfg!(tollgate_loom);
        bump(&self.0[if owned { at } else { shared }][i], n, owned);
    }

    /// Counter `i` summed over the stripes.
    pub(crate) fn sum(&self, i: usize) -> u64 {
        // Relaxed: an approximate snapshot of statistics.
        self.0.iter().map(|s| s[i].load(Ordering::Relaxed)).sum()
    }
}

/// What [`INDEX`] holds before the thread's first count.
const UNSET: usize = usize::MAX - 1;

/// What [`INDEX`] holds once the thread gave its index back.
const GIVEN_BACK: usize = usize::MAX;

thread_local! {
    /// The thread's index (see [`stripe_index`]), or [`UNSET`] or [`GIVEN_BACK`]: a
    /// const-initialised cell with no destructor, so reading it is one thread-local load.
    /// [`RELEASE`] gives the index back.
    static INDEX: std::cell::Cell<usize> = const { std::cell::Cell::new(UNSET) };
    /// Gives the thread's index back when the thread exits (registered on first use).
    static RELEASE: GiveBack = const { GiveBack };
}

/// First use on this thread: takes an index and arranges for it to be given back at exit.
#[cold]
fn take_index() -> usize {
    let i = FreeIndices::take();
    // Registers the destructor (also from another thread-local's destructor: std runs
    // destructors registered during teardown too). Defensive: it could only fail once `RELEASE`
    // was destroyed, and its destructor leaves `GIVEN_BACK`, so this is never reached then; if
    // it were, the index must not outlive the thread: give it straight back.
    if RELEASE.try_with(|_| ()).is_err() {
        FreeIndices::give_back(i);
        return GIVEN_BACK;
    }
    INDEX.with(|c| c.set(i));
    i
}

/// Gives the thread's index back when dropped, at thread exit.
struct GiveBack;

/// Indices given back by exited threads, and the next never-used one.
struct FreeIndices {
    free: std::collections::BinaryHeap<std::cmp::Reverse<usize>>,
    next: usize,
}

/// Process-wide, because a thread's index must be the same in every limiter it counts in (it
/// picks the thread's stripe in each). Touched once when a thread first counts and once when it
/// exits.
static FREE_INDICES: StaticMutex<FreeIndices> = StaticMutex::new(FreeIndices {
    free: std::collections::BinaryHeap::new(),
    next: 0,
});

impl FreeIndices {
    fn lock() -> std::sync::MutexGuard<'static, FreeIndices> {
        // Poisoning carries nothing here: the heap and the counter are valid after any panic.
        FREE_INDICES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The smallest index no live thread holds.
    fn take() -> usize {
        let mut f = FreeIndices::lock();
        match f.free.pop() {
            Some(std::cmp::Reverse(i)) => i,
            None => {
                f.next += 1;
                f.next - 1
            }
        }
    }

    fn give_back(i: usize) {
        // The mutex orders the hand-over: this thread's last plain stores to its owned stripes
        // happen before the unlock, and the next thread to take this index locks after it, so
        // its first load of a counter sees the final value (no count is lost).
        FreeIndices::lock().free.push(std::cmp::Reverse(i));
    }
}

impl Drop for GiveBack {
    fn drop(&mut self) {
        // From here on this thread counts on the shared stripe (`GIVEN_BACK`): its index, and
        // with it its stripes, may belong to a new thread as soon as it is given back.
        let held = INDEX.with(|c| c.replace(GIVEN_BACK));
        // Always an index: `RELEASE` is registered only after one was taken (defensive check).
        if held != UNSET && held != GIVEN_BACK {
            FreeIndices::give_back(held);
        }
    }
}

impl Counts {
    pub(crate) fn new() -> Self {
        Counts(
            (0..=stripe_count())
                .map(|_| CachePadded::new(Stripe::default()))
                .collect(),
        )
    }

    #[inline(always)]
    pub(crate) fn count(&self, what: Count, retries: u32) {
        self.tally().add(what, retries);
    }

    /// Takes back one count of `what` that this thread added (a part of a call counted as
    /// admitted, then denied or failed by another part).
    #[inline]
    pub(crate) fn uncount(&self, what: Count) {
        let t = self.tally();
        let c = &t.stripe.counts[what as usize];
        // Relaxed, as `Tally::add`; the same thread added the count to the same stripe, so it
        // never goes below zero.
        if t.owned {
            c.store(c.load(Ordering::Relaxed) - 1, Ordering::Relaxed);
        } else {
            c.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Where the calling thread counts: its own stripe (the one at its index, which no other
    /// live thread holds) or the shared one. Looked up apart from the count, so a check can do
    /// it before its compare-and-swap loop (see `Limiter::check_inline`). Under loom every
    /// model thread shares one OS thread's index, so models always take the shared stripe.
    #[inline(always)]
    pub(crate) fn tally(&self) -> Tally<'_> {
        let stripes = &self.0;
        let shared = stripes.len() - 1;
        let i = stripe_index();
        if i < shared && !cfg!(tollgate_loom) {
            Tally {
                stripe: &stripes[i],
                owned: true,
            }
        } else {
            Tally {
                stripe: &stripes[shared],
                owned: false,
            }
        }
    }

    /// The plan called `plan`'s decisions.
    pub(crate) fn plan_stats(&self, plan: &str) -> PlanStats {
        let mut st = Stats::default();
        self.add_to(&mut st);
        PlanStats {
            plan: plan.to_string(),
            allowed: st.allowed,
            denied: st.denied,
            soft_passed: st.soft_passed,
            shadow_passed: st.shadow_passed,
            table_full: st.table_full,
            denied_elsewhere: st.denied_elsewhere,
        }
    }

    /// Adds these counts' decisions and retries to `st`.
    pub(crate) fn add_to(&self, st: &mut Stats) {
        for s in self.0.iter() {
            // Relaxed: an approximate snapshot of statistics.
            let n = |c: Count| s.counts[c as usize].load(Ordering::Relaxed);
            st.allowed += n(Count::Allowed);
            st.denied += n(Count::Denied);
            st.soft_passed += n(Count::SoftPassed);
            st.shadow_passed += n(Count::ShadowPassed);
            st.table_full += n(Count::TableFull);
            st.denied_elsewhere += n(Count::DeniedElsewhere);
            st.cas_retries += s.cas_retries.load(Ordering::Relaxed);
        }
    }
}

impl Counters {
    pub(crate) fn new() -> Self {
        Counters {
            evictions: AtomicU64::new(0),
            evictions_by_rule: (0..=usize::from(u8::MAX))
                .map(|_| AtomicU64::new(0))
                .collect(),
            sweeps: AtomicU64::new(0),
            swept: AtomicU64::new(0),
        }
    }

    pub(crate) fn evicted(&self, rule: u8) {
        // Relaxed (all): statistics.
        self.evictions.fetch_add(1, Ordering::Relaxed);
        self.evictions_by_rule[usize::from(rule)].fetch_add(1, Ordering::Relaxed);
    }

    /// One sweep step ([`Limiter::sweep_once`](crate::Limiter::sweep_once), however many
    /// shards it visits).
    pub(crate) fn sweep_step(&self) {
        // Relaxed: a statistic.
        self.sweeps.fetch_add(1, Ordering::Relaxed);
    }

    /// States a sweep removed from one shard.
    pub(crate) fn swept(&self, removed: usize) {
        // Relaxed: a statistic.
        self.swept.fetch_add(removed as u64, Ordering::Relaxed);
    }

    /// Evictions of states of rule `rule` so far.
    pub(crate) fn evictions_of(&self, rule: u8) -> u64 {
        // Relaxed: a statistic.
        self.evictions_by_rule[usize::from(rule)].load(Ordering::Relaxed)
    }

    /// The limiter's stats: `plans`' counts summed, these counters, `keys` states.
    pub(crate) fn snapshot<'a>(
        &self,
        plans: impl Iterator<Item = &'a Counts>,
        keys: usize,
    ) -> Stats {
        let mut st = Stats {
            keys: keys as u64,
            ..Stats::default()
        };
        for p in plans {
            p.add_to(&mut st);
        }
        // Relaxed (all): a snapshot of statistics.
        st.evictions = self.evictions.load(Ordering::Relaxed);
        st.sweeps = self.sweeps.load(Ordering::Relaxed);
        st.swept = self.swept.load(Ordering::Relaxed);
        st
    }
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::*;

    /// Threads that replace one another, more of them over time than there are stripes, all
    /// count on their own stripes: each new thread inherits an exited one's index. Without the
    /// hand-over, the later threads' indices run past the stripes and their counts go to the
    /// shared stripe. Each thread is joined explicitly (a scope's implicit join does
    /// not wait for thread-local destructors, which give the index back). Other tests' threads
    /// may take a freed index in between, so a round can miss; one clean round of five is proof.
    #[test]
    fn a_new_thread_inherits_an_exited_threads_stripe() {
        let clean_round = (0..5).any(|_| {
            let counts = Counts::new();
            let stripes = counts.0.len() - 1;
            for _ in 0..4 * stripes {
                std::thread::scope(|s| {
                    s.spawn(|| counts.count(Count::Allowed, 0))
                        .join()
                        .expect("counting thread");
                });
            }
            let st = Counters::new().snapshot(std::iter::once(&counts), 0);
            assert_eq!(st.allowed, 4 * stripes as u64, "no count lost");
            counts.0[stripes].counts[Count::Allowed as usize].load(Ordering::Relaxed) == 0
        });
        assert!(clean_round, "every round counted on the shared stripe");
    }
}
