#!/usr/bin/env bash
# test_restart.sh — `ddprun --max-restarts N` keeps a training run going through failures. The GPT
# trainer, 2 ranks, a checkpoint every 10 of 60 steps, and N kills at random steps and ranks
# (train_gpt's test-only DDP_TEST_KILL points: SIGKILL after a step's backward, or rank 0 in the
# middle of writing a checkpoint; each fires once): the job restarts N times, each restart printed
# with the rank killed, resumes from its last complete checkpoint (--save PATH holds it), and ends
# with the same final checkpoint, byte for byte, as a run that was never killed. N+1 kills: ddprun
# gives up after N restarts and names the last failure. Across the sharding levels: a run killed
# under ZeRO-3, resumed under ZeRO-2 and killed again, resumed unsharded, ends with the straight
# run's parameters, bit for bit.
# Prints one PASS/FAIL line per check; exits 1 if any failed.
# Usage: tests/test_restart.sh [BUILD_DIR]      (env SEED: the kill points' seed; printed)
set -u
B=${1:-build}
B=$(cd "$B" && pwd) || { echo "FAIL setup: no build dir '$1'"; exit 1; }
for f in train_gpt ddprun; do
  [ -x "$B/$f" ] || { echo "FAIL setup: $B/$f missing (make build/train_gpt build/ddprun)"; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
fails=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; fails=$((fails + 1)); }
SEED=${SEED:-$RANDOM}
RANDOM=$SEED
echo "kill points drawn with SEED=$SEED"

seq 1 4000 | awk '{ printf "line %d: the quick brown fox jumps over the lazy dog, %d times.\n", $1, ($1 * 7919) % 1000 }' >data.txt
STEPS=60 EVERY=10 N=3
GPT=(--data data.txt --layers 1 --heads 2 --dim 32 --seq 16 --batch 2 --steps "$STEPS" --warmup 5
     --eval-every 0 --eval-batches 1 --sample 0 --log-every 10 --save-every "$EVERY")

# kill_points K: sets points to K points "rank:step[:save]" at distinct steps at least 2 apart
# (two points in one attempt would fire together), in the order they fire (by step; see
# train_gpt.c). In this shell, not a $(...) subshell: bash seeds RANDOM anew in a subshell.
kill_points() {
  local k=0 s ok p steps=()
  while [ $k -lt "$1" ]; do
    s=$((1 + RANDOM % STEPS)); ok=1
    for p in "${steps[@]}"; do [ $((s - p)) -ge 2 ] || [ $((p - s)) -ge 2 ] || ok=0; done
    [ $ok = 1 ] || continue
    steps+=("$s"); k=$((k + 1))
  done
  points=()
  for s in $(printf '%s\n' "${steps[@]}" | sort -n); do
    if [ $((s % EVERY)) = 0 ] && [ $((RANDOM % 2)) = 0 ]; then points+=("0:$s:save"); else points+=("$((RANDOM % 2)):$s"); fi
  done
}

# The uninterrupted reference.
timeout 120 "$B/ddprun" -n 2 "$B/train_gpt" "${GPT[@]}" --save ref >out.ref 2>&1 || { echo "FAIL setup: the reference run failed: $(tail -n 3 out.ref)"; exit 1; }

# run NAME POINTS...: the job under --max-restarts N with those kill points; sets rc.
run() {
  local name=$1; shift
  mkdir -p "once.$name"
  DDP_TEST_KILL=$(IFS=,; echo "$*") DDP_TEST_KILL_ONCE="once.$name" \
    timeout 300 "$B/ddprun" -n 2 --max-restarts $N --restart-delay 0.1 "$B/train_gpt" "${GPT[@]}" --save "ck.$name" >"out.$name" 2>"err.$name"
  rc=$?
}
rank_of() { echo "${1%%:*}"; }

# ---- N kills: N restarts, the same final checkpoint ----
kill_points $N
echo "  $N kills: ${points[*]}"
run n "${points[@]}"
why=""
[ "$rc" -eq 0 ] || why="exit $rc: $(grep '^ddprun' err.n | tail -n 2 | tr '\n' '|')"
for k in $(seq 1 $N); do
  r=$(rank_of "${points[$((k - 1))]}")
  grep -q "^ddprun: restart $k of $N: rank $r (pid [0-9]*) was killed by signal 9 (Killed); starting all 2 rank(s) again in [0-9.]* s$" err.n ||
    why="$why; no restart $k naming rank $r killed by signal 9"
done
[ "$(grep -c '^ddprun: restart ' err.n)" -eq $N ] || why="$why; $(grep -c '^ddprun: restart ' err.n) restarts, not $N"
[ "$(ls once.n | wc -l)" -eq $N ] || why="$why; $(ls once.n | wc -l) of $N kill points fired"
[ -z "$why" ] && pass "restarts_through_${N}_kills (each printed with its cause)" || fail "restarts_through_${N}_kills" "${why#; }"
# Each restart resumes from the last complete checkpoint before its kill: a kill in step S leaves
# the one of step 10*floor((S-1)/10); a kill while writing the checkpoint of step S, the one
# before it (none: the restart starts over, and says nothing).
want=$(for p in "${points[@]}"; do
  s=${p#*:}; s=${s%%:*}
  case $p in *:save) c=$((s - EVERY)) ;; *) c=$(( (s - 1) / EVERY * EVERY )) ;; esac
  [ "$c" -gt 0 ] && echo "$c"
done | tr '\n' ' ' | sed 's/ $//')
got=$(sed -n 's/^\[rank 0\] resumed from ck\.n at step \([0-9]*\) (the --save path held a checkpoint.*/\1/p' out.n | tr '\n' ' ' | sed 's/ $//')
[ "$got" = "$want" ] && pass "each_restart_resumes_from_the_last_checkpoint (steps: ${got:-none})" ||
  fail "each_restart_resumes_from_the_last_checkpoint" "resumed at '${got}', want '${want}'"
if [ "$rc" -eq 0 ] && cmp -s ck.n ref; then
  pass "final_checkpoint_equals_uninterrupted_run ($(stat -c %s ref) bytes)"
else
  fail "final_checkpoint_equals_uninterrupted_run" "rc=$rc: $(cmp ck.n ref 2>&1)"
fi

# ---- N+1 kills: N restarts, then the last failure is named ----
kill_points $((N + 1))
echo "  $((N + 1)) kills: ${points[*]}"
run n1 "${points[@]}"
r=$(rank_of "${points[$N]}")
if [ "$rc" -eq 137 ] && [ "$(grep -c '^ddprun: restart ' err.n1)" -eq $N ] &&
   grep -q "^ddprun: giving up: the job failed $((N + 1)) times (--max-restarts $N); the last failure: rank $r (pid [0-9]*) was killed by signal 9 (Killed)$" err.n1; then
  pass "gives_up_after_${N}_restarts_naming_the_failure"
else
  fail "gives_up_after_${N}_restarts_naming_the_failure" "rc=$rc (want 137), rank $r: $(grep '^ddprun' err.n1 | tail -n 2 | tr '\n' '|')"
fi

# ---- across sharding levels (ddp_desc.shard): killed under ZeRO-3, resumed under ZeRO-2 and killed
# again, resumed unsharded: the straight unsharded run's bits. Every run declares the model's
# units (--units; ZeRO-3 needs them), so every level has the same buckets and the same bits; a
# checkpoint holds the same data at every level. ----
hash_of() { sed -n 's/.*params fnv1a \([0-9a-f]*\).*/\1/p' "$1" | tail -n 1; }
timeout 120 "$B/ddprun" -n 2 "$B/train_gpt" "${GPT[@]}" --units --save ck.units >out.units 2>&1
a=$(hash_of out.units)
lv() {   # LEVEL KILL_POINT LOG: the job at that level with that kill point (none: "")
  mkdir -p "once.$3"   # a point's mark is its index in the list: one directory a run
  DDP_SHARD=$1 DDP_TEST_KILL=$2 DDP_TEST_KILL_ONCE="once.$3" timeout 120 "$B/ddprun" -n 2 "$B/train_gpt" "${GPT[@]}" \
    --units --save ck.levels >"$3" 2>&1
}
lv parameters 1:25 out.lv1; rc1=$?
lv gradients 0:43 out.lv2; rc2=$?
lv none "" out.lv3; rc3=$?
c=$(hash_of out.lv3)
if [ -n "$a" ] && [ "$a" = "$c" ] && [ $rc1 -ne 0 ] && [ $rc2 -ne 0 ] && [ $rc3 -eq 0 ] &&
   grep -q "parameters sharded (ZeRO-3)" out.lv1 && grep -q "resumed from ck.levels at step 20" out.lv2 &&
   grep -q "resumed from ck.levels at step 40" out.lv3; then
  pass "killed_under_zero3_resumed_under_zero2_then_unsharded_equals_straight (params fnv1a $a)"
else
  fail "killed_under_zero3_resumed_under_zero2_then_unsharded_equals_straight" "straight $a, resumed $c; exits $rc1 $rc2 $rc3: $(tail -n 2 out.lv3 | tr '\n' ' ')"
fi

[ "$fails" -eq 0 ] || { echo "test_restart: $fails check(s) failed"; exit 1; }
exit 0
