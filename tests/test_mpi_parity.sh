#!/usr/bin/env bash
# test_mpi_parity.sh — the MPI backend (build/mpi/mpi_parity, mpicc -DDDP_MPI) gives the CPU
# backend's bits (build/mpi_parity under ddprun) on one host, for bf16 parameters, the sharded
# optimizer, both, a bf16 wire under fp32 parameters and a fp32 wire under bf16 parameters,
# uneven inputs (ddp_join) in fp32 and bf16, unsharded, ZeRO-1 and ZeRO-2 (their final state = the unsharded join's)
# (tests/mpi_parity.c says what each rank writes: its loss, the grad norm, its gradients after
# ddp_finish, its parameters, every step; the master, m and v gathered at the end):
#   3 ranks, DDP_MPI_FLAT=1 (every rank in MPI) = ddprun -n 3, file by file;
#   2 ranks hierarchical (one host group of 2 through shared memory, its leader in MPI) = ddprun -n 2;
#   stragglers: the last of 3 ranks slowed, named in every rank's ddp_step_stats (CPU, MPI flat and hierarchical);
#   a checkpoint saved by the MPI run (sharded, bf16) loaded on the CPU backend on 2 ranks
#   sharded and on 1 rank, and one saved by the CPU run loaded by the MPI backend on 2 ranks:
#   every loading rank holds the saved master, m, v and step, the working copies its master rounded.
# Across hosts (2 hosts x 2 ranks, hierarchical and flat): tests/test_mpi_hosts.sh.
# One SKIP line where mpirun or the MPI build is missing, and in sanitizer builds (Open MPI under
# ASan/TSan takes minutes a job: tests/test_mpi_hosts.sh). Usage: tests/test_mpi_parity.sh [BUILD_DIR]
set -u
B=${1:-build}
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
mpi_begin mpi_parity "$B" "$B/mpi/mpi_parity" "$B/mpi_parity" "$B/ddprun"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; fails=$((fails + 1)); }
CONFIGS="fp32 fp32_shard bf16 bf16_shard fp32_bf16wire bf16_fp32wire_shard fp32_join bf16_join fp32_shard_join fp32_zero2_join bf16_shard_join fp32_diloco bf16_streaming"

# mpirun on this host: N ranks, rank 0's store on a free port; the rest of the arguments are the program's.
mpi() { local n=$1; shift; mpi_local "$n" 120 "$@"; }
# run LOG CMD...: the command's PASS/FAIL lines are this script's too
run() {
    local log=$1; shift
    "$@" >"$log" 2>&1
    local rc=$?
    grep -E "^(\[rank [0-9]+\] )?(PASS|FAIL) " "$log" | sed -E 's/^\[rank [0-9]+\] //' | sort -u
    [ $rc -eq 0 ] || fail "$(basename "$log" .log)_exit" "status $rc: $(grep -v '^\(\[rank [0-9]*\] \)\?PASS' "$log" | tail -n 4)"
}
# same WHAT DIR_A DIR_B RANKS: each configuration's files equal, rank by rank
same() {
    local what=$1 a=$2 b=$3 n=$4 c r why
    for c in $CONFIGS; do
        why=""
        for r in $(seq 0 $((n - 1))); do
            [ -s "$a/$c.rank$r" ] || { why="$why; no $a/$c.rank$r"; continue; }
            cmp -s "$a/$c.rank$r" "$b/$c.rank$r" || why="$why; rank $r: $(diff "$a/$c.rank$r" "$b/$c.rank$r" 2>&1 | head -n 3 | tr '\n' ' ')"
        done
        [ -z "$why" ] && pass "${what}_${c}_bits_equal_cpu" || fail "${what}_${c}_bits_equal_cpu" "${why#; }"
    done
}

mkdir -p "$tmp/cpu3" "$tmp/mpi3" "$tmp/cpu2" "$tmp/mpi2"
run "$tmp/cpu3.log" "$B/ddprun" -n 3 "$B/mpi_parity" train "$tmp/cpu3"
DDP_MPI_FLAT=1 run "$tmp/mpi3.log" mpi 3 "$B/mpi/mpi_parity" train "$tmp/mpi3"
same mpi_flat_ranks3 "$tmp/cpu3" "$tmp/mpi3" 3
run "$tmp/cpu2.log" "$B/ddprun" -n 2 "$B/mpi_parity" train "$tmp/cpu2"
DDP_LOG=info run "$tmp/mpi2.log" mpi 2 "$B/mpi/mpi_parity" train "$tmp/mpi2"
grep -q "rank 1 of 2 up (mpi backend, host " "$tmp/mpi2.log" && ! grep -q "up (mpi backend, flat" "$tmp/mpi2.log" ||
    fail mpi_hierarchical_ranks2_up "not the hierarchical MPI backend: $(grep ' up (' "$tmp/mpi2.log" | head -n 2)"
same mpi_hierarchical_ranks2 "$tmp/cpu2" "$tmp/mpi2" 2

# Uneven inputs sharded: after ddp_join the master, m, v (gathered) and step are the unsharded join's
# (fp32: on every backend; bf16 wire: on the CPU backend, where sharded = unsharded bit for bit)
final() { sed -n 's/^final //p' "$1"; }
for t in "cpu3 fp32_shard_join fp32_join" "cpu3 fp32_zero2_join fp32_join" "cpu3 bf16_shard_join bf16_join" \
         "mpi3 fp32_shard_join fp32_join" "mpi3 fp32_zero2_join fp32_join" "cpu2 fp32_zero2_join fp32_join" "mpi2 fp32_zero2_join fp32_join"; do
    set -- $t
    s=$(final "$tmp/$1/$2.rank0"); u=$(final "$tmp/$1/$3.rank0")
    [ -n "$s" ] && [ "$s" = "$u" ] && pass "${1}_${2}_final_state_equals_unsharded" || fail "${1}_${2}_final_state_equals_unsharded" "sharded '$s', unsharded '$u'"
done

# Stragglers (mpi_parity straggler): the last rank sleeps before each backward; every rank names it
# in ddp_step_stats, on the CPU backend and on MPI flat and hierarchical (3 ranks, one host group)
run "$tmp/s_cpu.log" "$B/ddprun" -n 3 "$B/mpi_parity" straggler
DDP_MPI_FLAT=1 run "$tmp/s_flat.log" mpi 3 "$B/mpi/mpi_parity" straggler
run "$tmp/s_hier.log" mpi 3 "$B/mpi/mpi_parity" straggler

# Checkpoints across backends and world sizes: the loading ranks hold what the saver's rank 0 gathered.
saved() { sed -n 's/^final //p' "$1/bf16_shard.rank0"; }
loaded() { sed -n 's/^final //p' "$1"; }
run "$tmp/l1.log" "$B/ddprun" -n 2 "$B/mpi_parity" load "$tmp/mpi3/bf16_shard.ck" 1 "$tmp/l1"
run "$tmp/l2.log" "$B/mpi_parity" load "$tmp/mpi3/bf16_shard.ck" 0 "$tmp/l2"
run "$tmp/l3.log" mpi 2 "$B/mpi/mpi_parity" load "$tmp/cpu3/bf16_shard.ck" 1 "$tmp/l3"
for t in "l1 mpi3 mpi_sharded_bf16_3ranks_checkpoint_loads_on_cpu_2ranks_sharded" "l2 mpi3 mpi_sharded_bf16_3ranks_checkpoint_loads_on_1rank" \
         "l3 cpu3 cpu_sharded_bf16_3ranks_checkpoint_loads_on_mpi_2ranks_sharded"; do
    set -- $t
    s=$(saved "$tmp/$2"); l=$(loaded "$tmp/$1" 2>/dev/null)
    [ -n "$s" ] && [ "$s" = "$l" ] && pass "$3" || fail "$3" "saved '$s', loaded '$l'"
done
[ $fails -eq 0 ]
