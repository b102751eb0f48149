#!/usr/bin/env bash
# tests/gpu/run.sh — the GPU tests; one SKIP line when there is no GPU or no GPU build.
# Usage: tests/gpu/run.sh [BUILD_DIR]   (the binaries are in BUILD_DIR/gpu)
set -u
B=${1:-build}
G=$B/gpu
cd "$(dirname "$0")/../.." || exit 1
if [ ! -x "$G/test_gpu_kernels" ]; then
    echo "SKIP gpu: not built (no nvcc when make ran)"
    exit 0
fi
# One probe: without a device every test would print the same SKIP line.
probe=$("$G/test_gpu_kernels" 2>&1 | grep -m1 '^SKIP gpu')
if [ -n "$probe" ]; then echo "$probe"; exit 0; fi
status=0
"$G/test_gpu_kernels" || status=1
"$G/test_gpu_train" || status=1
"$G/test_gpu_overlap" || status=1
"$G/c_link_check" || status=1
"$G/test_gpt_gpu" || status=1
v=$("$G/nccl_version" 2>/dev/null || echo 0)
gpus=$("$G/gpu_count" 2>/dev/null || echo 1)
if [ "$v" -ge 23003 ]; then
    NCCL_MULTI_RANK_GPU_ENABLE=1 "$B/ddprun" -n 2 "$G/test_gpu_train" || status=1
else
    echo "SKIP gpu 2 ranks on one GPU: NCCL $v is older than 2.30.3 (NCCL_MULTI_RANK_GPU_ENABLE)"
fi
# The GPT trainer on the GPU as a user runs it (resume bit for bit, refused checkpoints, data
# errors, sampling): 2 ranks where two GPUs or NCCL >= 2.30.3 allow, else 1.
if [ "$gpus" -ge 2 ]; then
    GPT_TEST_RANKS=2 TRAIN_GPT="$G/train_gpt" TEST_PREFIX=gpt_gpu tests/test_gpt.sh "$B" || status=1
elif [ "$v" -ge 23003 ]; then
    NCCL_MULTI_RANK_GPU_ENABLE=1 GPT_TEST_RANKS=2 TRAIN_GPT="$G/train_gpt" TEST_PREFIX=gpt_gpu tests/test_gpt.sh "$B" || status=1
else
    GPT_TEST_RANKS=1 TRAIN_GPT="$G/train_gpt" TEST_PREFIX=gpt_gpu tests/test_gpt.sh "$B" || status=1
fi
exit $status
