#!/usr/bin/env bash
# test_hybrid.sh — hybrid sharding (ddp_desc.shard_group) on the MPI backend across 2 namespace
# hosts x 2 ranks (tools/hosts.sh), a shard group a host: build/mpi/test_hybrid env says what each
# rank checks (fp32: the unsharded hierarchical run's bits every step; bf16: the same bits on every
# rank, within a derived bound of unsharded; checkpoints saved hybrid, resumed unsharded and
# hybrid). Then the ranks dealt round the hosts (--map-by node), so a shard group spans both:
# refused by name on every rank. One SKIP line, exit 0, where mpirun, the MPI build or the
# namespaces are missing, and in sanitizer builds (Open MPI under ASan/TSan takes minutes a job).
# The thread-rank test is tests/run.sh's own line (build/test_hybrid). Usage: tests/test_hybrid.sh [BUILD_DIR]
set -u
B=${1:-build}
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
mpi_begin hybrid_mpi_hosts "$B" "$B/mpi/test_hybrid"
hosts_begin hybrid_mpi_hosts hy 2
fails=0
# run NAME HOSTS_MPIRUN_ARGS...: the program's PASS/FAIL lines; a failure without one is named
run() {
    local name=$1 rc
    shift
    hosts_mpirun h1:2,h2:2 200 "$(free_port)" --mca btl tcp,self --mca btl_tcp_if_include eth0 "$@" >"$tmp/$name.log" 2>&1
    rc=$?
    grep -aE "^(PASS|FAIL) " "$tmp/$name.log"
    grep -aqE "^FAIL " "$tmp/$name.log" && fails=$((fails + 1))
    if [ $rc -ne 0 ] && ! grep -aqE "^FAIL " "$tmp/$name.log"; then
        echo "FAIL ${name}_exit: status $rc: $(tail -n 4 "$tmp/$name.log" | tr '\n' ' ')"
        fails=$((fails + 1))
    fi
}
run hybrid_mpi_2hosts_x2 "$PWD/$B/mpi/test_hybrid" env
run hybrid_mpi_interleaved --map-by node "$PWD/$B/mpi/test_hybrid" env-refused
[ -n "${KEEP_LOGS:-}" ] && cp "$tmp"/*.log "$KEEP_LOGS"/
exit $((fails > 0))
