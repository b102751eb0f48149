#!/usr/bin/env bash
# hybrid_hosts.sh — hybrid sharding (ddp_desc.shard_group, issue 27) against flat ZeRO-1 and DDP
# across 2 namespace hosts (tools/hosts.sh) x 2 ranks, the MPI backend (build/mpi/train_gpt under
# mpirun), the link shaped by tbf to --rate. Each configuration trains the tiny GPT twice, --short
# and --long steps (validation only at the end, the same for both), and the per-step figures are
# the differences divided by the extra steps, so set-up (MPI, the initial broadcast, the final
# validation) cancels: the step time, and the bytes h1's eth0 sent and received (every byte
# between the hosts crosses it: the slow link). Configurations (the environment picks them, so
# the trainer needs no flag): ddp; zero1 (DDP_SHARD=optimizer: the state split over all 4 ranks);
# hybrid (DDP_SHARD=optimizer DDP_SHARD_GROUP=2: split within each host, replicated across).
#   bench/hybrid_hosts.sh [BUILD_DIR] [--rate 1gbit] [--short 10] [--long 40]
# Prints a markdown table; a SKIP line where mpirun, mpicc or the namespaces are missing.
# DDP_HOSTS_PREFIX: hyb + this shell's pid.
set -u
cd "$(dirname "$0")/.." || exit 1
B=build
[ $# -gt 0 ] && [ "${1#-}" = "$1" ] && { B=$1; shift; }
RATE=1gbit
SHORT=10
LONG=40
while [ $# -gt 0 ]; do
    case $1 in
    --rate) RATE=$2; shift 2 ;;
    --short) SHORT=$2; shift 2 ;;
    --long) LONG=$2; shift 2 ;;
    *) echo "usage: $0 [BUILD_DIR] [--rate 1gbit] [--short N] [--long N]" >&2; exit 2 ;;
    esac
done
. tests/lib.sh
bench_mpi_begin hybrid_hosts "$B" "$B/mpi/train_gpt"
hosts_begin "hybrid_hosts bench" hyb 2 --rate "$RATE"
port=32700
# what h1's eth0 received and sent so far (/proc/net/dev is the namespace's own)
link_bytes() { "$H" exec h1 cat /proc/net/dev | awk '{ sub(/^ +/, "") } /^eth0:/ { sub(/^eth0: */, ""); split($0, f, / +/); print f[1] + f[9] }'; }
# run CONFIG STEPS: prints "WALL_S BYTES"
run() {
    local cfg=$1 steps=$2 xs=() b0 b1 wall log=$tmp/$1_$2.log
    case $cfg in
    zero1) xs=(-x DDP_SHARD=optimizer) ;;
    hybrid) xs=(-x DDP_SHARD=optimizer -x DDP_SHARD_GROUP=2) ;;
    esac
    port=$((port + 1))
    b0=$(link_bytes)
    hosts_mpirun h1:2,h2:2 900 "$port" --mca btl tcp,self --mca btl_tcp_if_include eth0 \
        -x OPENBLAS_NUM_THREADS=1 "${xs[@]}" "$B/mpi/train_gpt" --data "$DATA" --steps "$steps" --batch 8 --seq 64 \
        --eval-every 0 --eval-batches 4 --sample 0 --log-every 1000 >"$log" 2>&1 ||
        { echo "train_gpt ($cfg, $steps steps) failed: $(tail -n 5 "$log")" >&2; exit 1; }
    b1=$(link_bytes)
    wall=$(sed -n 's/.*done: step [0-9]* | val loss [0-9.]* | [0-9.]* s training | \([0-9.]*\) s without the validations.*/\1/p' "$log" | head -n 1)
    echo "${wall:-nan} $((b1 - b0))"
}
params=""
echo "| run | state split over | step (ms) | bytes on the slow link a step (h1's eth0, both ways) |"
echo "|---|---|---|---|"
for cfg in ddp zero1 hybrid; do
    read -r ws bs < <(run "$cfg" "$SHORT")
    read -r wl bl < <(run "$cfg" "$LONG")
    [ -z "$params" ] && params=$(sed -n 's/.*(\([0-9,]* parameters\).*/\1/p; s/.* \([0-9]*\) parameters.*/\1/p' "$tmp/${cfg}_$LONG.log" | head -n 1)
    split="-"; [ "$cfg" = zero1 ] && split="4 ranks"; [ "$cfg" = hybrid ] && split="each host's 2 ranks"
    awk -v c="$cfg" -v s="$split" -v ws="$ws" -v wl="$wl" -v bs="$bs" -v bl="$bl" -v n=$((LONG - SHORT)) \
        'BEGIN { printf "| %s | %s | %.1f | %.0f |\n", c, s, 1000 * (wl - ws) / n, (bl - bs) / n }'
done
echo
echo "tiny GPT ${params:-(size: see the log)}, batch 8 x seq 64 a rank, 2 hosts x 2 ranks, link $RATE (tbf), MPI backend (hierarchical)," \
     "steps $LONG minus $SHORT; $(nproc) CPUs, load before: $(cut -d' ' -f1-3 /proc/loadavg); command: bench/hybrid_hosts.sh --rate $RATE --short $SHORT --long $LONG"
