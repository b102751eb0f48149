#!/usr/bin/env bash
# bench/gpu/check_tests.sh — the first of the GPU machine's two calls: what the machine is, the
# GPU build, the GPU tests. The second (bench/gpu/check_bench.sh) runs the benchmarks.
#
# The two commands for the device tool (each one bash command; give it timeout_s 600):
#     OUT=$OUT bash bench/gpu/check_tests.sh   # ~4 min: environment, build, GPU tests
#     OUT=$OUT bash bench/gpu/check_bench.sh   # ~3 min: GPU benchmarks (builds what it needs)
#
# Files under $OUT, written as it goes (a call cut off still returns what it did):
#   tests-env.txt      GPU, driver, nvcc and host compiler, NCCL and cuBLAS (versions, where
#                      found), the Python wheels; after the build, the NCCL the binaries load and ldd
#   tests-build.log    make -k -j$(nproc) WERROR= ... : every GPU target the tests need, warnings
#                      shown, not fatal; what did not build is named, and the rest still runs
#   tests-run.log      tests/gpu/run.sh (each test once, each in a time limit of its own; a hang
#                      names what was still running), then `make run`'s path on the GPU (40 steps)
#   tests-summary.txt  one line a step, "STATUS NAME SECONDS passed failed skipped", the verdict last
# Exit status 0 when every step passed or was skipped. No step starts after CHECK_BUDGET_S
# (420 s), and a running one is cut then, so the call ends well inside the tool's 10 minutes.
# The CPU tests are CI's, not run here.
#
# Without a GPU (tests/test_gpu_check.sh runs it so in `make test`): `--no-build` takes the
# binaries as they are, and every GPU step runs up to its first CUDA call and says SKIP.
# Usage: bench/gpu/check_tests.sh [--no-build] [BUILD_DIR]
#   env: OUT (build/gpu-check), CHECK_BUDGET_S (420), CHECK_JOBS (nproc), CHECK_TARGETS (the build list)
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/gpu/steps.sh
. bench/gpu/check_common.sh
check_init tests 420 "$@"
ENV=$OUT/tests-env.txt
TESTS=$OUT/tests-run.log

echo "== check_tests: environment ($ENV)"
{
    echo "# check_tests $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(check_commit), $(uname -srm), $(nproc) cores, $(free -g 2>/dev/null | awk '/^Mem:/ { print $2 " GiB" }')"
    check_env_gpu
    check_env_toolchain
    check_env_python
} >"$ENV" 2>&1
# the lines that matter, on the call's own output too
sed -n '/^-- GPUs/,/^-- driver/p' "$ENV" | grep -v "^-- " | head -n 3
grep -E "^-- (nvcc|nccl|cublas):|^#define NCCL_MAJOR|^#define CUBLAS_VER_MAJOR|^torch|^the build adds|^FAILED" "$ENV" | head -n 12
grep -A1 "^-- nvcc probe" "$ENV" | head -n 2

TARGETS=${CHECK_TARGETS:-"$B/ddprun $G/gpu_count $G/nccl_version $G/test_gpu_kernels $G/test_gpu_train $G/test_gpu_overlap $G/c_link_check $G/test_gpt_gpu $G/train_gpt"}
# shellcheck disable=SC2086  # the list is words (the nvcc probe ran with the environment facts)
check_build_step 0 "$OUT/tests-build.log" $TARGETS
after=$(
    echo "-- after the build: the NCCL the binaries load (ncclGetVersion)"
    timeout 30 "$G/nccl_version" 2>&1 || echo "(no $G/nccl_version)"
    echo "-- ldd $G/test_gpt_gpu: the NCCL and cuBLAS it loads"
    ldd "$G/test_gpt_gpu" 2>&1 | grep -E "nccl|cublas|cudart|not found" || echo "(not built)"
    ldd "$G/test_gpt_gpu" 2>/dev/null | awk '/=> \// { print $3 }' | grep -E "nccl|cublas" | xargs -r readlink -f | sed 's/^/    file: /'
)
echo "$after" >>"$ENV"
echo "$after"

echo "== GPU tests ($TESTS)"
tests/gpu/run.sh "$B" 2>&1 | tee "$TESTS"

# `make run` on a GPU machine, shortened: examples/gpt/train_gpt_run.sh picks the GPU trainer and, on
# one GPU, 2 ranks sharing it. It must train and print the sample.
gpus=$(timeout 60 "$G/gpu_count" 2>/dev/null)
case "$gpus" in '' | *[!0-9]*) gpus=0 ;; esac
{
    trap 'gpu_steps_abort; exit 130' INT TERM   # a pipeline's subshell: its own trap
    if [ "$gpus" -eq 0 ]; then
        gpu_skip make_run_path_on_the_gpu "no GPU (gpu_count: 0)"
    else
        gpu_step make_run_path_on_the_gpu 150 "$B/ddprun $G/train_gpt $G/gpu_count" bash -c '
            examples/gpt/train_gpt_run.sh "$1" --data ddp.h --steps 40 --batch 8 --warmup 5 --eval-every 20 --log-every 10 --sample 120 >"$2" 2>&1
            rc=$?; cat "$2"
            if [ $rc -eq 0 ] && grep -q "train_gpt: 2 rank(s)" "$2" && grep -q "end of sample" "$2" && grep -q "CUDA .*cuBLAS" "$2"; then
                echo "PASS make_run_path_trains_2_ranks_on_the_gpu"
            else echo "FAIL make_run_path_trains_2_ranks_on_the_gpu: exit $rc, 2 ranks on the GPU and a sample expected"; fi' \
            _ "$B" "$(mktemp)"
    fi
} 2>&1 | tee -a "$TESTS"
check_verdict
