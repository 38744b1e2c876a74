#!/usr/bin/env bash
# Runs the loom models (loom-tests/) in release mode with a small preemption bound, and prints
# how many interleavings each model explored.
# Expected time on a 2-core machine: about a minute to build, under a minute to run.
#
# Extra arguments go to `cargo test` (e.g. `bash scripts/loom.sh --test cells`).
# TOLLGATE_LOOM_TARGET_DIR picks another target folder (scripts/must-fail.sh uses one per
# broken variant, so the normal build stays cached).
set -euo pipefail
cd "$(dirname "$0")/../loom-tests"
export RUSTFLAGS="${RUSTFLAGS:-} --cfg tollgate_loom"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
if [[ -n "${TOLLGATE_LOOM_TARGET_DIR:-}" ]]; then
    export CARGO_TARGET_DIR="$TOLLGATE_LOOM_TARGET_DIR"
fi
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
cargo test --release --tests "$@" -- --nocapture --test-threads=1 2>&1 | tee "$log" || status=$?
echo "== loom summary (LOOM_MAX_PREEMPTIONS=$LOOM_MAX_PREEMPTIONS)"
# Every model prints "<name>: <n> interleavings" (after cargo's "test <fn> ... " when captured).
grep -E ': [0-9]+ interleavings' "$log" | sed -E 's/^test [^ ]+ \.\.\. //' || true
echo "$(grep -cE ': [0-9]+ interleavings' "$log" || true) models"
exit "$status"
