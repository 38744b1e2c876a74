#!/usr/bin/env bash
# Builds every fuzz target that `cargo fuzz list` names (fuzz/, nightly toolchain, cargo-fuzz,
# address sanitizer, overflow checks) and runs each one for FUZZ_SECONDS (default 30) from its
# committed seed corpus (fuzz/corpus/<target>). Fails on any crash, panic, leak or timeout;
# libFuzzer then leaves the input in fuzz/artifacts/<target>/ (rerun it with
# `cd fuzz && cargo +nightly fuzz run <target> artifacts/<target>/<file>`).
# Installs the nightly toolchain and cargo-fuzz when missing.
#
# Prints the executions per target. Expected time on a 2-core machine: about 2 minutes to build
# (plus about 4 minutes to install cargo-fuzz on a fresh machine), then FUZZ_SECONDS per target.
#
# Usage: bash scripts/fuzz.sh [target...]   (default: every target)
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${FUZZ_SECONDS:-30}"

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "== installing the nightly toolchain"
    rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    # A debug build: it only drives cargo, and compiles in about half the time.
    cargo install cargo-fuzz --locked --debug
fi

if [[ $# -gt 0 ]]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
if [[ ${#targets[@]} -eq 0 ]]; then
    echo "no fuzz targets found" >&2
    exit 1
fi

echo "== building ${#targets[@]} fuzz targets: ${targets[*]}"
cargo +nightly fuzz build

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
summary=()
for t in "${targets[@]}"; do
    echo "== fuzzing $t for ${seconds} s"
    mkdir -p "$work/$t" "corpus/$t"
    # New inputs go to the scratch folder; the committed corpus is only read.
    status=0
    cargo +nightly fuzz run "$t" "$work/$t" "corpus/$t" -- \
        -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$work/$t.log" 2>&1 || status=$?
    grep -E '^Done [0-9]+ runs' "$work/$t.log" || true
    if [[ "$status" != 0 ]]; then
        echo "fuzz target $t FAILED (exit $status):"
        grep -m1 -A6 -E 'panicked|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)' "$work/$t.log" || true
        grep -E 'Test unit written|Reproduce with|cargo fuzz run' "$work/$t.log" || true
        tail -12 "$work/$t.log"
        exit 1
    fi
    runs="$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$work/$t.log" | grep -oE '[0-9]+$' || echo '?')"
    summary+=("$t: $runs executions in ${seconds} s")
done
echo "== fuzz summary"
printf '%s\n' "${summary[@]}"
