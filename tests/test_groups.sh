#!/usr/bin/env bash
# test_groups.sh — replica groups of several ranks (tests/test_groups.c says what each rank
# checks: its group's average only, bit for bit; the groups' replicas part, then meet at the
# outer sync) with process ranks: ddprun -n 4 on the CPU backend, and mpirun -n 4 on the MPI
# backend (build/mpi/test_groups), hierarchical (the host's ranks in one shared-memory group for
# the world's collectives, a communicator per replica group for the buckets) and flat
# (DDP_MPI_FLAT=1). The thread-rank run is tests/run.sh's own line. The MPI half prints a SKIP
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
exit $((fails > 0))
