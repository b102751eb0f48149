#!/usr/bin/env bash
# test_mpi_hosts.sh — the MPI backend (ddp.h's >>mpi, build/mpi/*: mpicc -DDDP_MPI) with ranks on
# two namespace hosts (tools/hosts.sh), started by mpirun with tools/hosts.sh's agent as its rsh.
# One PASS/FAIL line per check; one SKIP line, exit 0, where mpirun, the MPI builds or the
# namespaces are missing. Usage: tests/test_mpi_hosts.sh [BUILD_DIR]
#   equivalence: 2 hosts x 2 ranks = 1 rank at 4x batch, the same bits on every rank, hierarchical
#                and flat (DDP_MPI_FLAT=1); user collectives against float64; the tiny GPT
#   bf16 parameters and the sharded optimizer: the CPU backend's bits (tests/mpi_parity.c), a
#                checkpoint saved sharded + bf16 on the hosts loaded on the CPU backend
#   the TCP defaults ddp.h sets reach Open MPI (MPI_T), the user's --mca wins, DDP_MPI_TUNE=0
#   ddprun --nnodes 2 with an MPI build: every rank refuses at once, by name (no MPI launcher)
#   a host killed mid-step, a host cut off mid-step (ip link set eth0 down): every surviving rank
#   ends with an error naming the lost host and rank, within the timeout; nothing left running,
#   nothing left in any host's /dev/shm.
# mpirun gets --enable-recovery (a lost daemon does not make it kill the survivors before they
# say why) and --mca btl tcp,self (Open MPI's shared-memory transport leaves its own segments in
# /dev/shm when a host's processes are killed; within a host ddp.h uses its own segment anyway).
set -u
B=${1:-build}
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
M=$B/mpi
fails=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; fails=$((fails + 1)); }
case $B in *asan*|*tsan*) SLOW=3 ;; *) SLOW=1 ;; esac
# Under the sanitizers Open MPI's start-up and TCP progress slow each mpirun to minutes (a full run
# took over 15): the MPI backend is checked in the plain build only, for now.
mpi_begin mpi_hosts "$B" "$M/mpi_steps" "$M/test_equivalence" "$M/test_collectives" "$M/test_gpt"
# Sanitized builds: Open MPI's own allocations live until exit (not ddp.h's leaks).
export LSAN_OPTIONS=${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$PWD/tests/lsan_mpi.supp:print_suppressions=0
hosts_begin mpi_hosts dm 2
TOKEN=$HOSTS_TOKEN
port=29900
# mpirun on h1, ranks on h1 and h2 (HOSTS = h1:2,h2:2 ...); the environment names go with -x.
mpi() {
    local hosts=$1 limit=$2; shift 2
    port=$((port + 1))
    hosts_mpirun "$hosts" "$limit" "$port" --enable-recovery --mca btl tcp,self --mca btl_tcp_if_include eth0 \
        -x DDP_LOG -x DDP_TIMEOUT -x DDP_MPI_FLAT -x MPI_STEPS_LOG -x MPI_STEPS_CVARS -x DDP_MPI_TUNE -x LSAN_OPTIONS "$@"
}
shm_left() { local h; for h in h1 h2; do "$H" exec $h sh -c 'ls /dev/shm' | sed "s/^/$h:/"; done | tr '\n' ' '; }

# 1. The equivalence test on 2 hosts x 2 ranks, hierarchical and flat: its own PASS lines (N ranks
#    vs 1 rank at 4x batch; bit-identical on every rank), and each rank on the host it should be.
for flat in 0 1; do
    mode=hierarchical; [ $flat = 1 ] && mode=flat
    DDP_LOG=info DDP_MPI_FLAT=$flat mpi h1:2,h2:2 $((120 * SLOW)) "$M/test_equivalence" >"$tmp/eq$flat.log" 2>&1
    rc=$?
    why=""
    for c in ranks4_accum1_vs_1rank_batch32 ranks4_accum1_bitwise_identical_across_ranks \
             ranks4_accum2_vs_1rank_batch32 ranks4_accum2_bitwise_identical_across_ranks; do
        grep -q "^PASS equivalence_$c" "$tmp/eq$flat.log" || why="$why; no PASS equivalence_$c"
    done
    for r in 0 1 2 3; do
        h=h1; [ $r -ge 2 ] && h=h2
        f=""; [ $flat = 1 ] && f=", flat"
        grep -q "^ddp rank $r info: rank $r of 4 up (mpi backend$f, host $h," "$tmp/eq$flat.log" || why="$why; rank $r not up on $h ($mode)"
    done
    [ $rc -eq 0 ] || why="$why; exit status $rc"
    [ -z "$why" ] && pass "mpi_2hosts_x2_equivalence_${mode}_bit_identical_on_every_rank" ||
        fail "mpi_2hosts_x2_equivalence_${mode}_bit_identical_on_every_rank" "${why#; }: $(grep -v ' info: ' "$tmp/eq$flat.log" | tail -n 5)"
done

# 1a. Replica groups of 2 ranks (tests/test_groups.c): each rank holds its group's average only, bit
#     for bit, the groups' replicas part and meet at the outer sync, across the link. Ranks placed
#     by host, a group is a host's 2 ranks: its buckets through the host's shared memory; dealt
#     round the hosts (--map-by node: ranks 0 and 2 on h1), a group spans both hosts: through its
#     MPI communicator. The log says which each group took.
if [ -x "$M/test_groups" ]; then
    for place in hosts interleaved; do
        map=(); want="the host's shared memory"; tag=shared_memory
        [ $place = interleaved ] && { map=(--map-by node); want="its MPI communicator"; tag=mpi_communicator; }
        DDP_LOG=info mpi h1:2,h2:2 $((120 * SLOW)) "${map[@]}" "$M/test_groups" env >"$tmp/groups_$place.log" 2>&1
        rc=$?
        n=$(grep -c "^PASS groups_" "$tmp/groups_$place.log")
        why=""
        [ $rc -eq 0 ] || why="$why; status $rc"
        [ "$n" -gt 0 ] || why="$why; no PASS line"
        grep -q "^FAIL " "$tmp/groups_$place.log" && why="$why; $(grep -E '^FAIL ' "$tmp/groups_$place.log" | head -n 3)"
        grep -q "replica group 1 (ranks 2..3): its buckets through $want" "$tmp/groups_$place.log" ||
            why="$why; not through $want: $(grep 'replica group' "$tmp/groups_$place.log" | head -n 2)"
        [ -z "$why" ] && pass "mpi_2hosts_x2_replica_groups_by_${place}_through_${tag} ($n checks)" ||
            fail "mpi_2hosts_x2_replica_groups_by_${place}" "${why#; }: $(grep -v ' info: ' "$tmp/groups_$place.log" | tail -n 3)"
    done
fi

# 1b. bf16 parameters, the sharded optimizer, both, and the other wire dtype (tests/mpi_parity.c) on
#     2 hosts x 2 ranks, hierarchical and flat, against the CPU backend's 4 ranks on this machine
#     (ddprun -n 4), file by file (each rank's loss, grad norm, gradients after ddp_finish and
#     parameters every step; the master, m and v at the end): the configurations with bf16 on the
#     wire in both modes, the fp32 ones flat. Hierarchical fp32 adds the hosts' sums (each in local
#     rank order) in host order, not the CPU backend's rank order: there the check is that sharded
#     gives the bits of unsharded. A checkpoint the hierarchical run saved (sharded, bf16) loads on
#     the CPU backend on 3 ranks: every rank holds the saved master, m, v and step. Once more
#     hierarchical with the ranks dealt round the hosts (mpirun --map-by node): the same bits.
if [ -x "$M/mpi_parity" ] && [ -x "$B/mpi_parity" ]; then
    mkdir -p "$tmp/pcpu"
    "$B/ddprun" -n 4 "$B/mpi_parity" train "$tmp/pcpu" >"$tmp/pcpu.log" 2>&1 || fail mpi_parity_cpu_reference "$(tail -n 3 "$tmp/pcpu.log")"
    # same_files NAME A B CONFIG_A CONFIG_B [SED]: every rank's file of CONFIG_A in A equal to CONFIG_B's in B
    same_files() {
        local name=$1 a=$2 b=$3 ca=$4 cb=$5 filter=${6:-} r why=""
        for r in 0 1 2 3; do
            [ -s "$a/$ca.rank$r" ] && [ -s "$b/$cb.rank$r" ] || { why="$why; rank $r: no output"; continue; }
            cmp -s <(sed "$filter" "$a/$ca.rank$r") <(sed "$filter" "$b/$cb.rank$r") ||
                why="$why; rank $r: $(diff <(sed "$filter" "$a/$ca.rank$r") <(sed "$filter" "$b/$cb.rank$r") | head -n 3 | tr '\n' ' ')"
        done
        [ -z "$why" ] && pass "$name" || fail "$name" "${why#; }"
    }
    # 2: hierarchical with the ranks dealt round the hosts (--map-by node: ranks 0 and 2 on h1), so
    # that no host's ranks are consecutive
    for flat in 0 1 2; do
        mode=hierarchical; [ $flat = 1 ] && mode=flat; [ $flat = 2 ] && mode=hierarchical_interleaved
        mkdir -p "$tmp/pmpi$flat"
        map=(); [ $flat = 2 ] && map=(--map-by node)
        DDP_LOG=info DDP_MPI_FLAT=$((flat == 1)) mpi h1:2,h2:2 $((120 * SLOW)) "${map[@]}" "$M/mpi_parity" train "$tmp/pmpi$flat" >"$tmp/pmpi$flat.log" 2>&1
        rc=$?
        [ $flat = 2 ] && ! grep -q "rank 1 of 4 up (mpi backend, host h2," "$tmp/pmpi$flat.log" &&
            fail mpi_parity_2hosts_x2_interleaved_placement "rank 1 not on h2: $(grep ' up (' "$tmp/pmpi$flat.log" | head -n 4)"
        [ $rc -eq 0 ] && ! grep -q "^FAIL " "$tmp/pmpi$flat.log" ||
            fail "mpi_parity_2hosts_x2_${mode}_runs" "exit $rc: $(grep '^FAIL' "$tmp/pmpi$flat.log" | head -n 3; tail -n 3 "$tmp/pmpi$flat.log")"
        configs="bf16 bf16_shard fp32_bf16wire bf16_fp32wire_shard"
        [ $flat = 1 ] && configs="$configs fp32 fp32_shard"
        for c in $configs; do same_files "mpi_2hosts_x2_${mode}_${c}_bits_equal_cpu" "$tmp/pcpu" "$tmp/pmpi$flat" $c $c; done
    done
    # (sharded, each rank's gradient line covers its own parts only: that column is left out)
    same_files mpi_2hosts_x2_hierarchical_fp32_shard_bits_equal_unsharded "$tmp/pmpi0" "$tmp/pmpi0" fp32 fp32_shard 's/ grads [0-9a-f]*//'
    "$B/ddprun" -n 3 "$B/mpi_parity" load "$tmp/pmpi0/bf16_shard.ck" 1 "$tmp/pload" >"$tmp/pload.log" 2>&1
    s=$(sed -n 's/^final //p' "$tmp/pmpi0/bf16_shard.rank0"); l=$(sed -n 's/^final //p' "$tmp/pload" 2>/dev/null)
    [ -n "$s" ] && [ "$s" = "$l" ] && ! grep -q "FAIL " "$tmp/pload.log" && pass mpi_2hosts_sharded_bf16_checkpoint_loads_on_cpu_3ranks ||
        fail mpi_2hosts_sharded_bf16_checkpoint_loads_on_cpu_3ranks "saved '$s', loaded '$l': $(grep FAIL "$tmp/pload.log" | head -n 2)"
else
    echo "SKIP mpi_parity_2hosts: no $M/mpi_parity or $B/mpi_parity"
fi

# 1c. Stragglers (tests/mpi_parity.c straggler): rank 3 (h2, not its host's leader) sleeps 100 ms
#     before each backward; all 4 ranks name it in ddp_step_stats, the others waited most of it:
#     rank 1 (h1, no leader) learns it from its leader (the relay through h1's segment), fp32
#     buckets through the host groups and a bf16 wire among all ranks; hierarchical and flat.
if [ -x "$M/mpi_parity" ]; then
    for flat in 0 1; do
        mode=hierarchical; [ $flat = 1 ] && mode=flat
        DDP_MPI_FLAT=$flat mpi h1:2,h2:2 $((120 * SLOW)) "$M/mpi_parity" straggler >"$tmp/strag$flat.log" 2>&1
        rc=$?
        n=$(grep -c "^PASS parity_straggler_named_.*_mpi_ranks4" "$tmp/strag$flat.log")
        if [ $rc -eq 0 ] && [ "$n" -eq 8 ]; then pass "mpi_2hosts_x2_${mode}_straggler_named_by_every_rank"; grep "^  (" "$tmp/strag$flat.log"
        else fail "mpi_2hosts_x2_${mode}_straggler_named_by_every_rank" "exit $rc, $n of 8 PASS: $(grep '^FAIL' "$tmp/strag$flat.log" | head -n 4; tail -n 2 "$tmp/strag$flat.log")"; fi
    done
fi

# 2. User collectives across hosts (allreduce, broadcast, barrier; float64 references) and the
#    tiny GPT (vs PyTorch; 4 ranks vs 1 rank, bit-identical across ranks), 2 hosts x 2 ranks.
for p in test_collectives test_gpt; do
    mpi h1:2,h2:2 $((240 * SLOW)) "$M/$p" >"$tmp/$p.log" 2>&1
    rc=$?
    n=$(grep -c "^PASS " "$tmp/$p.log")
    if [ $rc -eq 0 ] && [ "$n" -gt 0 ] && ! grep -q "^FAIL " "$tmp/$p.log"; then pass "mpi_2hosts_x2_${p#test_} ($n checks passed)"
    else fail "mpi_2hosts_x2_${p#test_}" "exit $rc: $(grep '^FAIL' "$tmp/$p.log" | head -n 3; tail -n 3 "$tmp/$p.log")"; fi
done

# 2b. Ranks bound to one CPU each (mpirun --bind-to core, its default for 2 ranks or fewer a host)
#     are warned by name on every rank; the runs above (--bind-to none) are not.
DDP_LOG=warn mpi h1:1,h2:1 $((60 * SLOW)) --bind-to core "$M/mpi_steps" 1 >"$tmp/bound.log" 2>&1
rc=$?
why=""
for r in 0 1; do
    grep -q "^ddp rank $r warning: rank $r is bound to one CPU of [0-9]* .*--bind-to none" "$tmp/bound.log" || why="$why; rank $r not warned"
done
[ $rc -eq 0 ] || why="$why; exit status $rc"
grep -q "is bound to one CPU" "$tmp/eq0.log" "$tmp/test_collectives.log" && why="$why; an unbound run was warned"
if [ "$(nproc)" -lt 2 ]; then echo "SKIP mpi_rank_bound_to_one_cpu_warned: one CPU"
elif [ -z "$why" ]; then pass mpi_rank_bound_to_one_cpu_warned_by_name_on_every_rank
else fail mpi_rank_bound_to_one_cpu_warned_by_name_on_every_rank "${why#; }: $(head -c 400 "$tmp/bound.log")"; fi

# 2c. The TCP settings ddp.h gives Open MPI when it starts MPI itself, as Open MPI took them
#     (read back through MPI_T): set by default, the user's --mca wins, DDP_MPI_TUNE=0 leaves them.
cvar() { sed -n "s/^cvar $1 = //p" "$2" | head -n 1; }
tune_run() { MPI_STEPS_CVARS=1 DDP_MPI_TUNE=${TUNE:-1} mpi h1:1,h2:1 $((60 * SLOW)) "$@" "$M/mpi_steps" 0 >"$tmp/tune.log" 2>&1; }
why=""
tune_run; rc=$?
[ $rc -eq 0 ] || why="$why; default run exit $rc"
[ "$(cvar btl_tcp_eager_limit "$tmp/tune.log")" = 1048576 ] || why="$why; eager limit '$(cvar btl_tcp_eager_limit "$tmp/tune.log")' not 1048576"
[ "$(cvar btl_tcp_max_send_size "$tmp/tune.log")" = 1048576 ] || why="$why; max send size '$(cvar btl_tcp_max_send_size "$tmp/tune.log")' not 1048576"
[ "$(cvar btl_tcp_links "$tmp/tune.log")" = 2 ] || why="$why; links '$(cvar btl_tcp_links "$tmp/tune.log")' not 2"
tune_run --mca btl_tcp_links 3
[ "$(cvar btl_tcp_links "$tmp/tune.log")" = 3 ] || why="$why; --mca btl_tcp_links 3 gave '$(cvar btl_tcp_links "$tmp/tune.log")'"
[ "$(cvar btl_tcp_eager_limit "$tmp/tune.log")" = 1048576 ] || why="$why; with --mca links the eager limit was not set"
TUNE=0 tune_run
e=$(cvar btl_tcp_eager_limit "$tmp/tune.log")
{ [ -n "$e" ] && [ "$e" != 1048576 ] && [ "$(cvar btl_tcp_links "$tmp/tune.log")" = 1 ]; } ||
    why="$why; DDP_MPI_TUNE=0 gave eager '$e', links '$(cvar btl_tcp_links "$tmp/tune.log")'"
if [ -z "$why" ]; then pass mpi_tcp_defaults_reach_open_mpi_user_mca_wins_tune0_leaves_them
else fail mpi_tcp_defaults_reach_open_mpi_user_mca_wins_tune0_leaves_them "${why#; }: $(head -c 400 "$tmp/tune.log")"; fi

# 3. ddprun --nnodes 2 with an MPI build: no MPI launcher, so every rank says so at once.
port=$((port + 1))
t0=$(now)
for n in 0 1; do
    HOSTS_TIMEOUT=$((30 * SLOW)) "$H" exec "h$((n + 1))" "$B/ddprun" --nnodes 2 --node-rank $n --nproc-per-node 1 \
        --master-addr "$A1" --master-port $port --job-token $TOKEN "$M/mpi_steps" 1 >"$tmp/dr$n.log" 2>&1 &
    eval "p$n=\$!"
done
wait "$p0"; rc0=$?; wait "$p1"; rc1=$?
t=$(secs "$t0" "$(now)")
why=""
for r in 0 1; do
    grep -q "\(rank $r: \|\[rank $r\] \)the MPI backend needs the ranks started as one MPI job .*ddprun --nnodes" "$tmp/dr$r.log" || why="$why; rank $r: $(head -c 300 "$tmp/dr$r.log")"
done
[ $rc0 -ne 0 ] && [ $rc1 -ne 0 ] || why="$why; exit status $rc0 and $rc1"
lt "$t" $((10 * SLOW)) || why="$why; took ${t}s"
[ -z "$why" ] && pass "mpi_build_under_ddprun_nnodes_refused_by_name_on_every_rank (${t}s)" ||
    fail mpi_build_under_ddprun_nnodes_refused_by_name_on_every_rank "${why#; }"

# Lost hosts: mpi_steps trains on 2 hosts x 2 ranks (4 MiB buckets of checked averages), each rank
# logging to its own file; HOW is "kill" or "cut". Sets t_r (seconds from the event to rank r's
# last line), pid_r, and why for processes still alive 3 timeouts later.
lost_host() {
    local how=$1 tmo=$2 r f
    rm -rf "$tmp/$how"; mkdir -p "$tmp/$how"
    DDP_TIMEOUT=$tmo MPI_STEPS_LOG=$tmp/$how mpi h1:2,h2:2 $((3 * tmo + 30 * SLOW)) "$M/mpi_steps" 120 >"$tmp/$how.mpirun.log" 2>&1 &
    local job=$!
    for r in 0 1 2 3; do   # every rank stepping
        until grep -q "step .* ok" "$tmp/$how/rank$r.log" 2>/dev/null; do sleep 0.2; kill -0 $job 2>/dev/null || break 2; done
    done
    t_event=$(now)
    if [ "$how" = kill ]; then "$H" kill h2; else "$H" exec h2 ip link set eth0 down; fi
    local until=$(awk -v t="$t_event" -v d=$((3 * tmo)) 'BEGIN { printf "%.3f", t + d }')
    for r in 0 1 2 3; do
        eval "pid_$r=$(awk '/^pid/ { print $2; exit }' "$tmp/$how/rank$r.log" 2>/dev/null)"
    done
    while lt "$(now)" "$until"; do
        local alive=0
        for r in 0 1 2 3; do eval "p=\$pid_$r"; [ -n "$p" ] && [ -e "/proc/$p" ] && alive=1; done
        [ $alive = 0 ] && break
        sleep 0.2
    done
    left_alive=""
    for r in 0 1 2 3; do
        eval "p=\$pid_$r"; [ -n "$p" ] && [ -e "/proc/$p" ] && left_alive="$left_alive rank $r (pid $p)"
        eval "t_$r=$(secs "$t_event" "$(date -r "$tmp/$how/rank$r.log" +%s.%N)")"
    done
    [ "$how" = cut ] && "$H" exec h2 ip link set eth0 up
    kill "$job" 2>/dev/null; wait "$job" 2>/dev/null   # mpirun itself may wait on the lost daemon
    [ -n "${MPI_HOSTS_KEEP:-}" ] && cp -r "$tmp/$how" "$MPI_HOSTS_KEEP/" 2>/dev/null
}

# 4. A host killed mid-step (every process on h2 SIGKILLed): ranks 0 and 1 name a rank of h2 and
#    the host within seconds (its store connection closes), far inside the timeout.
TMO=$((20 * SLOW))
lost_host kill $TMO
why=""
# (As below, a peer's MPI_Abort may end a rank before it says anything: then the launcher's own
# report must name the lost host; a rank that says anything must name it.)
named=0
for r in 0 1; do
    said=$(grep -v 'step\|^pid\|^\s*$' "$tmp/kill/rank$r.log" | head -c 300)
    if grep -q "rank [23] on host h2 died" "$tmp/kill/rank$r.log"; then named=$((named + 1))
    elif [ -n "$said" ]; then why="$why; rank $r said something else: $said"; fi
    eval "t=\$t_$r"; lt "$t" $((3 * SLOW)) || why="$why; rank $r took ${t}s"
done
[ $named -ge 1 ] || grep -q "h2" "$tmp/kill.mpirun.log" || why="$why; neither rank 0, rank 1 nor mpirun named h2: $(tail -c 300 "$tmp/kill.mpirun.log")"
[ -z "$left_alive" ] || why="$why; still running:$left_alive"
[ -z "$why" ] && pass "mpi_host_h2_killed_mid_step_survivors_name_it (${t_0}s, ${t_1}s; timeout ${TMO}s)" ||
    fail mpi_host_h2_killed_mid_step_survivors_name_it "${why#; }"

# 5. A host cut off mid-step: nothing tells anyone; h1's ranks time out naming the silent ranks and
#    h2, h2's ranks lose rank 0's store and name h1; all within the timeout and MPI_Abort's grace
#    (a rank ended by a peer's MPI_Abort before its own deadline may say nothing: see below).
TMO=$((5 * SLOW))
lost_host cut $TMO
why=""
# The first rank to give up calls MPI_Abort after DDP__MPI_ABORT_GRACE_S, and the launcher then
# ends every rank: a rank whose own deadline came later can be gone before it says anything. So:
# on each host at least one rank names the other, and a rank that says anything says that.
for h in 1 2; do
    if [ $h = 1 ]; then ranks="0 1" want="timed out after $TMO s in .*not heard from: rank 2 on host h2, rank 3 on host h2"
    else ranks="2 3" want="rendezvous store on rank 0 (host h1"; fi
    named=0
    for r in $ranks; do
        said=$(grep -v 'step\|^pid\|^\s*$' "$tmp/cut/rank$r.log" | head -c 300)
        if grep -q "$want" "$tmp/cut/rank$r.log"; then named=$((named + 1))
        elif [ -n "$said" ]; then why="$why; rank $r said something else: $said"; fi
    done
    [ $named -ge 1 ] || why="$why; no rank on h$h named the other host"
done
for r in 0 1 2 3; do eval "t=\$t_$r"; lt "$t" $((TMO + 3 * SLOW)) || why="$why; rank $r took ${t}s"; done
[ -z "$left_alive" ] || why="$why; still running:$left_alive"
[ -z "$why" ] && pass "mpi_host_h2_cut_off_mid_step_each_host_names_the_other (${t_0}s ${t_1}s ${t_2}s ${t_3}s; timeout ${TMO}s)" ||
    fail mpi_host_h2_cut_off_mid_step_each_host_names_the_other "${why#; }"

# 6. Nothing left in any host's /dev/shm (ddp.h's segments, Open MPI's files).
left=$(shm_left)
[ -z "${left// /}" ] && pass mpi_no_shm_left_on_any_host || fail mpi_no_shm_left_on_any_host "$left"
[ $fails -eq 0 ]
