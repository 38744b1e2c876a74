//! The fake clock that every other model, the fuzz targets and the tests use to control time.

use loom::thread;
use tollgate::{Clock, FakeClock};
use tollgate_loom_tests::model;

/// An advance racing reads: every read is a time that existed, one thread's reads never go
/// backwards, and no advance is lost.
#[test]
fn fake_clock_advance() {
    model("fake clock advance", || {
        let clock = FakeClock::new();
        let c2 = clock.clone();
        let t = thread::spawn(move || {
            c2.advance_ns(5);
            c2.advance_ns(5);
        });
        let c3 = clock.clone();
        let r = thread::spawn(move || (c3.now(), c3.now()));
        let (a, b) = r.join().unwrap();
        assert!(a <= b && [0, 5, 10].contains(&a) && [0, 5, 10].contains(&b));
        t.join().unwrap();
        assert_eq!(clock.now(), 10);
    });
}

/// Two threads advance at once: both advances land (an add, not a load-then-store).
#[test]
fn fake_clock_concurrent_advances() {
    model("fake clock concurrent advances", || {
        let clock = FakeClock::new();
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let c = clock.clone();
                thread::spawn(move || c.advance_ns(7))
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(clock.now(), 14);
    });
}
