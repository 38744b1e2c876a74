//! loom models of turnstile's cells. Run with `scripts/loom.sh`.
#[cfg(not(turnstile_loom))]
compile_error!("loom-tests must be built with RUSTFLAGS=\"--cfg turnstile_loom\": run scripts/loom.sh");
