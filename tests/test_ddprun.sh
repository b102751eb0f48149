#!/usr/bin/env bash
# Tests for the ddprun launcher.  Usage: tests/test_ddprun.sh [path/to/ddprun]
# Prints "PASS <name>" or "FAIL <name>: <why>" per check; exits 1 if any failed.
# Ranks are `sh -c` scripts, so no extra binaries are needed.
# shellcheck disable=SC2016 # rank scripts are single-quoted on purpose
set -u

DDPRUN=${1:-build/ddprun}
case $DDPRUN in */*) ;; *) DDPRUN=./$DDPRUN ;; esac
if [ ! -x "$DDPRUN" ]; then
    echo "FAIL setup: '$DDPRUN' is not an executable"
    exit 1
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_ddprun.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
failures=0

report() { # name why
    if [ -z "$2" ]; then echo "PASS $1"; else echo "FAIL $1: $2"; failures=$((failures + 1)); fi
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# run SECONDS ARGS...: ddprun under a timeout; sets rc, elapsed_ms, out/err files.
run() {
    local limit=$1 start
    shift
    start=$(now_ms)
    timeout -s KILL "$limit" "$DDPRUN" "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    elapsed_ms=$(($(now_ms) - start))
}

# A zombie waiting for its reaper counts as gone.
alive() {
    kill -0 "$1" 2>/dev/null || return 1
    ! grep -q '^[0-9]* (.*) Z' "/proc/$1/stat" 2>/dev/null
}

# leftovers DIR: pids (one per *.pid file) still alive after up to 3 s.
leftovers() {
    local pid file left
    for _ in $(seq 30); do
        left=""
        for file in "$1"/*.pid; do
            [ -e "$file" ] || continue
            pid=$(cat "$file")
            if [ -n "$pid" ] && alive "$pid"; then left="$left $pid"; fi
        done
        [ -z "$left" ] && return 0
        sleep 0.1
    done
    echo "$left"
    # shellcheck disable=SC2086 # a list of pids
    kill -9 $left 2>/dev/null # don't leak them past the test
    return 1
}

count_files() { local files=("$1"/*); [ -e "${files[0]}" ] && echo ${#files[@]} || echo 0; }

# A rank script that records its shell's pid and its child's pid, then waits.
# The background sleep checks that ddprun stops a rank's whole process group.
SLEEPER='echo $$ > "$PIDS/sh.$RANK.pid"; sleep 30 & echo $! > "$PIDS/sleep.$RANK.pid"; wait'

test_environment() {
    local why="" r tokens token2 port
    run 10 -n 3 --master-port 29555 sh -c \
        'echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $DDP_JOB_TOKEN"'
    [ $rc -eq 0 ] || why="exit $rc"
    [ "$(wc -l <"$TMP/out")" -eq 3 ] || why="$why; expected 3 lines, got $(wc -l <"$TMP/out")"
    for r in 0 1 2; do
        grep -Eq "^\[rank $r\] $r 3 $r 3 127\.0\.0\.1 29555 [0-9a-f]{32}\$" "$TMP/out" ||
            why="$why; no correct line for rank $r"
    done
    tokens=$(awk '{print $NF}' "$TMP/out" | sort -u)
    [ "$(echo "$tokens" | wc -l)" -eq 1 ] || why="$why; ranks got different tokens"
    report "environment and prefixes" "${why#; }"

    why=""
    run 10 --nproc=2 sh -c 'echo "$MASTER_PORT $DDP_JOB_TOKEN"'
    [ $rc -eq 0 ] || why="exit $rc"
    port=$(awk '{print $3}' "$TMP/out" | sort -u)
    token2=$(awk '{print $4}' "$TMP/out" | sort -u)
    [ "$(echo "$port" | wc -l)" -eq 1 ] && [[ $port =~ ^[0-9]+$ ]] && [ "$port" -ge 1 ] &&
        [ "$port" -le 65535 ] || why="$why; bad MASTER_PORT '$port'"
    [[ $token2 =~ ^[0-9a-f]{32}$ ]] || why="$why; bad token '$token2'"
    [ "$token2" != "$tokens" ] || why="$why; two jobs got the same token"
    report "free port and fresh token per job" "${why#; }"

    # thread pools: each of N ranks gets its share of the CPUs, unless the user chose
    why=""
    local share=$(( $(nproc) / 2 )); [ "$share" -ge 1 ] || share=1
    (unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS; run 10 -n 2 sh -c 'echo "${OMP_NUM_THREADS-unset} ${OPENBLAS_NUM_THREADS-unset}"')
    [ "$(sed 's/^\[rank [01]\] //' "$TMP/out" | sort -u)" = "$share $share" ] || why="2 ranks: $(tr '\n' ' ' <"$TMP/out"), expected $share each"
    OMP_NUM_THREADS=7 run 10 -n 2 sh -c 'echo "$OMP_NUM_THREADS"'
    [ "$(sed 's/^\[rank [01]\] //' "$TMP/out" | sort -u)" = 7 ] || why="$why; a user's OMP_NUM_THREADS=7 became $(tr '\n' ' ' <"$TMP/out")"
    (unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS; run 10 -n 1 sh -c 'echo "${OMP_NUM_THREADS-unset} ${OPENBLAS_NUM_THREADS-unset}"')
    [ "$(sed 's/^\[rank 0\] //' "$TMP/out")" = "unset unset" ] || why="$why; 1 rank: $(cat "$TMP/out"), expected both unset"
    report "thread pools get each rank's share of the CPUs" "${why#; }"
}

test_failing_rank() {
    local why=""
    run 20 -n 3 sh -c 'if [ "$RANK" = 1 ]; then sleep 0.2; exit 3; fi; sleep 30'
    [ $rc -eq 3 ] || why="exit $rc, expected 3"
    [ $elapsed_ms -lt 10000 ] || why="$why; took ${elapsed_ms} ms"
    grep -q 'rank 1 .*exited with status 3' "$TMP/err" || why="$why; stderr does not name rank 1 and status 3"
    report "failing rank stops the job" "${why#; }"
}

test_killed_rank() {
    local why="" left
    export PIDS="$TMP/killed" && mkdir -p "$PIDS"
    run 20 -n 3 sh -c 'if [ "$RANK" = 2 ]; then sleep 0.5; kill -9 $$; fi; '"$SLEEPER"
    [ $rc -eq 137 ] || why="exit $rc, expected 137"
    grep -q 'rank 2 .*killed by signal 9' "$TMP/err" || why="$why; stderr does not name rank 2 and signal 9"
    left=$(leftovers "$PIDS") || why="$why; processes left running:$left"
    [ "$(count_files "$PIDS")" -eq 4 ] || why="$why; ranks did not start"
    report "rank killed by a signal" "${why#; }"
}

test_grace_kill() {
    local why="" left
    export PIDS="$TMP/grace" && mkdir -p "$PIDS"
    run 20 --grace 1 -n 3 sh -c 'trap "" TERM; if [ "$RANK" = 0 ]; then sleep 0.3; exit 5; fi; '"$SLEEPER"
    [ $rc -eq 5 ] || why="exit $rc, expected 5"
    [ $elapsed_ms -ge 1000 ] && [ $elapsed_ms -lt 4000 ] || why="$why; took ${elapsed_ms} ms, expected 1-4 s"
    left=$(leftovers "$PIDS") || why="$why; processes left running:$left"
    report "TERM-ignoring ranks are killed after the grace period" "${why#; }"
}

# signal_test NAME SIGNAL EXPECTED_RC RANK_PREAMBLE [SECOND_SIGNAL]
signal_test() {
    local name=$1 sig=$2 expect=$3 preamble=$4 second=${5:-} why="" pid left start
    export PIDS="$TMP/sig.$sig$second" && mkdir -p "$PIDS"
    "$DDPRUN" --grace 20 -n 2 sh -c "$preamble $SLEEPER" >"$TMP/out" 2>"$TMP/err" &
    pid=$!
    for _ in $(seq 50); do
        [ "$(count_files "$PIDS")" -ge 4 ] && break
        sleep 0.1
    done
    start=$(now_ms)
    kill -"$sig" "$pid"
    if [ -n "$second" ]; then sleep 0.3; kill -"$second" "$pid"; fi
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        why="ddprun still running 10 s after SIG$sig"
        kill -9 "$pid"
    fi
    wait "$pid"
    rc=$?
    [ $rc -eq "$expect" ] || why="$why; exit $rc, expected $expect"
    [ $(($(now_ms) - start)) -lt 5000 ] || why="$why; too slow to stop"
    left=$(leftovers "$PIDS") || why="$why; processes left running:$left"
    report "$name" "${why#; }"
}

test_bad_usage() {
    local why="" args
    for args in "-n 0 true" "-n abc true" "-n 1025 true" "-n 2" "--master-port 70000 true" \
        "--grace x true" "--bogus true" "-n" "--max-restarts -1 true" "--max-restarts x true" \
        "--restart-delay -1 true" "--restart-delay x true" "--restart-delay-max 1e9 true" "--restart-delay 5 --restart-delay-max 1 true" \
        "--restart-delay 0x10 true" "--grace 0x1 true"; do
        # shellcheck disable=SC2086 # split on purpose
        run 5 $args
        [ $rc -eq 2 ] || why="$why; '$args' exit $rc"
        grep -q usage "$TMP/err" || why="$why; '$args' printed no usage"
        [ "$(wc -l <"$TMP/err")" -ge 2 ] || why="$why; '$args' printed no message"
    done
    run 5 --help
    [ $rc -eq 0 ] && grep -q usage "$TMP/out" || why="$why; --help exit $rc"
    report "bad usage exits 2" "${why#; }"
}

# A parent that ignores SIGCHLD passes that on through exec: ddprun must still see its ranks exit
# (the kernel would reap them at once, and ddprun would wait for them forever).
test_sigchld_ignored_by_parent() {
    local why=""
    if ! command -v perl >/dev/null; then echo "SKIP SIGCHLD ignored by the parent: no perl here"; return; fi
    timeout -s KILL 10 perl -e '$SIG{CHLD} = "IGNORE"; exec @ARGV or exit 126' "$DDPRUN" -n 2 sh -c 'echo hi; exit 3' \
        >"$TMP/out" 2>"$TMP/err"
    rc=$?
    [ $rc -eq 3 ] || why="exit $rc, expected 3 (137: ddprun hung): $(tail -n 1 "$TMP/err")"
    grep -q '^ddprun: rank [01] (pid [0-9]*) exited with status 3' "$TMP/err" || why="$why; the failing rank not named"
    report "SIGCHLD ignored by ddprun's parent: the ranks' exits are still seen" "${why#; }"
}

# A mask with SIGTERM and SIGINT blocked survives exec as well: ddprun must still stop on them.
test_signals_blocked_by_parent() {
    local why="" pid
    if ! command -v perl >/dev/null; then echo "SKIP signals blocked by the parent: no perl here"; return; fi
    export PIDS="$TMP/blocked" && mkdir -p "$PIDS"
    perl -e 'use POSIX; sigprocmask(SIG_BLOCK, POSIX::SigSet->new(SIGINT, SIGTERM)); exec @ARGV or exit 126' \
        "$DDPRUN" --grace 1 -n 2 sh -c 'echo $$ > "$PIDS/sh.$RANK.pid"; sleep 30' >"$TMP/out" 2>"$TMP/err" &
    pid=$!
    for _ in $(seq 100); do [ "$(count_files "$PIDS")" -ge 2 ] && break; sleep 0.1; done
    kill -TERM "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && { why="still running 10 s after SIGTERM"; kill -9 "$pid"; }
    wait "$pid"; rc=$?
    [ $rc -eq 143 ] || why="$why; exit $rc, expected 143"
    leftovers "$PIDS" >/dev/null || why="$why; ranks left running"
    report "SIGTERM and SIGINT blocked by ddprun's parent: SIGTERM still stops the job" "${why#; }"
}

test_missing_program() {
    local why="" prog
    for prog in /nonexistent/program no-such-program-ddprun-test; do
        run 10 -n 2 "$prog"
        [ $rc -ne 0 ] || why="$why; $prog exit 0"
        grep -q "cannot run '$prog'" "$TMP/err" || why="$why; no 'cannot run' for $prog"
    done
    report "missing program" "${why#; }"
}

test_no_interleaving() {
    local why="" line bad
    line=$(printf '%0200d' 0 | tr 0 x)
    run 30 -n 2 sh -c 'yes "$1" | head -n 2000' sh "$line"
    [ $rc -eq 0 ] || why="exit $rc"
    bad=$(grep -Evc "^\[rank [01]\] $line\$" "$TMP/out")
    [ "$bad" -eq 0 ] || why="$why; $bad malformed lines"
    [ "$(grep -c '^\[rank 0\]' "$TMP/out")" -eq 2000 ] && [ "$(grep -c '^\[rank 1\]' "$TMP/out")" -eq 2000 ] ||
        why="$why; wrong line counts"
    report "lines are not interleaved" "${why#; }"
}

test_long_and_partial_lines() {
    local why="" xs
    run 10 -n 1 sh -c 'head -c 200000 /dev/zero | tr "\0" x; echo; printf tail; printf oops >&2'
    [ $rc -eq 0 ] || why="exit $rc"
    xs=$(grep -v tail "$TMP/out" | sed 's/^\[rank 0\] //' | tr -d '\n' | wc -c)
    [ "$xs" -eq 200000 ] || why="$why; got $xs of 200000 bytes"
    [ "$(grep -vc '^\[rank 0\] ' "$TMP/out")" -eq 0 ] || why="$why; a piece lacks the prefix"
    [ "$(tail -n 1 "$TMP/out")" = "[rank 0] tail" ] || why="$why; unterminated stdout line lost"
    grep -qx '\[rank 0\] oops' "$TMP/err" || why="$why; unterminated stderr line lost"
    report "long and unterminated lines" "${why#; }"
}

test_closed_stdout() {
    local why="" rcs
    timeout -s KILL 20 "$DDPRUN" -n 2 sh -c 'yes | head -n 100000' 2>"$TMP/err" | head -n 1 >/dev/null
    rcs=${PIPESTATUS[0]}
    [ "$rcs" -eq 0 ] || why="exit $rcs"
    report "closed stdout does not stop supervision" "$why"
}

# stdout into a pipe nobody reads for 6 s, rank 0 flooding it: ddprun must still notice at once
# that rank 1 failed (it queues output and drops what does not fit, with a count, rather than
# block in a write), and the reader gets a line that says how much was dropped.
test_blocked_stdout() {
    local why="" start t=""
    rm -f "$TMP/err" "$TMP/rc"
    start=$(now_ms)
    { timeout -s KILL 30 "$DDPRUN" -n 2 sh -c \
        'if [ "$RANK" = 1 ]; then sleep 1; exit 3; fi; yes "rank 0 says something rather long, again and again" | head -n 1000000; sleep 30' \
        2>"$TMP/err"; echo $? >"$TMP/rc"; } | { sleep 6; cat >"$TMP/out"; } &
    for _ in $(seq 80); do
        if grep -q 'rank 1 .*exited with status 3' "$TMP/err" 2>/dev/null; then t=$(($(now_ms) - start)); break; fi
        sleep 0.1
    done
    wait
    [ -n "$t" ] && [ "$t" -lt 4500 ] || why="the failure of rank 1 was reported after ${t:-more than 8000} ms (the reader starts at 6000)"
    [ "$(cat "$TMP/rc" 2>/dev/null)" = 3 ] || why="$why; exit $(cat "$TMP/rc" 2>/dev/null), expected 3"
    grep -Eq '^ddprun: [0-9]+ line\(s\) \([0-9]+ bytes\) dropped here: stdout was not read fast enough$' "$TMP/out" ||
        why="$why; no 'dropped here' line in stdout"
    [ "$(grep -c '^\[rank 0\] rank 0 says' "$TMP/out")" -gt 10000 ] || why="$why; too little of rank 0's output arrived"
    report "blocked stdout does not stop supervision (failure seen after ${t:-?} ms)" "${why#; }"
}

# Ctrl-Z (SIGTSTP to ddprun) stops every rank with it, and SIGCONT continues them all: no rank
# runs on alone (it would wait for a stopped peer and time out). ddprun runs as a job of a shell
# with job control (set -m), so its process group is not orphaned and a stop is not discarded.
test_ctrl_z() {
    local why="" pid ranks r before after st again
    export PIDS="$TMP/tstp" && mkdir -p "$PIDS"
    ( set -m
      # each rank counts until the test says go (a cap of 600 ticks): none can finish before the
      # stop, however late the other one started on a loaded machine
      "$DDPRUN" -n 2 sh -c 'i=0; while [ ! -e "$PIDS/go" ] && [ $i -lt 600 ]; do echo $i >"$PIDS/count.$RANK"; echo "tick $i"; i=$((i + 1)); sleep 0.05; done; echo "done at $i"' \
          >"$TMP/out" 2>"$TMP/err" &
      echo $! >"$PIDS/ddprun"
      wait $!; echo $? >"$PIDS/rc" ) &
    for _ in $(seq 200); do [ -s "$PIDS/count.0" ] && [ -s "$PIDS/count.1" ] && break; sleep 0.05; done
    pid=$(cat "$PIDS/ddprun")
    ranks=$(pgrep -P "$pid" | tr '\n' ' ')
    kill -TSTP "$pid"
    sleep 0.5
    before="$(cat "$PIDS/count.0") $(cat "$PIDS/count.1")"
    sleep 0.5
    after="$(cat "$PIDS/count.0") $(cat "$PIDS/count.1")"
    st=$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null)
    [ "$st" = T ] || why="ddprun is in state '$st', not stopped"
    for r in $ranks; do
        [ "$(awk '{ print $3 }' "/proc/$r/stat" 2>/dev/null)" = T ] || why="$why; rank pid $r still runs"
    done
    [ "$before" = "$after" ] || why="$why; the ranks went on counting while stopped ($before -> $after)"
    kill -CONT "$pid"
    set -- $after
    again=0
    for _ in $(seq 100); do   # both count again (a count file read while rewritten is empty: read again)
        [ "$(cat "$PIDS/count.0")" -gt "$1" ] 2>/dev/null && [ "$(cat "$PIDS/count.1")" -gt "$2" ] 2>/dev/null && { again=1; break; }
        sleep 0.05
    done
    [ "$again" = 1 ] || why="$why; the ranks did not both go on counting after SIGCONT ($after -> $(cat "$PIDS/count.0") $(cat "$PIDS/count.1"))"
    touch "$PIDS/go"
    wait
    [ "$(cat "$PIDS/rc" 2>/dev/null)" = 0 ] || why="$why; exit $(cat "$PIDS/rc" 2>/dev/null) after SIGCONT: $(tr '\n' '|' <"$TMP/err")"
    [ "$(grep -c 'done at [0-9]*$' "$TMP/out")" -eq 2 ] || why="$why; the ranks did not both finish"
    report "Ctrl-Z stops every rank, SIGCONT continues them all" "${why#; }"
}

# A rank that stalls: the survivor's error says it timed out waiting for it (ddp.h's words). The
# stalled rank is named as the cause, not the survivor that reported the timeout.
test_stalled_rank_named() {
    local why=""
    run 20 -n 2 sh -c 'if [ "$RANK" = 0 ]; then sleep 0.3; echo "rank 0: timed out after 2 s in the allreduce waiting for rank(s) 1" >&2; exit 3; fi; sleep 30'
    [ $rc -eq 3 ] || why="exit $rc, expected 3"
    grep -q '^ddprun: rank 1 (pid [0-9]*) stalled: rank 0 exited with status 3 after waiting for it, and it is still running' "$TMP/err" ||
        why="$why; rank 1 not named: $(grep '^ddprun' "$TMP/err" | head -n 2 | tr '\n' '|')"
    report "a stalled rank the survivors waited for is named" "${why#; }"
}

# The same for ddp.h's other timeout errors: a rank that never reached the rendezvous or
# ddp_commit is named too (the number comes before the words there).
test_stalled_rank_named_other_words() {
    local why="" words
    for words in "rank(s) 1 never arrived at the rendezvous on 127.0.0.1:1 within 2 s (WORLD_SIZE=2)" \
                 "rank 1 did not reach ddp_commit within 0.5 s"; do
        W="$words" run 20 -n 2 sh -c 'if [ "$RANK" = 0 ]; then sleep 0.3; echo "train: rank 0: $W" >&2; exit 3; fi; sleep 30'
        grep -q '^ddprun: rank 1 (pid [0-9]*) stalled: rank 0 exited with status 3 after waiting for it' "$TMP/err" ||
            why="$why; after '$words' rank 1 not named: $(grep '^ddprun' "$TMP/err" | head -n 1)"
    done
    report "a rank stalled before the rendezvous or ddp_commit is named" "${why#; }"
}

# A rank that returned (status 0) while its peers still waited for it is the cause, not the peer
# whose timeout reported it.
test_left_early_rank_named() {
    local why=""
    run 20 -n 3 sh -c 'if [ "$RANK" = 1 ]; then exit 0; fi; sleep 0.5; echo "rank $RANK: rank(s) 1 never arrived at the rendezvous on 127.0.0.1:1 within 2 s (WORLD_SIZE=3)" >&2; exit 1'
    [ $rc -eq 1 ] || why="exit $rc, expected 1"
    grep -q '^ddprun: rank 1 (pid [0-9]*) exited with status 0 before its peers were done: rank [02] exited with status 1 after waiting for it' "$TMP/err" ||
        why="$why; rank 1 not named: $(grep '^ddprun' "$TMP/err" | head -n 1)"
    report "a rank that left early (status 0) while the others waited for it is named" "${why#; }"
    # ddp.h's words when the peer is gone in the middle of a collective (CPU backend): it died, or
    # it called ddp_shutdown
    why=""
    for words in 'rank 1 (pid 4242) died; this rank was in ddp_allreduce of 1 elements' \
        'rank 1 called ddp_shutdown while this rank is in an allreduce(sum) of 1 elements'; do
        run 20 -n 3 sh -c 'if [ "$RANK" = 1 ]; then exit 0; fi; sleep 0.5; echo "rank $RANK: $1" >&2; exit 1' sh "$words"
        [ $rc -eq 1 ] || why="$why; '$words': exit $rc, expected 1"
        grep -q '^ddprun: rank 1 (pid [0-9]*) exited with status 0 before its peers were done: rank [02] exited with status 1' "$TMP/err" ||
            why="$why; '$words': rank 1 not named: $(grep '^ddprun' "$TMP/err" | head -n 1)"
    done
    report "a rank that left early (status 0) is named when its peers say it died or shut down" "${why#; }"
}

# --max-restarts: a failed job starts again (a new token and port each time) until it succeeds,
# or the restarts are used up; every restart says why.
test_max_restarts() {
    local why="" tokens ports
    export PIDS="$TMP/restarts" && mkdir -p "$PIDS"
    # rank 1 fails in the first two attempts, then all goes well
    run 30 -n 2 --max-restarts 2 --restart-delay 0.1 sh -c 'echo "$MASTER_PORT $DDP_JOB_TOKEN"; if [ "$RANK" = 1 ]; then n=$(cat "$PIDS/n" 2>/dev/null || echo 0); echo $((n + 1)) >"$PIDS/n"; [ "$n" -ge 2 ] || { sleep 0.2; exit 4; }; fi'
    [ $rc -eq 0 ] || why="exit $rc, expected 0"
    for k in 1 2; do
        grep -q "^ddprun: restart $k of 2: rank 1 (pid [0-9]*) exited with status 4; starting all 2 rank(s) again in 0\.[12] s\$" "$TMP/err" ||
            why="$why; no line for restart $k"
    done
    tokens=$(grep '^\[rank 0\]' "$TMP/out" | awk '{ print $4 }' | sort -u | wc -l)
    ports=$(grep '^\[rank 0\]' "$TMP/out" | awk '{ print $3 }' | sort -u | wc -l)
    [ "$tokens" -eq 3 ] && [ "$ports" -eq 3 ] || why="$why; $tokens tokens and $ports ports in 3 attempts"
    # always failing: 1 + 1 attempts, then the failure is named
    run 30 -n 2 --max-restarts 1 --restart-delay 0.1 sh -c 'if [ "$RANK" = 0 ]; then exit 5; fi; sleep 30'
    [ $rc -eq 5 ] || why="$why; always failing: exit $rc, expected 5"
    [ "$(grep -c '^ddprun: restart ' "$TMP/err")" -eq 1 ] || why="$why; always failing: $(grep -c '^ddprun: restart ' "$TMP/err") restarts"
    grep -q '^ddprun: giving up: the job failed 2 times (--max-restarts 1); the last failure: rank 0 (pid [0-9]*) exited with status 5$' "$TMP/err" ||
        why="$why; no 'giving up' line: $(tail -n 1 "$TMP/err")"
    # --restart-delay-max below the default delay: the delay gives way (it was refused)
    run 30 --max-restarts 1 --restart-delay-max 0.2 sh -c 'exit 6'
    [ $rc -eq 6 ] && grep -q "^ddprun: restart 1 of 1: .* again in 0\.2 s\$" "$TMP/err" ||
        why="$why; --restart-delay-max 0.2 alone: exit $rc: $(head -n 2 "$TMP/err" | tr '\n' ' ')"
    # exit 127 (the program cannot be run): no restart, and the log says why
    run 30 --max-restarts 3 --restart-delay 0.1 "$TMP/no-such-program"
    [ $rc -eq 127 ] && ! grep -q '^ddprun: restart ' "$TMP/err" && grep -q '^ddprun: not restarting: exit status 127 means the program could not be run' "$TMP/err" ||
        why="$why; a program that cannot run: exit $rc: $(tail -n 2 "$TMP/err" | tr '\n' ' ')"
    report "--max-restarts restarts a failed job, then gives up naming the failure" "${why#; }"
}

# SIGINT while a job with restarts runs: stop, no restart.
test_interrupt_no_restart() {
    local why="" pid
    "$DDPRUN" -n 2 --max-restarts 3 sh -c 'sleep 30' >"$TMP/out" 2>"$TMP/err" &
    pid=$!
    sleep 0.5
    kill -INT "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
    wait "$pid"; rc=$?
    [ $rc -eq 130 ] || why="exit $rc, expected 130"
    ! grep -q '^ddprun: restart' "$TMP/err" || why="$why; it restarted"
    report "SIGINT stops a job with --max-restarts for good" "${why#; }"
}

# --max-restarts backs off: a job that fails at once waits --restart-delay, then twice that, up to
# --restart-delay-max, each wait printed; a run that lasted as long as the cap resets the wait;
# Ctrl-C during a wait ends ddprun at once, without the restart.
test_restart_backoff() {
    local why="" waits pid t0 t1
    export PIDS="$TMP/backoff" && mkdir -p "$PIDS"
    # attempts 1, 2, 4, 5 fail at once, attempt 3 after 0.7 s (longer than the cap): the waits
    # double, reset after attempt 3, double again, capped at 0.5
    run 30 -n 1 --max-restarts 4 --restart-delay 0.2 --restart-delay-max 0.5 sh -c \
        'n=$(($(cat "$PIDS/n" 2>/dev/null || echo 0) + 1)); echo $n >"$PIDS/n"; [ $n != 3 ] || sleep 0.7; exit 7'
    waits=$(sed -n 's/^ddprun: restart [0-9] of 4: .* again in \([0-9.]*\) s$/\1/p' "$TMP/err" | tr '\n' ' ')
    [ "$waits" = "0.2 0.4 0.2 0.4 " ] || why="waits '$waits', expected '0.2 0.4 0.2 0.4 ': $(grep '^ddprun' "$TMP/err" | head -n 2)"
    [ $rc -eq 7 ] || why="$why; exit $rc, expected 7"
    [ "$elapsed_ms" -ge 1900 ] || why="$why; 5 attempts with 1.2 s of waits and a 0.7 s run took only ${elapsed_ms} ms"
    rm -f "$PIDS/n"
    run 30 -n 1 --max-restarts 5 --restart-delay 0.1 --restart-delay-max 0.3 sh -c 'exit 7'
    waits=$(sed -n 's/^ddprun: restart [0-9] of 5: .* again in \([0-9.]*\) s$/\1/p' "$TMP/err" | tr '\n' ' ')
    [ "$waits" = "0.1 0.2 0.3 0.3 0.3 " ] || why="$why; capped: waits '$waits', expected '0.1 0.2 0.3 0.3 0.3 '"
    # Ctrl-C during a long wait: out at once, 130, no second attempt
    "$DDPRUN" -n 2 --max-restarts 5 --restart-delay 30 sh -c 'echo attempt >>"$PIDS/attempts"; exit 3' >"$TMP/out" 2>"$TMP/err" &
    pid=$!
    for _ in $(seq 100); do grep -q '^ddprun: restart 1 of 5' "$TMP/err" && break; sleep 0.05; done
    t0=$(now_ms); kill -INT "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.02; done
    t1=$(now_ms); kill -9 "$pid" 2>/dev/null
    wait "$pid"; rc=$?
    [ $rc -eq 130 ] || why="$why; Ctrl-C in the wait: exit $rc, expected 130"
    [ $((t1 - t0)) -lt 1000 ] || why="$why; Ctrl-C in the wait took $((t1 - t0)) ms"
    [ "$(wc -l <"$PIDS/attempts")" -eq 2 ] || why="$why; $(wc -l <"$PIDS/attempts") rank starts, expected 2 (one attempt)"
    grep -q '^ddprun: interrupted while waiting to restart; not restarting$' "$TMP/err" || why="$why; no line for the interrupted wait"
    report "--max-restarts backs off (doubling, capped, reset after a run that lasted), Ctrl-C ends the wait" "${why#; }"
}

# A process a rank starts with setsid leaves the rank's group (ddprun's clean-up signals groups):
# ddprun is its subreaper, and kills it when the job ends. Rank 1's keeps the output pipe open.
test_setsid_stray() {
    local why="" r pid
    if ! command -v setsid >/dev/null; then echo "SKIP setsid escapes: no setsid here"; return; fi
    export STRAY="$TMP/stray" && mkdir -p "$STRAY"
    run 30 -n 2 sh -c 'if [ "$RANK" = 0 ]; then exec >/dev/null 2>&1; fi
        setsid sh -c "echo \$\$ >\"$STRAY/$RANK\"; exec sleep 300" </dev/null &
        while [ ! -s "$STRAY/$RANK" ]; do sleep 0.05; done; exit 0'
    [ $rc -eq 0 ] || why="exit $rc"
    [ "$elapsed_ms" -lt 10000 ] || why="$why; took ${elapsed_ms} ms"
    for r in 0 1; do
        pid=$(cat "$STRAY/$r" 2>/dev/null)
        if [ -z "$pid" ]; then why="$why; rank $r wrote no pid"; continue; fi
        if alive "$pid"; then why="$why; rank $r's setsid process $pid outlived ddprun"; kill -9 "$pid"; fi
    done
    report "a process a rank started with setsid is killed when the job ends" "${why#; }"
}

# Several nodes: node-major ranks, per-node LOCAL_*, the user's address, port, token and job id
# on every rank; both spellings of the flags; a node's failing rank is named by its job rank.
test_multi_node() {
    local why="" r id tok=0123456789abcdef0123456789abcdef
    run 10 --nnodes 3 --node-rank 1 --master-addr 10.77.0.1 --master-port 29561 --job-token "$tok" \
        --job-id train-7 -n 2 sh -c 'echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $DDP_JOB_TOKEN $DDP_JOB_ID"'
    [ $rc -eq 0 ] || why="exit $rc: $(head -n 2 "$TMP/err")"
    for r in 2 3; do
        grep -qx "\[rank $r\] $r 6 $((r - 2)) 2 10\.77\.0\.1 29561 $tok train-7" "$TMP/out" || why="$why; no correct line for rank $r"
    done
    [ "$(wc -l <"$TMP/out")" -eq 2 ] || why="$why; expected 2 lines, got $(wc -l <"$TMP/out")"
    # '=' forms, the token from the environment, node 2 of 3 with 1 rank each
    DDP_JOB_TOKEN=$tok run 10 --nnodes=3 --node-rank=2 --master-addr=h1 --master-port=29562 --nproc-per-node=1 \
        sh -c 'echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $DDP_JOB_TOKEN"'
    grep -qx "\[rank 2\] 2 3 0 1 h1 29562 $tok" "$TMP/out" || why="$why; '=' forms: $(cat "$TMP/out" "$TMP/err" | head -n 2)"
    # --job-id takes what ddp.h takes as DDP_JOB_ID: 255 characters
    id=$(printf 'j%.0s' $(seq 255))
    run 10 --job-id "$id" sh -c 'echo "${#DDP_JOB_ID}"'
    [ $rc -eq 0 ] && grep -qx '\[rank 0\] 255' "$TMP/out" || why="$why; --job-id of 255 characters: exit $rc: $(head -n 1 "$TMP/err")"
    run 10 --job-id "${id}j" sh -c 'echo started'
    [ $rc -eq 2 ] && grep -q 'must be 1\.\.255 characters' "$TMP/err" || why="$why; --job-id of 256 characters: exit $rc"
    # a failing rank on node 1 is named by its rank in the job
    run 10 --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port 29563 --job-token "$tok" -n 2 \
        sh -c '[ "$LOCAL_RANK" = 1 ] && exit 3; sleep 30'
    [ $rc -eq 3 ] || why="$why; failing rank: exit $rc, expected 3"
    grep -q '^ddprun: rank 3 (pid [0-9]*) exited with status 3' "$TMP/err" || why="$why; failing rank not named as rank 3: $(head -n 1 "$TMP/err")"
    report "--nnodes/--node-rank: node-major ranks, LOCAL_* per node, address, port, token and job id" "${why#; }"
}

# Inconsistent multi-node flags: exit 2 before anything starts, naming the flags at odds.
test_multi_node_bad_flags() {
    local why="" tok=0123456789abcdef0123456789abcdef
    bad_flags() { # WANT ARGS...
        local want=$1; shift
        env -u DDP_JOB_TOKEN "$DDPRUN" "$@" sh -c 'echo started' >"$TMP/out" 2>"$TMP/err"; rc=$?
        if [ $rc -ne 2 ] || [ -s "$TMP/out" ] || ! grep -qF -- "$want" "$TMP/err"; then
            why="$why; '$*': exit $rc, wanted 2 and '$want': $(head -n 1 "$TMP/err")"
        fi
    }
    bad_flags "--node-rank 2 is not below --nnodes 2" --nnodes 2 --node-rank 2 --master-addr a --master-port 1 --job-token "$tok"
    bad_flags "--node-rank 1 is not below --nnodes 1" --node-rank 1
    bad_flags "--nnodes 2 needs --master-addr" --nnodes 2 --master-port 1 --job-token "$tok"
    bad_flags "--nnodes 2 needs --master-port" --nnodes 2 --master-addr a --job-token "$tok"
    bad_flags "--nnodes 2 needs a job token" --nnodes 2 --master-addr a --master-port 1
    bad_flags "must be 16..127 characters" --nnodes 2 --master-addr a --master-port 1 --job-token short
    bad_flags "--max-restarts with --nnodes 2" --nnodes 2 --master-addr a --master-port 1 --job-token "$tok" --max-restarts 1
    bad_flags "--nnodes must be an integer 1..1024" --nnodes 0
    bad_flags "--nnodes 512 x --nproc-per-node 4 = 2048 ranks" --nnodes 512 -n 4 --master-addr a --master-port 1 --job-token "$tok"
    report "inconsistent multi-node flags: exit 2, the flags named, nothing started" "${why#; }"
}

# SIGUSR1/SIGUSR2 (a scheduler's preemption warning) are passed on to every rank, and the job goes
# on: each rank notes them in its trap, then ends on "go" with 0. (They used to kill ddprun alone.)
# The guard (ddpguard) of a ddprun started with GUARD_TAG=$1 in its environment.
guard_of() {
    local g
    for g in $(pgrep -x ddpguard); do
        tr '\0' '\n' <"/proc/$g/environ" 2>/dev/null | grep -qx "GUARD_TAG=$1" && echo "$g"
    done
}

# The guard is not ddprun's child (`pgrep -P ddprun` finds the ranks alone), does not answer to
# ddprun's name, and ends with the job.
test_guard_out_of_the_way() {
    local why="" pid kids g tag=guard$$
    GUARD_TAG=$tag "$DDPRUN" -n 2 sh -c 'sleep 3' >"$TMP/out" 2>"$TMP/err" &
    pid=$!
    for _ in $(seq 40); do kids=$(pgrep -P "$pid" | wc -l); [ "$kids" -ge 2 ] && break; sleep 0.05; done
    sleep 0.2
    kids=$(pgrep -P "$pid" | wc -l)
    [ "$kids" -eq 2 ] || why="pgrep -P ddprun found $kids processes, not the 2 ranks"
    g=$(guard_of "$tag")
    [ -n "$g" ] || why="$why; no ddpguard process"
    [ -n "$g" ] && tr '\0' ' ' <"/proc/$g/cmdline" | grep -q ddprun && why="$why; the guard's command line names ddprun"
    wait "$pid" || why="$why; exit $?"
    for _ in $(seq 30); do [ -n "$g" ] && alive "$g" || break; sleep 0.1; done
    [ -n "$g" ] && alive "$g" && why="$why; the guard outlived the job"
    report "ddprun's guard is out of the way and ends with the job" "${why#; }"
}

test_usr_signals_passed_on() {
    local why="" pid rc s
    export PIDS="$TMP/usr" && mkdir -p "$PIDS"
    "$DDPRUN" -n 2 sh -c 'trap "echo > \"\$PIDS/usr1.\$RANK\"" USR1; trap "echo > \"\$PIDS/usr2.\$RANK\"" USR2
        echo $$ > "$PIDS/sh.$RANK.pid"; n=0
        while [ ! -e "$PIDS/go" ] && [ $n -lt 600 ]; do sleep 0.05; n=$((n + 1)); done' >"$TMP/out" 2>"$TMP/err" &
    pid=$!
    for _ in $(seq 100); do [ "$(count_files "$PIDS")" -ge 2 ] && break; sleep 0.1; done
    for s in usr1 usr2; do
        kill -"${s^^}" "$pid"
        for _ in $(seq 100); do [ -e "$PIDS/$s.0" ] && [ -e "$PIDS/$s.1" ] && break; sleep 0.1; done
        [ -e "$PIDS/$s.0" ] && [ -e "$PIDS/$s.1" ] || why="$why; SIG${s^^} did not reach both ranks"
        kill -0 "$pid" 2>/dev/null || why="$why; ddprun gone after SIG${s^^}"
    done
    touch "$PIDS/go"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && { why="$why; still running after go"; kill -9 "$pid"; }
    wait "$pid"; rc=$?
    [ $rc -eq 0 ] || why="$why; exit $rc, expected 0: $(tail -n 2 "$TMP/err" | tr '\n' ' ')"
    report "SIGUSR1 and SIGUSR2 are passed on to the ranks, the job goes on" "${why#; }"
}

test_environment
test_failing_rank
test_killed_rank
test_grace_kill
signal_test "SIGINT stops the job with 130" INT 130 ""
signal_test "SIGTERM stops the job with 143" TERM 143 ""
signal_test "second SIGINT kills at once" INT 130 'trap "" INT TERM;' INT
# Ctrl-\ reaches ddprun alone: it must pass it on, not die and leave the ranks' children running
signal_test "SIGQUIT stops the job with 131, the ranks' children too" QUIT 131 ""
# a hang-up (closed terminal or ssh session) stops the ranks and their setsid strays, like SIGTERM
signal_test "SIGHUP stops the job with 129, setsid strays too" HUP 129 \
    'setsid sh -c "echo \$\$ >\"\$PIDS/stray.\$RANK.pid\"; exec sleep 300" </dev/null >/dev/null 2>&1 &
     while [ ! -s "$PIDS/stray.$RANK.pid" ]; do sleep 0.05; done;'
# ddprun killed outright (kill -9, the OOM killer) cleans nothing up itself: the ranks die with it
# (PR_SET_PDEATHSIG), and its guard SIGKILLs what they started in their groups
signal_test "SIGKILL of ddprun: its guard stops the ranks' children" KILL 137 ""
test_guard_out_of_the_way
test_usr_signals_passed_on
test_bad_usage
test_missing_program
test_sigchld_ignored_by_parent
test_signals_blocked_by_parent
test_no_interleaving
test_long_and_partial_lines
test_closed_stdout
test_blocked_stdout
test_ctrl_z
test_stalled_rank_named
test_stalled_rank_named_other_words
test_left_early_rank_named
test_max_restarts
test_interrupt_no_restart
test_restart_backoff
test_setsid_stray
test_multi_node
test_multi_node_bad_flags

[ $failures -eq 0 ]
