#!/usr/bin/env bash
# train_gpt_run.sh BUILD_DIR [train_gpt flags] — what `make run` starts: the tiny GPT on 2 ranks.
#   No GPU visible, or no nvcc when make ran: BUILD_DIR/train_gpt (CPU) on 2 ranks.
#   2 or more GPUs: BUILD_DIR/gpu/train_gpt on 2 ranks, one GPU each.
#   1 GPU: 2 ranks may share it only with NCCL >= 2.30.3 (NCCL_MULTI_RANK_GPU_ENABLE=1); with an
#     older NCCL, 1 rank with twice the --batch — the same training (N ranks at batch B see
#     exactly the windows 1 rank sees at N*B), said in one line before it starts.
set -u
B=${1:-build}
shift
gpus=0
if [ -x "$B/gpu/train_gpt" ] && [ -x "$B/gpu/gpu_count" ]; then gpus=$("$B/gpu/gpu_count" 2>/dev/null || echo 0); fi
case "$gpus" in '' | *[!0-9]*) gpus=0 ;; esac
if [ "$gpus" -eq 0 ]; then exec "$B/ddprun" -n 2 "$B/train_gpt" "$@"; fi
if [ "$gpus" -ge 2 ]; then exec "$B/ddprun" -n 2 "$B/gpu/train_gpt" "$@"; fi
v=$("$B/gpu/nccl_version" 2>/dev/null || echo 0)
case "$v" in '' | *[!0-9]*) v=0 ;; esac
if [ "$v" -ge 23003 ]; then NCCL_MULTI_RANK_GPU_ENABLE=1 exec "$B/ddprun" -n 2 "$B/gpu/train_gpt" "$@"; fi
args=() batch=8 i=1
while [ $i -le $# ]; do   # every flag but --batch passes through; --batch N becomes 2N
    a=${!i}
    if [ "$a" = --batch ] && [ $i -lt $# ]; then i=$((i + 1)); batch=${!i}; else args+=("$a"); fi
    i=$((i + 1))
done
echo "train_gpt_run: 1 GPU and NCCL $v (2 ranks need >= 2.30.3 to share a GPU): 1 rank at --batch $((2 * batch)) instead of 2 ranks at $batch, the same training"
exec "$B/ddprun" -n 1 "$B/gpu/train_gpt" "${args[@]}" --batch $((2 * batch))
