#!/usr/bin/env bash
# test_windows.sh — ddp.h's Windows build (MinGW-w64, `make windows`: build/win/*.exe) run under
# Wine: the unit tests that apply, the embedding tests (cancel in every phase, progress, thread-ranks
# ending mid-backward, ddp_join), N thread-ranks = 1 rank at N x batch with every rank
# bit-identical, the same bits as the Linux build (params_hash; both built with -ffp-contract=off
# and TEST_PORTABLE_MATH), the CPU backend with ranks as Windows processes (through ddprun.exe
# when it is built, else started here) and its bits, checkpoints (saved, replaced, loaded at
# other world sizes, refused; the file a Windows rank 0 wrote loads on Linux), the timeline, the
# engine and texture examples with their cancels and joins. One SKIP line where the cross
# compiler's programs or Wine are missing. The Windows programs are not sanitized: in the
# sanitizer passes they are the same build/win binaries, only the Linux side differs.
# Usage: tests/test_windows.sh [BUILD_DIR]
set -u
B=${1:-build}
W=build/win
WINE=${WINE:-$(command -v wine64 || command -v wine || ls /usr/lib/wine/wine64 2>/dev/null)}
if [ -z "$WINE" ] || [ ! -x "$W/test_unit.exe" ] || [ ! -x "$B/test_equivalence_portable" ]; then
    echo "SKIP windows_under_wine: $([ -z "$WINE" ] && echo "no wine64 (apt-get install wine64)" || echo "no $W/*.exe or $B/test_equivalence_portable (make windows; needs x86_64-w64-mingw32-gcc: apt-get install gcc-mingw-w64-x86-64)")"
    exit 0
fi
. tests/lib.sh
tmp=$(mktemp -d)
export WINEPREFIX="$tmp/prefix" WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml="   # headless, no Mono/Gecko prompts
WINESERVER=$(command -v wineserver || ls /usr/lib/wine/wineserver64 /usr/lib/wine/wineserver 2>/dev/null | head -n 1)
trap '[ -n "$WINESERVER" ] && "$WINESERVER" -k 2>/dev/null; rm -rf "$tmp"' EXIT   # this prefix's server only
fail=0
say() { echo "$1 $2${3:+: $3}"; [ "$1" = FAIL ] && fail=1; }

# One prefix for the whole run: its first start is the slow part (seconds). Its server is kept up
# for the whole run (-p): left to exit 3 s after its last client, a program started just as it went
# died of "wine client error: recvmsg: Connection reset by peer" (seen in CI, on a loaded machine).
mkdir -p "$WINEPREFIX"
[ -n "$WINESERVER" ] && "$WINESERVER" -p 2>/dev/null
if ! timeout 120 "$WINE" cmd /c exit 0 >"$tmp/boot.log" 2>&1; then
    echo "SKIP windows_under_wine: wine cannot start a prefix here: $(tail -n 2 "$tmp/boot.log" | tr '\n' ' ')"
    exit 0
fi

# wrun N LIMIT_S PROGRAM ARGS...: N ranks as Windows processes of one job, started here the way a
# launcher does (RANK, WORLD_SIZE, LOCAL_*, MASTER_*, a job id); their output prefixed by rank
# into $tmp/out. Returns the first non-zero status.
wrun() {
    local n=$1 limit=$2 port r rc=0 pids=""
    shift 2
    port=$(free_port)
    : >"$tmp/out"
    for r in $(seq 0 $((n - 1))); do
        RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            DDP_JOB_ID="wine-$$-$port" timeout "$limit" "$WINE" "$@" >"$tmp/out.$r" 2>&1 &
        pids="$pids $!"
    done
    for p in $pids; do wait "$p" || { s=$?; [ $rc -eq 0 ] && rc=$s; }; done
    for r in $(seq 0 $((n - 1))); do sed "s/^/[rank $r] /" "$tmp/out.$r" >>"$tmp/out"; done
    return $rc
}
# Pass the test program's own PASS/FAIL/SKIP lines through (tests/run.sh counts them).
verdicts() { grep -E "(^|\] )(PASS|FAIL|SKIP) " "$1" | sed -E 's/^\[rank [0-9]+\] //'; grep -qE "(^|\] )FAIL " "$1" && fail=1; }
hashes() { grep -oE "params_hash ranks[0-9]+_accum[0-9]+ [0-9a-f]+ reference [0-9a-f]+" "$1" | sort -u; }

# ---- the header as an engine's Windows build sees it: C99 and C++, -Werror, also with cl.exe's
#      Interlocked atomics (the compile is the only MSVC-side check possible here) ----
MINGW=$(command -v x86_64-w64-mingw32-gcc || true)
if [ -n "$MINGW" ]; then
    printf '#define DDP_IMPLEMENTATION\n#include "ddp.h"\nint main(void) { return 0; }\n' >"$tmp/first.c"
    bad=""
    "$MINGW" -std=c99 -Wall -Wextra -Werror -I. -c "$tmp/first.c" -o "$tmp/o.o" >"$tmp/cc" 2>&1 || bad="$bad c99"
    # C++: MinGW's g++ where it is installed, else clang for the MinGW target (Debian's gcc-mingw-w64 has no C++)
    if command -v "${MINGW%gcc}g++" >/dev/null; then
        "${MINGW%gcc}g++" -x c++ -Wall -Wextra -Werror -I. -c "$tmp/first.c" -o "$tmp/o.o" >>"$tmp/cc" 2>&1 || bad="$bad c++"
    elif command -v clang >/dev/null; then
        clang --target=x86_64-w64-mingw32 -x c++ -Wall -Wextra -Werror -I. -fsyntax-only "$tmp/first.c" >>"$tmp/cc" 2>&1 || bad="$bad c++(clang)"
        clang --target=x86_64-w64-mingw32 -x c++ -Wall -Wextra -Werror -I. -fsyntax-only examples/engine/texture.c >>"$tmp/cc" 2>&1 || bad="$bad texture-c++(clang)"
    else bad="$bad no-c++-compiler"; fi
    "$MINGW" -std=c99 -Wall -Wextra -Werror -DDDP__ATOMICS_INTERLOCKED -I. -c "$tmp/first.c" -o "$tmp/o.o" >>"$tmp/cc" 2>&1 || bad="$bad interlocked"
    if [ -z "$bad" ]; then say PASS windows_header_compiles_warning_free_c99_cxx_interlocked
    else say FAIL windows_header_compiles_warning_free_c99_cxx_interlocked "failed:$bad: $(grep -m3 -E 'error|warning' "$tmp/cc" | tr '\n' ' ')"; fi
fi

# A thread-rank program under Wine, once more when its only trouble was a port: Wine's Winsock
# (SO_EXCLUSIVEADDRUSE over Linux sockets) can refuse a loopback port the test had just probed free,
# or one left in TIME_WAIT by the test before it; that is the machine's, not the program's.
wine_run() {   # LIMIT OUT PROGRAM ARGS...
    local limit=$1 out=$2 rc
    shift 2
    timeout "$limit" "$WINE" "$@" >"$out" 2>&1; rc=$?
    if grep -q "is already in use (another job" "$out"; then
        echo "note: $(basename "$1") met a loopback port Wine held; running it once more"
        timeout "$limit" "$WINE" "$@" >"$out" 2>&1; rc=$?
    fi
    return $rc
}

# ---- the unit tests (two POSIX-only checks SKIP inside, with the reason) ----
wine_run 300 "$tmp/unit" "$W/test_unit.exe"
rc=$?
sed -E 's/^(PASS|FAIL|SKIP) /\1 windows_/' "$tmp/unit" >"$tmp/unit.v"
verdicts "$tmp/unit.v"
[ $rc -ne 0 ] && ! grep -q "^FAIL " "$tmp/unit" && say FAIL windows_test_unit "exited with status $rc: $(tail -n 3 "$tmp/unit" | tr '\n' ' ')"

# ---- embedding: NULL contexts, messages, thread-ranks; cancel in every phase, progress from another
#      thread, thread-ranks ending mid-backward, uneven inputs (ddp_join) ----
for t in test_embed test_host; do
    wine_run 300 "$tmp/$t" "$W/$t.exe"
    rc=$?
    sed -E 's/^(PASS|FAIL|SKIP) /\1 windows_/' "$tmp/$t" >"$tmp/$t.v"
    verdicts "$tmp/$t.v"
    [ $rc -ne 0 ] && ! grep -q "^FAIL " "$tmp/$t" && say FAIL "windows_$t" "exited with status $rc: $(tail -n 3 "$tmp/$t" | tr '\n' ' ')"
done

# ---- equivalence: thread-ranks, then processes; the bits against Linux ----
for n in 1 2 4; do
    wine_run 120 "$tmp/eq$n" "$W/test_equivalence.exe" --threads $n
    rc=$?
    sed -E 's/^(PASS|FAIL) equivalence/\1 windows_threads_equivalence/' "$tmp/eq$n" >"$tmp/eq$n.v"
    verdicts "$tmp/eq$n.v"
    [ $rc -ne 0 ] && ! grep -q "^FAIL " "$tmp/eq$n" && say FAIL "windows_threads_equivalence_$n" "exited with status $rc: $(tail -n 3 "$tmp/eq$n" | tr '\n' ' ')"
    "$B/test_equivalence_portable" --threads $n >"$tmp/lin$n" 2>&1
    win=$(hashes "$tmp/eq$n"); lin=$(hashes "$tmp/lin$n")
    if [ -n "$win" ] && [ "$win" = "$lin" ]; then say PASS "windows_threads${n}_bitwise_equals_linux"
    else say FAIL "windows_threads${n}_bitwise_equals_linux" "Windows: ${win:-none} | Linux: ${lin:-none}"; fi
done
if [ -x "$W/ddprun.exe" ]; then
    timeout 120 "$WINE" "$W/ddprun.exe" -n 2 "$W/test_equivalence.exe" >"$tmp/out" 2>&1; rc=$?; how="ddprun.exe -n 2"
else
    wrun 2 120 "$W/test_equivalence.exe"; rc=$?; how="2 processes started by this script"
fi
sed -E 's/(PASS|FAIL) equivalence/\1 windows_processes_equivalence/' "$tmp/out" >"$tmp/out.v"
verdicts "$tmp/out.v"
[ $rc -ne 0 ] && say FAIL windows_processes_equivalence_2 "$how: exited with status $rc: $(tail -n 3 "$tmp/out" | tr '\n' ' ')"
win=$(hashes "$tmp/out"); lin=$(hashes "$tmp/lin2")
if [ -n "$win" ] && [ "$win" = "$lin" ]; then say PASS windows_processes2_bitwise_equals_linux_threads
else say FAIL windows_processes2_bitwise_equals_linux_threads "Windows ($how): ${win:-none} | Linux: ${lin:-none}"; fi

if [ -x "$W/ddprun.exe" ]; then   # a rank killed (TerminateProcess, as SIGKILL): the job ends, fast, with its status
    t0=$(date +%s.%N)
    DDP_TEST_KILL_AT=grads-published:0 timeout 120 "$WINE" "$W/ddprun.exe" --grace 20 -n 2 "$W/test_equivalence.exe" >"$tmp/out" 2>&1
    rc=$?; took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    if [ $rc = 9 ] && grep -q "rank 0 exited with status 9" "$tmp/out" && ! grep -q terminating "$tmp/out"; then
        say PASS windows_ddprun_killed_rank_ends_job "status 9 in $took s, the other rank ended by itself"
    else say FAIL windows_ddprun_killed_rank_ends_job "status $rc after $took s: $(grep -m3 ddprun "$tmp/out" | tr '\n' ' ')"; fi
    # --max-restarts: the first attempt fails (the marker is not there yet), the second succeeds
    mark=$(printf 'Z:%s' "$tmp/restart-mark" | tr / '\\')
    timeout 120 "$WINE" "$W/ddprun.exe" --max-restarts 2 --restart-delay 0.1 -n 2 cmd /c \
        "if exist $mark (echo resumed & exit 0) else (echo first> $mark & exit 3)" >"$tmp/out" 2>&1; rc=$?
    if [ $rc = 0 ] && [ "$(grep -c 'restart 1 of 2: rank [01] exited with status 3' "$tmp/out")" = 1 ] && ! grep -q "restart 2 of 2" "$tmp/out"; then
        say PASS windows_ddprun_max_restarts_restarts_a_failed_job_once
    else say FAIL windows_ddprun_max_restarts_restarts_a_failed_job_once "status $rc: $(tr '\n' ' ' <"$tmp/out" | head -c 400)"; fi
    timeout 60 "$WINE" "$W/ddprun.exe" -n 2 "no-such-program.exe" >"$tmp/out" 2>&1; rc=$?
    timeout 60 "$WINE" "$W/ddprun.exe" --nnodes 2 -n 2 "$W/minimal.exe" >"$tmp/out2" 2>&1; rc2=$?
    if [ $rc = 127 ] && grep -q "no such program" "$tmp/out" && [ $rc2 = 2 ] && grep -q "not supported by ddprun on Windows yet" "$tmp/out2"; then
        say PASS windows_ddprun_missing_program_and_unsupported_flags_named
    else say FAIL windows_ddprun_missing_program_and_unsupported_flags_named "status $rc / $rc2: $(head -c 300 "$tmp/out" "$tmp/out2" | tr '\n' ' ')"; fi
fi

# ---- checkpoints: saved by 2 Windows processes, loaded on 1 and 2, refusals, another model;
#      then the Windows rank 0's file loaded by the Linux build on 3 ranks ----
ck="$tmp/ck"; mkdir -p "$ck"
for step in "2 save" "1 resume" "2 resume" "2 errors" "2 other"; do
    set -- $step
    wrun "$1" 120 "$W/test_checkpoint.exe" "$2" "$ck"
    rc=$?
    sed -E 's/(PASS|FAIL|SKIP) ckpt_/\1 windows_ckpt_/' "$tmp/out" >"$tmp/out.v"
    verdicts "$tmp/out.v"
    [ $rc -ne 0 ] && ! grep -q "FAIL " "$tmp/out" && say FAIL "windows_ckpt_$2_$1ranks" "exited with status $rc: $(tail -n 3 "$tmp/out" | tr '\n' ' ')"
done
if [ -x "$B/ddprun" ] && [ -x "$B/test_checkpoint" ]; then
    timeout 120 "$B/ddprun" -n 3 "$B/test_checkpoint" resume "$ck" >"$tmp/lck" 2>&1
    if grep -q "PASS ckpt_loaded_state_bitwise_on_every_rank_3ranks" "$tmp/lck" && ! grep -q "FAIL " "$tmp/lck"; then
        say PASS windows_checkpoint_loads_on_linux_3ranks
    else say FAIL windows_checkpoint_loads_on_linux_3ranks "$(grep -m2 -E 'FAIL|error' "$tmp/lck" | tr '\n' ' ')"; fi
fi

# ---- the timeline: 2 Windows processes write one Chrome trace of both ranks ----
if DDP_TIMELINE="$tmp/trace.json" wrun 2 120 "$W/minimal.exe" && python3 - "$tmp/trace.json" <<'PY'
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
ranks = {e["pid"] for e in events}
cats = {e["cat"] for e in events if e.get("ph") != "M"}
steps = {e["args"]["step"] for e in events if e.get("cat") == "step"}
want = {"forward", "backward", "ready", "comm", "exposed", "optimizer", "step"}
ok = ranks == {0, 1} and want <= cats and len(steps) >= 100
if not ok: print("ranks %s, missing kinds %s, %d steps" % (sorted(ranks), sorted(want - cats), len(steps)))
sys.exit(0 if ok else 1)
PY
then say PASS windows_timeline_one_trace_both_ranks
else say FAIL windows_timeline_one_trace_both_ranks "see above; $(tail -n 2 "$tmp/out" | tr '\n' ' ')"; fi

# ---- the engine example: 3 thread-ranks, progress, a cancel; then ddp_join (uneven inputs) ----
if timeout 120 "$WINE" "$W/engine.exe" >"$tmp/engine" 2>&1 && grep -q "training cancelled; the engine goes on" "$tmp/engine" &&
   [ "$(grep -c 'cancelled: rank' "$tmp/engine")" = 3 ] && grep -q "^\[engine .*\] step" "$tmp/engine"; then
    say PASS windows_engine_progress_and_cancel
else say FAIL windows_engine_progress_and_cancel "$(tail -n 4 "$tmp/engine" | tr '\n' ' ')"; fi
if timeout 120 "$WINE" "$W/engine.exe" --batches 60 --cancel-after 0 >"$tmp/engine" 2>&1 &&
   grep -q "rank 2: 30 steps, ok" "$tmp/engine" && grep -q "rank 0: 60 steps, ok" "$tmp/engine"; then
    say PASS windows_engine_join_uneven_inputs
else say FAIL windows_engine_join_uneven_inputs "$(tail -n 4 "$tmp/engine" | tr '\n' ' ')"; fi

# ---- cl.exe's atomics: the Interlocked mapping (>>platform), forced on MinGW (no MSVC here) ----
wine_run 120 "$tmp/il" "$W/test_equivalence_il.exe" --threads 2; rc=$?
win=$(hashes "$tmp/il"); lin=$(hashes "$tmp/lin2")
if [ $rc = 0 ] && ! grep -q "^FAIL" "$tmp/il" && [ -n "$win" ] && [ "$win" = "$lin" ]; then say PASS windows_interlocked_atomics_threads2_bitwise_equals_linux
else say FAIL windows_interlocked_atomics_threads2_bitwise_equals_linux "status $rc, $(grep -m1 FAIL "$tmp/il") Windows: ${win:-none} | Linux: ${lin:-none}"; fi
if timeout 120 "$WINE" "$W/engine_il.exe" --cancel-after 500 >"$tmp/engine" 2>&1 && grep -q "training cancelled; the engine goes on" "$tmp/engine" &&
   [ "$(grep -c 'cancelled: rank' "$tmp/engine")" = 3 ]; then
    say PASS windows_interlocked_atomics_engine_cancel
else say FAIL windows_interlocked_atomics_engine_cancel "$(tail -n 4 "$tmp/engine" | tr '\n' ' ')"; fi

# ---- the texture example: 2 thread-ranks to a step count, then a time limit cancels a run ----
if timeout 120 "$WINE" "$W/texture.exe" --ranks 2 --size 32 --steps 300 --batch 128 --seconds 0 --preview-every 100 \
        --out "$tmp/tex" >"$tmp/texture" 2>&1 && [ -s "$tmp/tex/result.png" ] && grep -q " 0 live at the end" "$tmp/texture"; then
    say PASS windows_texture_trains_writes_pngs_frees_all
else say FAIL windows_texture_trains_writes_pngs_frees_all "$(tail -n 3 "$tmp/texture" | tr '\n' ' ')"; fi
if timeout 120 "$WINE" "$W/texture.exe" --ranks 2 --size 16 --seconds 1 --out "$tmp/tex2" >"$tmp/texture" 2>&1 &&
   grep -q "cancelled" "$tmp/texture"; then
    say PASS windows_texture_time_limit_cancels
else say FAIL windows_texture_time_limit_cancels "$(tail -n 3 "$tmp/texture" | tr '\n' ' ')"; fi
exit $fail
