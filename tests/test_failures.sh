#!/usr/bin/env bash
# test_failures.sh — a dying rank, bad input from a real launch, leftovers. Prints PASS/FAIL lines.
# Usage: tests/test_failures.sh [BUILD_DIR]
set -u
B=${1:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; fails=$((fails + 1)); }
. "$(dirname "$0")/lib.sh"   # free_port
port() { free_port; }
now() { date +%s.%N; }
shm_ours() { ls /dev/shm 2>/dev/null | grep -E "^ddp-($1)-" || true; }

# kill_job NAME WORLD STEP WHERE [VAR=VALUE ...]: WORLD ranks of test_fault started by hand (no
# launcher to clean up), rank 1 SIGKILLed at step STEP in WHERE (the variables pick the rest); every
# other rank must exit non-zero within 10 s with an error that names rank 1. Leaves p and pids set.
kill_job() {
  local name=$1 world=$2 step=$3 where=$4 r rc t secs died_at
  shift 4
  p=$(port)
  pids=()
  for ((r = 0; r < world; r++)); do
    env RANK=$r WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$p DIE_RANK=1 DIE_STEP=$step DIE_WHERE=$where "$@" \
      timeout 60 "$B/test_fault" 100000 >"$tmp/out$r" 2>"$tmp/err$r" &
    pids+=($!)
  done
  wait "${pids[1]}" 2>/dev/null; died_at=$(now)
  for ((r = 0; r < world; r++)); do
    [ "$r" -eq 1 ] && continue
    wait "${pids[$r]}"; rc=$?; t=$(now)
    secs=$(awk -v a="$died_at" -v b="$t" 'BEGIN { printf "%.2f", b - a }')
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && awk -v s="$secs" 'BEGIN { exit !(s < 10) }' &&
       grep -q "rank 1 (pid [0-9]*) died" "$tmp/err$r"; then
      pass "${name}_rank${r}_names_rank1 (${secs}s)"
    else
      fail "${name}_rank${r}_names_rank1" "rc=$rc after ${secs}s: $(tail -n 1 "$tmp/err$r")"
    fi
  done
}

# 1. Killed in the forward, inside backward (its peers mid-allreduce) or just before the optimizer
#    step: nothing left in /dev/shm, the store's port released.
for where in forward backward optimizer; do
  kill_job "killed_in_${where}" 3 15 "$where"
  left=$(shm_ours "$(IFS='|'; echo "${pids[*]}")")
  [ -z "$left" ] && pass "killed_in_${where}_no_shm_left" || fail "killed_in_${where}_no_shm_left" "$left"
  if ss -ltn 2>/dev/null | grep -q ":$p "; then fail "killed_in_${where}_port_released" "port $p still listening"
  else pass "killed_in_${where}_port_released"; fi
done

# 1a. The same kill just before an outer step (replica groups of one rank, DiLoCo every 5 steps:
#     the peers are in the outer exchange; streaming with a delay: in the exchange's own thread,
#     found when the fragment is due to merge).
kill_job killed_before_outer_step_delay0 3 14 optimizer OUTER=5
kill_job killed_before_outer_step_delay1 3 14 optimizer OUTER=5 OUTER_DELAY=1

# 1c. Replica groups of 2 ranks (4 ranks, DiLoCo with H far beyond the run): rank 1 killed inside
#     backward. Its group's peer is mid-bucket and names it; the other group never waits for
#     rank 1 in its own buckets and sees the poison at its next bucket (or wait): every survivor
#     names the dead rank within 10 s (not H steps later, at the next outer sync).
kill_job killed_in_backward_groups_of_2 4 15 backward OUTER=1000000 OUTER_GROUP=2
left=$(shm_ours "$(IFS='|'; echo "${pids[*]}")")
[ -z "$left" ] && pass "killed_in_backward_groups_of_2_no_shm_left" || fail "killed_in_backward_groups_of_2_no_shm_left" "$left"

# 1b. A rank killed during the rendezvous: rank 0 is waiting for the others and names it at once.
p=$(port)
RANK=0 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p timeout 60 "$B/test_fault" 3 >/dev/null 2>"$tmp/rdv0" &
r0=$!
RANK=2 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p timeout 60 "$B/test_fault" 3 >/dev/null 2>&1 &
r2=$!
sleep 1
pkill -9 -P "$r2" 2>/dev/null; died_at=$(now)   # the rank under timeout
wait "$r0"; rc=$?
secs=$(awk -v a="$died_at" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && awk -v s="$secs" 'BEGIN { exit !(s < 10) }' && grep -q "rank 2 disconnected" "$tmp/rdv0"; then
  pass "killed_in_rendezvous_names_rank2 (${secs}s)"
else
  fail "killed_in_rendezvous_names_rank2" "rc=$rc after ${secs}s: $(cat "$tmp/rdv0")"
fi
wait "$r2" 2>/dev/null || true

# 1b'. Rank 0 SIGKILLed inside ddp.h between creating a shared segment and its peers' mapping it
#      (the kill points of DDP_TEST_KILL_AT): the survivors fail at once and sweep the segment, so
#      nothing of the dead rank 0 stays in /dev/shm until some later job.
for point in shm-created shm-published grads-published; do
  p=$(port)
  pids=()
  for r in 0 1 2; do
    # a job id of its own: a by-hand rank of some other test on this host cannot wander in
    RANK=$r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p DDP_TIMEOUT=20 DDP_TEST_KILL_AT=$point:0 \
      DDP_JOB_ID="kill-point-$$-$point" "$B/test_fault" 3 >/dev/null 2>"$tmp/kp$r" &
    pids+=($!)
  done
  ok=1; why=""
  wait "${pids[0]}"; rc0=$?
  [ "$rc0" -eq 137 ] || { ok=0; why="rank 0 exited $rc0, not killed;"; }
  for r in 1 2; do
    wait "${pids[$r]}"; rc=$?
    [ "$rc" -ne 0 ] && grep -q "rank 0" "$tmp/kp$r" || { ok=0; why="$why rank $r rc=$rc: $(tail -n 1 "$tmp/kp$r");"; }
  done
  left=$(shm_ours "${pids[0]}")
  [ -z "$left" ] || { ok=0; why="$why left in /dev/shm: $left (rank 1: $(tail -n 1 "$tmp/kp1"))"; rm -f /dev/shm/$left; }
  [ "$ok" -eq 1 ] && pass "rank0_killed_at_${point}_no_shm_left" || fail "rank0_killed_at_${point}_no_shm_left" "$why"
done

# 1b''. Two jobs on one node and one port, launched without ddprun (no DDP_JOB_TOKEN): job B's
#       rank 1 must not train inside job A. The launcher's job id (here Slurm's) tells them apart:
#       B's rank 1 is refused with a message naming both jobs, and job A then completes.
p=$(port)
job_a=1$$ job_b=2$$   # job ids of their own: no other test's ranks can match them
slurm() { SLURM_JOB_ID=$1 SLURM_STEP_ID=0 SLURM_PROCID=$2 SLURM_LOCALID=$2 SLURM_NTASKS=2 SLURM_NTASKS_PER_NODE=2 \
          MASTER_PORT=$p DDP_TIMEOUT=20 timeout 60 "$B/test_fault" 3; }
slurm "$job_a" 0 >/dev/null 2>"$tmp/jobA0" & a0=$!
sleep 0.3
slurm "$job_b" 1 >/dev/null 2>"$tmp/jobB1"; rcb=$?
slurm "$job_a" 1 >/dev/null 2>"$tmp/jobA1" & a1=$!
wait "$a0"; rca0=$?; wait "$a1"; rca1=$?
if [ "$rcb" -ne 0 ] && [ "$rcb" -ne 124 ] && grep -q "another job ('Slurm job $job_a step 0'); this rank is in job 'Slurm job $job_b step 0'" "$tmp/jobB1" &&
   [ "$rca0" -eq 0 ] && [ "$rca1" -eq 0 ]; then
  pass "rank_of_another_job_on_same_port_refused"
else
  fail "rank_of_another_job_on_same_port_refused" "job B rank 1 rc=$rcb: $(tail -n 1 "$tmp/jobB1"); job A rc=$rca0,$rca1: $(tail -n 1 "$tmp/jobA0")"
fi

# 1e. A rank started twice (a launcher bug, a typo in RANK): the process that claims the rank
#     second is refused, says which pid holds it, and its hang-up is no rank's death: the job
#     trains. Rank 2 of 3 starts only once one of the two rank 1s has exited (the refused one:
#     on main its hang-up was "rank 1 disconnected"), so the duplicate always meets the job
#     running, however slowly a process starts. (a) the duplicate 0.5 s after the real rank 1;
#     (b) ranks 0, 1 and 1 started at once: their claims race (3 tries).
dup_check() {   # dup_check NAME: $tmp/dupA, $tmp/dupB (the two rank 1s), rc_a rc_b rc_rest, pid_a pid_b
  local name=$1 loser= holder=
  if [ "$rc_a" -eq 0 ] && [ "$rc_b" -ne 0 ]; then loser=$tmp/dupB; holder=$pid_a
  elif [ "$rc_b" -eq 0 ] && [ "$rc_a" -ne 0 ]; then loser=$tmp/dupA; holder=$pid_b; fi
  if [ -n "$loser" ] && [ "$rc_rest" = 0 ] && [ "$rc_a" -ne 124 ] && [ "$rc_b" -ne 124 ] &&
     grep -q "two processes of this job were started as rank 1: pid $holder on host '.*' holds it" "$loser"; then
    pass "$name"
  else
    fail "$name" "rank 1 twice: rc $rc_a and $rc_b, others $rc_rest: $(cat "$tmp/dupA" "$tmp/dupB" "$tmp/dup_rest" | head -n 3)"
  fi
}
# exec: $! is the rank itself (its pid is what the refusal names)
dup_rank() { RANK=$1 WORLD_SIZE=$2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p DDP_TIMEOUT=20 DDP_JOB_ID="dup-$$-$p" exec "$B/test_fault" 3; }
dup_job() {   # dup_job SECONDS_BETWEEN_THE_RANK_1S
  p=$(port)
  (dup_rank 0 3) >/dev/null 2>"$tmp/dup_rest" & r0=$!
  (dup_rank 1 3) >/dev/null 2>"$tmp/dupA" & pid_a=$!
  sleep "$1"
  (dup_rank 1 3) >/dev/null 2>"$tmp/dupB" & pid_b=$!
  for _ in $(seq 1200); do kill -0 "$pid_a" 2>/dev/null && kill -0 "$pid_b" 2>/dev/null || break; sleep 0.05; done
  sleep 0.3   # the refused one has hung up
  (dup_rank 2 3) >/dev/null 2>>"$tmp/dup_rest"; rc2=$?
  wait "$r0"; rc0=$?; wait "$pid_a"; rc_a=$?; wait "$pid_b"; rc_b=$?
  rc_rest=$((rc0 + rc2))
}
dup_job 0.5
dup_check "duplicate_rank_refused_during_rendezvous_job_trains"
ok=1
for try in 1 2 3; do
  dup_job 0
  out=$(dup_check "duplicate_rank_started_at_once_job_trains_try$try")
  case $out in PASS*) ;; *) echo "$out"; fails=$((fails + 1)); ok=0; break ;; esac
done
[ "$ok" -eq 1 ] && pass "duplicate_rank_started_at_once_job_trains (3 of 3)"

# 1g. A stray started with a larger world (WORLD_SIZE=3 RANK=2 against a job of 2) is refused,
#     and its hang-up is no rank's death: the real job trains.
p=$(port)
(dup_rank 0 2) >/dev/null 2>"$tmp/big0" & r0=$!
sleep 0.3
(dup_rank 2 3) >/dev/null 2>"$tmp/big_stray"; rc_s=$?
sleep 0.3
(dup_rank 1 2) >/dev/null 2>"$tmp/big1"; rc1=$?
wait "$r0"; rc0=$?
if [ "$rc_s" -ne 0 ] && [ "$rc0" = 0 ] && [ "$rc1" = 0 ] && grep -q "ranks disagree on the world size" "$tmp/big_stray"; then
  pass "rank_beyond_the_world_refused_job_trains"
else
  fail "rank_beyond_the_world_refused_job_trains" "stray rc $rc_s, job rc $rc0,$rc1: $(cat "$tmp/big_stray" "$tmp/big0" | head -n 3)"
fi

# 1f. Rank 0 never listens (never started, or died before its store was up). A rank cannot tell
#     that from a slow rank 0, so by hand the wait lasts timeout_s, but it is not silent: a warning
#     after half the timeout (10 s at most) says what is refused; then the timeout names rank 0.
#     Under ddprun, rank 0's death ends the job at once.
p=$(port)
t0=$(now)
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p DDP_TIMEOUT=3 timeout 60 "$B/test_fault" 3 >/dev/null 2>"$tmp/norank0"; rc=$?
secs=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] &&
   grep -q "warning: nothing listens at 127.0.0.1:$p (MASTER_ADDR:MASTER_PORT): connection refused for 1.5 s" "$tmp/norank0" &&
   grep -q "no store at 127.0.0.1:$p - did rank 0 start?" "$tmp/norank0"; then
  pass "rank0_never_listening_warned_then_timeout (${secs}s)"
else
  fail "rank0_never_listening_warned_then_timeout" "rc=$rc after ${secs}s: $(cat "$tmp/norank0")"
fi
t0=$(now)
DDP_TIMEOUT=60 timeout 60 "$B/ddprun" -n 2 sh -c 'if [ "$RANK" = 0 ]; then exit 3; fi; exec "$0" 3' "$B/test_fault" >/dev/null 2>"$tmp/norank0"; rc=$?
secs=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
if [ "$rc" -eq 3 ] && awk -v s="$secs" 'BEGIN { exit !(s < 10) }' && grep -q "^ddprun: rank 0 (pid [0-9]*) exited with status 3" "$tmp/norank0"; then
  pass "rank0_dead_before_listening_under_ddprun_ends_job_at_once (${secs}s)"
else
  fail "rank0_dead_before_listening_under_ddprun_ends_job_at_once" "rc=$rc after ${secs}s: $(grep ddprun "$tmp/norank0" | head -n 2)"
fi

# 1c. A rank that stops answering without dying (SIGSTOP): the timeout names it and the collective.
p=$(port)
pids=()
for r in 0 1 2; do
  RANK=$r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p DDP_TIMEOUT=2 \
    timeout 60 "$B/test_fault" 100000 >"$tmp/out$r" 2>"$tmp/err$r" &
  pids+=($!)
done
for _ in $(seq 200); do grep -q "^step 5$" "$tmp/out1" 2>/dev/null && break; sleep 0.05; done
victim=$(pgrep -P "${pids[1]}" | head -n 1)
kill -STOP "$victim"; stopped_at=$(now)
ok=1; why=""
for r in 0 2; do
  wait "${pids[$r]}"; rc=$?
  secs=$(awk -v a="$stopped_at" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
  if ! { [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && awk -v s="$secs" 'BEGIN { exit !(s < 10) }' &&
         grep -q "timed out after 2 s in .* waiting for rank(s) 1" "$tmp/err$r"; }; then
    ok=0; why="$why rank $r rc=$rc after ${secs}s: $(tail -n 1 "$tmp/err$r");"
  fi
done
kill -KILL "$victim" 2>/dev/null; wait "${pids[1]}" 2>/dev/null
[ "$ok" -eq 1 ] && pass "stopped_rank_named_by_timeout" || fail "stopped_rank_named_by_timeout" "$why"

# 1d. The whole job stopped (Ctrl-Z on every rank) for twice DDP_TIMEOUT, then continued: time a
#     rank could not run is not waiting for its peers, so nobody times out and the run finishes.
#     (Rank 0 waits 0.3 s before its own stop, leaving 4.7 s after SIGCONT for rank 1 to get the
#     CPU back and arrive: 2.7 s was not always enough under ThreadSanitizer on 2 loaded cores.)
p=$(port)
pids=()
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p DDP_TIMEOUT=5 \
    timeout 60 "$B/test_fault" 400 >"$tmp/out$r" 2>"$tmp/err$r" &
  pids+=($!)
done
for _ in $(seq 200); do grep -q "^step 5$" "$tmp/out1" 2>/dev/null && break; sleep 0.05; done
r0=$(pgrep -P "${pids[0]}" | head -n 1); r1=$(pgrep -P "${pids[1]}" | head -n 1)
kill -STOP "$r1"; sleep 0.3    # rank 0 is now waiting for rank 1: its wait began before the stop
kill -STOP "$r0"; sleep 11; kill -CONT "$r0" "$r1"
ok=1; why=""
for r in 0 1; do
  wait "${pids[$r]}"; rc=$?
  [ "$rc" -eq 0 ] || { ok=0; why="$why rank $r rc=$rc: $(tail -n 1 "$tmp/err$r");"; }
done
[ "$ok" -eq 1 ] && pass "whole_job_stopped_longer_than_timeout_continues" || fail "whole_job_stopped_longer_than_timeout_continues" "$why"

# 2. Killed from outside while training, under ddprun: ddprun exits non-zero and says who.
p=$(port)
"$B/ddprun" -n 3 --master-port "$p" "$B/test_fault" 100000 >"$tmp/run_out" 2>"$tmp/run_err" &
runner=$!
for _ in $(seq 200); do grep -q "^\[rank 2\] step 5$" "$tmp/run_out" 2>/dev/null && break; sleep 0.05; done
victim=$(pgrep -P "$runner" | sort -n | sed -n 2p)     # ddprun starts ranks in order: rank 1
kill -9 "$victim" 2>/dev/null
( sleep 30; kill -9 "$runner" 2>/dev/null ) & guard=$!
wait "$runner"; rc=$?
kill "$guard" 2>/dev/null
if [ "$rc" -eq 137 ] && grep -q "rank 1 (pid $victim) was killed by signal 9" "$tmp/run_err"; then
  pass "ddprun_reports_killed_rank"
else
  fail "ddprun_reports_killed_rank" "rc=$rc: $(grep ddprun "$tmp/run_err" | head -n 2)"
fi
sleep 0.2
left=$(pgrep -P "$runner" || true; pgrep -f "^$B/test_fault 100000" || true)
[ -z "$left" ] && pass "ddprun_leaves_no_rank_running" || fail "ddprun_leaves_no_rank_running" "pids $left"

# 2b. A rank stopped (SIGSTOP) under ddprun with DDP_TIMEOUT=2: the survivors time out, and ddprun
#     names the stopped rank as the cause, not the survivor that reported the timeout; the job
#     ends soon after (the stopped rank gets SIGCONT after its SIGTERM, not SIGKILL 5 s later).
p=$(port)
DDP_TIMEOUT=2 "$B/ddprun" -n 3 --master-port "$p" "$B/test_fault" 100000 >"$tmp/stall_out" 2>"$tmp/stall_err" &
runner=$!
for _ in $(seq 200); do grep -q "^\[rank 2\] step 5$" "$tmp/stall_out" 2>/dev/null && break; sleep 0.05; done
victim=""
for c in $(pgrep -P "$runner"); do
  [ "$(tr '\0' '\n' <"/proc/$c/environ" 2>/dev/null | sed -n 's/^RANK=//p')" = 1 ] && victim=$c
done
kill -STOP "$victim"; stopped_at=$(now)
( sleep 40; kill -9 "$runner" 2>/dev/null ) & guard=$!
wait "$runner"; rc=$?
kill "$guard" 2>/dev/null
secs=$(awk -v a="$stopped_at" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
first=$(grep -m1 '^ddprun: rank' "$tmp/stall_err")
if [ -n "$victim" ] && [ "$rc" -eq 3 ] && awk -v s="$secs" 'BEGIN { exit !(s < 10) }' &&
   [[ $first == "ddprun: rank 1 (pid $victim) is stopped by signal 19 "*": rank "[02]" exited with status 3 after waiting for it"* ]]; then
  pass "ddprun_names_stopped_rank_not_the_survivor (${secs}s)"
else
  fail "ddprun_names_stopped_rank_not_the_survivor" "rc=$rc after ${secs}s, victim '$victim': $(grep '^ddprun' "$tmp/stall_err" | head -n 3 | tr '\n' '|')"
fi
kill -9 "$victim" 2>/dev/null

# 2c. ddp.h's own words reach ddprun: a rank that never starts the library (busy before ddp_init)
#     is named as stalled, and one that returns with status 0 before ddp_init as the one that
#     left early, not the survivors that timed out at the rendezvous.
for how in stalled left; do
  p=$(port)
  DDP_TIMEOUT=1 HOW=$how timeout 60 "$B/ddprun" -n 3 --grace 1 --master-port "$p" sh -c \
    'if [ "$RANK" = 1 ]; then if [ "$HOW" = left ]; then exit 0; fi; sleep 30; fi; exec "$0" 3' "$B/test_fault" \
    >"$tmp/early_out" 2>"$tmp/early_err"
  rc=$?
  case $how in
    stalled) want="ddprun: rank 1 (pid [0-9]*) stalled: rank [02] exited with status 3 after waiting for it" ;;
    left) want="ddprun: rank 1 (pid [0-9]*) exited with status 0 before its peers were done: rank [02] exited with status 3" ;;
  esac
  if [ "$rc" -eq 3 ] && grep -q "^$want" "$tmp/early_err" && grep -q 'rank(s) 1 never arrived at the rendezvous' "$tmp/early_err"; then
    pass "ddprun_names_rank_${how}_before_rendezvous"
  else
    fail "ddprun_names_rank_${how}_before_rendezvous" "rc=$rc: $(grep -v '^\[rank [0-9]\] step' "$tmp/early_err" | head -n 4 | tr '\n' '|')"
  fi
done

# 3. A segment left behind by a crashed job does not break the next run, and is swept away.
stale=/dev/shm/ddp-999999-deadbeef
: >"$stale" 2>/dev/null
p=$(port)
if timeout 60 "$B/ddprun" -n 2 --master-port "$p" "$B/test_fault" 3 >"$tmp/stale_out" 2>&1 && [ ! -e "$stale" ]; then
  pass "stale_segment_swept_next_run_ok"
else
  fail "stale_segment_swept_next_run_ok" "$(tail -n 2 "$tmp/stale_out")"
fi
rm -f "$stale"

# 4. Bad environment on a real launch: a clear error, non-zero exit, no hang.
RANK=5 WORLD_SIZE=2 MASTER_PORT=1 timeout 20 "$B/minimal" >/dev/null 2>"$tmp/env_err"; rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q "RANK=5 is not below WORLD_SIZE=2" "$tmp/env_err"; then
  pass "bad_env_real_process"
else
  fail "bad_env_real_process" "rc=$rc: $(cat "$tmp/env_err")"
fi

# 5. Ranks that registered different parameters: every rank fails naming the parameter.
p=$(port)
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p MISMATCH_RANK=1 \
    timeout 60 "$B/test_fault" 3 >/dev/null 2>"$tmp/mm_err$r" &
  pids[$r]=$!
done
ok=1
for r in 0 1; do
  wait "${pids[$r]}"; rc=$?
  { [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q "'layer0.weight [0-9]* 0'.*'layer0.weights [0-9]* 0' on rank 1" "$tmp/mm_err$r"; } || ok=0
done
[ "$ok" -eq 1 ] && pass "mismatched_params_every_rank_names_it" ||
  fail "mismatched_params_every_rank_names_it" "$(cat "$tmp/mm_err0" "$tmp/mm_err1")"

# 6. A /dev/shm too small (a container's default is 64 MiB). Run in a private mount namespace
#    with a small tmpfs on /dev/shm (needs root; SKIP otherwise). Room for the collectives'
#    segment but not the gradients': the job trains anyway, the same bits as with room, and says
#    so in a warning. No room even for the collectives: a clear error at init, no SIGBUS.
shm_small() {   # shm_small SIZE command...: run with a SIZE tmpfs on /dev/shm
  local size=$1; shift
  unshare -m sh -c 'mount -t tmpfs -o size="$0" tmpfs /dev/shm && exec "$@"' "$size" "$@"
}
GPT=(--data ddp.h --layers 4 --heads 4 --dim 128 --seq 64 --batch 2 --steps 3 --eval-every 0 --eval-batches 1 --sample 0)
if ! shm_small 1m true 2>/dev/null; then
  echo "SKIP small_dev_shm: cannot mount a private tmpfs on /dev/shm here (needs root and unshare)"
else
  timeout 120 "$B/ddprun" -n 2 "$B/train_gpt" "${GPT[@]}" >"$tmp/shm_roomy" 2>&1
  shm_small 6m timeout 120 "$B/ddprun" -n 2 "$B/train_gpt" "${GPT[@]}" >"$tmp/shm_tight" 2>&1; rc=$?
  want=$(sed -n 's/.*params fnv1a \([0-9a-f]*\).*/\1/p' "$tmp/shm_roomy")
  got=$(sed -n 's/.*params fnv1a \([0-9a-f]*\).*/\1/p' "$tmp/shm_tight")
  if [ "$rc" -eq 0 ] && [ -n "$want" ] && [ "$want" = "$got" ] && grep -q "warning: cannot reserve .*/dev/shm too small.*staging slots instead" "$tmp/shm_tight"; then
    pass "small_dev_shm_gradients_fall_back_same_bits (fnv1a $got)"
  else
    fail "small_dev_shm_gradients_fall_back_same_bits" "rc=$rc, params $got vs $want: $(grep -v '^\[rank [01]\] step' "$tmp/shm_tight" | tail -n 3)"
  fi
  shm_small 1m timeout 60 "$B/ddprun" -n 2 "$B/train_gpt" "${GPT[@]}" >"$tmp/shm_none" 2>&1; rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && ! grep -qi "signal" "$tmp/shm_none" &&
     grep -q "\(rank 0: \|\[rank 0\] \)cannot reserve .* bytes of shared memory .*/dev/shm too small" "$tmp/shm_none"; then
    pass "tiny_dev_shm_clear_error_at_init"
  else
    fail "tiny_dev_shm_clear_error_at_init" "rc=$rc: $(tail -n 3 "$tmp/shm_none")"
  fi
fi

exit $((fails > 0))
