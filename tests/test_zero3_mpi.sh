#!/usr/bin/env bash
# test_zero3_mpi.sh — sharded parameters (ZeRO-3, DDP_SHARD_PARAMETERS) on the MPI backend:
# build/mpi/test_zero3 (tests/test_zero3.c: the same bits as unsharded with the tape and without,
# accumulation, bf16 parameters, clipping, an unused parameter, skip_nonfinite, prefetch on = off,
# checkpoints across levels; released pages gone, a touch faults; ddp_commit's peak resident
# memory at 2+ ranks: the rank's parts, no whole model) under mpirun -n 1..4 on this
# host, hierarchical and (at 3 ranks) flat; checkpoints across world sizes (PARAMETERS on 2 ->
# NONE on 1, NONE on 1 -> PARAMETERS on 3), ranks gathering different units named on every
# rank. Then hybrid sharding (shard_group 2) on 2 namespace
# hosts x 2 ranks, a shard group a host, against ZeRO-1 in the same groups (TEST_ZERO3_SHARD_GROUP),
# and the GPT trainer there: --shard parameters, flat and hybrid, ends with DDP's parameters (and samples),
# and in DiLoCo replica groups of 2, a group a host (--outer diloco --group-size 2), with the unsharded run's.
# One SKIP line where mpirun or the MPI build is missing, and in sanitizer builds (Open MPI under
# ASan/TSan takes minutes a job); the hybrid part SKIPs alone without namespaces.
# Usage: tests/test_zero3_mpi.sh [BUILD_DIR]
set -u
B=${1:-build}
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
mpi_begin zero3_mpi "$B" "$B/mpi/test_zero3"
fails=0
# lines NAME LOG RC: the log's PASS/FAIL/SKIP lines with NAME in front; a failure without one is named
lines() {
    local name=$1 log=$2 rc=$3
    grep -aE "^(\[rank [0-9]+\] )?(PASS|FAIL|SKIP) " "$log" | sed -E "s/^(\[rank [0-9]+\] )?(PASS|FAIL|SKIP) /\2 mpi_${name}_/" | sort -u
    if grep -aqE "^(\[rank [0-9]+\] )?FAIL " "$log"; then fails=$((fails + 1))
    elif [ "$rc" -ne 0 ]; then echo "FAIL zero3_mpi_${name}_exit: status $rc: $(tail -n 4 "$log" | tr '\n' ' ')"; fails=$((fails + 1)); fi
}
log=$(mktemp)
for n in 1 2 3 4; do
    mpi_local "$n" 300 "$B/mpi/test_zero3" >"$log" 2>&1
    lines "n$n" "$log" $?
done
DDP_MPI_FLAT=1 mpi_local 3 300 "$B/mpi/test_zero3" >"$log" 2>&1
lines flat_n3 "$log" $?
dir=$(mktemp -d)
{ mpi_local 2 120 "$B/mpi/test_zero3" save "$dir" parameters && mpi_local 1 120 "$B/mpi/test_zero3" load "$dir" none &&
  mpi_local 1 120 "$B/mpi/test_zero3" save "$dir" none && mpi_local 3 120 "$B/mpi/test_zero3" load "$dir" parameters; } >"$log" 2>&1
lines ckpt_worlds "$log" $?
rm -rf "$dir"
# ranks that gather different units: named on every rank (the gathers' signature), no hang; the
# group is failed then, so MPI is not finalized and mpirun's status is not 0: the lines decide
mpi_local 2 120 "$B/mpi/test_zero3" mismatch >"$log" 2>&1
if [ "$(grep -acE "^(\[rank [0-9]+\] )?PASS zero3_mpi_gather_of_other_units_named_rank[01]$" "$log")" = 2 ]; then
    echo "PASS mpi_zero3_gather_of_other_units_named_on_every_rank"
else
    echo "FAIL mpi_zero3_gather_of_other_units_named_on_every_rank: $(grep -aE "(PASS|FAIL) " "$log" | tr '\n' ' ') $(tail -n 3 "$log" | tr '\n' ' ')"
    fails=$((fails + 1))
fi
rm -f "$log"
# hybrid: a shard group a host (the MPI backend's hybrid needs that), 2 hosts x 2 ranks; in a
# subshell (hosts_begin exits it with a SKIP line where namespaces are missing, and takes the hosts down)
(
    fails=0
    hosts_begin zero3_mpi_hybrid z3m 2
    hosts_mpirun h1:2,h2:2 400 "$(free_port)" --mca btl tcp,self --mca btl_tcp_if_include eth0 -x TEST_ZERO3_SHARD_GROUP=2 \
        "$PWD/$B/mpi/test_zero3" >"$tmp/hybrid.log" 2>&1
    lines hybrid_2hosts_x2 "$tmp/hybrid.log" $?
    # the GPT trainer on the MPI backend (2 hosts): --shard parameters, flat and hybrid, ends with DDP's parameters
    if [ -x "$B/mpi/train_gpt" ]; then   # the text: ddp.h (always there; fortunes.txt is made only by the main job)
        args=(--data "$PWD/ddp.h" --layers 2 --heads 2 --dim 64 --seq 32 --batch 2 --steps 8 --warmup 2 --eval-every 0 --units --sample 40)
        want=
        for level in "none" "parameters" "parameters --shard-group 2"; do
            # shellcheck disable=SC2086
            hosts_mpirun h1:2,h2:2 200 "$(free_port)" --mca btl tcp,self --mca btl_tcp_if_include eth0 -x OPENBLAS_NUM_THREADS=1 \
                "$PWD/$B/mpi/train_gpt" "${args[@]}" --shard $level >"$tmp/gpt.log" 2>&1
            rc=$?
            got=$(sed -n 's/.*params fnv1a //p' "$tmp/gpt.log" | head -n 1)
            [ -z "$want" ] && want=$got
            name=zero3_mpi_gpt_$(echo "$level" | tr -d '-' | tr ' ' '_')
            if [ $rc -eq 0 ] && [ -n "$got" ] && [ "$got" = "$want" ]; then echo "PASS ${name}_equals_ddp"
            else echo "FAIL ${name}_equals_ddp: status $rc, params $got, DDP's $want: $(tail -n 3 "$tmp/gpt.log" | tr '\n' ' ')"; fails=$((fails + 1)); fi
        done
        # DiLoCo replica groups of 2, a group a host (its buckets through the host's shared memory,
        # its gathers on the group's communicator): --shard parameters ends with the unsharded run's bits
        want=
        for level in "none" "parameters"; do
            # shellcheck disable=SC2086
            hosts_mpirun h1:2,h2:2 200 "$(free_port)" --mca btl tcp,self --mca btl_tcp_if_include eth0 -x OPENBLAS_NUM_THREADS=1 \
                "$PWD/$B/mpi/train_gpt" "${args[@]}" --outer diloco --inner-steps 3 --group-size 2 --shard $level >"$tmp/gpt.log" 2>&1
            rc=$?
            got=$(sed -n 's/.*params fnv1a //p' "$tmp/gpt.log" | head -n 1)
            [ -z "$want" ] && want=$got
            if [ $rc -eq 0 ] && [ -n "$got" ] && [ "$got" = "$want" ]; then echo "PASS zero3_mpi_gpt_outer_groups_a_host_${level}_equals_unsharded"
            else echo "FAIL zero3_mpi_gpt_outer_groups_a_host_${level}_equals_unsharded: status $rc, params $got, unsharded $want: $(tail -n 3 "$tmp/gpt.log" | tr '\n' ' ')"; fails=$((fails + 1)); fi
        done
    else echo "SKIP zero3_mpi_gpt: no $B/mpi/train_gpt (make)"; fi
    [ -n "${KEEP_LOGS:-}" ] && cp "$tmp"/*.log "$KEEP_LOGS"/
    exit $((fails > 0))
) || fails=$((fails + 1))
exit $((fails > 0))
