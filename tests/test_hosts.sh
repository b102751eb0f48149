#!/usr/bin/env bash
# test_hosts.sh — ranks on several "hosts" of this machine (tools/hosts.sh: a network, mount and
# UTS namespace each, their own /dev/shm, linked by a bridge). One PASS/FAIL line per check; one
# SKIP line, exit 0, where the machine does not allow the namespaces (not root, a container).
# Usage: tests/test_hosts.sh [BUILD_DIR]
#
# What runs across hosts today is the process group's set-up: ddprun's and mpirun's multi-node
# launch, rank 0's store on MASTER_ADDR, and the NCCL backend's rendezvous and ncclUniqueId
# exchange (tests/fakegpu, or the real NCCL without a GPU: set-up fails by name). A training step
# across hosts needs a data plane between them (the MPI backend, later); the CPU backend must
# refuse such a job at once. So "a host killed" and "a host cut off" happen in the NCCL set-up.
set -u
B=${1:-build}
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
fails=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; fails=$((fails + 1)); }
TOKEN=$HOSTS_TOKEN
# Sanitized builds start and fail slower: their time limits get slack (the property is the same).
case $B in *asan*|*tsan*) SLOW=3 ;; *) SLOW=1 ;; esac
hosts_begin hosts dt 3   # a set of hosts of our own: parallel runs never meet
port=29700
next_port() { port=$((port + 1)); }

# ddp-* entries in a host's /dev/shm (the CPU backend's segments).
shm_of() { "$H" exec "$1" sh -c 'ls /dev/shm | grep "^ddp-" || true'; }

# 1. Each host has its own /dev/shm: a file made in h1's is invisible on h2 and outside the hosts;
#    a CPU-backend job on h1 keeps its segments there, and nothing of it is left once it ends.
"$H" exec h1 sh -c 'echo x > /dev/shm/hosts-probe'
if "$H" exec h2 test -e /dev/shm/hosts-probe || [ -e /dev/shm/hosts-probe ]; then
    fail hosts_have_their_own_dev_shm "a file made in h1's /dev/shm is visible on h2 or outside"
else pass hosts_have_their_own_dev_shm; fi
"$H" exec h1 rm -f /dev/shm/hosts-probe
# The CPU backend unlinks its segments once every rank has mapped them, so they are found in the
# ranks' mappings (/proc/PID/maps: "MAJ:MIN ... /dev/shm/ddp-... (deleted)"): their filesystem must
# be h1's own /dev/shm, not h2's nor the machine's.
"$H" exec h1 "$B/ddprun" -n 2 "$B/test_fault" 1000000 >"$tmp/job.log" 2>&1 &
job=$!
maps=""
for _ in $(seq 100); do
    for p in $(ip netns pids "$DDP_HOSTS_PREFIX-h1"); do
        m=$(grep ' /dev/shm/ddp-' "/proc/$p/maps" 2>/dev/null | awk '{print $4, $6}' | sort -u)
        [ -n "$m" ] && maps="$maps$m"$'\n'
    done
    # TERM in steady training, not while rank 0 still holds a segment it has not unlinked yet (a
    # process killed there leaves it for the next job's sweep: that window is not what is tested)
    [ -n "$maps" ] && grep -q '\] step 3$' "$tmp/job.log" && break
    maps=""
    sleep 0.1
done
kill -TERM "$job"; wait "$job" 2>/dev/null
devof() { "$H" exec "$1" python3 -c 'import os; d = os.stat("/dev/shm").st_dev; print("%02x:%02x" % (os.major(d), os.minor(d)))'; }
d1=$(devof h1); d2=$(devof h2)
droot=$(python3 -c 'import os; d = os.stat("/dev/shm").st_dev; print("%02x:%02x" % (os.major(d), os.minor(d)))')
segdevs=$(echo "$maps" | awk 'NF {print $1}' | sort -u | tr '\n' ' ')
if [ -n "$maps" ] && [ "$segdevs" = "$d1 " ] && [ "$d1" != "$d2" ] && [ "$d1" != "$droot" ]; then
    pass "cpu_segment_of_h1_lives_in_h1s_own_dev_shm ($(echo "$maps" | awk 'NF {print $2}' | sort -u | wc -l) segment(s) on device $d1; h2 $d2, outside $droot)"
else
    fail cpu_segment_of_h1_lives_in_h1s_own_dev_shm "segments: '$maps' devices '$segdevs'; h1 $d1, h2 $d2, outside $droot: $(tail -n 2 "$tmp/job.log")"
fi
left=$(shm_of h1)
[ -z "$left" ] && pass cpu_job_stopped_leaves_no_shm_on_h1 || fail cpu_job_stopped_leaves_no_shm_on_h1 "$left"

# 2. The CPU backend across hosts (ddprun on two hosts, 2 ranks each): every rank fails at once
#    with the error that names its host and says what works.
next_port
t0=$(now)
for n in 0 1; do
    "$H" exec "h$((n + 1))" "$B/ddprun" --nnodes 2 --node-rank $n --master-addr "$A1" --master-port $port \
        --job-token $TOKEN -n 2 "$B/minimal" >"$tmp/cpu$n.log" 2>&1 &
    eval "p$n=\$!"
done
# shellcheck disable=SC2154 # set by eval
wait "$p0"; rc0=$?; wait "$p1"; rc1=$?
t=$(secs "$t0" "$(now)")
why=""
for r in 0 1 2 3; do
    host=h$((r / 2 + 1))
    grep -q "^\[rank $r\] the CPU backend needs every rank on one host, but WORLD_SIZE=4 and LOCAL_WORLD_SIZE=2: the job spans hosts (this rank on '$host', rank 0's store on MASTER_ADDR $A1). What works: all 4 ranks on one host" \
        "$tmp/cpu$((r / 2)).log" || why="$why; rank $r did not name its host $host"
done
[ $rc0 -ne 0 ] && [ $rc1 -ne 0 ] || why="$why; exit status $rc0 and $rc1"
lt "$t" $((3 * SLOW)) || why="$why; took ${t}s"
[ -z "$why" ] && pass "cpu_backend_across_hosts_ddprun_fails_at_once_on_every_rank (${t}s)" ||
    fail cpu_backend_across_hosts_ddprun_fails_at_once_on_every_rank "${why#; }: $(head -c 600 "$tmp/cpu0.log")"

# 2b. The same through mpirun, its remote ranks started by tools/hosts.sh's agent.
if command -v mpirun >/dev/null; then
    next_port
    t0=$(now)
    hosts_mpirun h1:1,h2:2 60 "$port" "$B/minimal" >"$tmp/mpi.log" 2>&1
    rc=$?
    t=$(secs "$t0" "$(now)")
    why=""
    for r in 0 1 2; do
        host=h1; [ $r -gt 0 ] && host=h2
        grep -q "^rank $r: the CPU backend needs every rank on one host, but WORLD_SIZE=3 and LOCAL_WORLD_SIZE=[12]: the job spans hosts (this rank on '$host'" \
            "$tmp/mpi.log" || why="$why; rank $r did not name its host $host"
    done
    [ $rc -ne 0 ] || why="$why; mpirun exited 0"
    lt "$t" $((10 * SLOW)) || why="$why; took ${t}s"
    [ -z "$why" ] && pass "cpu_backend_across_hosts_mpirun_fails_at_once_on_every_rank (${t}s)" ||
        fail cpu_backend_across_hosts_mpirun_fails_at_once_on_every_rank "${why#; }: $(head -c 600 "$tmp/mpi.log")"
else
    echo "SKIP cpu_backend_across_hosts_mpirun: no mpirun (Open MPI)"
fi

# 3. Rank 0's store on h1 refuses a stranger from h2 that does not know the job token (both sides
#    say so by name), and the job goes on: the real rank 1 joins and it trains to the end.
next_port
E="WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=$A1 MASTER_PORT=$port DDP_TIMEOUT=$((30 * SLOW))"
env $E RANK=0 LOCAL_RANK=0 DDP_JOB_TOKEN=$TOKEN "$H" exec h1 "$B/minimal" >"$tmp/st0.log" 2>&1 &
r0=$!
sleep 0.5
t0=$(now)
env -u DDP_JOB_TOKEN $E RANK=1 LOCAL_RANK=1 "$H" exec h2 "$B/minimal" >"$tmp/st1.log" 2>&1
rcs=$?
t=$(secs "$t0" "$(now)")
env $E RANK=1 LOCAL_RANK=1 DDP_JOB_TOKEN=$TOKEN "$H" exec h1 "$B/minimal" >"$tmp/st2.log" 2>&1
rc1=$?
wait "$r0"; rc0=$?
why=""
[ $rcs -ne 0 ] || why="stranger exited 0"
grep -q "^rank 1: the process on $A1:$port (MASTER_ADDR:MASTER_PORT) could not prove that it knows this rank's job token" "$tmp/st1.log" ||
    why="$why; stranger's error: $(head -c 300 "$tmp/st1.log")"
grep -q "rendezvous store: a client announcing rank 1 has another job token" "$tmp/st0.log" ||
    why="$why; rank 0 did not log the refusal: $(head -c 300 "$tmp/st0.log")"
lt "$t" $((5 * SLOW)) || why="$why; the stranger took ${t}s to be refused"
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || why="$why; the real job failed ($rc0, $rc1): $(tail -n 2 "$tmp/st0.log" "$tmp/st2.log")"
[ -z "$why" ] && pass "store_on_h1_refuses_stranger_from_h2_and_the_job_goes_on (refused in ${t}s)" ||
    fail store_on_h1_refuses_stranger_from_h2_and_the_job_goes_on "${why#; }"

# 4. The NCCL backend's multi-node set-up on the fake GPU, one rank per host through ddprun: the
#    rendezvous crosses hosts, rank 1 on h2 sets its communicator up with the ncclUniqueId rank 0
#    made on h1 (it names rank 0's process); the fake cannot join processes, so the set-up ends
#    at its deadline with ddp.h's error naming the unfinished ranks, on both, without a hang.
next_port
TMO=$((4 * SLOW))
t0=$(now)
for n in 0 1; do
    HOSTS_TIMEOUT=$TMO "$H" exec "h$((n + 1))" "$B/ddprun" --nnodes 2 --node-rank $n --master-addr "$A1" \
        --master-port $port --job-token $TOKEN "$B/hosts_nccl_fake" >"$tmp/nf$n.log" 2>&1 &
    eval "p$n=\$!"
done
wait "$p0"; wait "$p1"
t=$(secs "$t0" "$(now)")
made=$(sed -n "s/^\[rank 0\] hosts_nccl: rank 0: made id '\([^']*\)'.*/\1/p" "$tmp/nf0.log")
got=$(sed -n "s/^\[rank 1\] hosts_nccl: rank 1: made id '', set up with id '\([^']*\)'.*/\1/p" "$tmp/nf1.log")
why=""
case $made in "fakenccl pid "*) ;; *) why="rank 0 made no id: $(head -c 300 "$tmp/nf0.log")" ;; esac
[ -n "$made" ] && [ "$got" = "$made" ] || why="$why; rank 1 on h2 set up with '$got', rank 0 on h1 made '$made'"
[ -z "$why" ] && pass "nccl_unique_id_from_rank0_on_h1_reaches_rank1_on_h2 ($made)" ||
    fail nccl_unique_id_from_rank0_on_h1_reaches_rank1_on_h2 "${why#; }"
why=""
for r in 0 1; do
    grep -q "^\[rank $r\] hosts_nccl: rank $r: ddp_init failed after [0-9.]* s: .*rank $r: .*timed out after $TMO s in NCCL's set-up; rank(s) never started it: none; rank(s) that did not finish it: 0, 1" \
        "$tmp/nf$r.log" || why="$why; rank $r: $(grep -h 'ddp_init' "$tmp/nf$r.log" | head -c 300)"
done
lt "$t" $((TMO + 4 * SLOW)) || why="$why; took ${t}s with timeout ${TMO}s"
[ -z "$why" ] && pass "nccl_setup_across_hosts_fake_gpu_ends_by_name_at_its_deadline (${t}s, timeout ${TMO}s)" ||
    fail nccl_setup_across_hosts_fake_gpu_ends_by_name_at_its_deadline "${why#; }"

# 5. The nvcc-built NCCL rank (real CUDA runtime and NCCL) across hosts: without a GPU, every rank
#    gets past the rendezvous on h1's store and fails by name; with GPUs, a real allreduce.
if [ -x "$B/gpu/hosts_nccl" ]; then
    next_port
    t0=$(now)
    for n in 0 1; do
        HOSTS_TIMEOUT=$((30 * SLOW)) "$H" exec "h$((n + 1))" "$B/ddprun" --nnodes 2 --node-rank $n --master-addr "$A1" \
            --master-port $port --job-token $TOKEN "$B/gpu/hosts_nccl" >"$tmp/nr$n.log" 2>&1 &
        eval "p$n=\$!"
    done
    wait "$p0"; rc0=$?; wait "$p1"; rc1=$?
    t=$(secs "$t0" "$(now)")
    if "$B/gpu/gpu_count" >/dev/null 2>&1 && [ "$("$B/gpu/gpu_count" 2>/dev/null)" -gt 0 ] 2>/dev/null; then
        if [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && grep -q "allreduce success, 0 of 1024 values wrong" "$tmp/nr1.log"; then
            pass "nccl_real_across_hosts_allreduce (${t}s)"
        else fail nccl_real_across_hosts_allreduce "exit $rc0/$rc1: $(tail -n 3 "$tmp/nr0.log" "$tmp/nr1.log")"; fi
    else
        why=""
        for r in 0 1; do
            grep -q "^\[rank $r\] hosts_nccl: rank $r: ddp_init failed after [0-9.]* s: .*rank $r: the NCCL backend needs a CUDA device, but cudaGetDeviceCount says" \
                "$tmp/nr$r.log" || why="$why; rank $r: $(head -c 300 "$tmp/nr$r.log")"
        done
        [ $rc0 -ne 0 ] && [ $rc1 -ne 0 ] || why="$why; exit status $rc0 and $rc1"
        lt "$t" 10 || why="$why; took ${t}s"
        [ -z "$why" ] && pass "nccl_real_across_hosts_no_gpu_every_rank_fails_by_name (${t}s)" ||
            fail nccl_real_across_hosts_no_gpu_every_rank_fails_by_name "${why#; }"
    fi
else
    echo "SKIP nccl_real_across_hosts: no $B/gpu/hosts_nccl (built where nvcc is)"
fi

# 6. A host killed in the middle of the set-up (3 hosts, one rank each, fake GPU): the survivors
#    fail within seconds, naming rank 2, long before the timeout.
next_port
for n in 0 1 2; do
    # in a subshell whose stderr is dropped: the shell's "Killed" notice of h3's job goes there
    ( HOSTS_TIMEOUT=$((60 * SLOW)) "$H" exec "h$((n + 1))" "$B/ddprun" --nnodes 3 --node-rank $n --master-addr "$A1" \
        --master-port $port --job-token $TOKEN "$B/hosts_nccl_fake" >"$tmp/k$n.log" 2>&1 & wait $! ) 2>/dev/null &
    eval "p$n=\$!"
done
sleep $((2 * SLOW))
"$H" kill h3
t0=$(now)
wait "$p0"; rc0=$?; t_0=$(secs "$t0" "$(now)")
wait "$p1"; rc1=$?; t_1=$(secs "$t0" "$(now)")
wait "$p2"
why=""
for r in 0 1; do
    grep -q "^\[rank $r\] hosts_nccl: rank $r: ddp_init failed after .*rank $r: .*rank 2 disconnected from the rendezvous store" "$tmp/k$r.log" ||
        why="$why; rank $r: $(grep -h 'ddp_init\|ddprun' "$tmp/k$r.log" | head -c 300)"
done
[ $rc0 -ne 0 ] && [ $rc1 -ne 0 ] || why="$why; exit status $rc0 and $rc1"
lt "$t_1" $((5 * SLOW)) || why="$why; survivors took ${t_0}s and ${t_1}s after the kill"
[ -z "$why" ] && pass "host_h3_killed_mid_setup_survivors_name_rank2 (${t_0}s, ${t_1}s after the kill; timeout $((60 * SLOW))s)" ||
    fail host_h3_killed_mid_setup_survivors_name_rank2 "${why#; }"

# 7. A host cut off in the middle of the set-up (ip link set eth0 down on h3): nothing tells the
#    others it is gone, so the survivors end at the set-up's deadline naming what is unfinished;
#    the cut-off rank fails by name too (its store requests time out: up to twice the timeout).
next_port
TMO=$((5 * SLOW))
t0=$(now)
for n in 0 1 2; do
    HOSTS_TIMEOUT=$TMO "$H" exec "h$((n + 1))" "$B/ddprun" --nnodes 3 --node-rank $n --master-addr "$A1" \
        --master-port $port --job-token $TOKEN "$B/hosts_nccl_fake" >"$tmp/c$n.log" 2>&1 &
    eval "p$n=\$!"
done
sleep 1
"$H" exec h3 ip link set eth0 down
wait "$p0"; rc0=$?; t_0=$(secs "$t0" "$(now)")
wait "$p1"; rc1=$?; t_1=$(secs "$t0" "$(now)")
wait "$p2"; rc2=$?; t_2=$(secs "$t0" "$(now)")
"$H" exec h3 ip link set eth0 up
why=""
for r in 0 1; do
    grep -q "^\[rank $r\] hosts_nccl: rank $r: ddp_init failed after .*rank $r: .*timed out after $TMO s in NCCL's set-up; .*rank(s) that did not finish it: 0, 1, 2" "$tmp/c$r.log" ||
        why="$why; rank $r: $(grep -h 'ddp_init' "$tmp/c$r.log" | head -c 300)"
done
grep -q "^\[rank 2\] hosts_nccl: rank 2: ddp_init failed after .*rank 2: .*rendezvous store on rank 0" "$tmp/c2.log" ||
    why="$why; rank 2: $(grep -h 'ddp_init' "$tmp/c2.log" | head -c 300)"
[ $rc0 -ne 0 ] && [ $rc1 -ne 0 ] && [ $rc2 -ne 0 ] || why="$why; exit status $rc0, $rc1, $rc2"
lt "$t_1" $((TMO + 3 * SLOW)) || why="$why; survivors took ${t_0}s and ${t_1}s (timeout ${TMO}s)"
lt "$t_2" $((2 * TMO + 4 * SLOW)) || why="$why; the cut-off rank took ${t_2}s (timeout ${TMO}s)"
[ -z "$why" ] && pass "host_h3_cut_off_mid_setup_every_rank_fails_by_name (survivors ${t_0}s ${t_1}s, cut-off rank ${t_2}s; timeout ${TMO}s)" ||
    fail host_h3_cut_off_mid_setup_every_rank_fails_by_name "${why#; }"

# 8. MASTER_ADDR a name, and a nameserver that never answers (a UDP socket on h3 that reads nothing;
#    h2's /etc/resolv.conf points there, in a mount namespace of the rank's own). getaddrinfo alone
#    waits 5 s a try, and tries again: the lookup must give up at DDP_TIMEOUT, and say why.
A3=$("$H" addr h3)
printf 'nameserver %s\n' "$A3" >"$tmp/resolv.conf"
"$H" exec h3 /usr/bin/python3 -c 'import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], 53)); time.sleep(120)' "$A3" &
dns=$!
sleep 0.5
t0=$(now)
"$H" exec h2 unshare -m sh -c "mount --bind '$tmp/resolv.conf' /etc/resolv.conf && WORLD_SIZE=2 RANK=1 LOCAL_RANK=1 \
    LOCAL_WORLD_SIZE=2 MASTER_ADDR=rank0.ddp-hosts.test MASTER_PORT=$port DDP_TIMEOUT=1 exec '$B/minimal'" >"$tmp/dns.log" 2>&1
rc=$?; took=$(secs "$t0" "$(now)")
kill "$dns" 2>/dev/null; wait "$dns" 2>/dev/null
why=""
grep -q "^rank 1: cannot resolve MASTER_ADDR 'rank0.ddp-hosts.test': the name service gave no answer within 1 s (timeout_s, DDP_TIMEOUT)" "$tmp/dns.log" ||
    why="$why; $(head -c 300 "$tmp/dns.log")"
[ $rc -ne 0 ] || why="$why; exit status 0"
lt "$took" $((1 + 3 * SLOW)) || why="$why; it took ${took}s at DDP_TIMEOUT=1"
[ -z "$why" ] && pass "silent_nameserver_lookup_gives_up_at_timeout (${took}s)" ||
    fail silent_nameserver_lookup_gives_up_at_timeout "${why#; }"

# 9. Nothing left in any host's /dev/shm, and `down` removes every namespace and mount.
left=""
for h in h1 h2 h3; do s=$(shm_of $h); [ -n "$s" ] && left="$left $h: $s"; done
[ -z "$left" ] && pass no_shm_left_on_any_host || fail no_shm_left_on_any_host "$left"
"$H" down
left=$(ip netns list | grep -E "^$DDP_HOSTS_PREFIX-" | tr '\n' ' '; grep " /run/ddp-hosts/$DDP_HOSTS_PREFIX" /proc/mounts)
[ -z "$left" ] && [ ! -e "/run/ddp-hosts/$DDP_HOSTS_PREFIX" ] && pass hosts_down_leaves_nothing ||
    fail hosts_down_leaves_nothing "$left"
[ $fails -eq 0 ]
