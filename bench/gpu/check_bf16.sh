#!/usr/bin/env bash
# bench/gpu/check_bf16.sh — ONE device call for a short GPU window (issue 28): bf16 measured and
# checked first, then the rest, most valuable first, inside a budget (CHECK_BUDGET_S, 460 s) so
# that the call ends well inside the tool's 10 minutes. No build by default: the binaries are
# made here beforehand and carried, portable (-march=x86-64-v3, sm_90):
#     make gpu-window            # here: build-gpu/ (ignored by git)
#     device run: carry ["build-gpu"], timeout_s 600, command:
#         OUT=$OUT bash bench/gpu/check_bf16.sh
# (--build: build there instead, with make gpu-window, ~2-4 min of the budget; it also builds
# there when a carried binary is missing or cannot find its libraries and nvcc is there.)
#
# Steps, in order (each its own time limit; none starts after the budget; a hang costs that
# step only and names what was running):
#   1 smoke_bf16_gpt2        train_gpt --bf16, the GPT-2-small-sized model, 12 steps: it runs,
#                            the loss is finite and falls
#   2 sanitizer_bf16         compute-sanitizer memcheck on a small odd-shaped --bf16 run (sizes
#                            no multiple of 32), 3 steps with dropout
#   3 bench_bf16_tf32        bench_gpt_gpu.sh PRECISIONS="bf16 tf32": ours against PyTorch eager
#   4 gpt_model_bf16         test_gpt_gpu gemm bf16 kernels2 fused: the split-K bf16 GEMM bound and
#                            math mode, the bf16 model against fp32, GPT_KERNELS=2 against the CPU,
#                            GPT_ATTENTION=fused against the explicit attention
#   5 gpu_kernels            test_gpu_kernels (the bf16 AdamW/scale against the CPU bit for bit)
#   7 two_ranks_bf16         2 ranks sharing the GPU in bf16: tests/test_gpt.sh's bf16 and resume
#                            groups (resume bit for bit), then the exposed communication of a
#                            40-step run of the shakespeare_char model
#   7b zero_2ranks           the same 2 ranks, shakespeare_char's shape, 30 steps at --shard none,
#                            optimizer, gradients, parameters, parameters --prefetch off (issue
#                            27), fp32 then bf16 while time lasts: the params hash against none's
#                            (PASS/FAIL a level), step ms, a rank's device MiB (nvidia-smi);
#                            bench/gpu/zero_2ranks.sh
#   8 op_times_*             GPT_OP_TIMES=1: where a bf16 step goes, kernel by kernel, with the
#                            old and the new kernels (GPT_KERNELS=2), the new ones with the fused
#                            attention (GPT_ATTENTION=fused), then TF32; the new
#                            kernels' bf16 tokens/s (bench_bf16_kernels2)
#   6 gpt_model_rest         test_gpt_gpu reference vs_cpu determinism (the templated fp32 model)
#   9 bench_fp32_compile     if time is left: fp32 against PyTorch, then bf16 against torch.compile
# Files under $OUT (8 at most, as the device tool brings back), written as the steps run:
#   bf16-summary.txt   one line a step (STATUS NAME SECONDS passed failed skipped), the RESULT
#                      lines, the benchmark tables and the ZeRO table (ZERO lines), the verdict last
#   bf16-env.txt       GPU, driver, nvcc, NCCL, cuBLAS, what the binaries load; the build log
#   bf16-1-smoke.log  bf16-2-sanitizer.log  bf16-3-bench.log  bf16-4-tests.log (steps 4-6)
#   bf16-5-2ranks.log (steps 7, 7b)  bf16-6-more.log (steps 8-9)
# Without a GPU (tests/test_gpu_check.sh runs it so): every GPU step says SKIP, exit 0.
# Usage: bench/gpu/check_bf16.sh [--build] [--no-build] [BUILD_DIR (build-gpu)]
#   env: OUT (build/gpu-check), CHECK_BUDGET_S (460), CHECK_JOBS, DATA (the text; default: the
#        shakespeare file if carried in .data/, else ddp.h: throughput does not care); for the
#        dry run with a stand-in GPU (tests/test_gpu_check.sh): CHECK_GPT2 (the smoke and
#        op-time runs' shape flags), CHECK_2RANKS_SHAPE and CHECK_2RANKS_GROUPS (step 7's shape
#        and test_gpt.sh groups), SANITIZER (the compute-sanitizer to run), and
#        bench_gpt_gpu.sh's (LAYERS HEADS DIM SEQ BATCH STEPS SKIP PY)
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/gpu/steps.sh
. bench/gpu/check_common.sh
BUILD=0
args=()
for a in "$@"; do
    case $a in
    --build) BUILD=1 ;;
    --no-build | -h | --help | -*) args+=("$a") ;;
    *) args+=("$a"); have_b=1 ;;
    esac
done
[ -n "${have_b:-}" ] || args+=(build-gpu)
check_init bf16 460 "${args[@]}"
ENV=$OUT/bf16-env.txt
TARGETS="$B/ddprun $G/gpu_count $G/nccl_version $G/train_gpt $G/test_gpt_gpu $G/test_gpu_kernels"
DATA=${DATA:-}
[ -n "$DATA" ] || for d in .data/tinyshakespeare.txt ../shared/data/tinyshakespeare.txt ddp.h; do [ -f "$d" ] && { DATA=$d; break; }; done
export DATA

# --- the machine, and whether the carried binaries load here ---
missing_libs() {   # the binaries' libraries the loader cannot find ("" when all load)
    local f
    for f in $TARGETS; do [ -x "$f" ] && ldd "$f" 2>/dev/null | grep "not found" | sed "s|^|$f: |"; done
}
{
    echo "# check_bf16 $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(check_commit), $(uname -srm), $(nproc) cores; build $B"
    fact "GPU" nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_mode,clocks.max.sm,power.limit --format=csv
    echo "-- nvcc: $(tools/gpu_paths.sh nvcc) $(timeout 20 "$(tools/gpu_paths.sh nvcc)" --version 2>/dev/null | tail -n 1)"
    echo "-- nccl lib: $(tools/gpu_paths.sh nccl-lib) | cublas lib: $(tools/gpu_paths.sh cublas-lib)"
    echo "-- compute-sanitizer: $(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || echo none)"
    echo "-- the carried build: $(cat "$B/.gpu-window" 2>/dev/null || echo "(no stamp)")"
    for f in $TARGETS; do [ -x "$f" ] || echo "   missing: $f"; done
} >"$ENV" 2>&1
if [ -n "$(missing_libs)" ]; then   # the machine keeps NCCL/cuBLAS elsewhere: tell the loader
    for w in nccl-lib cublas-lib; do d=$(tools/gpu_paths.sh $w); [ -n "$d" ] && LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; done
    export LD_LIBRARY_PATH
    echo "-- LD_LIBRARY_PATH=$LD_LIBRARY_PATH (libraries not found at the rpath)" >>"$ENV"
fi
need_build=$BUILD force=()
for f in $TARGETS; do [ -x "$f" ] || need_build=1; done
[ -n "$(missing_libs)" ] && { need_build=1; force=(-B); }   # relinked against what this machine has
if [ "$need_build" = 1 ] && [ "$NO_BUILD" = 0 ] && [ -n "$(tools/gpu_paths.sh nvcc)" ]; then
    limit=$(($(check_left) - 150)); [ $limit -gt 300 ] && limit=300; [ $limit -lt 60 ] && limit=60
    echo "== build here: make gpu-window's flags into $B (limit $limit s)"
    t0=$(date +%s)
    # shellcheck disable=SC2086  # the list is words
    { echo "-- build there: make B=$B HOST_ARCH=x86-64-v3 GPT_BLAS=0 WERROR= (limit $limit s)"
      timeout -k 10 "$limit" make "${force[@]}" -k -j"${CHECK_JOBS:-$(nproc)}" B="$B" HOST_ARCH=x86-64-v3 GPT_BLAS=0 WERROR= $TARGETS </dev/null 2>&1 | tail -n 40
    } >>"$ENV"
    miss=""
    for f in $TARGETS; do [ -x "$f" ] || miss="$miss $f"; done
    if [ -z "$miss" ]; then echo "ok build $(($(date +%s) - t0)) 1 0 0" >>"$SUMMARY"
    else echo "FAIL build: did not build:$miss"; echo "FAIL build $(($(date +%s) - t0)) 0 1 0 did not build:$miss" >>"$SUMMARY"; fi
else
    echo "SKIP build 0 0 0 1 $([ "$need_build" = 1 ] && echo "needed, but --no-build or no nvcc" || echo "carried $B")" >>"$SUMMARY"
fi
{ echo "-- what $G/train_gpt loads:"; ldd "$G/train_gpt" 2>&1 | grep -E "nccl|cublas|cudart|not found"; } >>"$ENV" 2>&1
gpus=$(timeout 60 "$G/gpu_count" 2>/dev/null)
case "$gpus" in '' | *[!0-9]*) gpus=0 ;; esac
gpu=$(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
echo "# GPU: ${gpu:-none (nvidia-smi lists none)}; $gpus GPU(s) for CUDA; data $DATA" | tee -a "$SUMMARY"
[ "$gpus" -eq 0 ] && export GPU_STEPS_MODE=quiet
grep -E "^-- (nvcc|nccl|compute)" "$ENV"

# step NAME LIMIT LOG NEEDS CMD...: gpu_step, its output appended to LOG as it comes; a step
# that would train on the CPU without a GPU (train_gpt falls back) only says SKIP there.
step() {
    local name=$1 limit=$2 log=$3 needs=$4 cpu_fallback=0
    shift 4
    [ "$1" = --gpu-only ] && { cpu_fallback=1; shift; }
    if [ "$cpu_fallback" = 1 ] && [ "$gpus" -eq 0 ]; then gpu_skip "$name" "no GPU (gpu_count: 0)" 2>&1 | tee -a "$log"; return; fi
    { trap 'gpu_steps_abort; exit 130' INT TERM; gpu_step "$name" "$limit" "$needs" "$@"; } 2>&1 | tee -a "$log"
}
read -r -a GPT2 <<<"${CHECK_GPT2:---layers 12 --heads 12 --dim 768 --seq 1024 --batch 8}"
GPT2+=(--data "$DATA")
QUIET=(--eval-every 0 --eval-batches 1 --sample 0)

# 1. The GPT-2-small-sized model in bf16 runs, and learns.
step smoke_bf16_gpt2 90 "$OUT/bf16-1-smoke.log" "$G/train_gpt" --gpu-only bash -c '
    "$1" "${@:2}" >"$0" 2>&1; rc=$?; cat "$0"
    first=$(grep -oE "^step +1/12 \| loss [0-9.]+" "$0" | sed "s/.*loss //"); last=$(grep -oE "^step +12/12 \| loss [0-9.]+" "$0" | sed "s/.*loss //")
    if [ $rc -eq 0 ] && grep -q ", bf16" "$0" && [ -n "$first" ] && [ -n "$last" ] && awk -v a="$first" -v b="$last" "BEGIN { exit !(b < a) }"; then
        echo "PASS smoke_bf16_gpt2_trains (loss $first -> $last in 12 steps)"
    else echo "FAIL smoke_bf16_gpt2_trains: exit $rc, loss ${first:-?} -> ${last:-?}"; fi' \
    "$(mktemp)" "$G/train_gpt" "${GPT2[@]}" "${QUIET[@]}" --bf16 --steps 12 --warmup 2 --log-every 1

# 2. compute-sanitizer on a small odd-shaped bf16 run (NCCL probes its own kernel images with API
#    calls that fail by design: --report-api-errors no, as in the first window).
SAN=${SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
step sanitizer_bf16 120 "$OUT/bf16-2-sanitizer.log" "$G/train_gpt" --gpu-only bash -c '
    "$1" --tool memcheck --report-api-errors no --error-exitcode 3 "${@:2}" >"$0" 2>&1; rc=$?; tail -n 30 "$0"
    if [ $rc -eq 0 ] && grep -q "ERROR SUMMARY: 0 errors" "$0"; then echo "PASS sanitizer_memcheck_bf16_odd_shapes"
    else echo "FAIL sanitizer_memcheck_bf16_odd_shapes: exit $rc: $(grep -m1 "ERROR SUMMARY" "$0")"; fi' \
    "$(mktemp)" "$SAN" "$G/train_gpt" --data "$DATA" --layers 2 --heads 3 --dim 72 --seq 37 --batch 3 --steps 3 --dropout 0.1 --warmup 1 \
    --log-every 1 "${QUIET[@]}" --bf16

# 3. The benchmark: bf16 first, then TF32, each against PyTorch eager on this GPU.
step bench_bf16_tf32 240 "$OUT/bf16-3-bench.log" "$G/train_gpt" env PRECISIONS="bf16 tf32" STREAM=1 RUN_LIMIT_S=100 \
    LOG_DIR="$B/bench-runs" bench/gpu/bench_gpt_gpu.sh "$B"

# 4-5. The GPT model test's bf16 parts (the rest, the templated fp32 model, comes after the op
#      times: its CPU side may run without OpenBLAS there and take minutes); the kernels.
step gpt_model_bf16 150 "$OUT/bf16-4-tests.log" "$G/test_gpt_gpu" "$G/test_gpt_gpu" gemm bf16 kernels2 fused
step gpu_kernels 150 "$OUT/bf16-4-tests.log" "$G/test_gpu_kernels" "$G/test_gpu_kernels"

# 7. Two ranks sharing the GPU (NCCL over loopback sockets: tools/nccl_one_gpu.sh) in bf16.
step two_ranks_bf16_resume 150 "$OUT/bf16-5-2ranks.log" "$B/ddprun $G/train_gpt" --gpu-only env GPT_TEST_RANKS=2 TRAIN_GPT="$G/train_gpt" \
    TEST_PREFIX=gpt_gpu RANK_WRAPPER=tools/nccl_one_gpu.sh GPT_TEST_ONLY="${CHECK_2RANKS_GROUPS:-bf16 resume}" tests/test_gpt.sh "$B"
read -r -a SHAPE2 <<<"${CHECK_2RANKS_SHAPE:---layers 6 --heads 6 --dim 384 --seq 256 --batch 32}"   # shakespeare_char's, 2 x 32
step two_ranks_bf16_exposed_comm 90 "$OUT/bf16-5-2ranks.log" "$B/ddprun $G/train_gpt" --gpu-only \
    "$B/ddprun" -n 2 tools/nccl_one_gpu.sh "$G/train_gpt" --data "$DATA" "${SHAPE2[@]}" --steps 40 --log-every 10 "${QUIET[@]}" --bf16

# 7b. ZeRO on NCCL (issue 27): the same 2 ranks, shakespeare_char's shape, 30 steps at each --shard
#     level and ZeRO-3 with --prefetch off, fp32 then bf16: the same parameters as --shard none bit
#     for bit, step ms against none, a rank's device MiB (bench/gpu/zero_2ranks.sh).
step zero_2ranks 100 "$OUT/bf16-5-2ranks.log" "$B/ddprun $G/train_gpt" --gpu-only \
    bench/gpu/zero_2ranks.sh "$B/ddprun" "$G/train_gpt" --data "$DATA" "${SHAPE2[@]}" "${QUIET[@]}"

# 8. Where a step goes: per-op CUDA-event times of the GPT-2-sized model, bf16 with the old and
#    the new kernels (GPT_KERNELS=2), the new ones with the fused attention (GPT_ATTENTION=fused:
#    no [T, T] matrices), then TF32; and the new kernels' tokens/s in bf16.
for run in bf16:1:explicit bf16:2:explicit bf16:2:fused tf32:1:explicit; do
    IFS=: read -r p k att <<<"$run"
    name="op_times_${p}_kernels$k"
    [ "$att" = fused ] && name="${name}_fused_attention"
    step "$name" 60 "$OUT/bf16-6-more.log" "$G/train_gpt" --gpu-only env GPT_OP_TIMES=1 GPT_KERNELS=$k GPT_ATTENTION=$att "$G/train_gpt" \
        "${GPT2[@]}" "${QUIET[@]}" --steps 12 --warmup 2 --log-every 4 "--$p"
done
step bench_bf16_kernels2 90 "$OUT/bf16-6-more.log" "$G/train_gpt" env PRECISIONS=bf16 IMPLS=ours OURS_ENV=GPT_KERNELS=2 TAG=_kernels2 \
    STREAM=1 RUN_LIMIT_S=80 LOG_DIR="$B/bench-runs" bench/gpu/bench_gpt_gpu.sh "$B"

# The rest of the GPT model test: the templated fp32 model against PyTorch's reference, the CPU
# model and itself.
step gpt_model_rest 200 "$OUT/bf16-4-tests.log" "$G/test_gpt_gpu" "$G/test_gpt_gpu" reference vs_cpu determinism

# 9. If time is left: fp32 against PyTorch; bf16 against torch.compile (its compile is minutes).
step bench_fp32 120 "$OUT/bf16-6-more.log" "$G/train_gpt" env PRECISIONS=fp32 STREAM=1 RUN_LIMIT_S=100 \
    LOG_DIR="$B/bench-runs" bench/gpu/bench_gpt_gpu.sh "$B"
step bench_bf16_torch_compile 200 "$OUT/bf16-6-more.log" "$G/train_gpt" env PRECISIONS=bf16 IMPLS=compile STREAM=1 RUN_LIMIT_S=90 \
    LOG_DIR="$B/bench-runs" bench/gpu/bench_gpt_gpu.sh "$B"

grep -h "^RESULT" "$OUT"/bf16-*.log 2>/dev/null | sed 's/^/# /' >>"$SUMMARY"
grep -h "^| " "$OUT/bf16-3-bench.log" "$OUT/bf16-6-more.log" 2>/dev/null | sed 's/^/# /' >>"$SUMMARY"
grep -h -A3 "exposed" "$OUT/bf16-5-2ranks.log" 2>/dev/null | grep -E "^\[rank 0\] step +40/40|^step +40/40" | sed 's/^/# 2 ranks: /' >>"$SUMMARY"
grep -hE "^(ZERO |FAIL zero_2ranks|note: zero_2ranks)" "$OUT/bf16-5-2ranks.log" 2>/dev/null | sed 's/^/# /' >>"$SUMMARY"
check_verdict
