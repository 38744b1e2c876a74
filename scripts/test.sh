#!/usr/bin/env bash
# Every test: format, lints, the API docs (no broken links), unit + integration + doc tests (the
# Redis ones on servers it starts), the async twins without features, the loom models, the
# key/hash flood and real-clock tests (release, full size), the must-fail run against the
# deliberately broken cell, every fuzz target for 30 s, a short demo run, the HTTP server under
# curl, Envoy's rate limit API against a client it did not write, and the benches once each.
# Installs what it needs (redis-server, curl, a Python venv for the RLS client, nightly and
# cargo-fuzz). Expected run time on a 2-core machine: see docs/verification.md.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== fmt";    cargo fmt --all --check
echo "== clippy"; cargo clippy --all-targets --all-features -- -D warnings
(cd benches && cargo fmt --check && cargo clippy --quiet --all-targets --all-features -- -D warnings)   # the benches' own package
echo "== doc";    RUSTDOCFLAGS="-D warnings" cargo doc --quiet --no-deps --all-features   # as docs.rs builds it
echo "== redis";  bash scripts/ensure-redis.sh   # the redis feature's tests start real servers
echo "== features"; cargo clippy --quiet --lib -- -D warnings && cargo clippy --quiet --lib --features tokio -- -D warnings   # each alone builds clean
echo "== tests";  cargo test --all-features
echo "== no features"; cargo test --quiet --test async_twins   # the async twins without redis
echo "== loom";   bash scripts/loom.sh
echo "== flood";  cargo test --release --test flood -- --nocapture --test-threads=1
echo "== must-fail"; bash scripts/must-fail.sh
echo "== fuzz";   bash scripts/fuzz.sh
echo "== demo";   cargo run --release --features cli --quiet -- demo >/dev/null
echo "== http";   bash scripts/http_curl.sh
echo "== rls";    bash scripts/rls-conformance.sh   # grpcio + xds-protos against tollgate rls
echo "== bench"   # the benches are a package of their own (benches/Cargo.toml)
(cd benches && cargo bench --quiet --bench check -- --test)   # every criterion bench once
(cd benches && TOLLGATE_BENCH=short cargo bench --quiet --bench throughput)   # the harness, short mode
echo "all tests passed"
