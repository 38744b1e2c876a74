//! A limiter's book: the plans it knows ([`Plan`], from `crate::plan`) compiled to integer
//! rules, and the rule table that gives every distinct quota part one id (so equal quotas share
//! one state per key, whichever plans list them, in whatever order).

use std::collections::HashMap;

use crate::algo::{Kind, Rule};
use crate::cell::Mode;
use crate::clock::nanos;
use crate::error::Error;
use crate::plan::{MAX_PARTS, Plan, PlanId, Strategy};
use crate::stats::Counts;
use crate::store::{MAX_RULES, RuleId};
use crate::sync::{AtomicPtr, Ordering};

/// One part of a compiled plan: its rule, by id and by value.
#[derive(Debug, Clone)]
pub(crate) struct PartRule {
    pub(crate) id: RuleId,
    pub(crate) rule: Rule,
    /// The rules this part had before the plan changed, latest first, that no plan uses any
    /// more: a key with no state under `id` yet starts from its state under the first of these
    /// it has, which moves over ([`Cell::migrate`](crate::cell::Cell::migrate)) and is removed.
    /// Only a change of this plan adds to it, so two live plans never carry state into each
    /// other, and a state that moved cannot come back. A key's first call under the part probes
    /// once per rule listed (a limiter has at most 256 rules in its life).
    pub(crate) lineage: Vec<RuleId>,
}

/// A plan checked and compiled to integer rules.
#[derive(Debug)]
pub(crate) struct Compiled {
    pub(crate) name: String,
    pub(crate) parts: Vec<PartRule>,
    pub(crate) strategy: Strategy,
    pub(crate) headroom: u64,
    /// The largest cost that can ever pass: the smallest capacity minus the headroom.
    pub(crate) max_cost: u64,
    /// The plan as the short path serves it, where it can (see [`Short`]).
    pub(crate) short: Short,
    /// The plan's decision counts (the same ones in every book that has the plan).
    pub(crate) counts: Counts,
}

impl Compiled {
    /// The mode a call in `mode` runs in under this plan's strategy.
    pub(crate) fn mode(&self, mode: Mode) -> Mode {
        match (mode, self.strategy) {
            (Mode::Check, Strategy::Queue { max_delay }) => Mode::Reserve(nanos(max_delay)),
            (Mode::Peek, Strategy::Queue { max_delay }) => Mode::PeekReserve(nanos(max_delay)),
            (m, _) => m,
        }
    }

    /// Checks a cost against what the plan can ever admit.
    pub(crate) fn check_cost(&self, cost: u64) -> Result<(), Error> {
        if cost == 0 {
            return Err(Error::ZeroCost);
        }
        if cost > self.max_cost {
            return Err(Error::CostExceedsCapacity {
                cost,
                capacity: self.max_cost,
            });
        }
        Ok(())
    }
}

/// All plans of a limiter and its rule table; replaced as a whole (copy on write) when a plan
/// changes.
#[derive(Debug)]
pub(crate) struct Book {
    /// The limiter's tag, the same in all its books: the plan ids it issues carry it, so an id
    /// from another limiter is told apart with one compare.
    pub(crate) owner: u32,
    pub(crate) plans: Vec<Compiled>,
    pub(crate) by_name: HashMap<String, PlanId>,
    /// Every distinct rule any book of this limiter ever had, by id: append-only, so a state's
    /// rule id means the same rule for the limiter's whole life (sweeps read it from slots).
    pub(crate) rules: Vec<Rule>,
    /// The default plan as the short path serves it (see [`Words`]): read by `check` with one
    /// load of the book.
    pub(crate) default_words: Option<Words<1>>,
}

/// A plan the short path serves, worked out once per book: its parts are all word states (no
/// sliding log) and it is not a queue (a reservation is the general path's), for a part count
/// the engine is specialised for.
#[derive(Debug, Clone)]
pub(crate) enum Short {
    One(Words<1>),
    Two(Words<2>),
    /// The general path decides every call of the plan.
    None,
}

/// The `N` word parts of a plan as the short path charges them (see
/// [`Limiter::charge_words`](super::Limiter::charge_words)): rules by id and by value, in one
/// place.
#[derive(Debug, Clone)]
pub(crate) struct Words<const N: usize> {
    pub(crate) ids: [RuleId; N],
    pub(crate) rules: [Rule; N],
    pub(crate) headroom: u64,
    /// What the plan's strategy does with a denial.
    pub(crate) lenient: Lenient,
    /// The plan's decision counts.
    pub(crate) counts: Counts,
}

/// What a short-path plan's strategy does with a denial: a byte beside the words, where the
/// strategy itself is three words (a queue's delay).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lenient {
    /// Denies it.
    Hard,
    /// Lets it through as [`Strategy::Soft`] does.
    Soft,
    /// Lets it through as [`Strategy::Shadow`] does.
    Shadow,
}

impl Lenient {
    /// The strategy that lets a denial through, if any.
    #[inline(always)]
    pub(crate) fn strategy(self) -> Option<Strategy> {
        match self {
            Lenient::Hard => None,
            Lenient::Soft => Some(Strategy::Soft),
            Lenient::Shadow => Some(Strategy::Shadow),
        }
    }
}

impl<const N: usize> Words<N> {
    fn of(plan: &Compiled) -> Option<Words<N>> {
        let served = plan.parts.len() == N
            && plan.parts.iter().all(|p| p.rule.kind != Kind::Log)
            && !matches!(plan.strategy, Strategy::Queue { .. });
        served.then(|| Words {
            ids: std::array::from_fn(|i| plan.parts[i].id),
            rules: std::array::from_fn(|i| plan.parts[i].rule),
            headroom: plan.headroom,
            lenient: match plan.strategy {
                Strategy::Soft => Lenient::Soft,
                Strategy::Shadow => Lenient::Shadow,
                _ => Lenient::Hard,
            },
            counts: plan.counts.clone(),
        })
    }
}

impl Short {
    fn of(plan: &Compiled) -> Short {
        match (Words::of(plan), Words::of(plan)) {
            (Some(one), _) => Short::One(one),
            (_, Some(two)) => Short::Two(two),
            _ => Short::None,
        }
    }
}

impl Book {
    /// Compiles `plans`, extending `previous`'s rule table (and taking each changed part's
    /// lineage from the plan of the same name there). `short`: whether the limiter takes the
    /// short path at all (in process, on a store that keeps word states).
    pub(crate) fn compile(
        plans: &[(String, Plan)],
        unix_epoch_ns: u64,
        previous: Option<&Book>,
        short: bool,
    ) -> Result<Book, Error> {
        let mut rules: Vec<Rule> = previous.map(|b| b.rules.clone()).unwrap_or_default();
        let owner = previous.map_or_else(crate::sync::next_limiter_tag, |b| b.owner);
        let mut compiled: Vec<Compiled> = Vec::with_capacity(plans.len());
        let mut by_name = HashMap::new();
        for (name, plan) in plans {
            if plan.quotas().is_empty() {
                return Err(Error::NoQuota);
            }
            if plan.quotas().len() > MAX_PARTS {
                return Err(Error::Config {
                    line: None,
                    message: format!(
                        "plan '{name}' combines {} quotas; at most {MAX_PARTS}",
                        plan.quotas().len()
                    ),
                });
            }
            let before = previous.and_then(|b| b.by_name.get(name).map(|id| &b.plans[id.index()]));
            let mut parts = Vec::with_capacity(plan.quotas().len());
            for (i, quota) in plan.quotas().iter().enumerate() {
                let rule = quota.compile(unix_epoch_ns)?;
                let id = intern(&mut rules, rule)?;
                let lineage = match before.and_then(|b| b.parts.get(i)) {
                    Some(old) if old.id != id => std::iter::once(old.id)
                        .chain(old.lineage.iter().copied())
                        .filter(|&r| r != id)
                        .collect(),
                    Some(old) => old.lineage.clone(),
                    None => Vec::new(),
                };
                parts.push(PartRule { id, rule, lineage });
            }
            let capacity = parts.iter().map(|p| p.rule.capacity).min().unwrap_or(0);
            if plan.headroom_units() >= capacity {
                return Err(Error::HeadroomTooLarge {
                    plan: name.clone(),
                    headroom: plan.headroom_units(),
                    capacity,
                });
            }
            by_name.insert(
                name.clone(),
                PlanId {
                    index: compiled.len() as u32,
                    owner,
                },
            );
            compiled.push(Compiled {
                name: name.clone(),
                parts,
                strategy: plan.strategy_kind(),
                headroom: plan.headroom_units(),
                max_cost: capacity - plan.headroom_units(),
                short: Short::None,
                // A plan that was there before keeps counting where it did.
                counts: before.map_or_else(Counts::new, |b| b.counts.clone()),
            });
        }
        // A part carries state over only from rules that no plan uses any more: the state of a
        // rule that is still live belongs to the plans that list it.
        let live: Vec<RuleId> = compiled
            .iter()
            .flat_map(|p| p.parts.iter().map(|r| r.id))
            .collect();
        for part in compiled.iter_mut().flat_map(|p| p.parts.iter_mut()) {
            part.lineage.retain(|r| !live.contains(r));
            // The deliberately broken build (scripts/must-fail.sh): every other live rule of the
            // same algorithm is a predecessor, so a key's state moves between live plans.
            #[cfg(tollgate_broken = "live_migration")]
            {
                part.lineage = live
                    .iter()
                    .copied()
                    .filter(|&r| r != part.id && rules[usize::from(r)].kind == part.rule.kind)
                    .collect();
            }
        }
        if short {
            for plan in &mut compiled {
                plan.short = Short::of(plan);
            }
        }
        let default_words = match compiled.first().map(|p| &p.short) {
            Some(Short::One(words)) => Some(words.clone()),
            _ => None,
        };
        Ok(Book {
            owner,
            plans: compiled,
            by_name,
            rules,
            default_words,
        })
    }

    /// Plan `id`, if this limiter issued it (or it is [`PlanId::DEFAULT`]).
    #[inline]
    pub(crate) fn get(&self, id: PlanId) -> Result<&Compiled, Error> {
        // One compare on the common path (an id of this limiter); DEFAULT's owner is 0, which
        // no limiter's tag is.
        if id.owner != self.owner && id != PlanId::DEFAULT {
            return Err(foreign_plan(id));
        }
        match self.plans.get(id.index()) {
            Some(plan) => Ok(plan),
            None => Err(unknown_plan(id)),
        }
    }

    /// This limiter's own id of its default plan (what [`Limiter::plan`] gives for it), for
    /// tables keyed by plan id, where [`PlanId::DEFAULT`] would be another key.
    ///
    /// [`Limiter::plan`]: crate::Limiter::plan
    #[cfg(feature = "http")]
    pub(crate) fn default_id(&self) -> PlanId {
        PlanId {
            index: 0,
            owner: self.owner,
        }
    }
}

/// The id of `rule` in `rules`, adding it when it is new.
fn intern(rules: &mut Vec<Rule>, rule: Rule) -> Result<RuleId, Error> {
    if let Some(i) = rules.iter().position(|r| *r == rule) {
        return Ok(i as RuleId);
    }
    if rules.len() == MAX_RULES {
        return Err(Error::Config {
            line: None,
            message: format!(
                "a limiter holds at most {MAX_RULES} distinct quotas over its life (plan changes \
                 included); build a new limiter for a new set"
            ),
        });
    }
    rules.push(rule);
    Ok((rules.len() - 1) as RuleId)
}

#[cold]
fn unknown_plan(id: PlanId) -> Error {
    Error::UnknownPlan(format!("#{}", id.index))
}

#[cold]
fn foreign_plan(id: PlanId) -> Error {
    Error::ForeignPlan(id)
}

/// The current book behind one plain load.
///
/// Plan changes are rare (a config reload), so every book ever installed is kept until the
/// limiter drops: a reader never needs a reference count or a guard, and a check reads the
/// current book with one Acquire load of a pointer that no core writes on the hot path.
pub(crate) struct Books {
    current: AtomicPtr<Book>,
    /// Owns every installed book, the current one included. Only `install` pushes. The boxes
    /// give each book an address that stays put while the Vec grows.
    #[allow(clippy::vec_box)]
    all: crate::sync::Mutex<Vec<Box<Book>>>,
}

impl Books {
    pub(crate) fn new(book: Book) -> Self {
        let mut first = Box::new(book);
        let current = AtomicPtr::new(&mut *first as *mut Book);
        Books {
            current,
            all: crate::sync::Mutex::new(vec![first]),
        }
    }

    #[inline]
    pub(crate) fn current(&self) -> &Book {
        // Acquire: pairs with the Release store in `install`, so the book's contents, written
        // before it was published, are visible here.
        let p = self.current.load(Ordering::Acquire);
        // SAFETY: `p` points into a Box owned by `all`, which only ever grows and is dropped
        // with `self`; the returned borrow cannot outlive `self`. Books are never mutated after
        // being published.
        unsafe { &*p }
    }

    pub(crate) fn install(&self, book: Book) {
        let mut all = crate::sync::lock(&self.all);
        let mut boxed = Box::new(book);
        let p = &mut *boxed as *mut Book;
        all.push(boxed);
        // Release: pairs with the Acquire load in `current`.
        self.current.store(p, Ordering::Release);
    }
}
