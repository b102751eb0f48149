#!/usr/bin/env bash
# bench/gpu/check_bench.sh — the second of the GPU machine's two calls: the GPU benchmarks.
#   bench/gpu/bench_gpu.cu      device-to-device copy vs the fused AdamW kernel (GB/s), ddp.h's
#                               cost at 1 rank on a chain of cuBLAS layers
#   bench/gpu/bench_gpt_gpu.sh  GPT-2-small-sized training, ours vs PyTorch: tokens/s, MFU
# It builds what it needs itself (make is a no-op where check_tests.sh's machine is still warm;
# a fresh one builds 3 targets). Their RESULT lines are what bench/RESULTS.md's GPU section wants.
#
# The two commands for the device tool (each one bash command; give it timeout_s 600):
#     OUT=$OUT bash bench/gpu/check_tests.sh        # ~4 min: environment, build, GPU tests
#     OUT=$OUT bash bench/gpu/check_bench.sh        # ~3 min: GPU benchmarks
#     OUT=$OUT bash bench/gpu/check_shakespeare.sh  # optional, ~8 min: nanoGPT shakespeare_char target
#
# Files under $OUT, written as it goes:
#   bench-build.log    the build (warnings shown, not fatal)
#   bench-gpu.log      build/gpu/bench_gpu
#   bench-gpt.log      bench/gpu/bench_gpt_gpu.sh
#   bench-summary.txt  the GPU this ran on (check_tests.sh's may have been another), one line a
#                      step, the RESULT lines, the verdict last
# No step starts after CHECK_BUDGET_S (360 s). Without a GPU every step says SKIP.
# Usage: bench/gpu/check_bench.sh [--no-build] [BUILD_DIR]
#   env: OUT (build/gpu-check), CHECK_BUDGET_S (360), CHECK_JOBS (nproc), CHECK_TARGETS;
#        bench_gpt_gpu.sh's own (STEPS, BATCH, PY, ...)
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/gpu/steps.sh
. bench/gpu/check_common.sh
check_init bench 360 "$@"
TARGETS=${CHECK_TARGETS:-"$G/gpu_count $G/bench_gpu $G/train_gpt"}
# shellcheck disable=SC2086  # the list is words
check_gpu_and_build "$OUT/bench-build.log" $TARGETS

# each in a pipeline's subshell (to tee its log): each with its own trap
{ trap 'gpu_steps_abort; exit 130' INT TERM; gpu_step bench_gpu 180 "$G/bench_gpu" "$G/bench_gpu"; } 2>&1 | tee "$OUT/bench-gpu.log"
# each run's log streamed into bench-gpt.log (kept whole in $B/bench-runs): $OUT holds 8 files at most
{ trap 'gpu_steps_abort; exit 130' INT TERM; gpu_step bench_gpt_gpu 300 "$G/train_gpt" env STREAM=1 LOG_DIR="$B/bench-runs" RUN_LIMIT_S=120 \
    bench/gpu/bench_gpt_gpu.sh "$B"; } 2>&1 |
    tee "$OUT/bench-gpt.log"
grep -h "^RESULT" "$OUT/bench-gpu.log" "$OUT/bench-gpt.log" 2>/dev/null | sed 's/^/# /' >>"$SUMMARY"
grep -h "^| " "$OUT/bench-gpt.log" 2>/dev/null | sed 's/^/# /' >>"$SUMMARY"
check_verdict
