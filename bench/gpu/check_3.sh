#!/usr/bin/env bash
# bench/gpu/check_3.sh — an optional third call on the GPU machine: nanoGPT's shakespeare_char
# quality target (val <= 1.47 in less than 3 minutes), on 1 rank and on 2 ranks sharing the GPU
# (bench/gpu/shakespeare_gpu.sh; the configuration is tools/shakespeare_char.sh's).
#     OUT=$OUT bash bench/gpu/check_3.sh      # ~8 min (timeout_s 600)
# Files under $OUT: 3-build.log, 3-shakespeare_1rank.log, 3-shakespeare_2rank.log, 3-summary.txt
# (the RESULT lines, the verdict last). No step starts after CHECK_BUDGET_S (330 s); each run is
# cut at 260 s. Without a GPU every step says SKIP.
# Usage: bench/gpu/check_3.sh [--no-build] [BUILD_DIR]    env: OUT, CHECK_BUDGET_S, CHECK_JOBS
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/gpu/steps.sh
. bench/gpu/check_common.sh
check_init 3 330 "$@"

check_gpu_and_build "$OUT/3-build.log" "$B/ddprun" "$B/train_gpt" "$G/gpu_count" "$G/train_gpt"
for r in 1 2; do
    { trap 'gpu_steps_abort; exit 130' INT TERM; gpu_step "shakespeare_char_${r}rank" 260 "$G/train_gpt" bench/gpu/shakespeare_gpu.sh "$B" "$r"; } 2>&1 |
        tee "$OUT/3-shakespeare_${r}rank.log"
done
grep -h "^RESULT" "$OUT"/3-shakespeare_*.log 2>/dev/null | sed 's/^/# /' >>"$SUMMARY"
check_verdict
