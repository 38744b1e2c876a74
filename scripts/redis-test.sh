#!/usr/bin/env bash
# The Redis tests alone: installs redis-server when missing, then runs every tests/redis_*.rs
# against servers (and a 3-master cluster) the tests start on free loopback ports and stop
# themselves. About 25 s warm on the 2-core dev machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-redis.sh
cargo test --features redis --test redis_exact --test redis_faults --test redis_cluster \
    --test redis_synced --test redis_shared --test redis_exact_limiter "$@"
# Three `tollgate serve` processes behind one redis-server (needs the program and the layer).
cargo test --features redis,http,cli --test redis_serve "$@"
