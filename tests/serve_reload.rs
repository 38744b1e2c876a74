//! `tollgate serve` reloads its config without losing state: on a change of the file (written
//! in place or replaced by a rename) and on SIGHUP; a bad new file keeps the running config;
//! SIGTERM stops it gracefully. A real process, real HTTP on loopback.
#![cfg(all(feature = "http", feature = "cli", unix))]

mod serve_support;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serve_support::Serve;

/// A config of plan `free` (`limit` an hour, so nothing refills during the test) keyed by
/// address, with `extra` after it.
fn config(limit: u64, extra: &str) -> String {
    format!("[plans.free]\nlimit = {limit}\nwindow = \"1h\"\n\n[http]\nkey = \"ip\"\n{extra}")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-reload-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_changed_file_is_reloaded_keeping_what_clients_spent() {
    let dir = scratch("change");
    let path = dir.join("serve.toml");
    std::fs::write(&path, config(3, "")).unwrap();
    let serve = Serve::start(&path);
    assert_eq!(serve.statuses("/", 2), [200, 200]);

    // Raised in place to 5: the client keeps the 2 it spent, so 3 more pass, not 5.
    std::fs::write(&path, config(5, "")).unwrap();
    serve.said("reloaded");
    assert_eq!(serve.statuses("/", 4), [200, 200, 200, 429]);

    // A bad file keeps the running config (and says which field is wrong).
    std::fs::write(&path, "[plans.free]\nlimit = 0\nwindow = \"1h\"\n").unwrap();
    let why = serve.said("kept the running config");
    assert!(why.contains("limit"), "{why}");
    assert_eq!(serve.statuses("/", 1), [429]);

    // Replaced by a rename, with a route rule added: the plan's state is still there, and the
    // new rule is in effect.
    let next = dir.join("next.toml");
    std::fs::write(
        &next,
        config(
            10,
            "\n[plans.api]\nlimit = 1\nwindow = \"1h\"\n\n[[http.routes]]\npath = \"/api/*\"\nplan = \"api\"\n",
        ),
    )
    .unwrap();
    std::fs::rename(&next, &path).unwrap();
    serve.said("reloaded");
    // The rule admits one: the second is its 429 (the plan's unit refunded).
    assert_eq!(serve.statuses("/api/x", 2), [200, 429]);
    // The plan: 10 less the 5 spent before and the 1 the rule's first request kept.
    assert_eq!(serve.statuses("/", 5), [200, 200, 200, 200, 429]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sighup_reloads_and_sigterm_stops_gracefully() {
    let dir = scratch("signals");
    let path = dir.join("serve.toml");
    std::fs::write(&path, config(2, "")).unwrap();
    let mut serve = Serve::start(&path);
    assert_eq!(serve.statuses("/", 3), [200, 200, 429]);
    let pid = serve.child.id().to_string();
    let kill = |signal: &str| {
        let ok = Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {signal} {pid}");
    };
    kill("-HUP");
    serve.said("reloaded");
    // Nothing changed: the client's state is as it was.
    assert_eq!(serve.statuses("/", 1), [429]);
    kill("-TERM");
    let deadline = Instant::now() + Duration::from_secs(5);
    let code = loop {
        if let Some(code) = serve.child.try_wait().unwrap() {
            break code;
        }
        assert!(
            Instant::now() < deadline,
            "tollgate serve did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(code.success(), "{code:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
