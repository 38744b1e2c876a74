//! Cross-module tests: real threads, the table cap, sweeping, compound limits, plans, strategies.

mod config;
mod engine;
mod flat;
mod plans;
mod shadow;
mod stores;
