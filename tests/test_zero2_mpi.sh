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
case $B in *asan*|*tsan*) echo "SKIP zero2_mpi: not in sanitizer builds (Open MPI under ASan/TSan takes minutes a job)"; exit 0 ;; esac
command -v mpirun >/dev/null || { echo "SKIP zero2_mpi: no mpirun (apt-get install openmpi-bin libopenmpi-dev)"; exit 0; }
[ -x "$B/mpi/test_zero2" ] || { echo "SKIP zero2_mpi: no $B/mpi/test_zero2 (built by make where mpicc is)"; exit 0; }
fails=0
for flat in 0 1; do
    log=$(mktemp)
    DDP_MPI_FLAT=$flat MASTER_ADDR=127.0.0.1 MASTER_PORT=$(free_port) DDP_JOB_TOKEN=$HOSTS_TOKEN timeout 250 mpirun \
        --allow-run-as-root --oversubscribe --bind-to none --mca btl tcp,self -n 3 -x MASTER_ADDR -x MASTER_PORT \
        -x DDP_JOB_TOKEN -x DDP_MPI_FLAT "$B/mpi/test_zero2" >"$log" 2>&1
    rc=$?
    what=$([ "$flat" = 1 ] && echo flat || echo hierarchical)
    grep -aE "^(\[rank [0-9]+\] )?(PASS|FAIL) " "$log" | sed -E "s/^(\[rank [0-9]+\] )?(PASS|FAIL) /\2 mpi_${what}_/" | sort -u
    if grep -aqE "^(\[rank [0-9]+\] )?FAIL " "$log"; then fails=$((fails + 1))
    elif [ $rc -ne 0 ]; then echo "FAIL zero2_mpi_${what}_exit: status $rc: $(tail -n 4 "$log" | tr '\n' ' ')"; fails=$((fails + 1)); fi
    rm -f "$log"
done
exit $((fails > 0))
