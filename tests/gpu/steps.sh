# tests/gpu/steps.sh — sourced by tests/gpu/run.sh and bench/gpu/check_*.sh: run each GPU test
# or benchmark as a step of its own, so that a hang costs that step and not the whole run.
#
#   gpu_step NAME SECONDS NEEDS CMD...
#       NEEDS: files that must exist and be executable ("" for none): one missing is a FAIL
#       ("was not built"; a SKIP with GPU_STEPS_MISSING=skip, as after --no-build) and CMD
#       does not run. CMD runs in a process group of its own, its
#       output streamed to stdout; after SECONDS (or at GPU_STEPS_DEADLINE, epoch seconds,
#       whichever is first) the step is cut: what was still running (every process of the
#       group, and what holds the GPU) is printed first, then the group gets TERM, KILL 5 s later.
#       Then one verdict line, unless CMD's own PASS/FAIL/SKIP lines already say it:
#         FAIL NAME: timed out after S s ...    FAIL NAME: exited with status N
#         PASS NAME (exit status 0, no verdict lines of its own)
#       and "== NAME: STATUS ..." with its time and counts; STATUS is ok, FAIL, TIMEOUT or SKIP.
#   gpu_skip NAME REASON     a step that cannot run here: "SKIP NAME: REASON"
#
# GPU_STEPS_MODE=quiet (no GPU here): CMD's output is kept back; a step whose command said SKIP
# and exited 0 (the GPU binaries do when they find no device) prints one "SKIP NAME: reason";
# its PASS and FAIL lines are printed as they are. So a machine without a GPU runs every step
# up to its first CUDA call and says so in one line a step.
# GPU_STEPS_SUMMARY=FILE: each step appends "STATUS NAME SECONDS passed failed skipped" to it.
# GPU_STEPS_FAILED counts the steps that were not ok or SKIP (the caller's exit status).

GPU_STEPS_FAILED=${GPU_STEPS_FAILED:-0}
gpu__pgid=""   # the running step's process group, for gpu_steps_abort

gpu__record() {   # status name seconds passed failed skipped [note]
    [ -n "${GPU_STEPS_SUMMARY:-}" ] && echo "$*" >>"$GPU_STEPS_SUMMARY"
    case $1 in ok | SKIP) ;; *) GPU_STEPS_FAILED=$((GPU_STEPS_FAILED + 1)) ;; esac
    return 0
}

gpu_skip() {
    echo "SKIP $1: $2"
    gpu__record SKIP "$1" 0 0 0 1 "$2"
}

# What is still running in process group $1: each process (pid, seconds, state, command) and
# the GPU's compute processes, so a hang says where it hung.
gpu__what_runs() {
    ps -eo pid=,pgid=,etimes=,stat=,args= 2>/dev/null | awk -v g="$1" '$2 == g { $2 = ""; print "    running: " $0 }'
    if command -v nvidia-smi >/dev/null 2>&1; then
        timeout 10 nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>/dev/null |
            sed 's/^/    on the GPU: /'
    fi
}

# Kill the running step's group (the caller's INT/TERM trap calls this too).
gpu_steps_abort() {
    [ -n "$gpu__pgid" ] || return 0
    kill -TERM -- "-$gpu__pgid" 2>/dev/null
    local i
    for i in $(seq 50); do kill -0 -- "-$gpu__pgid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$gpu__pgid" 2>/dev/null
    return 0
}

gpu_step() {
    local name=$1 limit=$2 needs=$3 f
    shift 3
    if [ -n "${GPU_STEPS_DEADLINE:-}" ]; then
        local left=$((GPU_STEPS_DEADLINE - $(date +%s)))
        if [ "$left" -lt 10 ]; then
            echo "SKIP $name: out of time (the run's deadline has passed; not a result)"
            gpu__record OUT_OF_TIME "$name" 0 0 0 1 "the run's deadline"
            return 0
        fi
        [ "$left" -lt "$limit" ] && limit=$left
    fi
    for f in $needs; do
        if [ ! -x "$f" ] && [ "${GPU_STEPS_MISSING:-}" = skip ]; then
            gpu_skip "$name" "$f not built"
            return 0
        elif [ ! -x "$f" ]; then
            echo "FAIL $name: $f was not built (see the build log)"
            gpu__record FAIL "$name" 0 0 1 0 "not built: $f"
            return 0
        fi
    done
    local out tailpid="" t0 t1 rc timed_out=0 quiet=0
    [ "${GPU_STEPS_MODE:-}" = quiet ] && quiet=1
    out=$(mktemp)
    [ $quiet -eq 1 ] || echo "== $name (limit $limit s): $*"
    t0=$(date +%s.%N)
    set -m   # a process group of its own: a timeout ends all of it (ddprun's ranks, a script's children)
    "$@" >"$out" 2>&1 </dev/null &
    gpu__pgid=$!
    set +m
    [ $quiet -eq 1 ] || { tail -s 0.2 -n +1 -f --pid="$gpu__pgid" "$out" & tailpid=$!; }
    local end=$(($(date +%s) + limit))
    while kill -0 "$gpu__pgid" 2>/dev/null; do
        if [ "$(date +%s)" -ge "$end" ]; then
            timed_out=1
            sleep 0.3   # let the streamed output catch up before the report
            echo "FAIL $name: timed out after $limit s; was running: $*"
            gpu__what_runs "$gpu__pgid"
            gpu_steps_abort
            break
        fi
        sleep 0.2
    done
    wait "$gpu__pgid" 2>/dev/null
    rc=$?
    [ -n "$tailpid" ] && wait "$tailpid" 2>/dev/null
    gpu__pgid=""
    t1=$(date +%s.%N)
    local secs p f s status
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    p=$(grep -cE "(^|\] )PASS " "$out")
    f=$(grep -cE "(^|\] )FAIL " "$out")
    s=$(grep -cE "(^|\] )SKIP " "$out")
    if [ $quiet -eq 1 ]; then
        grep -E "(^|\] )(PASS|FAIL) " "$out"
        if [ "$s" -gt 0 ] && [ "$rc" -eq 0 ] && [ "$f" -eq 0 ] && [ "$timed_out" -eq 0 ]; then
            echo "SKIP $name: $(grep -m1 -E "(^|\] )SKIP " "$out" | sed -E 's/^(\[rank [0-9 ]+\] )?SKIP //')"
            s=1
        fi
    fi
    if [ "$timed_out" -eq 1 ]; then
        status=TIMEOUT
        f=$((f + 1))
        echo "    its last lines:"; tail -n 5 "$out" | sed 's/^/    | /'
    elif [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        status=FAIL
        f=1
        echo "FAIL $name: exited with status $rc"
        [ $quiet -eq 1 ] && tail -n 5 "$out" | sed 's/^/    | /'
    elif [ "$f" -gt 0 ]; then
        status=FAIL
    elif [ "$p" -eq 0 ] && [ "$s" -gt 0 ]; then
        status=SKIP
    else
        status=ok
        if [ "$p" -eq 0 ]; then echo "PASS $name (exit status 0)"; p=1; fi
    fi
    rm -f "$out"
    [ $quiet -eq 1 ] || echo "== $name: $status in $secs s ($p passed, $f failed, $s skipped)"
    gpu__record "$status" "$name" "$secs" "$p" "$f" "$s"
}
