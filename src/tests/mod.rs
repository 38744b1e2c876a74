//! Cross-module tests: real threads, the table cap, sweeping, compound limits, plans, strategies.

mod config;
// The page lists the keys of every table, `[http]` and `[redis]` included.
#[cfg(all(feature = "http", feature = "redis"))]
mod config_reference;
mod engine;
mod flat;
mod plans;
mod shadow;
mod stores;
