#!/usr/bin/env bash
# Conformance of `tollgate rls` through a gRPC client the project did not write: Python grpcio
# with the Envoy stubs of the xds-protos package (installed here, in target/rls-venv). Starts the
# server on free ports with a copy of tests/rls/conformance, runs scripts/rls_conformance.py
# (exact codes, remaining counts, stats, reloads), then stops it with SIGTERM and checks it
# exits 0. About 30 s on a warm build (the first run also installs the venv: ~1 min).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    # Debian splits venv and pip out of python3 (and a fresh machine may lack python3).
    echo "== installing python3-venv"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq python3-venv
fi
VENV=target/rls-venv
if ! "$VENV/bin/python" -c 'import grpc, envoy.service.ratelimit.v3.rls_pb2' 2>/dev/null; then
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q grpcio xds-protos
fi

cargo build -q --features cli,rls --bin tollgate
WORK=target/rls-conformance
rm -rf "$WORK" && mkdir -p "$WORK"
cp tests/rls/conformance/*.yaml "$WORK/"
free_port() { "$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
GRPC="127.0.0.1:$(free_port)"
HTTP="127.0.0.1:$(free_port)"

# Start-up with a bad config: a non-zero exit naming the file and the field.
if target/debug/tollgate rls --config tests/rls/bad --grpc "$GRPC" --http "$HTTP" 2>"$WORK/bad.log"; then
    echo "FAIL: a bad config started"; exit 1
fi
grep -q 'tests/rls/bad/bad.yaml: descriptors\[0\].rate_limit.unit: invalid rate limit unit' "$WORK/bad.log" \
    || { echo "FAIL: the error does not name the file and field:"; cat "$WORK/bad.log"; exit 1; }

target/debug/tollgate rls --config "$WORK" --grpc "$GRPC" --http "$HTTP" 2>"$WORK/server.log" &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
"$VENV/bin/python" - "$HTTP" <<'PY'
import sys, time, urllib.request
for _ in range(100):
    try:
        urllib.request.urlopen(f"http://{sys.argv[1]}/healthcheck", timeout=1)
        break
    except OSError:
        time.sleep(0.1)
PY
"$VENV/bin/python" scripts/rls_conformance.py "$GRPC" "$HTTP" "$WORK" "$PID"
kill -TERM "$PID"
STATUS=0; wait "$PID" || STATUS=$?
trap - EXIT
[ "$STATUS" -eq 0 ] || { echo "FAIL: exit $STATUS after SIGTERM"; cat "$WORK/server.log"; exit 1; }
grep -q 'keeping the previous config' "$WORK/server.log" \
    || { echo "FAIL: the bad reload was not logged"; exit 1; }
echo "rls conformance: server stopped cleanly on SIGTERM"
