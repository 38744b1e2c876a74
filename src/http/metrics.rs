//! The layer's own counters, and the Prometheus text of its `/metrics`.

use metrics::{Label, counter, describe_counter, describe_gauge, gauge};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};

use crate::stats::Striped;

/// Counters the layer bumps per request, striped as the limiter's plan counts are (each thread
/// adds to its own stripe without a locked instruction; a read sums the stripes).
pub(crate) struct HttpCounters(Striped<{ Counter::COUNT }>);

/// The layer's counters, by index in a stripe.
#[derive(Clone, Copy)]
enum Counter {
    Requests,
    Limited,
    SoftPassed,
    Queued,
    QueuedWaitNs,
    BadKey,
    RejectedBadKey,
    UnknownPlan,
    InternalErrors,
    Exempt,
    Refunded,
    ShadowPassed,
}

impl Counter {
    const COUNT: usize = Counter::ShadowPassed as usize + 1;
}

impl Default for HttpCounters {
    fn default() -> Self {
        HttpCounters(Striped::new())
    }
}

impl HttpCounters {
    #[inline(always)]
    fn add(&self, c: Counter, n: u64) {
        self.0.add(c as usize, n);
    }
    #[inline]
    pub(crate) fn request(&self) {
        self.add(Counter::Requests, 1);
    }
    pub(crate) fn limited(&self) {
        self.add(Counter::Limited, 1);
    }
    pub(crate) fn soft_passed(&self) {
        self.add(Counter::SoftPassed, 1);
    }
    pub(crate) fn shadow_passed(&self) {
        self.add(Counter::ShadowPassed, 1);
    }
    pub(crate) fn queued(&self, wait_ns: u64) {
        self.add(Counter::Queued, 1);
        self.add(Counter::QueuedWaitNs, wait_ns);
    }
    pub(crate) fn bad_key(&self) {
        self.add(Counter::BadKey, 1);
    }
    pub(crate) fn rejected_bad_key(&self) {
        self.add(Counter::RejectedBadKey, 1);
    }
    pub(crate) fn unknown_plan(&self) {
        self.add(Counter::UnknownPlan, 1);
    }
    pub(crate) fn exempt(&self) {
        self.add(Counter::Exempt, 1);
    }
    pub(crate) fn refunded(&self) {
        self.add(Counter::Refunded, 1);
    }
    pub(crate) fn internal_error(&self) {
        self.add(Counter::InternalErrors, 1);
    }

    /// Publishes the layer's counters through the `metrics` facade, with labels `base`.
    pub(crate) fn publish(&self, base: &[Label]) {
        let get = |c: Counter| self.0.sum(c as usize);
        for (metric, help, v) in [
            (
                "tollgate_http_requests_total",
                "Requests seen by the layer.",
                get(Counter::Requests),
            ),
            (
                "tollgate_http_limited_total",
                "Requests answered 429.",
                get(Counter::Limited),
            ),
            (
                "tollgate_http_soft_passed_total",
                "Requests over a soft limit, passed with a warning.",
                get(Counter::SoftPassed),
            ),
            (
                "tollgate_http_shadow_passed_total",
                "Requests a limit in shadow mode would have denied, passed unmarked.",
                get(Counter::ShadowPassed),
            ),
            (
                "tollgate_http_queued_total",
                "Requests held by the queue strategy before passing.",
                get(Counter::Queued),
            ),
            (
                "tollgate_http_bad_key_total",
                "Requests whose client key could not be taken (fallback applied).",
                get(Counter::BadKey),
            ),
            (
                "tollgate_http_rejected_bad_key_total",
                "Requests rejected for a bad key (400, or a custom extractor's rejection).",
                get(Counter::RejectedBadKey),
            ),
            (
                "tollgate_http_unknown_plan_total",
                "Resolver answers naming an unknown plan (default plan used).",
                get(Counter::UnknownPlan),
            ),
            (
                "tollgate_http_internal_errors_total",
                "Requests answered 500 because the limiter refused the configuration.",
                get(Counter::InternalErrors),
            ),
            (
                "tollgate_http_exempt_total",
                "Requests from exempt keys or networks, passed uncharged.",
                get(Counter::Exempt),
            ),
            (
                "tollgate_http_refunded_total",
                "Requests whose charge was refunded after the response (refund_when).",
                get(Counter::Refunded),
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
            .set(get(Counter::QueuedWaitNs) as f64 / 1e9);
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
