#!/usr/bin/env bash
# tests/gpu/run.sh — the GPU tests, each once, each in a time limit of its own
# (tests/gpu/steps.sh: a hang costs that test, and the report names what was still running).
#   kernels vs the CPU; the MLP trained on the NCCL backend == the CPU backend (1 rank, then 2
#   ranks at half the batch each == 1 rank at the whole batch); overlap on streams; the C-compiled
#   build; the CUDA GPT against PyTorch, the CPU model and itself; the GPT trainer as a user runs
#   it on 2 ranks (resume bit for bit, refused checkpoints, data errors, sampling); and a rank
#   killed mid-training (the survivor must name the error within its timeout, not hang).
# One GPU: the 2-rank tests share it through tools/nccl_one_gpu.sh (each rank a "host" of its
# own to NCCL, sockets on loopback), whatever the NCCL version.
# Without a GPU build: one SKIP line. With one but no GPU (CI): every step runs up to its first
# CUDA call and prints one SKIP line (the steps that would train on the CPU instead: SKIP unrun).
# Usage: tests/gpu/run.sh [BUILD_DIR]   (the binaries are in BUILD_DIR/gpu)
#   env: GPU_STEPS_DEADLINE, GPU_STEPS_SUMMARY (tests/gpu/steps.sh)
set -u
B=${1:-build}
G=$B/gpu
cd "$(dirname "$0")/../.." || exit 1
. tests/gpu/steps.sh
trap 'gpu_steps_abort; exit 130' INT TERM

built=0
for f in gpu_count test_gpu_kernels test_gpu_train test_gpu_overlap c_link_check test_gpt_gpu train_gpt; do
    [ -x "$G/$f" ] && built=1
done
if [ $built -eq 0 ]; then gpu_skip gpu "not built (no nvcc when make ran)"; exit 0; fi
# How many GPUs: gpu_count (one cudaGetDeviceCount), else what nvidia-smi lists.
if [ -x "$G/gpu_count" ]; then gpus=$(timeout 60 "$G/gpu_count" 2>/dev/null)
else gpus=$(timeout 30 nvidia-smi -L 2>/dev/null | grep -c '^GPU'); fi
case "$gpus" in '' | *[!0-9]*) gpus=0 ;; esac
if [ "$gpus" -eq 0 ]; then export GPU_STEPS_MODE=quiet; fi
nccl=$(timeout 30 "$G/nccl_version" 2>/dev/null)
echo "== gpu tests: $gpus GPU(s), NCCL ${nccl:-unknown}"
# 2 ranks: one GPU each where there are two, else both on the one (any NCCL version).
share=()
[ "$gpus" -ge 2 ] || share=(tools/nccl_one_gpu.sh)

gpu_step gpu_kernels 180 "$G/test_gpu_kernels" "$G/test_gpu_kernels"
gpu_step gpu_train_1rank 120 "$G/test_gpu_train" "$G/test_gpu_train"
gpu_step gpu_overlap 120 "$G/test_gpu_overlap" "$G/test_gpu_overlap"
gpu_step gpu_c_compiled_build 60 "$G/c_link_check" "$G/c_link_check"
gpu_step gpt_cuda_model 240 "$G/test_gpt_gpu" "$G/test_gpt_gpu"
gpu_step gpu_train_2ranks 180 "$B/ddprun $G/test_gpu_train" "$B/ddprun" -n 2 "${share[@]}" "$G/test_gpu_train"
# These two would train on the CPU without a GPU (train_gpt falls back): not run there.
if [ "$gpus" -eq 0 ]; then
    gpu_skip gpt_trainer_2ranks "no GPU (gpu_count: 0)"
    gpu_skip gpu_rank_killed "no GPU (gpu_count: 0)"
else
    gpu_step gpt_trainer_2ranks 300 "$B/ddprun $G/train_gpt" env GPT_TEST_RANKS=2 TRAIN_GPT="$G/train_gpt" \
        TEST_PREFIX=gpt_gpu RANK_WRAPPER="${share[*]}" tests/test_gpt.sh "$B"
    gpu_step gpu_rank_killed 150 "$G/train_gpt $G/gpu_count" tests/gpu/test_gpu_fault.sh "$B"
fi
[ "$GPU_STEPS_FAILED" -eq 0 ]
