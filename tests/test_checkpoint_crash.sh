#!/usr/bin/env bash
# test_checkpoint_crash.sh — rank 0 SIGKILLed in the middle of writing a checkpoint (train_gpt's
# test-only hook DDP_TEST_DIE_IN_CHECKPOINT=S): the job fails fast and cleanly, the checkpoint on
# disk is still the previous complete one, and resuming from it ends bit for bit where an
# uninterrupted run ends. Prints one PASS/FAIL line per check; exits 1 if any failed.
# Usage: tests/test_checkpoint_crash.sh [BUILD_DIR]      (needs BUILD_DIR/train_gpt and ddprun)
set -u
B=${1:-build}
B=$(cd "$B" && pwd) || { echo "FAIL setup: no build dir '$1'"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; fails=$((fails + 1)); }
now() { date +%s.%N; }
. "$(dirname "$0")/lib.sh"   # free_port: a port below the ephemeral range that no socket uses
for f in train_gpt ddprun; do
  [ -x "$B/$f" ] || { echo "FAIL setup: $B/$f missing (make build/train_gpt build/ddprun)"; exit 1; }
done

# A ~170 KB text made here (not the repo's corpus) and a model small enough that a step is ~1 ms.
seq 1 4000 | awk '{ printf "line %d: the quick brown fox jumps over the lazy dog, %d times.\n", $1, ($1 * 7919) % 1000 }' >"$tmp/data.txt"
STEPS=60 EVERY=10 DIE=40    # checkpoints at 10, 20, 30; rank 0 dies while writing the one of step 40
GPT=(--data "$tmp/data.txt" --layers 1 --heads 2 --dim 32 --seq 16 --batch 2 --steps $STEPS --warmup 5
     --eval-every 0 --eval-batches 1 --sample 0 --log-every 10)
cd "$tmp" || exit 1

# ---- a. the crash, 3 ranks under ddprun ----
p=$(free_port)
DDP_TEST_DIE_IN_CHECKPOINT=$DIE timeout 60 "$B/ddprun" -n 3 --master-port "$p" \
  "$B/train_gpt" "${GPT[@]}" --save ck --save-every $EVERY >out.crash 2>err.crash &
job=$!
t0=$(now)
pids=""
while kill -0 "$job" 2>/dev/null; do   # the rank pids, for the /dev/shm check
  for c in $(pgrep -P "$job" 2>/dev/null); do
    for r in $c $(pgrep -P "$c" 2>/dev/null); do case " $pids " in *" $r "*) ;; *) pids="$pids $r" ;; esac; done
  done
  sleep 0.01
done
wait "$job"; rc=$?
secs=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
pid0=$(sed -n 's/^ddprun: rank 0 (pid \([0-9]*\)) was killed by signal 9.*/\1/p' err.crash | head -n 1)
[ -n "$pid0" ] && pids="$pids $pid0"
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -Eq "^ddprun: rank 0 (\(pid [0-9]+\) was killed|stopped) by signal 9" err.crash; then
  pass "crash_ddprun_nonzero_names_rank0_signal9 (rc=$rc)"
else
  fail "crash_ddprun_nonzero_names_rank0_signal9" "rc=$rc: $(grep '^ddprun' err.crash | tr '\n' '|')"
fi
if grep -Eq "^\[rank [12]\] .*(rank 0 \(pid [0-9]+\) died|rendezvous store.*rank 0|rank 0 disconnected)" err.crash; then
  pass "crash_survivor_names_rank0 ($(grep -Ec '^\[rank [12]\] .*rank 0' err.crash) of 2)"
else
  fail "crash_survivor_names_rank0" "no survivor reported it (ddprun SIGTERMed them first?): $(tr '\n' '|' <err.crash)"
fi
if awk -v s="$secs" 'BEGIN { exit !(s < 10) }' && [ "$rc" -ne 124 ]; then pass "crash_job_ends_fast (${secs}s)"
else fail "crash_job_ends_fast" "${secs}s, rc=$rc"; fi
pat=$(echo $pids | tr ' ' '|')
left=$( [ -n "$pat" ] && ls /dev/shm 2>/dev/null | grep -E "^ddp-($pat)-" )
if [ -z "$pat" ]; then fail "crash_no_shm_left" "could not learn the rank pids"
elif [ -z "$left" ]; then pass "crash_no_shm_left"
else fail "crash_no_shm_left" "$left"; fi
if ss -ltn 2>/dev/null | grep -q ":$p "; then fail "crash_port_released" "port $p still listening"
else pass "crash_port_released"; fi
alive=""
for r in $pids; do kill -0 "$r" 2>/dev/null && alive="$alive $r"; done
[ -z "$alive" ] && pass "crash_no_rank_left" || fail "crash_no_rank_left" "still running:$alive"

# ---- b. the file on disk is the old complete checkpoint ----
tmpf=$(ls ck.tmp.* 2>/dev/null | head -n 1)
# ddp_save's temporary: ck.tmp.<pid>.<16 random hex digits> (a name nobody can plant a link at first)
if [ -n "$pid0" ] && [[ "$tmpf" =~ ^ck\.tmp\.$pid0\.[0-9a-f]{16}$ ]] && [ -s ck ] && [ "$(stat -c %s "$tmpf")" -lt "$(stat -c %s ck)" ]; then
  pass "crash_hit_mid_write ($tmpf: $(stat -c %s "$tmpf") of $(stat -c %s ck) bytes)"
else
  fail "crash_hit_mid_write" "want a partial ck.tmp.$pid0.<random> next to ck: $(ls -l ck* 2>&1 | tr '\n' '|')"
fi
cp ck ck.copy 2>/dev/null
p=$(free_port)
timeout 30 "$B/ddprun" -n 3 --master-port "$p" "$B/train_gpt" "${GPT[@]}" --resume ck --save final.resumed >out.resume 2>err.resume
rc=$?
at=$(sed -n 's/^\[rank 0\] resumed from ck at step \([0-9]*\)$/\1/p' out.resume)
if [ "$rc" -eq 0 ] && [ "$at" = $((DIE - EVERY)) ]; then pass "checkpoint_is_old_complete_one (resumed at step $at)"
else fail "checkpoint_is_old_complete_one" "rc=$rc, resumed at '${at}', want $((DIE - EVERY)): $(tail -n 2 err.resume | tr '\n' '|')"; fi

# ---- c. resume == never interrupted, bit for bit (the checkpoint holds nothing run-specific:
#         header with model/step/seed, params, AdamW m and v, checksum; so whole files are compared) ----
p=$(free_port)
timeout 30 "$B/ddprun" -n 3 --master-port "$p" "$B/train_gpt" "${GPT[@]}" --resume ck.copy --save final.again >out.again 2>&1
rc2=$?
p=$(free_port)
timeout 30 "$B/ddprun" -n 3 --master-port "$p" "$B/train_gpt" "${GPT[@]}" --save final.ref >out.ref 2>&1
rc3=$?
if [ "$rc" -eq 0 ] && [ "$rc2" -eq 0 ] && cmp -s final.resumed final.again; then
  pass "resume_after_crash_equals_resume_from_same_checkpoint"
else fail "resume_after_crash_equals_resume_from_same_checkpoint" "rc=$rc/$rc2: $(cmp final.resumed final.again 2>&1)"; fi
if [ "$rc" -eq 0 ] && [ "$rc3" -eq 0 ] && cmp -s final.resumed final.ref; then
  pass "resume_after_crash_equals_uninterrupted_run (params fnv1a $(sed -n 's/^\[rank 0\] params fnv1a //p' out.ref))"
else fail "resume_after_crash_equals_uninterrupted_run" "rc=$rc/$rc3: $(cmp final.resumed final.ref 2>&1)"; fi

# ---- d. the next save into the same path removes the partial file the dead writer left ----
p=$(free_port)
timeout 30 "$B/ddprun" -n 3 --master-port "$p" "$B/train_gpt" "${GPT[@]}" --resume ck.copy --save ck >out.clean 2>&1
left=$(ls ck.tmp.* 2>/dev/null)
if [ -z "$left" ] && [ -s ck ]; then pass "stale_partial_checkpoint_removed_by_next_save"
else fail "stale_partial_checkpoint_removed_by_next_save" "left: $left"; fi

[ "$fails" -eq 0 ] || { echo "test_checkpoint_crash: $fails check(s) failed"; exit 1; }
exit 0
