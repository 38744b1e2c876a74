#!/usr/bin/env bash
# Instructions per call of each case of `benches/plans.rs`, tollgate's and governor's, counted
# by callgrind (exact and repeatable where wall-clock figures on a shared VM move by 30%).
# Usage: bash scripts/instructions.sh [case substring...]   (about 1 minute a case)
set -euo pipefail
cd "$(dirname "$0")/../benches"   # the benches' own package
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)"; exit 1; }
cargo bench --bench plans --no-run --message-format=json 2>/dev/null >"${TMPDIR:-/tmp}/plans-build.json"
bin=$(grep -o '"executable":"[^"]*plans-[^"]*"' "${TMPDIR:-/tmp}/plans-build.json" | cut -d'"' -f4)
calls=${TOLLGATE_PLANS_CALLS:-200000}
cases=("$@")
if [[ ${#cases[@]} -eq 0 ]]; then
    cases=("default plan" "3 plans" "2 quotas" "first denies" "second denies"
        "AND global" "per-user denies" "global denies")
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
printf '| case | tollgate Ir/call | governor Ir/call | ratio |\n|---|---|---|---|\n'
for c in "${cases[@]}"; do
    TOLLGATE_PLANS_ONLY="$c" TOLLGATE_PLANS_CALLS="$calls" valgrind --tool=callgrind \
        --callgrind-out-file="$out/cg" "$bin" >/dev/null 2>&1
    callgrind_annotate --inclusive=yes "$out/cg" >"$out/annotated" 2>/dev/null
    ir() { grep -m1 "plans::$1" "$out/annotated" | awk '{gsub(",","",$1); print $1}'; }
    t=$(ir calls_tollgate); g=$(ir calls_governor)
    awk -v c="$c" -v t="$t" -v g="$g" -v n="$calls" \
        'BEGIN { printf "| %s | %.0f | %.0f | %.2f |\n", c, t/n, g/n, g/t }'
done
