#!/usr/bin/env bash
# Makes sure redis-server, redis-cli and redis-benchmark are on PATH (the Redis tests start their
# own servers on free loopback ports; nothing needs to be running). Installs Debian's
# `redis-server` package when any is missing. Idempotent; about 20 s when it installs.
set -euo pipefail

if command -v redis-server >/dev/null && command -v redis-cli >/dev/null \
    && command -v redis-benchmark >/dev/null; then
    exit 0
fi
echo "installing redis-server (apt-get)"
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq redis-server >/dev/null
# The package starts a system service on port 6379; the tests do not use it.
redis-server --version
