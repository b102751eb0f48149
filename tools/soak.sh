#!/usr/bin/env bash
# soak.sh — kill/resume soak test of the GPT example: 2 ranks under ddprun train for --steps N
# with a checkpoint every --save-every E steps; K times a random rank is SIGKILLed at a random
# moment (at least one new checkpoint written since the last start), and the job is resumed
# from the last checkpoint. At the end the final checkpoint (header, params, AdamW state,
# checksum: nothing run-specific) must equal, byte for byte, that of one uninterrupted run.
# Prints a table and exits 0 if everything held, 1 if not.
#   tools/soak.sh [--steps N] [--kills K] [--save-every E] [--build DIR] [--seed S] [--keep]
# Defaults (N=12000, K=8, E=50) take ~2-3 minutes on a 2-core machine.
set -u
N=12000 K=8 E=50 B=build SEED=$RANDOM KEEP=0
while [ $# -gt 0 ]; do
  case $1 in
    --steps) N=$2; shift 2 ;; --kills) K=$2; shift 2 ;; --save-every) E=$2; shift 2 ;;
    --build) B=$2; shift 2 ;; --seed) SEED=$2; shift 2 ;; --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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
     --eval-every 0 --eval-batches 2 --sample 0 --log-every 10 --save ck --save-every "$E")
ck_step() { [ -s ck ] && od -An -t d8 -j 32 -N 8 ck | tr -d ' ' || echo 0; }   # ckpt_header.step
last_step() { sed -n 's/^\[rank 0\] step *\([0-9]*\)\/.*/\1/p' "$1" 2>/dev/null | tail -n 1; }
rank_of() { tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null | sed -n 's/^RANK=//p'; }

# K kill targets: one random step in each of K equal slices of [E, N - E).
span=$(( (N - 2 * E) / K )); [ "$span" -lt 1 ] && span=1
targets=($(for k in $(seq 0 $((K - 1))); do echo $(( E + k * span + (RANDOM * 32768 + RANDOM) % span )); done))
rows=() ok=1 kills=0 resumes=0 seg=0 t_start=$(date +%s)
while :; do
  seg=$((seg + 1))
  from=$(ck_step)
  args=("${GPT[@]}"); [ -s ck ] && { args+=(--resume ck); resumes=$((resumes + 1)); }
  timeout 900 "$B/ddprun" -n 2 "$B/train_gpt" "${args[@]}" >"out.$seg" 2>"err.$seg" &
  job=$!
  killed="" krank="" kstep=""
  if [ "$kills" -lt "$K" ]; then
    want=${targets[$kills]}
    while kill -0 "$job" 2>/dev/null; do
      s=$(last_step "out.$seg"); s=${s:-0}
      if [ "$s" -ge "$want" ] && [ "$(ck_step)" -gt "$from" ]; then
        sleep "0.0$((RANDOM % 10))$((RANDOM % 10))"              # a random moment inside a step
        ddprun_pid=$(pgrep -x -P "$job" ddprun)
        ranks=($(pgrep -P "${ddprun_pid:-0}"))
        [ "${#ranks[@]}" -eq 0 ] && break
        victim=${ranks[$((RANDOM % ${#ranks[@]}))]}
        krank=$(rank_of "$victim"); kstep=$(last_step "out.$seg")
        kill -KILL "$victim" 2>/dev/null && killed=$victim
        break
      fi
      sleep 0.02
    done
  fi
  wait "$job"; rc=$?
  at=$(sed -n 's/^\[rank 0\] resumed from ck at step \([0-9]*\)$/\1/p' "out.$seg"); at=${at:-0}
  if [ -n "$killed" ]; then
    kills=$((kills + 1))
    sleep 0.2
    left=$(ls /dev/shm 2>/dev/null | grep -E "^ddp-(${ranks[0]}|${ranks[1]:-0})-" | wc -l)
    named=$(grep -c "rank $krank (pid $killed) was killed by signal 9\|rank $krank stopped by signal 9" "err.$seg")
    verdict=ok
    { [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$left" -ne 0 ] || [ "$(ck_step)" -lt "$from" ]; } && { verdict=BAD; ok=0; }
    [ "$named" -eq 0 ] && verdict="$verdict(ddprun blamed: $(grep -m1 '^ddprun: rank' "err.$seg" | cut -c9-60))"
    rows+=("$(printf '%4d  %6s  %6s  %8s  %6s  %5s  %6s  %4s  %s' "$seg" "$at" "$want" "${kstep:-?}" "$krank" "$rc" "$(ck_step)" "$left" "$verdict")")
    continue
  fi
  # not killed: it must have run to the end
  if [ "$rc" -eq 0 ] && [ "$(last_step "out.$seg")" = "$N" ]; then
    rows+=("$(printf '%4d  %6s  %6s  %8s  %6s  %5s  %6s  %4s  %s' "$seg" "$at" "-" "-" "-" "$rc" "$(ck_step)" "-" "finished")")
  else
    rows+=("$(printf '%4d  %6s  %6s  %8s  %6s  %5s  %6s  %4s  %s' "$seg" "$at" "-" "-" "-" "$rc" "$(ck_step)" "-" "FAILED: $(tail -n 1 "err.$seg")")")
    ok=0
  fi
  break
done
t_soak=$(( $(date +%s) - t_start ))

# The uninterrupted reference.
ref=("${GPT[@]}"); ref[${#ref[@]}-3]=ref
timeout 900 "$B/ddprun" -n 2 "$B/train_gpt" "${ref[@]}" >out.ref 2>err.ref; rrc=$?
h_soak=$(sed -n 's/^\[rank 0\] params fnv1a //p' "out.$seg"); h_ref=$(sed -n 's/^\[rank 0\] params fnv1a //p' out.ref)
if [ "$rrc" -eq 0 ] && cmp -s ck ref; then cmpres="identical (whole checkpoint, $(stat -c %s ref) bytes; params fnv1a $h_ref)"
else cmpres="DIFFERENT (rc=$rrc; $(cmp ck ref 2>&1 | head -n 1); fnv1a $h_soak vs $h_ref)"; ok=0; fi

echo "soak: 2 ranks, $N steps, checkpoint every $E, seed $SEED | $kills kill(s), $resumes resume(s), $seg segment(s), ${t_soak}s + reference $(( $(date +%s) - t_start - t_soak ))s"
echo " seg  resumed  target  killed@~  rank  ddprun  ckpt@end  shm  verdict"
for r in "${rows[@]}"; do echo "$r"; done
echo "leftover partial checkpoints (rank 0 killed mid-write): $(ls ck.tmp.* 2>/dev/null | wc -l)"
echo "final parameters vs uninterrupted run: $cmpres"
[ "$kills" -lt "$K" ] && { echo "only $kills of $K kills happened (the run ended first)"; }
[ "$ok" = 1 ] && { echo "soak: PASS"; exit 0; } || { echo "soak: FAIL"; exit 1; }
