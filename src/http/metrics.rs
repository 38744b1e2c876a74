//! The layer's own counters and the Prometheus text rendering.

use std::fmt::Write as _;

use crate::stats::Stats;
use crate::sync::{AtomicU64, Ordering};

/// Counters the layer bumps per request. Relaxed everywhere: statistics, each add one RMW so
/// none is lost, read as an approximate snapshot (no other memory depends on them).
#[derive(Default)]
pub(crate) struct HttpCounters {
    requests: AtomicU64,
    limited: AtomicU64,
    soft_passed: AtomicU64,
    queued: AtomicU64,
    queued_wait_ns: AtomicU64,
    bad_key: AtomicU64,
    rejected_bad_key: AtomicU64,
    unknown_plan: AtomicU64,
    internal_errors: AtomicU64,
    exempt: AtomicU64,
    refunded: AtomicU64,
}

impl HttpCounters {
    pub(crate) fn request(&self) {
        // Relaxed: a statistic (see the type's doc).
        self.requests.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn limited(&self) {
        // Relaxed: a statistic.
        self.limited.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn soft_passed(&self) {
        // Relaxed: a statistic.
        self.soft_passed.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn queued(&self, wait_ns: u64) {
        // Relaxed: statistics; the two adds need not be seen together.
        self.queued.fetch_add(1, Ordering::Relaxed);
        self.queued_wait_ns.fetch_add(wait_ns, Ordering::Relaxed);
    }
    pub(crate) fn bad_key(&self) {
        // Relaxed: a statistic.
        self.bad_key.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn rejected_bad_key(&self) {
        // Relaxed: a statistic.
        self.rejected_bad_key.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn unknown_plan(&self) {
        // Relaxed: a statistic.
        self.unknown_plan.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn exempt(&self) {
        // Relaxed: a statistic.
        self.exempt.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn refunded(&self) {
        // Relaxed: a statistic.
        self.refunded.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn internal_error(&self) {
        // Relaxed: a statistic.
        self.internal_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Publishes the layer's counters through the `metrics` facade, labelled `limiter = name`.
    #[cfg(feature = "metrics")]
    pub(crate) fn publish(&self, name: &str) {
        // Relaxed loads: an approximate snapshot, as a scrape is.
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        for (metric, v) in [
            ("tollgate_http_requests_total", get(&self.requests)),
            ("tollgate_http_limited_total", get(&self.limited)),
            ("tollgate_http_soft_passed_total", get(&self.soft_passed)),
            ("tollgate_http_queued_total", get(&self.queued)),
            ("tollgate_http_bad_key_total", get(&self.bad_key)),
            (
                "tollgate_http_rejected_bad_key_total",
                get(&self.rejected_bad_key),
            ),
            ("tollgate_http_unknown_plan_total", get(&self.unknown_plan)),
            (
                "tollgate_http_internal_errors_total",
                get(&self.internal_errors),
            ),
            ("tollgate_http_exempt_total", get(&self.exempt)),
            ("tollgate_http_refunded_total", get(&self.refunded)),
        ] {
            metrics::counter!(metric, "limiter" => name.to_string()).absolute(v);
        }
    }

    /// Prometheus text exposition format (version 0.0.4).
    pub(crate) fn render(&self, stats: &Stats) -> String {
        // Relaxed loads: an approximate snapshot is what a scrape is.
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut out = String::with_capacity(2048);
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(&str, u64)]| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        };
        metric(
            "tollgate_decisions_total",
            "counter",
            "Limiter decisions by outcome (one per limit checked).",
            &[
                ("{outcome=\"allowed\"}", stats.allowed),
                ("{outcome=\"denied\"}", stats.denied),
                ("{outcome=\"soft_passed\"}", stats.soft_passed),
                ("{outcome=\"table_full\"}", stats.table_full),
            ],
        );
        metric(
            "tollgate_keys",
            "gauge",
            "Keys tracked now.",
            &[("", stats.keys)],
        );
        metric(
            "tollgate_evictions_total",
            "counter",
            "Fresh keys evicted to make room.",
            &[("", stats.evictions)],
        );
        metric(
            "tollgate_swept_keys_total",
            "counter",
            "Keys removed by sweeping.",
            &[("", stats.swept)],
        );
        metric(
            "tollgate_cas_retries_total",
            "counter",
            "Compare-and-swap attempts lost to another thread.",
            &[("", stats.cas_retries)],
        );
        metric(
            "tollgate_http_requests_total",
            "counter",
            "Requests seen by the layer.",
            &[("", get(&self.requests))],
        );
        metric(
            "tollgate_http_limited_total",
            "counter",
            "Requests answered 429.",
            &[("", get(&self.limited))],
        );
        metric(
            "tollgate_http_soft_passed_total",
            "counter",
            "Requests over a soft limit, passed with a warning.",
            &[("", get(&self.soft_passed))],
        );
        metric(
            "tollgate_http_queued_total",
            "counter",
            "Requests held by the queue strategy before passing.",
            &[("", get(&self.queued))],
        );
        metric(
            "tollgate_http_queued_seconds_total",
            "counter",
            "Total time requests were held by the queue strategy.",
            &[],
        );
        let ns = get(&self.queued_wait_ns);
        let _ = writeln!(
            out,
            "tollgate_http_queued_seconds_total {}.{:09}",
            ns / 1_000_000_000,
            ns % 1_000_000_000
        );
        let mut metric = |name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(out, "{name} {v}");
        };
        metric(
            "tollgate_http_bad_key_total",
            "Requests whose client key could not be taken (fallback applied).",
            get(&self.bad_key),
        );
        metric(
            "tollgate_http_rejected_bad_key_total",
            "Requests rejected for a bad key (400, or a custom extractor's rejection).",
            get(&self.rejected_bad_key),
        );
        metric(
            "tollgate_http_unknown_plan_total",
            "Resolver answers naming an unknown plan (default plan used).",
            get(&self.unknown_plan),
        );
        metric(
            "tollgate_http_internal_errors_total",
            "Requests answered 500 because the limiter refused the configuration.",
            get(&self.internal_errors),
        );
        metric(
            "tollgate_http_exempt_total",
            "Requests from exempt keys or networks, passed uncharged.",
            get(&self.exempt),
        );
        metric(
            "tollgate_http_refunded_total",
            "Requests whose charge was refunded after the response (refund_when).",
            get(&self.refunded),
        );
        out
    }
}
