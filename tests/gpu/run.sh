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
v=$("$G/nccl_version" 2>/dev/null || echo 0)
if [ "$v" -ge 23003 ]; then
    NCCL_MULTI_RANK_GPU_ENABLE=1 "$B/ddprun" -n 2 "$G/test_gpu_train" || status=1
else
    echo "SKIP gpu 2 ranks on one GPU: NCCL $v is older than 2.30.3 (NCCL_MULTI_RANK_GPU_ENABLE)"
fi
exit $status
