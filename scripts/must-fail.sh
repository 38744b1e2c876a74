#!/usr/bin/env bash
# Proves the suite can fail: builds the deliberately broken cell (`cell::swap_loop` under
# `--cfg tollgate_broken=...`) and runs the checks that must catch it. Succeeds only if every
# one of them FAILS, for the right reason:
#
#   load_store  a load then a plain store instead of a compare-and-swap (lost updates):
#               the loom suite must fail, and so must the real-thread exactness tests
#               (threads_on_one_key_admit_exactly_burst, and _the_window_limit for the fixed
#               window and sliding counter) with an over-admission.
#   relaxed     a Relaxed load where Acquire is needed: the loom suite must fail (a data race
#               reported by the model `denial_sees_what_admissions_published`). The thread test
#               cannot see this one (counting on one word is correct even with Relaxed, and x86
#               orders loads anyway), so it is not asked to.
#   torn_load   the inline 16-byte load of the sweep and the probe (`sync::Vmovdqa`) built from two loads' halves:
#               the tearing test (sync::tests::inline_load_never_tears_under_swaps) must fail.
#               Loom cannot see this one (its pair is a mutex), so it is not asked to.
#   blind_removal  the sweep's removal a plain store a little while after its load, and no
#               transactions: both sweep race tests (tests::flat::sweeps_*_racing_fresh_keys_*)
#               must see a round admit more than its bound. Only the real-thread tests are asked.
#   blind_move  a shard's growth moves each slot with a plain store a little while after its
#               load: the loom model check_against_growth and the real-thread tests
#               (tests::flat::growth_racing_checks_loses_no_charge, and _compound_ for a plan
#               of two quotas) must see a charge lost.
#   blind_near  a compound plan's later state, looked for in the cache line of its first
#               (`FlatStore::pending_near`), taken from the slot it would sit in without checking
#               its tag: the flat store then decides on another key's word, and the property
#               test that the flat and dash stores decide alike
#               (tests::stores::flat_and_dash_stores_agree) must fail. Only the unit tests are
#               asked (loom has no inline load, so it never takes this path).
#   live_migration  a key's state moves between live plans (every other live rule of the same
#               algorithm is taken as a predecessor): the plan tests (tests::plans::*) must see a
#               rule admit above its bound. Only the unit tests are asked.
#
# The loom runs build in their own target folders (target/broken-loom-*), so the normal loom
# build stays cached; the unit tests are rebuilt in target/ with the cfg on this crate only (the
# next plain `cargo test` recompiles them once). Expected time on a 2-core machine: about
# 5 minutes cold (three loom builds and six builds of this crate), 1-2 minutes warm.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
ok=1

expect_failure() { # name, grep pattern that the failure output must contain, command...
    local name="$1" pattern="$2"
    shift 2
    local log
    log="$(mktemp)"
    if "$@" >"$log" 2>&1; then
        echo "MUST-FAIL BROKEN: $name passed against the broken cell"
        tail -20 "$log"
        ok=0
    elif grep -qE "$pattern" "$log"; then
        echo "ok: $name failed as it must ($(grep -oE "$pattern" "$log" | head -1))"
    else
        echo "MUST-FAIL BROKEN: $name failed, but not for the expected reason ($pattern)"
        tail -30 "$log"
        ok=0
    fi
    rm -f "$log"
}

for variant in load_store relaxed torn_load blind_removal blind_move blind_near live_migration; do
    echo "== broken cell: $variant"
    flags="--cfg tollgate_broken=\"$variant\""
    case "$variant" in
        load_store) loom_reason='a charge was lost|state went back|left: [0-9]+' ;;
        relaxed) loom_reason='Causality violation|data race' ;;
    esac
    if [[ "$variant" == blind_move ]]; then
        expect_failure "loom store model ($variant)" 'a charge was lost in the move' \
            env RUSTFLAGS="$flags" TOLLGATE_LOOM_TARGET_DIR="$root/target/broken-loom-$variant" \
            bash scripts/loom.sh --test store check_against_growth
    elif [[ "$variant" != torn_load && "$variant" != blind_removal && "$variant" != blind_near \
        && "$variant" != live_migration ]]; then
        expect_failure "loom suite ($variant)" "$loom_reason" \
            env RUSTFLAGS="$flags" TOLLGATE_LOOM_TARGET_DIR="$root/target/broken-loom-$variant" \
            bash scripts/loom.sh --test cells
    fi
    if [[ "$variant" != relaxed ]]; then
        # `cargo rustc` gives the cfg to this crate only, so the dependencies already built for
        # `cargo test --all-features` are reused (RUSTFLAGS would rebuild every one of them).
        echo "building the unit tests with the broken cell"
        exe="$(cargo rustc --lib --profile test --all-features --message-format=json \
            -- --cfg "tollgate_broken=\"$variant\"" \
            | grep -oE '"executable":"[^"]+"' | tail -1 | cut -d'"' -f4)"
        if [[ -z "$exe" ]]; then
            echo "MUST-FAIL BROKEN: could not build the unit tests with the broken cell"
            ok=0
        elif [[ "$variant" == load_store ]]; then
            expect_failure "thread exactness test ($variant)" 'attempt [0-9]+' \
                "$exe" --exact tests::engine::threads_on_one_key_admit_exactly_burst
            expect_failure "window thread exactness test ($variant)" 'attempt [0-9]+' \
                "$exe" --exact tests::engine::threads_on_one_key_admit_exactly_the_window_limit
        elif [[ "$variant" == blind_move ]]; then
            expect_failure "growth race test ($variant)" 'key [0-9]+' \
                "$exe" --exact tests::flat::growth_racing_checks_loses_no_charge
            expect_failure "compound growth race test ($variant)" 'key [0-9]+, quota' \
                "$exe" --exact tests::flat::growth_racing_compound_checks_loses_no_charge
        elif [[ "$variant" == blind_near ]]; then
            expect_failure "store equivalence test ($variant)" 'Test failed: assertion failed' \
                "$exe" --exact tests::stores::flat_and_dash_stores_agree
        elif [[ "$variant" == live_migration ]]; then
            expect_failure "alternating plans test ($variant)" 'left: \([0-9]+, [0-9]+\)' \
                "$exe" --exact tests::plans::alternating_plans_each_hold_their_burst
            expect_failure "plan bound property test ($variant)" 'units in \[' \
                "$exe" --exact tests::plans::every_rule_holds_its_own_bound
        elif [[ "$variant" == blind_removal ]]; then
            paths=one_swap_at_a_time
            # The transactional path exists only where the CPU has RTM; elsewhere its test
            # says so and returns, so it is not asked to fail.
            if grep -qw rtm /proc/cpuinfo 2>/dev/null; then
                paths="in_transactions $paths"
            else
                echo "no RTM on this CPU: the transactional sweep path is not checked here"
            fi
            for path in $paths; do
                expect_failure "sweep race test, $path ($variant)" 'more than [0-9]+ a round' \
                    "$exe" --exact \
                    "tests::flat::sweeps_${path}_racing_fresh_keys_grant_no_extra_permits"
            done
        else
            expect_failure "tearing test ($variant)" 'a torn or stale load' \
                "$exe" --exact sync::tests::inline_load_never_tears_under_swaps
        fi
    fi
done

if [[ "$ok" == 1 ]]; then
    echo "must-fail: every check caught every broken cell"
else
    echo "must-fail: the suite did not catch a broken cell"
    exit 1
fi
