#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
#![warn(missing_debug_implementations)]

pub(crate) mod algo;
pub(crate) mod cell;
pub(crate) mod clock;
pub(crate) mod decision;
pub(crate) mod error;
pub(crate) mod guard;
#[cfg(feature = "http")]
pub mod http;
pub(crate) mod ip;
pub(crate) mod limiter;
pub(crate) mod plan;
pub(crate) mod quota;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "rls")]
pub mod rls;
pub(crate) mod stats;
pub(crate) mod store;
pub(crate) mod sweep;
pub(crate) mod sync;
#[cfg(feature = "tokio")]
mod wait;

#[cfg(test)]
mod tests;

#[cfg(tollgate_loom)]
#[doc(hidden)]
pub mod loom_api;

#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzz_api;

pub use clock::{Clock, FAKE_UNIX_EPOCH_S, FakeClock, MonotonicClock};
pub use decision::{Decision, Reason};
pub use error::Error;
pub use guard::LoginGuard;
pub use ip::{DEFAULT_V6_PREFIX, client_ip_key};
pub use limiter::{
    Bound, Builder, Limiter, MAX_PARTS, MAX_SHARDS, Part, Plan, PlanId, Strategy, check_all,
};
pub use plan::PlanConfig;
pub use quota::{Algorithm, Quota};
pub use stats::{PlanStats, RuleStats, Stats};
pub use store::{OnFull, StoreKind};
pub use sweep::Sweeper;
