#!/usr/bin/env bash
# test_shard_gpt.sh — the tiny GPT trainer with --shard-optimizer (ZeRO-1) and --shard gradients
# (ZeRO-2) on 2 and 3 ranks ends with the same parameters, bit for bit, as without it (and --shard
# parameters, ZeRO-3, on 4 ranks in shard groups and in DiLoCo groups of 2); its checkpoints are those of an unsharded
# run, byte for byte, and resume across sharding ends bit for bit where a straight run does.
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
    # --shard gradients (ZeRO-2): the averaged gradients in parts too, released after each bucket
    c=$(OPENBLAS_NUM_THREADS=1 "$B/ddprun" -n "$n" "$B/train_gpt" "${args[@]}" --shard gradients 2>&1 | sed -n 's/.*params fnv1a //p')
    if [ -n "$a" ] && [ "$a" = "$c" ]; then echo "PASS gpt_shard_gradients_ranks${n}_bitwise_equals_unsharded"
    else echo "FAIL gpt_shard_gradients_ranks${n}_bitwise_equals_unsharded: parameters' hash '$a' unsharded, '$c' with --shard gradients"; fi
done
# ZeRO-2 under hybrid sharding (--shard-group 2 on 4 ranks): each rank releases what lies outside
# its shard group's part; the same bits as unsharded on 4 ranks
a4=$(OPENBLAS_NUM_THREADS=1 "$B/ddprun" -n 4 "$B/train_gpt" "${args[@]}" 2>&1 | sed -n 's/.*params fnv1a //p')
c4=$(OPENBLAS_NUM_THREADS=1 "$B/ddprun" -n 4 "$B/train_gpt" "${args[@]}" --shard gradients --shard-group 2 2>&1 | sed -n 's/.*params fnv1a //p')
if [ -n "$a4" ] && [ "$a4" = "$c4" ]; then echo "PASS gpt_shard_gradients_hybrid_groups_of_2_bitwise_equals_unsharded"
else echo "FAIL gpt_shard_gradients_hybrid_groups_of_2_bitwise_equals_unsharded: parameters' hash '$a4' unsharded, '$c4' with --shard gradients --shard-group 2"; fi
# ZeRO-3 (--shard parameters) within shard groups of 2 on 4 ranks (hybrid: each unit gathered from
# the group's parts) and within DiLoCo replica groups of 2 (the outer step gathers the group's
# parts of the parameters): the same bits as unsharded runs that declare the same units (--units)
u4=$(OPENBLAS_NUM_THREADS=1 "$B/ddprun" -n 4 "$B/train_gpt" "${args[@]}" --units 2>&1 | sed -n 's/.*params fnv1a //p')
p4=$(OPENBLAS_NUM_THREADS=1 "$B/ddprun" -n 4 "$B/train_gpt" "${args[@]}" --shard parameters --shard-group 2 2>&1 | sed -n 's/.*params fnv1a //p')
if [ -n "$u4" ] && [ "$u4" = "$p4" ]; then echo "PASS gpt_shard_parameters_hybrid_groups_of_2_bitwise_equals_unsharded"
else echo "FAIL gpt_shard_parameters_hybrid_groups_of_2_bitwise_equals_unsharded: parameters' hash '$u4' unsharded with --units, '$p4' with --shard parameters --shard-group 2"; fi
uo=$(OPENBLAS_NUM_THREADS=1 "$B/ddprun" -n 4 "$B/train_gpt" "${args[@]}" --units --outer diloco --inner-steps 3 --group-size 2 2>&1 | sed -n 's/.*params fnv1a //p')
po=$(OPENBLAS_NUM_THREADS=1 "$B/ddprun" -n 4 "$B/train_gpt" "${args[@]}" --shard parameters --outer diloco --inner-steps 3 --group-size 2 2>&1 | sed -n 's/.*params fnv1a //p')
if [ -n "$uo" ] && [ "$uo" = "$po" ]; then echo "PASS gpt_shard_parameters_outer_groups_of_2_bitwise_equals_unsharded"
else echo "FAIL gpt_shard_parameters_outer_groups_of_2_bitwise_equals_unsharded: parameters' hash '$uo' unsharded with --units, '$po' with --shard parameters"; fi
# --shard takes a level by name; anything else is refused before training, naming the flag
bad=$("$B/train_gpt" "${args[@]}" --shard everything 2>&1); rc=$?
case $bad in *"--shard: 'everything' is not one of none, optimizer, gradients, parameters"*) ok=1 ;; *) ok=0 ;; esac
if [ "$rc" -ne 0 ] && [ "$ok" = 1 ]; then echo "PASS gpt_shard_bad_level_refused"
else echo "FAIL gpt_shard_bad_level_refused: status $rc: $(echo "$bad" | tail -n 2)"; fi
# Replica groups (--outer diloco, 2 groups of 2): the state sharded within each group, the same bits.
a=$(OPENBLAS_NUM_THREADS=1 "$B/ddprun" -n 4 "$B/train_gpt" "${args[@]}" --outer diloco --inner-steps 3 --group-size 2 2>&1 | sed -n 's/.*params fnv1a //p')
b=$(OPENBLAS_NUM_THREADS=1 "$B/ddprun" -n 4 "$B/train_gpt" "${args[@]}" --outer diloco --inner-steps 3 --group-size 2 --shard-optimizer 2>&1 | sed -n 's/.*params fnv1a //p')
if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "PASS gpt_shard_optimizer_outer_groups_of_2_bitwise_equals_unsharded"
else echo "FAIL gpt_shard_optimizer_outer_groups_of_2_bitwise_equals_unsharded: parameters' hash '$a' unsharded, '$b' sharded"; fi
# Checkpoints (ddp_save / ddp_load gather and scatter the parts): saved at step 6 sharded and
# unsharded, the same file but for the record of the sharding (the header's flag and shard table,
# and so the checksum); resumed either way, the same end as a straight run.
OPENBLAS_NUM_THREADS=1 "$B/ddprun" -n 2 "$B/train_gpt" "${args[@]}" --shard-optimizer --save "$tmp/s.ckpt" --stop-at 6 >/dev/null 2>&1
OPENBLAS_NUM_THREADS=1 "$B/ddprun" -n 2 "$B/train_gpt" "${args[@]}" --save "$tmp/u.ckpt" --stop-at 6 >/dev/null 2>&1
same=$(python3 - "$tmp/s.ckpt" "$tmp/u.ckpt" 2>&1 <<'PY'
import sys
def parts(path):   # ddp.h's format (>>checkpoint): all but the sharding record and the checksum
    b = open(path, "rb").read()
    le = lambda at, n: int.from_bytes(b[at:at + n], "little")
    shards = le(48, 4)
    table = [le(56 + 8 * i, 8) for i in range(shards)]
    return b[:16] + b[20:48] + b[56 + 8 * shards:-8], le(16, 4), table
s, u = parts(sys.argv[1]), parts(sys.argv[2])
print("same" if s[0] == u[0] and s[1] == 1 and u[1] == 0 and u[2] == [0] and s[2][0] == 0 and 0 < s[2][1] else
      "differ: sharded %s %s, unsharded %s %s, rest %s" % (s[1], s[2], u[1], u[2], "equal" if s[0] == u[0] else "different"))
PY
)
if [ "$same" = same ]; then echo "PASS gpt_shard_optimizer_checkpoint_equals_unsharded_but_its_record"
else echo "FAIL gpt_shard_optimizer_checkpoint_equals_unsharded_but_its_record: ${same:-no checkpoints}"; fi
want=$(OPENBLAS_NUM_THREADS=1 "$B/ddprun" -n 2 "$B/train_gpt" "${args[@]}" 2>&1 | sed -n 's/.*params fnv1a //p')
cp "$tmp/s.ckpt" "$tmp/s2.ckpt"; cp "$tmp/u.ckpt" "$tmp/u2.ckpt"
x=$(OPENBLAS_NUM_THREADS=1 "$B/ddprun" -n 2 "$B/train_gpt" "${args[@]}" --shard-optimizer --resume "$tmp/u2.ckpt" 2>&1 | sed -n 's/.*params fnv1a //p')
y=$(OPENBLAS_NUM_THREADS=1 "$B/ddprun" -n 2 "$B/train_gpt" "${args[@]}" --resume "$tmp/s2.ckpt" 2>&1 | sed -n 's/.*params fnv1a //p')
if [ -n "$want" ] && [ "$x" = "$want" ] && [ "$y" = "$want" ]; then echo "PASS gpt_shard_optimizer_resume_across_sharding_bitwise"
else echo "FAIL gpt_shard_optimizer_resume_across_sharding_bitwise: straight '$want', unsharded checkpoint resumed sharded '$x', sharded resumed unsharded '$y'"; fi
