#!/usr/bin/env bash
# train_gpt_run.sh BUILD_DIR [train_gpt flags] — what `make run` starts: the tiny GPT on 2 ranks.
#   No GPU visible, or no GPU build: BUILD_DIR/train_gpt (CPU) on 2 ranks.
#   2 or more GPUs: BUILD_DIR/gpu/train_gpt on 2 ranks, one GPU each.
#   1 GPU: both ranks on it, through tools/nccl_one_gpu.sh (NCCL sees two "hosts" that talk
#     over loopback sockets; any NCCL version). RUN_ONE_RANK=1 instead runs 1 rank at twice the
#     --batch: the same training (N ranks at batch B see exactly the windows 1 rank sees at N*B).
set -u
B=${1:-build}
shift
gpus=0
if [ -x "$B/gpu/train_gpt" ] && [ -x "$B/gpu/gpu_count" ]; then gpus=$("$B/gpu/gpu_count" 2>/dev/null || echo 0); fi
case "$gpus" in '' | *[!0-9]*) gpus=0 ;; esac
if [ "$gpus" -eq 0 ]; then exec "$B/ddprun" -n 2 "$B/train_gpt" "$@"; fi
if [ "$gpus" -ge 2 ]; then exec "$B/ddprun" -n 2 "$B/gpu/train_gpt" "$@"; fi
if [ "${RUN_ONE_RANK:-0}" != 1 ]; then
    echo "train_gpt_run: 1 GPU: 2 ranks share it (tools/nccl_one_gpu.sh: NCCL over loopback sockets; RUN_ONE_RANK=1 for 1 rank at twice the batch)"
    exec "$B/ddprun" -n 2 "$(dirname "$0")/../../tools/nccl_one_gpu.sh" "$B/gpu/train_gpt" "$@"
fi
args=() batch=8 i=1
while [ $i -le $# ]; do   # every flag but --batch passes through; --batch N becomes 2N
    a=${!i}
    if [ "$a" = --batch ] && [ $i -lt $# ]; then i=$((i + 1)); batch=${!i}; else args+=("$a"); fi
    i=$((i + 1))
done
echo "train_gpt_run: 1 GPU, RUN_ONE_RANK=1: 1 rank at --batch $((2 * batch)) instead of 2 ranks at $batch, the same training"
exec "$B/ddprun" -n 1 "$B/gpu/train_gpt" "${args[@]}" --batch $((2 * batch))
