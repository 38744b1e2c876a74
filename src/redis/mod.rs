//! Cluster-wide limits on Redis, Redis Cluster or Valkey (feature `redis`).
//!
//! Two modes:
//!
//! - [`RedisLimiter`], **exact mode**: every check is one Lua script that reads, decides and
//!   writes atomically on the server, with the server's clock (`TIME`), so every app server gets
//!   exactly the [`Decision`](crate::Decision) the in-process engine would give for the same
//!   history, whatever its own clock says. Compound limits (several quotas) are all-or-nothing in one script; their
//!   keys share a hash tag, so they live in one Cluster slot.
//! - [`SyncedLimiter`], **synced mode**: local atomic cells answer at in-process speed, and a
//!   background task reconciles local consumption with Redis in pipelined batches. It over-admits
//!   by a bounded amount (see its docs).
//!
//! When Redis is down, slow or has lost its data, a [`FailurePolicy`] answers instead: fail open,
//! fail closed, or a local share of the quota. Each call has a deadline; a circuit breaker stops
//! calling a dead server and probes it with backoff; nothing is queued while it is down, and a
//! call whose outcome is unknown is never replayed. Every degraded decision is counted in
//! [`RedisStats`].
//!
//! The files: `exact.rs` exact mode's limiter, `builder.rs` its builder and the settings both
//! modes share, `policy.rs` the failure policy's answer (one for both modes) and what is counted
//! of it, `link.rs` the connection and the breaker, `script.rs` the Lua scripts, `synced.rs`
//! the synced limiter, `track.rs` and `round.rs` synced mode's bookkeeping and rounds (shared by
//! [`SyncedLimiter`] and a [`Limiter`](crate::Limiter) synced through Redis), `config.rs` the
//! [`RedisConfig`] of a `Limiter` on Redis, `name.rs` the Redis key names.

mod builder;
mod config;
mod exact;
pub(crate) mod link;
mod name;
mod policy;
pub(crate) mod round;
mod script;
mod synced;
#[cfg(test)]
mod tests;
pub(crate) mod track;

pub(crate) use builder::common_setters;
pub(crate) use exact::LocalShare;
pub(crate) use name::state_key;
pub(crate) use policy::{CountsDegraded, Fallback};
pub(crate) use script::Call as ScriptCall;

pub use builder::{DEFAULT_DEADLINE, RedisBuilder};
pub use config::RedisConfig;
pub use exact::RedisLimiter;
pub use policy::{Checked, FailurePolicy, RedisStats, Source};
pub use synced::{SyncedBuilder, SyncedLimiter, SyncedStats};
