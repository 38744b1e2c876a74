//! The layer's own counters, and the Prometheus text of its `/metrics`.

use metrics::{Label, counter, describe_counter, describe_gauge, gauge};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};

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

    /// Publishes the layer's counters through the `metrics` facade, with labels `base`.
    pub(crate) fn publish(&self, base: &[Label]) {
        // Relaxed loads: an approximate snapshot, as a scrape is.
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        for (metric, help, v) in [
            (
                "tollgate_http_requests_total",
                "Requests seen by the layer.",
                get(&self.requests),
            ),
            (
                "tollgate_http_limited_total",
                "Requests answered 429.",
                get(&self.limited),
            ),
            (
                "tollgate_http_soft_passed_total",
                "Requests over a soft limit, passed with a warning.",
                get(&self.soft_passed),
            ),
            (
                "tollgate_http_queued_total",
                "Requests held by the queue strategy before passing.",
                get(&self.queued),
            ),
            (
                "tollgate_http_bad_key_total",
                "Requests whose client key could not be taken (fallback applied).",
                get(&self.bad_key),
            ),
            (
                "tollgate_http_rejected_bad_key_total",
                "Requests rejected for a bad key (400, or a custom extractor's rejection).",
                get(&self.rejected_bad_key),
            ),
            (
                "tollgate_http_unknown_plan_total",
                "Resolver answers naming an unknown plan (default plan used).",
                get(&self.unknown_plan),
            ),
            (
                "tollgate_http_internal_errors_total",
                "Requests answered 500 because the limiter refused the configuration.",
                get(&self.internal_errors),
            ),
            (
                "tollgate_http_exempt_total",
                "Requests from exempt keys or networks, passed uncharged.",
                get(&self.exempt),
            ),
            (
                "tollgate_http_refunded_total",
                "Requests whose charge was refunded after the response (refund_when).",
                get(&self.refunded),
            ),
        ] {
            describe_counter!(metric, help);
            counter!(metric, base.to_vec()).absolute(v);
        }
        // Seconds are fractional: a gauge that only grows (the exporter's counters are whole).
        describe_gauge!(
            "tollgate_http_queued_seconds_total",
            "Total time requests were held by the queue strategy."
        );
        gauge!("tollgate_http_queued_seconds_total", base.to_vec())
            .set(get(&self.queued_wait_ns) as f64 / 1e9);
    }
}

/// The Prometheus text of the layer's `/metrics`: the limiter's and the layer's counters
/// published (as `publish_metrics` publishes them, without the `limiter` label) into a
/// recorder of the layer's own, which metrics-exporter-prometheus renders. Nothing global is
/// installed.
pub(crate) struct Exposition {
    recorder: PrometheusRecorder,
}

impl Exposition {
    pub(crate) fn new() -> Self {
        Exposition {
            recorder: PrometheusBuilder::new().build_recorder(),
        }
    }

    /// Renders after `publish` ran against the layer's recorder.
    pub(crate) fn render(&self, publish: impl FnOnce()) -> String {
        metrics::with_local_recorder(&self.recorder, || {
            crate::stats::publish::describe();
            publish();
        });
        self.recorder.handle().render()
    }
}
