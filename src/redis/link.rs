//! The connection to Redis (one multiplexed connection, or a cluster connection), made lazily
//! and remade after a failure, and the circuit breaker that decides when to try it.
//!
//! There is no offline queue: a call either reaches Redis within its deadline or is answered by
//! the failure policy, and a call whose outcome is unknown (a timeout, a dropped connection after
//! the request was written) is never sent again.

use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::cluster_async::ClusterConnection;
use ::redis::{AsyncConnectionConfig, Client, Cmd, FromRedisValue, Pipeline, RedisResult};

use crate::error::Error;
use crate::sync::{AtomicU64, Mutex, Ordering, lock};

/// Where the limiter's state lives.
#[derive(Clone)]
pub(crate) enum Target {
    Single(Client),
    Cluster(::redis::cluster::ClusterClient),
}

impl Target {
    pub(crate) fn single(url: &str) -> Result<Target, Error> {
        Client::open(url)
            .map(Target::Single)
            .map_err(|e| bad_url(url, &e))
    }

    pub(crate) fn cluster(nodes: &[&str], deadline: Duration) -> Result<Target, Error> {
        if nodes.is_empty() {
            return Err(Error::Config {
                line: None,
                message: "redis cluster: no seed nodes given".into(),
            });
        }
        for n in nodes {
            // Each node is checked on its own so the message names the bad one.
            Client::open(*n).map_err(|e| bad_url(n, &e))?;
        }
        ::redis::cluster::ClusterClient::builder(nodes.to_vec())
            // No retries: a retried script after an I/O error could charge twice.
            .retries(0)
            .connection_timeout(deadline.max(Duration::from_millis(100)))
            .build()
            .map(Target::Cluster)
            .map_err(|e| Error::Config {
                line: None,
                message: format!("redis cluster: {e}"),
            })
    }
}

fn bad_url(url: &str, e: &::redis::RedisError) -> Error {
    Error::Config {
        line: None,
        message: format!("redis url '{url}': {e}"),
    }
}

/// A live connection: cheap to clone (both kinds multiplex over shared sockets).
#[derive(Clone)]
pub(crate) enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    pub(crate) async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> RedisResult<T> {
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => cmd.query_async(c).await,
        }
    }

    pub(crate) async fn pipe<T: FromRedisValue>(&mut self, p: &Pipeline) -> RedisResult<T> {
        match self {
            Conn::Single(c) => p.query_async(c).await,
            Conn::Cluster(c) => p.query_async(c).await,
        }
    }
}

/// The connection slot: at most one connection, and at most one attempt to make one at a time.
pub(crate) struct Link {
    target: Target,
    conn: Mutex<Option<Conn>>,
    connecting: tokio::sync::Mutex<()>,
    /// Connections made (for the stats).
    pub(crate) connects: AtomicU64,
}

/// Deletes `keys` (the names of one key, so one Cluster slot) within `deadline`: how many of them
/// existed.
pub(crate) async fn delete(link: &Link, deadline: Duration, keys: &[String]) -> Result<u64, Error> {
    let run = async {
        let mut conn = link.get().await?;
        let mut cmd = Cmd::new();
        cmd.arg("DEL").arg(keys);
        conn.query::<u64>(&cmd).await
    };
    match tokio::time::timeout(deadline, run).await {
        Ok(Ok(n)) => Ok(n),
        Ok(Err(e)) => Err(Error::Redis(e.to_string())),
        Err(_) => Err(Error::Redis(format!("no answer within {deadline:?}"))),
    }
}

impl Link {
    pub(crate) fn new(target: Target) -> Link {
        Link {
            target,
            conn: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            connects: AtomicU64::new(0),
        }
    }

    /// True for a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(_))
    }

    /// The live connection, connecting first if there is none. The caller bounds the wait.
    pub(crate) async fn get(&self) -> RedisResult<Conn> {
        if let Some(c) = lock(&self.conn).clone() {
            return Ok(c);
        }
        // One connection attempt at a time: callers queue behind it (within their deadline)
        // instead of each opening a socket.
        let _one = self.connecting.lock().await;
        if let Some(c) = lock(&self.conn).clone() {
            return Ok(c);
        }
        let c = match &self.target {
            Target::Single(client) => Conn::Single(
                client
                    .get_multiplexed_async_connection_with_config(
                        &AsyncConnectionConfig::new()
                            .set_connection_timeout(Some(Duration::from_secs(5))),
                    )
                    .await?,
            ),
            Target::Cluster(client) => Conn::Cluster(client.get_async_connection().await?),
        };
        // Relaxed: a statistic.
        self.connects.fetch_add(1, Ordering::Relaxed);
        *lock(&self.conn) = Some(c.clone());
        Ok(c)
    }

    /// Forgets the connection (after an I/O error, or when the breaker opens): requests still
    /// waiting on it are abandoned with it, and the next attempt connects afresh.
    pub(crate) fn reset(&self) {
        lock(&self.conn).take();
    }
}

/// Circuit-breaker settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BreakerConfig {
    /// Consecutive failures that open the breaker.
    pub(crate) threshold: u64,
    /// First wait before a probe, ns.
    pub(crate) min_backoff_ns: u64,
    /// Longest wait before a probe, ns (the backoff doubles up to it).
    pub(crate) max_backoff_ns: u64,
}

impl BreakerConfig {
    /// The defaults of every mode: open after 3 failures, probe after 100 ms, back off to 5 s.
    pub(crate) const DEFAULT: BreakerConfig = BreakerConfig {
        threshold: 3,
        min_backoff_ns: 100_000_000,
        max_backoff_ns: 5_000_000_000,
    };

    /// The settings a builder's `breaker(threshold, min_backoff, max_backoff)` asks for: at
    /// least one failure, a backoff of at least 1 ns, the longest at least the first.
    pub(crate) fn new(threshold: u64, min_backoff: Duration, max_backoff: Duration) -> Self {
        let min = crate::clock::nanos(min_backoff).max(1);
        BreakerConfig {
            threshold: threshold.max(1),
            min_backoff_ns: min,
            max_backoff_ns: crate::clock::nanos(max_backoff).max(min),
        }
    }
}

/// What the breaker lets a call do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Closed: go to Redis.
    Pass,
    /// Open, and this call is the one probe: go to Redis; its outcome closes or reopens.
    Probe,
    /// Open: answer by the policy without touching Redis.
    Shut,
}

/// A circuit breaker on the limiter's clock: closed, open until a moment, then one probe at a
/// time. Races between callers only decide which of them counts a failure first or which one
/// probes; every field is a single word changed by one atomic operation.
pub(crate) struct Breaker {
    cfg: BreakerConfig,
    /// Consecutive failures while closed.
    failures: AtomicU64,
    /// 0 when closed; else the clock reading at which a probe may go.
    open_until: AtomicU64,
    /// The wait the next opening uses.
    backoff: AtomicU64,
    /// 1 while a probe is in flight.
    probing: AtomicU64,
}

impl Breaker {
    pub(crate) fn new(cfg: BreakerConfig) -> Breaker {
        Breaker {
            cfg,
            failures: AtomicU64::new(0),
            open_until: AtomicU64::new(0),
            backoff: AtomicU64::new(cfg.min_backoff_ns),
            probing: AtomicU64::new(0),
        }
    }

    /// Whether a call at `now` may go to Redis.
    pub(crate) fn gate(&self, now: u64) -> Gate {
        // Acquire: pairs with the Release stores in `success` / `failure`; whichever of those
        // came last decides. A stale read only makes one more call pass or wait one backoff.
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Gate::Pass;
        }
        if now < until {
            return Gate::Shut;
        }
        // AcqRel: exactly one caller wins the probe; the winner's later Release store of 0
        // (in `success` / `failure` / `abandon`) lets the next probe go.
        match self
            .probing
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Gate::Probe,
            Err(_) => Gate::Shut,
        }
    }

    /// The wait left before the next probe (for a fail-closed `retry_after`).
    pub(crate) fn wait_ns(&self, now: u64) -> u64 {
        // Acquire: see `gate`.
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            self.cfg.min_backoff_ns
        } else {
            until.saturating_sub(now).max(1)
        }
    }

    /// A call reached Redis and got an answer: close.
    pub(crate) fn success(&self, gate: Gate) {
        // Relaxed: the count is only compared against the threshold.
        self.failures.store(0, Ordering::Relaxed);
        if gate == Gate::Probe {
            // Relaxed: only `failure` reads it, after the breaker opens again.
            self.backoff
                .store(self.cfg.min_backoff_ns, Ordering::Relaxed);
            // Release (both): a caller that sees the breaker closed sees the reset backoff.
            self.open_until.store(0, Ordering::Release);
            self.probing.store(0, Ordering::Release);
        }
    }

    /// A call failed at `now`. Returns true when this failure opened the breaker.
    pub(crate) fn failure(&self, gate: Gate, now: u64) -> bool {
        let opened = self.record_failure(gate, now);
        #[cfg(feature = "tracing")]
        if opened {
            // Relaxed: a figure for the message only.
            let backoff_ms = self.backoff.load(Ordering::Relaxed) / 1_000_000;
            tracing::warn!(
                target: "tollgate",
                ?gate,
                backoff_ms,
                "Redis failing: breaker open, the failure policy answers"
            );
        }
        opened
    }

    /// [`failure`](Self::failure)'s bookkeeping.
    fn record_failure(&self, gate: Gate, now: u64) -> bool {
        match gate {
            Gate::Probe => {
                // Relaxed: only probes (one at a time, ordered by `probing`) touch it here.
                let b = self.backoff.load(Ordering::Relaxed);
                let next = b.saturating_mul(2).min(self.cfg.max_backoff_ns);
                self.backoff.store(next, Ordering::Relaxed);
                // Release: see `gate`.
                self.open_until
                    .store(now.saturating_add(b).max(1), Ordering::Release);
                self.probing.store(0, Ordering::Release);
                true
            }
            Gate::Pass => {
                // Relaxed: a counter; one RMW per failure so none is lost.
                let f = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
                if f < self.cfg.threshold {
                    return false;
                }
                // Relaxed: see above.
                let b = self.backoff.load(Ordering::Relaxed);
                // AcqRel: only the caller that moves it from closed opens it (and counts it).
                self.open_until
                    .compare_exchange(
                        0,
                        now.saturating_add(b).max(1),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    )
                    .is_ok()
            }
            Gate::Shut => false,
        }
    }

    /// A probe that ended without an outcome (its caller dropped the future): let another go.
    pub(crate) fn abandon(&self) {
        // Release: see `gate`.
        self.probing.store(0, Ordering::Release);
    }

    /// True while open.
    pub(crate) fn is_open(&self) -> bool {
        // Acquire: see `gate`.
        self.open_until.load(Ordering::Acquire) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breaker_opens_probes_backs_off_and_closes() {
        let b = Breaker::new(BreakerConfig {
            threshold: 3,
            min_backoff_ns: 100,
            max_backoff_ns: 350,
        });
        assert_eq!(b.gate(0), Gate::Pass);
        assert!(!b.failure(Gate::Pass, 10));
        assert!(!b.failure(Gate::Pass, 11));
        assert!(b.failure(Gate::Pass, 12), "the third failure opens");
        assert!(
            !b.failure(Gate::Pass, 12),
            "only one caller counts the opening"
        );
        assert!(b.is_open());
        assert_eq!(b.gate(111), Gate::Shut);
        assert_eq!(b.wait_ns(111), 1);
        assert_eq!(b.gate(112), Gate::Probe);
        assert_eq!(b.gate(112), Gate::Shut, "one probe at a time");
        // A failed probe reopens for the same backoff, and doubles the next one.
        assert!(b.failure(Gate::Probe, 120));
        assert_eq!(b.gate(219), Gate::Shut);
        assert_eq!(b.gate(220), Gate::Probe);
        assert!(b.failure(Gate::Probe, 220));
        assert_eq!(b.gate(419), Gate::Shut);
        assert_eq!(b.gate(420), Gate::Probe);
        assert!(b.failure(Gate::Probe, 420));
        // Capped at max_backoff.
        assert_eq!(b.gate(769), Gate::Shut);
        assert_eq!(b.gate(770), Gate::Probe);
        // An abandoned probe lets the next caller probe.
        b.abandon();
        assert_eq!(b.gate(770), Gate::Probe);
        b.success(Gate::Probe);
        assert!(!b.is_open());
        assert_eq!(b.gate(771), Gate::Pass);
        // Closed again: the backoff starts over and the count restarts.
        assert!(!b.failure(Gate::Pass, 800));
        assert!(!b.failure(Gate::Pass, 800));
        b.success(Gate::Pass);
        assert!(!b.failure(Gate::Pass, 800));
        assert!(!b.failure(Gate::Pass, 800));
        assert!(b.failure(Gate::Pass, 800));
        assert_eq!(b.gate(899), Gate::Shut);
        assert_eq!(b.gate(900), Gate::Probe);
    }
}
