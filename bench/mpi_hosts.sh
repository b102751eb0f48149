#!/usr/bin/env bash
# mpi_hosts.sh — the MPI backend across 2 namespace hosts (tools/hosts.sh), links shaped by tbf.
#
#   bench/mpi_hosts.sh [BUILD_DIR] [--rates "1gbit 10gbit"] [--sizes 1M,25M,256M] [--steps 30] [--no-write]
#
# For each link rate, with 2 hosts x 1 rank started by mpirun (btl tcp, the hosts' eth0,
# --bind-to none):
#   allreduce  build/mpi/bench_allreduce (ddp_allreduce: the MPI backend's inter-host sum, fixed
#              order; again with DDP_MPI_TUNE=0: without ddp.h's Open MPI defaults) against build/mpi_allreduce (Open MPI's MPI_Allreduce, default settings) and
#              torch's gloo (bench/gloo_allreduce.py, one rank per host; a SKIP line without
#              torch); busbw = bytes / time * 2(N-1)/N, next to the link's rate;
#   gpt        build/mpi/train_gpt, the tiny GPT's step with overlap (default buckets) and without
#              (--bucket-mb 1000: one bucket, launched when backward ends), the mean of the last
#              --steps/2 steps' wall time, comm and exposed ms, against the link's bound
#              2(N-1)/N x gradient bytes / bandwidth, and the last bucket's bound (what overlap
#              cannot hide).
# Results replace the section between <!-- mpi-hosts:begin --> and <!-- mpi-hosts:end --> of
# bench/RESULTS.md (unless --no-write). Needs root (namespaces), mpirun, make mpi.
set -u
cd "$(dirname "$0")/.." || exit 1
B=build
[ $# -gt 0 ] && [ "${1#-}" = "$1" ] && { B=$1; shift; }
RATES="1gbit 10gbit"
SIZES=1M,25M,256M
STEPS=30
WRITE=1
CMDLINE="bench/mpi_hosts.sh${*:+ $*}"
while [ $# -gt 0 ]; do
    case $1 in
    --rates) RATES=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --no-write) WRITE=0; shift ;;
    *) echo "usage: $0 [BUILD_DIR] [--rates R] [--sizes S] [--steps N] [--no-write]" >&2; exit 2 ;;
    esac
done
. tests/lib.sh
bench_mpi_begin mpi_hosts "$B" "$B/mpi/bench_allreduce" "$B/mpi/train_gpt"
[ -x "$B/mpi_allreduce" ] && [ "$B/mpi_allreduce" -nt bench/mpi_allreduce.c ] ||
    mpicc -std=c99 -O3 -march=native -o "$B/mpi_allreduce" bench/mpi_allreduce.c || exit 1
hosts_begin "mpi_hosts bench" bm 2
out=$tmp/section.md
port=29950
mpi2() {
    port=$((port + 1))
    hosts_mpirun h1:1,h2:1 600 "$port" --mca btl tcp,self --mca btl_tcp_if_include eth0 "$@"
}
gbps() { case $1 in *gbit) echo "${1%gbit}" ;; *mbit) awk -v m="${1%mbit}" 'BEGIN { print m / 1000 }' ;; esac; }

{
echo "## MPI backend across 2 hosts (namespace hosts, tbf-shaped links)"
echo
echo "\`$CMDLINE\` on $(date -u +%Y-%m-%d), $(getconf _NPROCESSORS_ONLN) CPUs shared by both hosts (one kernel: the"
echo "\"link\" is a veth pair through a bridge, shaped by tbf both ways; no latency is added). 2 hosts x"
echo "1 rank, mpirun with btl tcp and --bind-to none (tests/lib.sh's hosts_mpirun: the hosts share this"
echo "machine's cores). ddp.h: its Open MPI TCP defaults (the manual's BACKENDS, mpi); DDP_MPI_TUNE=0: without"
echo "them; MPI_Allreduce: Open MPI's defaults. busbw = bytes / time x 2(N-1)/N in GB/s; the link's rate in"
echo "GB/s is the ceiling; ddp.h / link bound: its time over 2(N-1)/N x bytes / rate. Load average at the"
echo "start: $(cut -d' ' -f1-3 /proc/loadavg)."
} >"$out"

for rate in $RATES; do
    "$H" down >/dev/null 2>&1
    "$H" up 2 --rate "$rate" >"$tmp/up.log" 2>&1 || { echo "hosts up failed: $(cat "$tmp/up.log")"; exit 1; }
    A1=$("$H" addr h1)
    G=$(gbps "$rate")
    echo "== $rate"
    mpi2 "$B/mpi/bench_allreduce" --sizes "$SIZES" --target-s 1 2>&1 | grep '^allreduce' >"$tmp/ddp.txt"
    mpi2 -x DDP_MPI_TUNE=0 "$B/mpi/bench_allreduce" --sizes "$SIZES" --target-s 1 2>&1 | grep '^allreduce' >"$tmp/ddp0.txt"
    mpi2 "$B/mpi_allreduce" --sizes "$SIZES" --target-s 1 2>&1 | grep '^allreduce' >"$tmp/mpi.txt"
    : >"$tmp/gloo.txt"
    if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
        port=$((port + 1))
        for r in 0 1; do
            RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=$A1 MASTER_PORT=$port GLOO_SOCKET_IFNAME=eth0 \
                timeout 600 "$H" exec "h$((r + 1))" /usr/bin/python3 bench/gloo_allreduce.py --sizes "$SIZES" --target-s 1 \
                >"$tmp/gloo$r.txt" 2>&1 &
        done
        wait
        grep '^allreduce' "$tmp/gloo0.txt" >"$tmp/gloo.txt"
    fi
    cat "$tmp/ddp.txt" "$tmp/ddp0.txt" "$tmp/mpi.txt" "$tmp/gloo.txt"
    {
        echo
        echo "### Link $rate (at most $(awk -v g="$G" 'BEGIN { printf "%.3f", g / 8 }') GB/s of payload)"
        echo
        echo "| size | ddp.h (MPI backend) busbw | ddp.h, DDP_MPI_TUNE=0 | Open MPI MPI_Allreduce busbw | gloo busbw | link | ddp.h / link bound |"
        echo "|---|---|---|---|---|---|---|"
        for bytes in $(sed 's/.*bytes=\([0-9]*\).*/\1/' "$tmp/ddp.txt"); do
            printf "| %s MiB |" "$(awk -v b="$bytes" 'BEGIN { printf "%g", b / 1048576 }')"
            for f in ddp ddp0 mpi gloo; do
                awk -v b="$bytes" '$0 ~ "bytes=" b " " { for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
                    printf " %.3f GB/s (%.1f ms) |", v["busbw"], v["time_us"] / 1000; found = 1 }
                    END { if (!found) printf " not run |" }' "$tmp/$f.txt"
            done
            printf " %s GB/s |" "$(awk -v g="$G" 'BEGIN { printf "%.3f", g / 8 }')"
            awk -v b="$bytes" -v g="$G" '$0 ~ "bytes=" b " " { for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
                printf " %.2fx |\n", v["time_us"] * 1e-6 / (b / (g / 8 * 1e9)); found = 1 } END { if (!found) print " - |" }' "$tmp/ddp.txt"
        done
        if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then echo; echo "gloo: not run (no torch for /usr/bin/python3 on this machine)."; fi
    } >>"$out"
    # The tiny GPT's step, 2 hosts x 1 rank, with and without overlap.
    for mode in overlap one-bucket; do
        extra=""; [ $mode = one-bucket ] && extra="--bucket-mb 1000"
        mpi2 "$B/mpi/train_gpt" --data "$B/fortunes.txt" --steps "$STEPS" --warmup 5 --eval-every 0 --sample 0 \
            --log-every 1 $extra >"$tmp/gpt-$mode.txt" 2>&1
        awk -v s="$STEPS" '/^step .*ms \|/ { n = $2; sub(/\/.*/, "", n); if (n + 0 > s / 2) {
                split($0, a, "|"); ms += a[5] + 0; c++;
                match($0, /comm [0-9.]+/); comm += substr($0, RSTART + 5, RLENGTH - 5);
                match($0, /exposed [0-9.]+/); ex += substr($0, RSTART + 8, RLENGTH - 8) } }
            END { if (c) printf "%.1f %.2f %.2f %d\n", ms / c, comm / c, ex / c, c; else print "- - - 0" }' "$tmp/gpt-$mode.txt" >"$tmp/gpt-$mode.sum"
        echo "gpt $mode: $(cat "$tmp/gpt-$mode.sum") (step ms, comm ms, exposed ms, steps averaged)"
    done
    {
        echo
        read -r o_ms o_comm o_ex o_n <"$tmp/gpt-overlap.sum"
        read -r b_ms b_comm b_ex b_n <"$tmp/gpt-one-bucket.sum"
        awk -v g="$G" -v oms="$o_ms" -v oc="$o_comm" -v oe="$o_ex" -v bms="$b_ms" -v bc="$b_comm" -v be="$b_ex" '
            BEGIN { bytes = 4 * (256 * 128 + 64 * 128 + 4 * (12 * 128 * 128 + 13 * 128) + 2 * 128)
                    bound = bytes / (g / 8 * 1e9) * 1e3; last = (bytes - 1048576) / (g / 8 * 1e9) * 1e3
                    printf "Tiny GPT (4 layers, width 128, %.2f MB of fp32 gradients), 2 hosts x 1 rank, the mean of the last steps:\n\n", bytes / 1e6
                    print "| | step ms | comm ms | exposed ms | link bound for all gradients | bound for the last bucket |"
                    print "|---|---|---|---|---|---|"
                    printf "| overlap (buckets: 1 MiB first, then the rest) | %s | %s | %s | %.2f ms | %.2f ms |\n", oms, oc, oe, bound, last
                    printf "| no overlap (one bucket after backward) | %s | %s | %s | %.2f ms | %.2f ms |\n", bms, bc, be, bound, bound }'
    } >>"$out"
    "$H" down >/dev/null 2>&1
done
cat "$out"
if [ $WRITE = 1 ]; then
    /usr/bin/python3 - "$out" <<'PY'
import re, sys
new = open(sys.argv[1]).read().rstrip() + "\n"
path = "bench/RESULTS.md"
text = open(path).read()
block = "<!-- mpi-hosts:begin -->\n" + new + "<!-- mpi-hosts:end -->"
if "<!-- mpi-hosts:begin -->" in text:
    text = re.sub(r"<!-- mpi-hosts:begin -->.*?<!-- mpi-hosts:end -->", lambda m: block, text, flags=re.S)
else:
    text = text.rstrip() + "\n\n" + block + "\n"
open(path, "w").write(text)
PY
fi
