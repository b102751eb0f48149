#!/usr/bin/env bash
# bench/gpu/check_shakespeare.sh — an optional third call on the GPU machine: nanoGPT's
# shakespeare_char quality target (best val <= 1.47 in less than 3 minutes), on 1 rank and on 2
# ranks sharing the GPU (bench/gpu/shakespeare_gpu.sh; the configuration is
# examples/gpt/shakespeare_char.sh's).
#     SHAKESPEARE=$PWD/.data/tinyshakespeare.txt OUT=$OUT bash bench/gpu/check_shakespeare.sh   # ~6 min (timeout_s 600)
# The text does not travel with the repository (../shared stays behind): first, here,
#     mkdir -p .data .git/info && cp ../shared/data/tinyshakespeare.txt .data/ && echo /.data/ >>.git/info/exclude
# then name ".data" in the device call's carry.
# Files under $OUT: shakespeare-build.log, shakespeare-1rank.log, shakespeare-2rank.log,
# shakespeare-summary.txt
# (the RESULT lines, the verdict last). No step starts after CHECK_BUDGET_S (480 s); each run is
# cut at 260 s. Without a GPU every step says SKIP.
# Usage: bench/gpu/check_shakespeare.sh [--no-build] [BUILD_DIR]    env: OUT, CHECK_BUDGET_S, CHECK_JOBS
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/gpu/steps.sh
. bench/gpu/check_common.sh
check_init shakespeare 480 "$@"

check_gpu_and_build "$OUT/shakespeare-build.log" "$B/ddprun" "$B/train_gpt" "$G/gpu_count" "$G/train_gpt"
# 1 rank: the whole schedule (~195 s on an H100). 2 ranks sharing the GPU talk over loopback
# sockets (~56 ms a step): the same schedule, stopped after step 2000 (the best validation loss
# comes near step 1750; the model overfits after it).
for r in 1 2; do
    extra=()
    [ "$r" = 2 ] && extra=(--stop-at 2000)
    { trap 'gpu_steps_abort; exit 130' INT TERM; gpu_step "shakespeare_char_${r}rank" 260 "$G/train_gpt" bench/gpu/shakespeare_gpu.sh "$B" "$r" "${extra[@]}"; } 2>&1 |
        tee "$OUT/shakespeare-${r}rank.log"
done
grep -h "^RESULT" "$OUT"/shakespeare-[12]rank.log 2>/dev/null | sed 's/^/# /' >>"$SUMMARY"
check_verdict
