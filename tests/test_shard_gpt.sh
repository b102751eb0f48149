#!/usr/bin/env bash
# test_shard_gpt.sh — the tiny GPT trainer with --shard-optimizer (ZeRO-1) on 2 and 3 ranks ends
# with the same parameters, bit for bit, as without it; with --save it is refused by name.
# Usage: tests/test_shard_gpt.sh [BUILD_DIR]
set -u
B=${1:-build}
cd "$(dirname "$0")/.." || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 200000 ddp.h >"$tmp/data.txt"   # any text will do
args=(--data "$tmp/data.txt" --layers 2 --heads 2 --dim 64 --seq 32 --batch 2 --steps 12 --warmup 2 --eval-every 0
      --eval-batches 1 --sample 0 --log-every 6 --bucket-mb 0.05 --clip 0.5)
for n in 2 3; do
    a=$(OPENBLAS_NUM_THREADS=1 "$B/ddprun" -n "$n" "$B/train_gpt" "${args[@]}" 2>&1 | sed -n 's/.*params fnv1a //p')
    b=$(OPENBLAS_NUM_THREADS=1 "$B/ddprun" -n "$n" "$B/train_gpt" "${args[@]}" --shard-optimizer 2>&1 | sed -n 's/.*params fnv1a //p')
    if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "PASS gpt_shard_optimizer_ranks${n}_bitwise_equals_unsharded"
    else echo "FAIL gpt_shard_optimizer_ranks${n}_bitwise_equals_unsharded: parameters' hash '$a' unsharded, '$b' sharded"; fi
done
msg=$("$B/train_gpt" "${args[@]}" --shard-optimizer --save "$tmp/c.ckpt" 2>&1)
if echo "$msg" | grep -q -- "--shard-optimizer does not go with --save"; then echo "PASS gpt_shard_optimizer_with_save_refused"
else echo "FAIL gpt_shard_optimizer_with_save_refused: $msg"; fi
