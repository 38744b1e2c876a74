//! The layer's own counters, and the Prometheus text of its `/metrics`.

use std::collections::HashMap;
use std::sync::Arc;

use metrics::{Label, counter, describe_counter, describe_gauge, gauge};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};

use crate::stats::Striped;
use crate::sync::{AtomicU64, Ordering};

/// Counters the layer bumps per request, striped as the limiter's plan counts are (each thread
/// adds to its own stripe without a locked instruction; a read sums the stripes); and the
/// denials by the limit that denied, one counter per label the config names. A reload makes
/// new ones that share every counter with the old ones (a label the new config still names
/// keeps its count).
pub(crate) struct HttpCounters {
    striped: Arc<Striped<{ Counter::COUNT }>>,
    /// Denials by limit, indexed as `labels`.
    limited: Box<[Arc<AtomicU64>]>,
    /// The `limit` label of each denial counter.
    labels: Vec<String>,
}

/// The `limit` labels of `tollgate_http_limited_total`, each with its counter's index: a few
/// fixed ones, then one per part of every plan and every rule the config names (so the
/// label set is bounded by the config, never by clients).
pub(crate) struct LimitLabels {
    names: Vec<String>,
    index: HashMap<String, usize>,
}

impl LimitLabels {
    /// A key serving a penalty (`Limiter::block`).
    pub(crate) const BLOCKED: usize = 0;
    /// A new key denied because the table is at `max_keys`.
    pub(crate) const TABLE_FULL: usize = 1;
    /// A request whose cost no limit could ever hold.
    pub(crate) const COST: usize = 2;

    pub(crate) fn new() -> Self {
        let mut labels = LimitLabels {
            names: Vec::new(),
            index: HashMap::new(),
        };
        for fixed in ["blocked", "table_full", "cost"] {
            labels.id(fixed.to_string());
        }
        labels
    }

    /// The counter of `label` (the same counter for the same label).
    pub(crate) fn id(&mut self, label: String) -> usize {
        if let Some(&i) = self.index.get(&label) {
            return i;
        }
        let i = self.names.len();
        self.names.push(label.clone());
        self.index.insert(label, i);
        i
    }

    /// The counters of a limit's parts: `<kind>:<name>/<part>` (`plan:pro/0`, `rule:/login/0`).
    pub(crate) fn parts(&mut self, kind: &str, name: &str, parts: usize) -> Vec<usize> {
        (0..parts)
            .map(|i| self.id(format!("{kind}:{name}/{i}")))
            .collect()
    }
}

/// The layer's counters, by index in a stripe.
#[derive(Clone, Copy)]
enum Counter {
    Requests,
    SoftPassed,
    Queued,
    QueuedWaitNs,
    BadKey,
    Anonymous,
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

impl HttpCounters {
    pub(crate) fn new(labels: LimitLabels) -> Self {
        HttpCounters {
            striped: Arc::new(Striped::new()),
            limited: labels.names.iter().map(|_| Arc::default()).collect(),
            labels: labels.names,
        }
    }

    /// The counters of a reloaded config's `labels`, going on from these: the same request
    /// counters, and the same denial counter for every label both configs name.
    pub(crate) fn carried(&self, labels: LimitLabels) -> Self {
        let limited = labels
            .names
            .iter()
            .map(|name| match self.labels.iter().position(|l| l == name) {
                Some(i) => Arc::clone(&self.limited[i]),
                None => Arc::default(),
            })
            .collect();
        HttpCounters {
            striped: Arc::clone(&self.striped),
            limited,
            labels: labels.names,
        }
    }

    #[inline(always)]
    fn add(&self, c: Counter, n: u64) {
        self.striped.add(c as usize, n);
    }
    #[inline]
    pub(crate) fn request(&self) {
        self.add(Counter::Requests, 1);
    }
    /// A denial by limit `by` (a [`LimitLabels`] index).
    pub(crate) fn limited(&self, by: usize) {
        // Relaxed: a statistic, read as a snapshot. One shared word per limit (not striped):
        // a denial also formats and allocates its answer, which costs far more.
        self.limited[by].fetch_add(1, Ordering::Relaxed);
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
    pub(crate) fn anonymous(&self) {
        self.add(Counter::Anonymous, 1);
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
        let get = |c: Counter| self.striped.sum(c as usize);
        describe_counter!(
            "tollgate_http_limited_total",
            "Requests denied (429), by the limit that denied: `plan:<plan>/<part>`, \
             `rule:<rule>/<part>`, `blocked`, `table_full` or `cost`."
        );
        for (label, n) in self.labels.iter().zip(&self.limited[..]) {
            let mut labels = base.to_vec();
            labels.push(Label::new("limit", label.clone()));
            // Relaxed: a snapshot of statistics.
            counter!("tollgate_http_limited_total", labels).absolute(n.load(Ordering::Relaxed));
        }
        for (metric, help, v) in [
            (
                "tollgate_http_requests_total",
                "Requests seen by the layer.",
                get(Counter::Requests),
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
                "Requests whose client key was malformed or unknown (fallback applied).",
                get(Counter::BadKey),
            ),
            (
                "tollgate_http_anonymous_total",
                "Requests without the API key or user the key asks for (fallback applied).",
                get(Counter::Anonymous),
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
