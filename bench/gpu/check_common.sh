# bench/gpu/check_common.sh — sourced by bench/gpu/check_tests.sh, check_bench.sh,
# check_shakespeare.sh and check_bf16.sh: arguments, $OUT, the time budget, the environment
# facts, the build, the verdict.

check_usage() {
    echo "usage: $0 [--no-build] [BUILD_DIR]   env: OUT, CHECK_BUDGET_S, CHECK_JOBS, CHECK_TARGETS" >&2
    exit 2
}

# check_init CALL DEFAULT_BUDGET_S ARGS...: sets B, G, OUT, NO_BUILD, SUMMARY, DEADLINE, T0. CALL
# (tests, bench, shakespeare, bf16) names the call: its files under $OUT begin with it.
check_init() {
    CALL=$1 budget_default=$2
    shift 2
    NO_BUILD=0
    B=build
    while [ $# -gt 0 ]; do
        case $1 in
        --no-build) NO_BUILD=1 ;;
        -h | --help) check_usage ;;
        -*) check_usage ;;
        *) B=$1 ;;
        esac
        shift
    done
    G=$B/gpu
    # --no-build takes what is there: a binary that is not is a SKIP, not a failure
    [ "$NO_BUILD" -eq 1 ] && export GPU_STEPS_MISSING=skip
    OUT=${OUT:-build/gpu-check}
    mkdir -p "$OUT" || exit 1
    T0=$(date +%s)
    DEADLINE=$((T0 + ${CHECK_BUDGET_S:-$budget_default}))
    SUMMARY=$OUT/$CALL-summary.txt
    : >"$SUMMARY"
    export GPU_STEPS_SUMMARY=$SUMMARY GPU_STEPS_DEADLINE=$DEADLINE
    echo "# check_$CALL $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $(check_commit); budget ${CHECK_BUDGET_S:-$budget_default} s" >>"$SUMMARY"
    echo "# STATUS NAME SECONDS passed failed skipped [note]" >>"$SUMMARY"
    trap 'gpu_steps_abort; echo "INTERRUPTED check_$CALL (signal)" >>"$SUMMARY"; exit 130' INT TERM
}

check_commit() {
    local c
    c=$(git rev-parse --short HEAD 2>/dev/null) || { echo "unknown (no git)"; return; }
    if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then echo "$c+changes"; else echo "$c"; fi
}

check_left() { echo $((DEADLINE - $(date +%s))); }

# fact TITLE CMD...: one block of the environment file; a command that hangs costs 30 s.
fact() {
    local title=$1
    shift
    echo "-- $title"
    timeout 30 "$@" 2>&1 | head -n 60
    return 0
}

# The GPU: nvidia-smi, the driver. (All of it also holds without a GPU: then it says so.)
check_env_gpu() {
    fact "nvidia-smi" nvidia-smi
    fact "GPUs (name, driver, memory, compute mode: 2 ranks on one GPU need Default, not Exclusive_Process)" \
        nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total,compute_mode,clocks.max.sm,power.limit --format=csv
    fact "driver" cat /proc/driver/nvidia/version
    fact "devices, and what steers the loader" sh -c 'ls -l /dev/nvidia* 2>&1; for v in CUDA_VISIBLE_DEVICES LD_LIBRARY_PATH CUDA_HOME NCCL_HOME PATH; do eval "echo $v=\${$v-(unset)}"; done'
}

# Can nvcc build a kernel with this host compiler? Where it refuses the compiler (a newer GCC
# than it knows: no GPU failure), CHECK_NVCC_EXTRA=-allow-unsupported-compiler for the build.
CHECK_NVCC_EXTRA=""
check_nvcc_probe() {
    local probe
    probe=$(mktemp -d)
    printf '__global__ void k(float *x) { x[threadIdx.x] += 1.0f; }\nint main(void) { return 0; }\n' >"$probe/p.cu"
    echo "-- nvcc probe: a trivial kernel for ${CUDA_ARCH:-sm_90}"
    if timeout 120 "$1" -arch="${CUDA_ARCH:-sm_90}" -o "$probe/p" "$probe/p.cu" >"$probe/log" 2>&1; then echo "ok"
    else echo "FAILED:"; head -n 15 "$probe/log"; fi
    if grep -qi "unsupported GNU version\|unsupported.*compiler" "$probe/log"; then
        CHECK_NVCC_EXTRA=-allow-unsupported-compiler
        echo "the build adds NVCC_EXTRA=$CHECK_NVCC_EXTRA"
    fi
    rm -rf "$probe"
}

# Where nvcc, NCCL and cuBLAS are, their versions, the host compiler; whether nvcc accepts it.
check_env_toolchain() {
    local nvcc inc lib
    nvcc=$(tools/gpu_paths.sh nvcc)
    echo "-- nvcc: ${nvcc:-not found}"
    [ -n "$nvcc" ] && timeout 30 "$nvcc" --version 2>&1 | tail -n 2
    fact "host compilers (nvcc uses the g++ on PATH)" sh -c 'for c in gcc g++ cc; do printf "%s: %s | %s\n" "$c" "$(command -v $c)" "$($c --version 2>&1 | head -n 1)"; done'
    [ -n "$nvcc" ] && check_nvcc_probe "$nvcc"
    for what in nccl cublas; do
        inc=$(tools/gpu_paths.sh $what-inc)
        lib=$(tools/gpu_paths.sh $what-lib)
        echo "-- $what: include ${inc:-not found} | lib ${lib:-not found} | link $(tools/gpu_paths.sh $what-link)"
        if [ $what = nccl ] && [ -f "$inc/nccl.h" ]; then
            grep -E "^#define NCCL_(MAJOR|MINOR|PATCH|SUFFIX)\b" "$inc/nccl.h" | tr '\n' ' '; echo
        fi
        if [ $what = cublas ] && [ -f "$inc/cublas_api.h" ]; then
            grep -E "^#define CUBLAS_VER_(MAJOR|MINOR|PATCH|BUILD)\b" "$inc/cublas_api.h" | tr '\n' ' '; echo
        fi
        [ -n "$lib" ] && ls -l "$lib"/lib$what* 2>&1 | head -n 8
    done
    fact "ldconfig: NCCL and cuBLAS the loader knows" sh -c 'ldconfig -p 2>/dev/null | grep -E "libnccl|libcublas" || echo none'
}

# What Python brings (PyTorch's wheels are where NCCL and cuBLAS may be), and the network the
# 2-rank tests use (loopback).
check_env_python() {
    local py
    for py in python3 /opt/torch/.venv/bin/python3; do
        command -v "$py" >/dev/null 2>&1 || continue
        echo "-- $py: $(command -v "$py") $("$py" --version 2>&1)"
        timeout 60 "$py" -m pip show nvidia-nccl-cu13 nvidia-nccl-cu12 nvidia-cublas nvidia-cublas-cu12 2>/dev/null |
            grep -E "^(Name|Version|Location):" | paste - - - 2>/dev/null
        timeout 90 "$py" -c 'import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
try:
    print("torch nccl", torch.cuda.nccl.version())
except Exception as e:
    print("torch nccl: ?", e)' 2>&1 | tail -n 3
    done
    fact "network interfaces (the 2-rank tests use lo)" ls /sys/class/net
    fact "/dev/shm" df -h /dev/shm
}

# check_build LOG TARGET...: make -k, warnings not fatal; prints what did not build. Returns 0
# when everything built. The log keeps all of it.
check_build() {
    local log=$1 jobs left limit t0 missing="" t rc extra=""
    shift
    jobs=${CHECK_JOBS:-$(nproc)}
    left=$(check_left)
    limit=$((left - 60)); [ $limit -gt 420 ] && limit=420; [ $limit -lt 60 ] && limit=60
    [ -n "$CHECK_NVCC_EXTRA" ] && extra="NVCC_EXTRA=$CHECK_NVCC_EXTRA"
    echo "== build: make -k -j$jobs WERROR= $extra (limit $limit s): $*"
    t0=$(date +%s)
    {
        echo "# make -k -j$jobs WERROR= $extra $*"
        timeout -k 10 "$limit" make -k -j"$jobs" WERROR= $extra "$@" </dev/null 2>&1
        rc=$?
        [ $rc -eq 124 ] && echo "# the build was cut after $limit s"
        echo "# make exited $rc after $(($(date +%s) - t0)) s"
    } >"$log" 2>&1
    for t in "$@"; do [ -x "$t" ] || missing="$missing $t"; done
    local warnings
    warnings=$(grep -ciE "warning" "$log")
    echo "built in $(($(date +%s) - t0)) s; $warnings warning line(s)$([ -n "$missing" ] && echo "; did not build:$missing")"
    if [ "$warnings" -gt 0 ]; then grep -iE "warning" "$log" | sort | uniq -c | sort -rn | head -n 10 | sed 's/^/    /'; fi
    if [ -n "$missing" ]; then
        echo "FAIL build: did not build:$missing"
        grep -iE "error|No rule" "$log" | grep -v "^#" | head -n 20 | sed 's/^/    /'
        echo "FAIL build 0 0 1 0 did not build:$missing" >>"$SUMMARY"
        return 1
    fi
    echo "ok build $(($(date +%s) - t0)) 1 0 0" >>"$SUMMARY"
    return 0
}

# check_build_step PROBE LOG TARGET...: the build step of every call: SKIP with --no-build or
# without nvcc; else (after the nvcc probe when PROBE is 1) check_build.
check_build_step() {
    local probe=$1 log=$2
    shift 2
    if [ "$NO_BUILD" -eq 1 ]; then
        echo "== build: skipped (--no-build)"
        echo "SKIP build 0 0 0 1 --no-build" >>"$SUMMARY"
    elif [ -z "$(tools/gpu_paths.sh nvcc)" ]; then
        echo "SKIP build: no nvcc"
        echo "SKIP build 0 0 0 1 no nvcc" >>"$SUMMARY"
    else
        [ "$probe" = 1 ] && check_nvcc_probe "$(tools/gpu_paths.sh nvcc)"
        check_build "$log" "$@"
    fi
    return 0
}

# check_gpu_and_build LOG TARGET...: what check_bench.sh and check_shakespeare.sh begin with: the
# GPU this call got (check_tests.sh's may have been another) in the summary, the build (unless
# --no-build or no nvcc), then the GPU count; with none, the steps run quiet (one SKIP line each).
check_gpu_and_build() {
    local log=$1 gpu
    shift
    gpu=$(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
    echo "# GPU: ${gpu:-none (nvidia-smi lists none)}" | tee -a "$SUMMARY"
    check_build_step 1 "$log" "$@"   # probe as check_tests.sh did: a fresh machine, the same host compiler
    gpus=$(timeout 60 "$G/gpu_count" 2>/dev/null)
    case "$gpus" in '' | *[!0-9]*) gpus=0 ;; esac
    [ "$gpus" -eq 0 ] && export GPU_STEPS_MODE=quiet
    return 0
}

# The last line of the summary and of stdout; the exit status.
check_verdict() {
    local bad skipped ok
    bad=$(grep -vE "^(#|ok |SKIP )" "$SUMMARY" | grep -c .)
    skipped=$(grep -c "^SKIP " "$SUMMARY")
    ok=$(grep -c "^ok " "$SUMMARY")
    local line="check_$CALL: $ok step(s) ok, $bad not ok, $skipped skipped, $(($(date +%s) - T0)) s; logs in $OUT"
    echo "# $line" >>"$SUMMARY"
    echo "== $line"
    [ "$bad" -eq 0 ]
}
