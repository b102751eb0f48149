#!/usr/bin/env bash
# soak.sh — kill/restart soak test of the GPT example: 2 ranks train for --steps N under
# `ddprun --max-restarts K`, with a checkpoint every --save-every E steps; K times a random rank is
# SIGKILLed at a random moment (at least one new checkpoint written since the job last started),
# ddprun restarts the job and it resumes from the last checkpoint (train_gpt's --save PATH).
# At the end the final checkpoint (header, params, AdamW state, checksum: nothing run-specific)
# must equal, byte for byte, that of one uninterrupted run.
# Prints a table and exits 0 if everything held, 1 if not.
#   tests/soak.sh [--steps N] [--kills K] [--save-every E] [--build DIR] [--seed S] [--keep]
# Defaults (N=12000, K=8, E=50) take ~2-3 minutes on a 2-core machine.
set -u
N=12000 K=8 E=50 B=build SEED=$RANDOM KEEP=0
while [ $# -gt 0 ]; do
  case $1 in
    --steps) N=$2; shift 2 ;; --kills) K=$2; shift 2 ;; --save-every) E=$2; shift 2 ;;
    --build) B=$2; shift 2 ;; --seed) SEED=$2; shift 2 ;; --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "soak.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
B=$(cd "$B" && pwd) || exit 2
for f in train_gpt ddprun; do [ -x "$B/$f" ] || { echo "soak.sh: $B/$f missing (make build/train_gpt build/ddprun)" >&2; exit 2; }; done
RANDOM=$SEED
tmp=$(mktemp -d)
[ "$KEEP" = 1 ] && echo "soak.sh: keeping $tmp" || trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 2
seq 1 20000 | awk '{ printf "line %d: the quick brown fox jumps over the lazy dog, %d times.\n", $1, ($1 * 7919) % 1000 }' >data.txt
GPT=(--data data.txt --layers 2 --heads 2 --dim 64 --seq 32 --batch 4 --steps "$N" --warmup 50
     --eval-every 0 --eval-batches 2 --sample 0 --log-every 10 --save-every "$E")
ck_step() { [ -s ck ] && od -An -t d8 -j 24 -N 8 ck | tr -d ' ' || echo 0; }   # ddp.h's header: the AdamW step
last_step() { sed -n 's/^\[rank 0\] step *\([0-9]*\)\/.*/\1/p' out 2>/dev/null | tail -n 1; }
rank_of() { tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null | sed -n 's/^RANK=//p'; }
restarts() { grep -c '^ddprun: restart ' err 2>/dev/null; }
ranks_now() { pgrep -P "${ddprun_pid:-0}" | sort -n | tr '\n' ' '; }

# K kill targets: one random step in each of K equal slices of [E, N - E).
span=$(( (N - 2 * E) / K )); [ "$span" -lt 1 ] && span=1
targets=()   # drawn in this shell: bash seeds RANDOM anew in a $(...) subshell, and --seed would not repeat a soak
for k in $(seq 0 $((K - 1))); do targets+=($(( E + k * span + (RANDOM * 32768 + RANDOM) % span ))); done
rows=() ok=1 kills=0 t_start=$(date +%s)
timeout 3600 "$B/ddprun" -n 2 --max-restarts "$K" "$B/train_gpt" "${GPT[@]}" --save ck >out 2>err &
job=$!
for _ in $(seq 100); do ddprun_pid=$(pgrep -x -P "$job" ddprun) && break; sleep 0.05; done
while [ "$kills" -lt "$K" ] && kill -0 "$job" 2>/dev/null; do
  # this attempt: started (its ranks up) after the last kill's restart
  for _ in $(seq 600); do
    ranks=($(ranks_now)); [ "${#ranks[@]}" -eq 2 ] && [ "$(restarts)" -eq "$kills" ] && break; sleep 0.05
  done
  from=$(ck_step) want=${targets[$kills]} victim=""
  while kill -0 "$job" 2>/dev/null; do
    s=$(last_step); s=${s:-0}
    if [ "$s" -ge "$want" ] && [ "$(ck_step)" -gt "$from" ]; then
      sleep "0.0$((RANDOM % 10))$((RANDOM % 10))"              # a random moment inside a step
      ranks=($(ranks_now))
      [ "${#ranks[@]}" -eq 0 ] && break
      victim=${ranks[$((RANDOM % ${#ranks[@]}))]}
      krank=$(rank_of "$victim"); kstep=$(last_step); kck=$(ck_step)
      kill -KILL "$victim" 2>/dev/null || victim=""
      break
    fi
    sleep 0.02
  done
  [ -n "$victim" ] || break
  kills=$((kills + 1))
  for _ in $(seq 600); do [ "$(restarts)" -ge "$kills" ] && break; kill -0 "$job" 2>/dev/null || break; sleep 0.05; done
  sleep 0.2
  left=$(ls /dev/shm 2>/dev/null | grep -E "^ddp-(${ranks[0]}|${ranks[1]:-0})-" | wc -l)
  named=$(grep -c "^ddprun: restart $kills of $K: rank $krank (pid $victim) was killed by signal 9" err)
  at=$(sed -n 's/^\[rank 0\] resumed from ck at step \([0-9]*\) .*/\1/p' out | tail -n 1)
  verdict=ok
  { [ "$left" -ne 0 ] || [ "$(ck_step)" -lt "$kck" ]; } && { verdict=BAD; ok=0; }
  [ "$named" -eq 0 ] && { verdict="BAD(ddprun said: $(grep -m1 "^ddprun: restart $kills " err | cut -c9-80))"; ok=0; }
  rows+=("$(printf '%4d  %6s  %8s  %4s  %8s  %4s  %s' "$kills" "$want" "${kstep:-?}" "$krank" "${at:-0}" "$left" "$verdict")")
done
wait "$job"; rc=$?
t_soak=$(( $(date +%s) - t_start ))
if [ "$rc" -ne 0 ] || [ "$(last_step)" != "$N" ]; then ok=0; fi

# The uninterrupted reference.
timeout 3600 "$B/ddprun" -n 2 "$B/train_gpt" "${GPT[@]}" --save ref >out.ref 2>err.ref; rrc=$?
h_soak=$(sed -n 's/^\[rank 0\] params fnv1a //p' out | tail -n 1); h_ref=$(sed -n 's/^\[rank 0\] params fnv1a //p' out.ref)
if [ "$rrc" -eq 0 ] && cmp -s ck ref; then cmpres="identical (whole checkpoint, $(stat -c %s ref) bytes; params fnv1a $h_ref)"
else cmpres="DIFFERENT (rc=$rrc; $(cmp ck ref 2>&1 | head -n 1); fnv1a $h_soak vs $h_ref)"; ok=0; fi

echo "soak: 2 ranks, $N steps, checkpoint every $E, seed $SEED | $kills kill(s), $(restarts) restart(s) by ddprun --max-restarts $K, ${t_soak}s + reference $(( $(date +%s) - t_start - t_soak ))s"
echo "kill  target  killed@~  rank  resumed@  shm  verdict (ddprun named the rank and pid)"
for r in "${rows[@]}"; do echo "$r"; done
echo "the job: ddprun exit $rc, last step $(last_step) of $N$([ "$rc" -ne 0 ] && echo "; $(grep '^ddprun' err | tail -n 1)")"
echo "leftover partial checkpoints (rank 0 killed mid-write): $(ls ck.tmp.* 2>/dev/null | wc -l)"
echo "final parameters vs uninterrupted run: $cmpres"
[ "$kills" -lt "$K" ] && { echo "only $kills of $K kills happened (the run ended first)"; }
[ "$ok" = 1 ] && { echo "soak: PASS"; exit 0; } || { echo "soak: FAIL"; exit 1; }
