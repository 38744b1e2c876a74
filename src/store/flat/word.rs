//! The flat store's word states as the layers above see them: a (key, rule) state is named by
//! its key's hash ([`FlatStore::hash`]) and the rule's id, and reached only through a closure
//! over its packed word that the store runs on the slot it finds. Probes, slot handles, rule
//! hashes, a slot removed or moved under a call: all of it stays here.

use std::hash::Hash;

use super::{FlatStore, Found, Group, INLINE, tag};
use crate::cell::{Applied, Inline, WordCall};
use crate::store::{Fresh, Full, RuleId, rule_hash};
use crate::sync::AtomicPair;

/// How the store keeps a (key, rule) state, as one read found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kept {
    /// A word state holding this word.
    Word(u64),
    /// A cell beside the table (a sliding log): read it through
    /// [`Store::with`](crate::store::Store::with).
    Cell,
    /// No state: the (key, rule) is fresh.
    Absent,
}

/// A word state found and read, nothing written yet: a charge decided first and written once
/// every limit of its call has admitted ([`FlatStore::pending`]), so that a call another limit
/// denies writes nothing and takes nothing back.
#[derive(Clone, Copy)]
pub(crate) struct Pending<'a> {
    slot: &'a AtomicPair,
    /// The cache line `slot` is in, where the key's other rules' states most likely are too.
    line: &'a Group,
    tag: u64,
    word: u64,
}

/// Where a key's state was found (its cache line), for [`FlatStore::pending_near`] to look
/// for the key's other states first.
#[derive(Clone, Copy)]
pub(crate) struct Near<'a>(&'a Group);

impl<'a> Pending<'a> {
    /// Where this state is, for the key's other states.
    #[inline(always)]
    pub(crate) fn near(&self) -> Near<'a> {
        Near(self.line)
    }
}

impl Pending<'_> {
    /// The word read.
    #[inline(always)]
    pub(crate) fn word(&self) -> u64 {
        self.word
    }

    /// Charges the state with `call`, deciding on [`word`](Self::word) (as
    /// [`FlatStore::charge_once`] does on the word it finds), again on the word it holds then
    /// where it changed since. `None` when the slot stopped being the key's (swept, reset,
    /// evicted, moved): nothing was written.
    #[inline(always)]
    pub(crate) fn charge(&self, call: &WordCall<'_>) -> Option<Applied> {
        let slot = Inline {
            slot: self.slot,
            tag: self.tag,
        };
        call.apply(&slot, self.word)
    }
}

impl<K: Hash + Eq + Clone> FlatStore<K> {
    /// The word state of (`key_hash`, `rule`), read to be decided on and charged later
    /// ([`Pending::charge`]): `None` when it is not a word in the table. No lock, no write.
    #[inline(always)]
    pub(crate) fn pending(&self, key_hash: u64, rule: RuleId) -> Option<Pending<'_>> {
        match self.find(rule_hash(key_hash, rule)) {
            Found::Inline {
                slot,
                line,
                tag,
                word,
            } => Some(Pending {
                slot,
                line,
                tag,
                word,
            }),
            Found::Spilled | Found::Absent => None,
        }
    }

    /// [`pending`](Self::pending) of another rule of the key whose state `near` is: every rule
    /// of a key has the same home group, so its state is most likely in `near`'s cache line,
    /// looked at first (four slots at once, the rule's slot picked by its tag, as
    /// [`find`](Self::find) picks one in a home group: a fingerprint is in at most one slot of
    /// a shard, so a match is the state), and looked up as `pending` does where it is not there.
    #[inline(always)]
    pub(crate) fn pending_near<'s>(
        &'s self,
        near: Near<'s>,
        key_hash: u64,
        rule: RuleId,
    ) -> Option<Pending<'s>> {
        let hash = rule_hash(key_hash, rule);
        if let Some(v) = self.vmovdqa {
            let (line, inline) = (near.0, tag(hash, INLINE));
            // Where `find` looks first in the home group: most states are there.
            let first = &line.0[Self::first_slot(hash)];
            let found = match crate::sync::PairLoad::load(v, first) {
                (t, word) if t == inline => Some((first, word)),
                // The deliberately broken build takes the slot without its tag (must-fail).
                #[cfg(tollgate_broken = "blind_near")]
                (_, word) => Some((first, word)),
                #[cfg(not(tollgate_broken = "blind_near"))]
                _ => Self::scan_line(v, line, inline),
            };
            if let Some((slot, word)) = found {
                #[cfg(test)]
                self.near_hits.fetch_add(1, crate::sync::Ordering::Relaxed);
                return Some(Pending {
                    slot,
                    line,
                    tag: inline,
                    word,
                });
            }
        }
        self.pending(key_hash, rule)
    }

    /// How (`key_hash`, `rule`)'s state is kept now. No lock, no write.
    #[inline(always)]
    pub(crate) fn kept(&self, key_hash: u64, rule: RuleId) -> Kept {
        match self.find(rule_hash(key_hash, rule)) {
            Found::Inline { word, .. } => Kept::Word(word),
            Found::Spilled => Kept::Cell,
            Found::Absent => Kept::Absent,
        }
    }

    /// The word of (`key_hash`, `rule`)'s state, where it is one (fresh, 0, where there is none).
    #[inline(always)]
    pub(crate) fn word_or_fresh(&self, key_hash: u64, rule: RuleId) -> u64 {
        match self.kept(key_hash, rule) {
            Kept::Word(word) => word,
            Kept::Cell | Kept::Absent => 0,
        }
    }

    /// Runs `step` on the word state of (`key_hash`, `rule`): the slot it is in and the word
    /// read with the slot's tag, for the one compare-and-swap loop of `cell` to drive. A
    /// `step` that answers `None` (the slot stopped being the key's under it: swept, reset,
    /// evicted, moved) is run again on the state found anew. `None` when the state is not a
    /// word in the table (absent, or a cell), having run nothing that stuck.
    #[inline(always)]
    pub(crate) fn apply_word<R>(
        &self,
        key_hash: u64,
        rule: RuleId,
        mut step: impl FnMut(&Inline<'_>, u64) -> Option<R>,
    ) -> Option<R> {
        let hash = rule_hash(key_hash, rule);
        loop {
            let Found::Inline {
                slot, tag, word, ..
            } = self.find(hash)
            else {
                return None;
            };
            if let Some(r) = step(&Inline { slot, tag }, word) {
                return Some(r);
            }
        }
    }

    /// Charges the word state of (`key_hash`, `rule`) once with `call` (checked, inline, with
    /// or without a refund token), as [`apply_word`](Self::apply_word) but without looking
    /// again: `None` when the state is not a word in the table or stopped being the key's under
    /// the call. For the short path, which leaves every such case to the general one.
    #[inline(always)]
    pub(crate) fn charge_once(
        &self,
        key_hash: u64,
        rule: RuleId,
        call: &WordCall<'_>,
    ) -> Option<Applied> {
        let Found::Inline {
            slot, tag, word, ..
        } = self.find(rule_hash(key_hash, rule))
        else {
            return None;
        };
        call.apply(&Inline { slot, tag }, word)
    }

    /// Runs `step` on the word state of (`key_hash`, `rule`) until it sticks, following the
    /// state into the slot it moved to (its shard grew); a state removed meanwhile (a reset,
    /// a sweep) is left alone. For what must land on the state it was meant for or nowhere: a
    /// refund, a synced round's global state. What `step` answered when it stuck; `None` when
    /// the state is gone.
    pub(crate) fn update_word<R>(
        &self,
        key_hash: u64,
        rule: RuleId,
        mut step: impl FnMut(&Inline<'_>, u64) -> Option<R>,
    ) -> Option<R> {
        let hash = rule_hash(key_hash, rule);
        let mut last = std::ptr::null();
        while let Found::Inline {
            slot, tag, word, ..
        } = self.find(hash)
        {
            if std::ptr::eq(slot, last) {
                // The same slot, no longer the key's: the state was removed.
                return None;
            }
            last = slot;
            if let Some(r) = step(&Inline { slot, tag }, word) {
                return Some(r);
            }
        }
        None
    }

    /// Inserts (`key_hash`, `rule`) as a word state holding `first` (a fresh state after its
    /// first call, so insertion and first charge are one write). `Ok(false)` when it turned
    /// out to be present already (the caller charges that); `Err(Full)` at the cap when
    /// nothing may be evicted.
    pub(crate) fn insert_word(
        &self,
        key_hash: u64,
        rule: RuleId,
        first: u64,
        fresh: Fresh<'_>,
    ) -> Result<bool, Full> {
        self.insert_inline(rule_hash(key_hash, rule), first, fresh)
    }

    /// Starts loading the cache line where (`key_hash`, `rule`)'s probe starts: every rule of
    /// a key starts in the same one (see [`rule_hash`]).
    #[inline(always)]
    pub(crate) fn prefetch_state(&self, key_hash: u64, rule: RuleId) {
        self.prefetch(rule_hash(key_hash, rule));
    }

    /// Where (`key_hash`, `rule`)'s state sits, for tests: (groups from its home group,
    /// whether it is in the first slot its probe reads); `None` when no slot holds it.
    #[cfg(test)]
    pub(crate) fn placement_of(&self, key_hash: u64, rule: RuleId) -> Option<(usize, bool)> {
        self.placement(rule_hash(key_hash, rule))
    }
}
