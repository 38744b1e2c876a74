#!/usr/bin/env bash
# Runs the loom models (loom-tests/) in release mode with a small preemption bound.
# Expected time on a 2-core machine: about a minute to build, seconds to run.
set -euo pipefail
cd "$(dirname "$0")/../loom-tests"
export RUSTFLAGS="${RUSTFLAGS:-} --cfg turnstile_loom"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
cargo test --release --tests "$@" -- --nocapture --test-threads=1
