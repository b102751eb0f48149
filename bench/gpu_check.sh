#!/usr/bin/env bash
# bench/gpu_check.sh — the whole GPU check in one call, for a machine with a GPU:
# the device and NCCL version, the GPU build, the GPU tests (tests/gpu/run.sh: kernels vs CPU,
# NCCL training == CPU, overlap on streams, 2 ranks on one GPU where NCCL >= 2.30.3, the CUDA
# GPT against PyTorch / the CPU model / itself, the GPT trainer on the GPU) and the GPU
# benchmarks (bench/gpu/bench_gpu.cu; bench/gpu/bench_gpt_gpu.sh: GPT-2-small-sized training,
# ours vs PyTorch, tokens/s and MFU). Logs go to $OUT (or build/gpu-check); the RESULT lines
# of bench.log and bench_gpt.log are what bench/RESULTS.md's GPU section wants.
# Usage: bench/gpu_check.sh            (CUDA_ARCH=sm_90 by default; make's variables apply)
set -u
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-build/gpu-check}
mkdir -p "$out"
status=0
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not available"
    echo "nvcc: $(tools/gpu_paths.sh nvcc)"
    "$(tools/gpu_paths.sh nvcc)" --version 2>&1 | tail -n 1
} | tee "$out/device.txt"
echo "== build (log: $out/build.log)"
if ! make -j"$(nproc)" all >"$out/build.log" 2>&1; then echo "FAIL build: see $out/build.log"; tail -n 20 "$out/build.log"; exit 1; fi
grep -iE "warning" "$out/build.log" | head -n 20
echo "NCCL: $(build/gpu/nccl_version 2>/dev/null || echo unknown)" | tee -a "$out/device.txt"
echo "== GPU tests (log: $out/tests.log)"
tests/gpu/run.sh build 2>&1 | tee "$out/tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
grep -q "^FAIL" "$out/tests.log" && status=1
echo "== CPU tests (log: $out/cpu-tests.log)"
tests/run.sh build >"$out/cpu-tests.log" 2>&1 || status=1
tail -n 1 "$out/cpu-tests.log"
echo "== GPU benchmarks (log: $out/bench.log)"
build/gpu/bench_gpu 2>&1 | tee "$out/bench.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "== GPT-2-small-sized training, ours vs PyTorch (log: $out/bench_gpt.log)"
bench/gpu/bench_gpt_gpu.sh build 2>&1 | tee "$out/bench_gpt.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "== done: $([ $status -eq 0 ] && echo ok || echo FAILED); logs in $out"
exit $status
