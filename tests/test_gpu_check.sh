#!/usr/bin/env bash
# test_gpu_check.sh — the GPU machine's two calls (bench/gpu/check_1.sh, check_2.sh) dry-run
# here, so that they are known to work up to the first CUDA call before a GPU machine's time is
# spent on them: with the binaries as built (--no-build, no nvcc run), every GPU step must say
# SKIP and the call exit 0; the files under $OUT must be what the device tool brings back (at
# most 8, plain names, no deeper than $OUT/a/b/file). Also: a target that does not build is
# named and the rest still runs; a budget that has run out starts nothing; a step that hangs is
# cut at its limit, with what was running named, and nothing of it left behind.
# Usage: tests/test_gpu_check.sh [BUILD_DIR]
set -u
B=${1:-build}
cd "$(dirname "$0")/.." || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; fails=$((fails + 1)); }
# The calls run make and nvcc of their own: not as a part of the make that runs this test.
unset MAKEFLAGS MFLAGS MAKELEVEL

out_ok() {   # OUT dir: what the device tool brings back, all of it
    local n bad
    n=$(find "$1" -type f | wc -l)
    bad=$(find "$1" -mindepth 1 | sed "s|^$1/||" | grep -vE '^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+){0,2}$')
    [ "$n" -ge 1 ] && [ "$n" -le 8 ] && [ -z "$bad" ] && [ -z "$(find "$1" -mindepth 3 -type d)" ]
}

gpus=0
[ -x "$B/gpu/gpu_count" ] && gpus=$(timeout 60 "$B/gpu/gpu_count" 2>/dev/null)
case "$gpus" in '' | *[!0-9]*) gpus=0 ;; esac
if [ "$gpus" -gt 0 ]; then
    echo "SKIP gpu_check_dry_run: a GPU is here; run bench/gpu/check_1.sh itself"
else
    for call in 1 2; do
        name=gpu_check_${call}_dry_run_every_step_skips
        t0=$(date +%s)
        OUT=$tmp/out$call timeout 240 bench/gpu/check_$call.sh --no-build "$B" >"$tmp/log$call" 2>&1
        rc=$?
        sum=$tmp/out$call/$call-summary.txt
        steps=$(grep -cvE '^#' "$sum" 2>/dev/null)
        notok=$(grep -vE '^(#|ok |SKIP )' "$sum" 2>/dev/null)
        if [ $rc -eq 0 ] && [ "${steps:-0}" -ge 2 ] && [ -z "$notok" ] && grep -q "^# check_$call: .* 0 not ok" "$sum" &&
           ! grep -q "^FAIL" "$tmp/log$call" && out_ok "$tmp/out$call"; then
            pass "$name"
            echo "  ($steps steps in $(($(date +%s) - t0)) s: $(grep -cE '^SKIP ' "$sum") SKIP, $(grep -cE '^ok ' "$sum") ok; files: $(cd "$tmp/out$call" && ls | tr '\n' ' '))"
        else
            fail "$name" "exit $rc; not ok: $(tr '\n' ' ' <<<"$notok") $(tail -n 4 "$tmp/log$call" | tr '\n' ' ')"
        fi
    done
    # check_1 writes the environment before anything can fail
    if grep -q "^-- nvcc" "$tmp/out1/1-env.txt" 2>/dev/null && grep -q "^-- nccl: " "$tmp/out1/1-env.txt" &&
       grep -q "^-- cublas: " "$tmp/out1/1-env.txt"; then pass gpu_check_1_records_the_environment
    else fail gpu_check_1_records_the_environment "1-env.txt lacks nvcc, NCCL or cuBLAS lines"; fi
fi

# A target that does not build: named, the call goes on to its steps, and fails.
if [ -n "$(tools/gpu_paths.sh nvcc)" ]; then
    OUT=$tmp/nobuild CHECK_TARGETS="$B/gpu/no_such_target" timeout 240 bench/gpu/check_2.sh "$B" >"$tmp/nobuild.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ] && grep -q "^FAIL build: did not build: $B/gpu/no_such_target" "$tmp/nobuild.log" &&
       grep -q "No rule to make target" "$tmp/nobuild/2-build.log" && grep -qE "^(SKIP|PASS|FAIL|==) bench_gpu" "$tmp/nobuild.log"; then
        pass gpu_check_names_what_did_not_build_and_goes_on
    else
        fail gpu_check_names_what_did_not_build_and_goes_on "exit $rc: $(grep -m2 -E "build|FAIL" "$tmp/nobuild.log" | tr '\n' ' ')"
    fi
else
    echo "SKIP gpu_check_names_what_did_not_build_and_goes_on: no nvcc"
fi

# Each call's default build list reaches make as separate targets (check_2 once passed its list as
# one quoted word: "No rule to make target 'a b c'", and nothing was built). A stand-in make on
# PATH records its arguments; the real nvcc probe runs first, so this needs nvcc.
if [ -n "$(tools/gpu_paths.sh nvcc 2>/dev/null)" ]; then
    mkdir -p "$tmp/fakemake"
    printf '#!/bin/sh\nfor a in "$@"; do echo "arg: $a"; done\nexit 0\n' >"$tmp/fakemake/make"
    chmod +x "$tmp/fakemake/make"
    why=""
    for c in 1 2 3; do
        PATH="$tmp/fakemake:$PATH" OUT="$tmp/targets$c" CHECK_BUDGET_S=100 timeout 200 bench/gpu/check_$c.sh "$B" >"$tmp/targets$c.log" 2>&1
        n=$(grep -c "^arg: $B/" "$tmp/targets$c/$c-build.log" 2>/dev/null)
        if [ "${n:-0}" -lt 3 ] || grep -q "^arg: .* " "$tmp/targets$c/$c-build.log"; then
            why="$why check_$c: ${n:-0} target argument(s): $(grep "^arg:" "$tmp/targets$c/$c-build.log" 2>/dev/null | head -n 3 | tr '\n' ' ');"
        fi
    done
    if [ -z "$why" ]; then pass gpu_check_build_lists_reach_make_as_separate_targets
    else fail gpu_check_build_lists_reach_make_as_separate_targets "$why"; fi
else
    echo "SKIP gpu_check_build_lists_reach_make_as_separate_targets: no nvcc"
fi

# No budget left: no step starts, each says so, the call fails (its results are not complete).
OUT=$tmp/late CHECK_BUDGET_S=0 timeout 120 bench/gpu/check_2.sh --no-build "$B" >"$tmp/late.log" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ "$(grep -c "out of time" "$tmp/late.log")" -eq 2 ] && grep -q "^OUT_OF_TIME bench_gpu" "$tmp/late/2-summary.txt"; then
    pass gpu_check_budget_spent_starts_nothing
else
    fail gpu_check_budget_spent_starts_nothing "exit $rc: $(tail -n 3 "$tmp/late.log" | tr '\n' ' ')"
fi

# The optional third call (nanoGPT's shakespeare_char target): without a GPU each run says SKIP.
OUT=$tmp/c3 timeout 120 bench/gpu/check_3.sh --no-build "$B" >"$tmp/c3.log" 2>&1
rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c "^SKIP shakespeare_char_[12]rank 0" "$tmp/c3/3-summary.txt")" -eq 2 ]; then
    pass gpu_check_3_dry_run_skips_both_runs
else
    fail gpu_check_3_dry_run_skips_both_runs "exit $rc: $(tail -n 3 "$tmp/c3.log" | tr '\n' ' ')"
fi

# A hang: cut at its limit, what was running named, its whole process group gone.
marker="gpu_check_hang_$$"
t0=$(date +%s)
hang=$(bash -c '. tests/gpu/steps.sh; gpu_step hang 2 "" bash -c "echo started; exec -a $1 sleep 60 & sleep 61; echo never"' _ "$marker" 2>&1)
secs=$(($(date +%s) - t0))
sleep 0.5
if grep -q "^FAIL hang: timed out after 2 s; was running: bash -c" <<<"$hang" && grep -q "running: .*$marker" <<<"$hang" &&
   grep -qx "started" <<<"$hang" && ! grep -qx never <<<"$hang" && [ $secs -lt 20 ] && ! pgrep -f "$marker" >/dev/null; then
    pass gpu_step_cuts_a_hang_and_names_what_ran
    echo "  (cut after $secs s; $(grep -c "running:" <<<"$hang") process(es) named)"
else
    fail gpu_step_cuts_a_hang_and_names_what_ran "$secs s: $(tr '\n' ' ' <<<"$hang")"
fi

[ "$fails" -eq 0 ]
