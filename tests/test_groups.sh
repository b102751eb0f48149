#!/usr/bin/env bash
# test_groups.sh — replica groups of several ranks (tests/test_groups.c says what each rank
# checks: its group's average only, bit for bit; the groups' replicas part, then meet at the
# outer sync) with process ranks: ddprun -n 4 on the CPU backend, and mpirun -n 4 on the MPI
# backend (build/mpi/test_groups), hierarchical (the host's ranks in one shared-memory group for
# the world's collectives, a communicator per replica group for the buckets) and flat
# (DDP_MPI_FLAT=1); test_groups_shard (ZeRO-1 and ZeRO-3 within the groups) the same ways, and the
# GPT trainer's ZeRO-3 in DiLoCo groups on MPI. The thread-rank run is tests/run.sh's own line. The MPI half prints a SKIP
# line where mpirun or the MPI build is missing, and in sanitizer builds (Open MPI under ASan/TSan
# takes minutes a job). Usage: tests/test_groups.sh [BUILD_DIR]
set -u
B=${1:-build}
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
fails=0
# run NAME CMD...: the command's PASS/FAIL lines are this script's too; a failure without one is named
run() {
    local name=$1 log rc
    shift
    log=$(mktemp)
    "$@" >"$log" 2>&1
    rc=$?
    grep -aE "^(\[rank [0-9]+\] )?(PASS|FAIL) " "$log" | sed -E 's/^\[rank [0-9]+\] //'
    grep -aqE "^(\[rank [0-9]+\] )?FAIL " "$log" && fails=$((fails + 1))
    if [ $rc -ne 0 ] && ! grep -aqE "^(\[rank [0-9]+\] )?FAIL " "$log"; then
        echo "FAIL ${name}_exit: status $rc: $(tail -n 4 "$log" | tr '\n' ' ')"
        fails=$((fails + 1))
    fi
    rm -f "$log"
}

run groups_ddprun_processes timeout 200 "$B/ddprun" -n 4 "$B/test_groups" env
run groups_shard_ddprun_processes timeout 200 "$B/ddprun" -n 4 "$B/test_groups_shard" env

mpi_begin groups_mpi "$B" "$B/mpi/test_groups"
mpi() { mpi_local 4 200 "$B/mpi/${1:-test_groups}" env; }
DDP_MPI_FLAT=0 run groups_mpi_hierarchical mpi
DDP_MPI_FLAT=1 run groups_mpi_flat mpi
# shard_optimizer within the groups (tests/test_groups_shard.c): sharded = unsharded, bit for bit
if [ -x "$B/mpi/test_groups_shard" ]; then
    DDP_MPI_FLAT=0 run groups_shard_mpi_hierarchical mpi test_groups_shard
    DDP_MPI_FLAT=1 run groups_shard_mpi_flat mpi test_groups_shard
else echo "SKIP groups_shard_mpi: no $B/mpi/test_groups_shard"; fi
# the GPT trainer, ZeRO-3 within DiLoCo groups of 2 on MPI (the gathers on the group's communicator,
# prefetched by the tape): the parameters of the unsharded run with the same units, bit for bit
if [ -x "$B/mpi/train_gpt" ]; then
    tmp=$(mktemp -d)
    head -c 200000 ddp.h >"$tmp/data.txt"   # any text will do
    gargs=(--data "$tmp/data.txt" --layers 2 --heads 2 --dim 64 --seq 32 --batch 2 --steps 12 --warmup 2 --eval-every 0
           --eval-batches 1 --sample 0 --log-every 6 --bucket-mb 0.05 --clip 0.5 --outer diloco --inner-steps 3 --group-size 2)
    gpt() { OPENBLAS_NUM_THREADS=1 mpi_local 4 200 -x OPENBLAS_NUM_THREADS "$B/mpi/train_gpt" "${gargs[@]}" "$@" 2>&1 | sed -n 's/.*params fnv1a //p'; }
    uo=$(DDP_MPI_FLAT=0 gpt --units); po=$(DDP_MPI_FLAT=0 gpt --shard parameters)
    if [ -n "$uo" ] && [ "$uo" = "$po" ]; then echo "PASS groups_mpi_gpt_shard_parameters_diloco_groups_of_2_bitwise_equals_unsharded"
    else echo "FAIL groups_mpi_gpt_shard_parameters_diloco_groups_of_2_bitwise_equals_unsharded: parameters' hash '$uo' unsharded with --units, '$po' with --shard parameters"; fails=$((fails + 1)); fi
    rm -rf "$tmp"
else echo "SKIP groups_mpi_gpt_shard_parameters: no $B/mpi/train_gpt"; fi
exit $((fails > 0))
