//! What `tollgate serve` and `tollgate rls` share: the signals that stop them, and a config
//! watched for changes.

use std::future::Future;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};

/// How often a watched config is read for a change.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
pub(crate) async fn stop_signal() {
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Reads a config with `read` (on a blocking thread, so a slow disk holds up no request)
/// every [`WATCH_EVERY`], and with `hup` on SIGHUP too; calls `changed` with what it read
/// whenever that differs from the reading before (a file edited in place or replaced by a
/// rename alike), and on SIGHUP (`asked`) whatever it read. Runs until `stop` resolves.
pub(crate) async fn watch<T, R>(
    read: R,
    hup: bool,
    mut changed: impl FnMut(&T, bool),
    stop: impl Future<Output = ()>,
) where
    T: PartialEq + Send + 'static,
    R: Fn() -> T + Clone + Send + 'static,
{
    let read_now = || tokio::task::spawn_blocking(read.clone());
    let mut hup = if hup {
        signal(SignalKind::hangup()).ok()
    } else {
        None
    };
    let mut last = read_now().await.ok();
    let mut tick = tokio::time::interval(WATCH_EVERY);
    // A read slower than the period (a large directory, a slow disk) is not followed by a
    // burst of the ticks it missed.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is now: the reading above is its.
    tick.tick().await;
    tokio::pin!(stop);
    loop {
        let asked = tokio::select! {
            _ = tick.tick() => false,
            Some(()) = async {
                match hup.as_mut() {
                    Some(hup) => hup.recv().await,
                    None => std::future::pending().await,
                }
            } => true,
            () = &mut stop => return,
        };
        let Ok(now) = read_now().await else {
            continue;
        };
        if !asked && last.as_ref() == Some(&now) {
            continue;
        }
        changed(&now, asked);
        last = Some(now);
    }
}
