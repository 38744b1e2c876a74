#!/usr/bin/env bash
# `tollgate serve` watched with curl: the headers count down, the 429 arrives with Retry-After
# and the JSON body, a forged X-Forwarded-For from an untrusted peer changes nothing, and
# /metrics counts it all. Builds the binary (debug) and starts/stops its own server on a free
# loopback port. Installs curl with apt-get if it is missing. About 5 s after the build.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v curl >/dev/null; then
    echo "curl missing: installing it"
    if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq curl >/dev/null
    else sudo apt-get update -qq && sudo apt-get install -y -qq curl >/dev/null; fi
fi

# The binary as `cargo test --all-features` builds it for the integration tests (the CI step before
# this one), so no dependency is compiled a second time with other features.
cargo test --quiet --all-features --no-run 2>/dev/null
bin=${CARGO_TARGET_DIR:-target}/debug/tollgate
[ -x "$bin" ] || { echo "FAIL: $bin was not built"; exit 1; }
work=$(mktemp -d)
server_pid=
cleanup() {
    if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

# The example config, with the free plan's burst of 5 and a fixed 127.0.0.1-only proxy list.
"$bin" serve --config examples/plans.toml --listen 127.0.0.1:0 >"$work/out" 2>&1 &
server_pid=$!
for _ in $(seq 1 100); do
    grep -q "listening on" "$work/out" 2>/dev/null && break
    kill -0 "$server_pid" 2>/dev/null || { cat "$work/out"; echo "FAIL: the server exited"; exit 1; }
    sleep 0.1
done
url=$(sed -n 's/.*listening on \(http:\/\/[0-9.:]*\).*/\1/p' "$work/out")
[ -n "$url" ] || { cat "$work/out"; echo "FAIL: no listening line"; exit 1; }
echo "server at $url"

fail() { echo "FAIL: $*"; exit 1; }
header() { grep -i "^$1:" "$2" | head -1 | cut -d' ' -f2- | tr -d '\r'; }

# The free plan: burst 5 (10 per minute). From 127.0.0.2, not a trusted proxy, with a new
# forged X-Forwarded-For each time: one client all the same.
for want in 4 3 2 1 0; do
    curl -s -i --interface 127.0.0.2 -H "X-Forwarded-For: 198.51.100.$want" "$url/" >"$work/r"
    head -1 "$work/r" | grep -q " 200" || { cat "$work/r"; fail "expected 200"; }
    [ "$(header x-ratelimit-limit "$work/r")" = 5 ] || fail "X-RateLimit-Limit"
    [ "$(header x-ratelimit-remaining "$work/r")" = "$want" ] || { cat "$work/r"; fail "X-RateLimit-Remaining $want"; }
    header ratelimit "$work/r" | grep -q "\"free\";r=$want;t=" || fail "RateLimit r=$want"
    echo "  200  X-RateLimit-Remaining: $want   RateLimit: $(header ratelimit "$work/r")"
done
curl -s -i --interface 127.0.0.2 -H "X-Forwarded-For: 198.51.100.99" "$url/" >"$work/r"
head -1 "$work/r" | grep -q " 429" || { cat "$work/r"; fail "expected 429"; }
retry=$(header retry-after "$work/r")
[ "$retry" -ge 1 ] && [ "$retry" -le 6 ] || fail "Retry-After $retry (one 6 s interval at most)"
[ "$(header content-type "$work/r")" = application/json ] || fail "content-type"
body=$(tail -1 "$work/r")
echo "$body" | grep -q '^{"error":"Rate limit exceeded","message":"You have exceeded your 10 requests per minute limit","reset_at":"[0-9]\{4\}-[0-9]\{2\}-[0-9]\{2\}T[0-9]\{2\}:[0-9]\{2\}:[0-9]\{2\}Z"}$' \
    || fail "429 body: $body"
echo "  429  Retry-After: $retry   $body"

# Another address is another client; the same header from the trusted proxy 127.0.0.1 is
# believed (198.51.100.7 gets its own bucket).
curl -s -i --interface 127.0.0.3 "$url/" >"$work/r"
[ "$(header x-ratelimit-remaining "$work/r")" = 4 ] || fail "127.0.0.3 is its own client"
curl -s -i --interface 127.0.0.1 -H "X-Forwarded-For: 198.51.100.7" "$url/" >"$work/r"
[ "$(header x-ratelimit-remaining "$work/r")" = 4 ] || fail "forwarded client from a trusted proxy"

# The pro plan (API key), a compound limit: both parts and the global rule are listed.
curl -s -i --interface 127.0.0.4 -H "x-api-key: demo-pro-key" "$url/api/items" >"$work/r"
policy=$(header ratelimit-policy "$work/r")
[ "$policy" = '"pro.0";q=5;w=1, "pro.1";q=1000;w=3600;burst=100, "global";q=100;w=1' ] || fail "policy: $policy"
echo "  pro: RateLimit-Policy: $policy"

curl -s "$url/metrics" >"$work/m"
grep -q '^tollgate_http_limited_total{limit="plan:free/0"} 1$' "$work/m" || { cat "$work/m"; fail "metrics: limited"; }
grep -q '^tollgate_http_requests_total 9$' "$work/m" || { cat "$work/m"; fail "metrics: requests"; }
grep -q '^# TYPE tollgate_decisions_total counter$' "$work/m" || fail "metrics: TYPE line"
echo "  /metrics: $(grep -c '^tollgate_' "$work/m") samples"
echo "http curl checks passed"
