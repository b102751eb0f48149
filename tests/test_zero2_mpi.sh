#!/usr/bin/env bash
# test_zero2_mpi.sh — ZeRO-2 (DDP_SHARD_GRADIENTS) on the MPI backend: build/mpi/test_zero2 under
# mpirun -n 3, hierarchical (one host group through shared memory, its leader in MPI) and flat
# (DDP_MPI_FLAT=1): the same bits as unsharded, the gradients outside a rank's parts released
# (private memory: MADV_DONTNEED, not resident afterwards), the views fixed (tests/test_zero2.c).
# One SKIP line where mpirun or the MPI build is missing, and in sanitizer builds (Open MPI under
# ASan/TSan takes minutes a job). Usage: tests/test_zero2_mpi.sh [BUILD_DIR]
set -u
B=${1:-build}
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
mpi_begin zero2_mpi "$B" "$B/mpi/test_zero2"
fails=0
for flat in 0 1; do
    log=$(mktemp)
    DDP_MPI_FLAT=$flat mpi_local 3 250 "$B/mpi/test_zero2" >"$log" 2>&1
    rc=$?
    what=$([ "$flat" = 1 ] && echo flat || echo hierarchical)
    grep -aE "^(\[rank [0-9]+\] )?(PASS|FAIL) " "$log" | sed -E "s/^(\[rank [0-9]+\] )?(PASS|FAIL) /\2 mpi_${what}_/" | sort -u
    if grep -aqE "^(\[rank [0-9]+\] )?FAIL " "$log"; then fails=$((fails + 1))
    elif [ $rc -ne 0 ]; then echo "FAIL zero2_mpi_${what}_exit: status $rc: $(tail -n 4 "$log" | tr '\n' ' ')"; fails=$((fails + 1)); fi
    rm -f "$log"
done
exit $((fails > 0))
