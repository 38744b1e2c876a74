//! The ecosystem hooks: the limiter's and the HTTP layer's counters through the `metrics` facade
//! (checked exactly with metrics-util's debugging recorder), and `tracing` events for plan
//! changes, sweeps and a full table (checked with a subscriber that records them).
#![cfg(all(feature = "metrics", feature = "tracing"))]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tollgate::{FakeClock, Limiter, Plan, Quota};

/// The recorded value of `name` with label `outcome` (if given), for limiter `limiter`.
fn value(
    snapshot: &[(metrics_util::CompositeKey, DebugValue)],
    name: &str,
    limiter: &str,
    outcome: Option<&str>,
) -> Option<String> {
    snapshot.iter().find_map(|(k, v)| {
        let key = k.key();
        let labels: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
        let ok = key.name() == name
            && labels.contains(&("limiter", limiter))
            && outcome.is_none_or(|o| labels.contains(&("outcome", o)));
        ok.then(|| format!("{v:?}"))
    })
}

/// The tests of this file run one at a time: tracing caches each event site's interest
/// process-wide, and an event site first reached by one test with no subscriber while another
/// test's scoped subscriber is being installed can miss it.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn stats_are_published_through_the_metrics_facade() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let clock = FakeClock::new();
    let l = Limiter::<u64>::builder()
        .quota(Quota::per_minute(2))
        .max_keys(3)
        .clock(clock.clone())
        .build()
        .unwrap();
    for k in 0..3 {
        assert!(l.check(&k).is_allowed());
    }
    assert!(l.check(&0).is_allowed());
    assert!(!l.check(&0).is_allowed());
    assert!(!l.check(&9).is_allowed()); // table full
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        l.publish_metrics("api");
        // Published twice: counters are set to their totals, never added twice.
        l.publish_metrics("api");
    });
    let snapshot: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| (k, v))
        .collect();
    let counter = |name, outcome| value(&snapshot, name, "api", outcome);
    assert_eq!(
        counter("tollgate_decisions_total", Some("allowed")),
        Some(format!("{:?}", DebugValue::Counter(4)))
    );
    assert_eq!(
        counter("tollgate_decisions_total", Some("denied")),
        Some(format!("{:?}", DebugValue::Counter(2)))
    );
    assert_eq!(
        counter("tollgate_decisions_total", Some("table_full")),
        Some(format!("{:?}", DebugValue::Counter(1)))
    );
    assert_eq!(
        value(&snapshot, "tollgate_keys", "api", None),
        Some(format!("{:?}", DebugValue::Gauge(3.0.into())))
    );
}

/// A subscriber that keeps every event's message.
#[derive(Default, Clone)]
struct Recorded(Arc<Mutex<Vec<String>>>);

impl tracing::Subscriber for Recorded {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{v:?}");
                }
            }
        }
        let mut m = Message(String::new());
        event.record(&mut m);
        self.0
            .lock()
            .unwrap()
            .push(format!("{} {}", event.metadata().level(), m.0));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn plan_changes_sweeps_and_a_full_table_are_traced() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let clock = FakeClock::new();
    let l = Limiter::<u64>::builder()
        .quota(Quota::per_second(1))
        .max_keys(1)
        .on_full(tollgate::OnFull::Deny)
        .clock(clock.clone())
        .build()
        .unwrap();
    let recorded = Recorded::default();
    tracing::subscriber::with_default(recorded.clone(), || {
        assert!(l.check(&1).is_allowed());
        assert!(!l.check(&2).is_allowed());
        l.set_plan("pro", Plan::new([Quota::per_second(10)]))
            .unwrap();
        clock.advance(Duration::from_secs(5));
        assert_eq!(l.sweep_now(), 1);
    });
    let events = recorded.0.lock().unwrap().clone();
    assert_eq!(
        events,
        [
            "DEBUG table full: a new state was denied (Reason::TableFull)",
            "INFO plan changed",
            "DEBUG sweep step",
        ],
        "{events:?}"
    );
}
