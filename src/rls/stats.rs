//! Upstream's per-limit stats (`total_hits`, `within_limit`, `over_limit`, `near_limit`,
//! `shadow_mode`), counted as upstream counts them, and their Prometheus text under the names
//! and labels of upstream's statsd-exporter mapping (`ratelimit_service_rate_limit_total_hits
//! {domain, key1, key2}`).

use std::fmt::Write as _;
use std::sync::Arc;

use dashmap::DashMap;

use crate::sync::{AtomicU64, Ordering};

/// The counters of one stats key.
#[derive(Debug, Default)]
pub struct LimitStats {
    /// Hits (the sum of `hits_addend`) that reached the limit.
    pub total_hits: AtomicU64,
    /// Hits answered OK.
    pub within_limit: AtomicU64,
    /// Hits over the limit (shadow mode included).
    pub over_limit: AtomicU64,
    /// Hits above 80% of the limit.
    pub near_limit: AtomicU64,
    /// Hits over a limit in shadow mode (answered OK).
    pub shadow_mode: AtomicU64,
}

/// The ratio of the limit above which hits are near it (upstream's default).
const NEAR_LIMIT_RATIO: f32 = 0.8;

/// What one descriptor's charge came to, for the stats.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Charge {
    /// The window's count before this request (the limit + 1 once over).
    pub(crate) before: u64,
    /// The hits of this request.
    pub(crate) hits: u64,
    /// Over the limit.
    pub(crate) over: bool,
}

impl LimitStats {
    /// `[total_hits, within_limit, over_limit, near_limit, shadow_mode]`.
    pub fn snapshot(&self) -> [u64; 5] {
        // Relaxed: independent counters; a snapshot racing a request may show part of it.
        [
            self.total_hits.load(Ordering::Relaxed),
            self.within_limit.load(Ordering::Relaxed),
            self.over_limit.load(Ordering::Relaxed),
            self.near_limit.load(Ordering::Relaxed),
            self.shadow_mode.load(Ordering::Relaxed),
        ]
    }

    /// Counts hits in `total_hits` only (neither within nor over the limit).
    pub(crate) fn count_total(&self, hits: u64) {
        // Relaxed: an independent monotonic counter.
        self.total_hits.fetch_add(hits, Ordering::Relaxed);
    }

    /// Counts a charge as upstream's `GetResponseDescriptorStatus` does: the part of the hits
    /// above the limit is over it, the part between 80% and the limit near it.
    pub(crate) fn count(&self, limit: u64, c: Charge, shadow: bool) {
        // Relaxed everywhere: independent monotonic counters, read only for the metrics text.
        self.total_hits.fetch_add(c.hits, Ordering::Relaxed);
        // Upstream rounds 80% of the limit in single precision.
        let near = (limit as f32 * NEAR_LIMIT_RATIO).floor() as u64;
        let after = c.before + c.hits;
        if c.over {
            let over = if c.before >= limit {
                c.hits
            } else {
                let near_part = limit - near.max(c.before);
                self.near_limit.fetch_add(near_part, Ordering::Relaxed);
                after.saturating_sub(limit)
            };
            self.over_limit.fetch_add(over, Ordering::Relaxed);
            if shadow {
                self.shadow_mode.fetch_add(over, Ordering::Relaxed);
            }
        } else {
            self.within_limit.fetch_add(c.hits, Ordering::Relaxed);
            if after > near {
                let part = if c.before >= near {
                    c.hits
                } else {
                    after - near
                };
                self.near_limit.fetch_add(part, Ordering::Relaxed);
            }
        }
    }
}

/// One counter of [`LimitStats`], picked.
type Field = fn(&LimitStats) -> &AtomicU64;

/// The most stats keys named by requests' descriptor values (a limit override's,
/// `detailed_metric`'s, `value_to_metric`'s) the service keeps: clients choose those values, so
/// past this a new one's hits are counted under its domain's [`OVERFLOW`] key instead, and the
/// registry and the `/metrics` text stay bounded. Keys named by the config alone always count.
pub(crate) const MAX_CLIENT_KEYS: usize = 4096;

/// The stats key (after the domain) of hits whose own client-named key found no room.
pub(crate) const OVERFLOW: &str = "stats_overflow";

/// Every stats key's counters, kept across config reloads.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    /// Sharded: every request reads it, from every connection at once.
    by_key: DashMap<String, Arc<LimitStats>>,
    /// How many keys of `by_key` requests named (see [`MAX_CLIENT_KEYS`]).
    client_keys: AtomicU64,
    pub(crate) config_load_success: AtomicU64,
    pub(crate) config_load_error: AtomicU64,
}

impl Registry {
    /// The counters of `key` (created at first use). `by_client`: the key carries values a
    /// request chose, so it takes room under [`MAX_CLIENT_KEYS`], or counts as its domain's
    /// overflow where there is none left.
    pub(crate) fn get(&self, key: &str, by_client: bool) -> Arc<LimitStats> {
        if let Some(s) = self.by_key.get(key) {
            return s.clone();
        }
        // Relaxed: a bound, not a synchronisation; racing requests may pass it by a few.
        if by_client && self.client_keys.load(Ordering::Relaxed) >= MAX_CLIENT_KEYS as u64 {
            let domain = key.split('.').next().unwrap_or(key);
            return self.get(&format!("{domain}.{OVERFLOW}"), false);
        }
        let entry = self.by_key.entry(key.to_string()).or_insert_with(|| {
            if by_client {
                self.client_keys.fetch_add(1, Ordering::Relaxed);
            }
            Arc::default()
        });
        entry.clone()
    }

    /// The counters of `key`, if it was ever counted.
    pub(crate) fn find(&self, key: &str) -> Option<Arc<LimitStats>> {
        self.by_key.get(key).map(|s| s.clone())
    }

    /// The Prometheus text format of every counter.
    pub(crate) fn render(&self) -> String {
        let mut rows: Vec<(String, Arc<LimitStats>)> = self
            .by_key
            .iter()
            .map(|e| (e.key().clone(), e.value().clone()))
            .collect();
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out = String::new();
        let stats: [(&str, Field); 5] = [
            ("total_hits", |s| &s.total_hits),
            ("within_limit", |s| &s.within_limit),
            ("over_limit", |s| &s.over_limit),
            ("near_limit", |s| &s.near_limit),
            ("shadow_mode", |s| &s.shadow_mode),
        ];
        for (stat, field) in stats {
            let name = format!("ratelimit_service_rate_limit_{stat}");
            let _ = writeln!(out, "# TYPE {name} counter");
            for (key, s) in &rows {
                let _ = writeln!(
                    out,
                    "{name}{{{}}} {}",
                    labels(key),
                    // Relaxed: a counter read for display.
                    field(s).load(Ordering::Relaxed)
                );
            }
        }
        for (name, v) in [
            ("config_load_success", &self.config_load_success),
            ("config_load_error", &self.config_load_error),
        ] {
            let _ = writeln!(out, "# TYPE ratelimit_service_{name} counter");
            // Relaxed: a counter read for display.
            let _ = writeln!(
                out,
                "ratelimit_service_{name} {}",
                v.load(Ordering::Relaxed)
            );
        }
        out
    }
}

/// Upstream's stat-name sanitising: `:` and `|` become `_`.
pub(crate) fn sanitize(key: &str) -> String {
    key.replace([':', '|'], "_")
}

/// `domain="…",key1="…"[,key2="…"]` of a stats key `domain.key1[.key2…]` (keys past the
/// second stay in `key2`, dots and all).
fn labels(key: &str) -> String {
    let key = sanitize(key);
    let mut parts = key.splitn(3, '.');
    let mut out = String::new();
    for (label, value) in ["domain", "key1", "key2"].iter().zip(&mut parts) {
        if !out.is_empty() {
            out.push(',');
        }
        let _ = write!(out, "{label}=\"{}\"", escape(value));
    }
    out
}

/// A label value in the text format: backslash, quote and newline escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(limit: u64, charges: &[(u64, u64, bool)], shadow: bool) -> [u64; 5] {
        let s = LimitStats::default();
        for &(before, hits, over) in charges {
            s.count(limit, Charge { before, hits, over }, shadow);
        }
        s.snapshot()
    }

    #[test]
    fn near_and_over_split_the_hits_as_upstream() {
        // Limit 10, near threshold 8: ten single hits, then two over.
        let mut charges: Vec<(u64, u64, bool)> = (0..10).map(|b| (b, 1, false)).collect();
        charges.push((10, 1, true));
        charges.push((11, 1, true));
        assert_eq!(counted(10, &charges, false), [12, 10, 2, 2, 0]);
        // One request of 5 from 7: 3 within (to 10), crossing 8: near gets 2; then 4 from 10
        // over.
        assert_eq!(counted(10, &[(7, 5, true)], false), [5, 0, 2, 2, 0]);
        assert_eq!(counted(10, &[(7, 3, false)], false), [3, 3, 0, 2, 0]);
        assert_eq!(counted(10, &[(10, 4, true)], true), [4, 0, 4, 0, 4]);
        // Limit 0: every hit is over, none near.
        assert_eq!(
            counted(0, &[(0, 1, true), (1, 1, true)], false),
            [2, 0, 2, 0, 0]
        );
    }

    #[test]
    fn labels_follow_the_mapper() {
        assert_eq!(labels("rl.foo"), r#"domain="rl",key1="foo""#);
        assert_eq!(
            labels("rl.foo.bar_a:b"),
            r#"domain="rl",key1="foo",key2="bar_a_b""#
        );
        assert_eq!(labels("rl.a.b.c"), r#"domain="rl",key1="a",key2="b.c""#);
    }
}
