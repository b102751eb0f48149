#!/usr/bin/env bash
# scaling_hosts.sh — tools/scaling.py's ring formula against allreduces across hosts: the tiny GPT
# on 2 namespace hosts (tools/hosts.sh) through the MPI backend (build/mpi/train_gpt, mpirun),
# 1 and 2 ranks per host (2 ranks: hierarchical, shared memory inside the host, one leader each
# across), links shaped by tbf to each --rates value.
#
#   bench/scaling_hosts.sh [BUILD_DIR] [--rates "1gbit 10gbit"] [--per-host "1 2"] [--steps 60] [--no-write]
#
# For each ranks-per-host G: one run on unshaped links (the base: compute, each bucket's ready
# time), then one run per rate, each with DDP_TIMELINE. The model sees the base trace and a fabric
# describing the link (--algo ring, --ranks-per-node G, --inter-gbps = the rate, one NIC per host,
# --inter-latency-us 50; inside a host --intra-gbps 80, --intra-latency-us 5: a shared-memory copy,
# an assumption) and predicts the step on 2G ranks (A). B: the same prediction from the shaped
# run's own trace, its measured communication and wait taken out (only the model of the
# communication is tested, not the compute of another run). Errors against the measured step and
# exposed communication (scaling.py's median over the steps after the first) of the shaped run.
# Each rate twice: with tools/hosts.sh's shaping (a burst of 4 ms at the rate, 50 ms of queue)
# and with the smallest burst (32 KiB) and 5 ms of queue (DDP_HOSTS_TBF_BURST, _LATENCY): a burst
# of 4 ms is 0.5 MB at 1 Gbit/s, as much as a bucket, which then crosses the link at no cost.
# Results replace the section between <!-- scaling-hosts:begin --> and <!-- scaling-hosts:end -->
# of bench/RESULTS.md (unless --no-write). A SKIP line where mpirun, the MPI build or the
# namespaces are missing.
set -u
cd "$(dirname "$0")/.." || exit 1
B=build
[ $# -gt 0 ] && [ "${1#-}" = "$1" ] && { B=$1; shift; }
RATES="1gbit 10gbit"
PER_HOST="1 2"
STEPS=60
BUCKET_MB=0.5
WRITE=1
CMDLINE="bench/scaling_hosts.sh${*:+ $*}"
while [ $# -gt 0 ]; do
    case $1 in
    --rates) RATES=$2; shift 2 ;;
    --per-host) PER_HOST=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --no-write) WRITE=0; shift ;;
    *) echo "usage: $0 [BUILD_DIR] [--rates R] [--per-host \"1 2\"] [--steps N] [--no-write]" >&2; exit 2 ;;
    esac
done
. tests/lib.sh
bench_mpi_begin scaling_hosts "$B" "$B/mpi/train_gpt"
hosts_begin "scaling_hosts bench" sc 2
port=29850
out=$tmp/section.md
gpt() { # TRACE G
    port=$((port + 1))
    hosts_mpirun "h1:$2,h2:$2" 600 "$port" --mca btl tcp,self --mca btl_tcp_if_include eth0 -x DDP_TIMELINE="$1" \
        "$B/mpi/train_gpt" --data "$B/fortunes.txt" --steps "$STEPS" --log-every "$STEPS" --eval-every 0 --sample 0 \
        --bucket-mb "$BUCKET_MB" >"$tmp/gpt.log" 2>&1 || { echo "train_gpt on 2 hosts failed: $(tail -n 5 "$tmp/gpt.log")" >&2; exit 1; }
}
gbps() { case $1 in *gbit) echo "${1%gbit}" ;; *mbit) awk -v m="${1%mbit}" 'BEGIN { print m / 1000 }' ;; esac; }
# "STEP_MS COMM_MS EXPOSED_MS" measured in TRACE (the medians over its steps after the first)
measured() { python3 tools/scaling.py "$1" --algo flat --inter-gbps 1 --ranks 1 -o /dev/null |
    sed -n 's/.*measured: .* step \([0-9.]*\) ms of which.* measured comm \([0-9.]*\) ms, exposed \([0-9.]*\) ms$/\1 \2 \3/p'; }
# predicted "STEP_MS COMM_MS EXPOSED_MS" on 2G ranks from TRACE G GBIT
predicted() { python3 tools/scaling.py "$1" --algo ring --ranks-per-node "$2" --nics-per-node 1 --inter-gbps "$3" \
    --inter-latency-us 50 --intra-gbps 80 --intra-latency-us 5 --ranks $((2 * $2)) -o /dev/null | awk -v n=$((2 * $2)) '$1 == n { printf "%.1f %.1f %.1f\n", $2, $3, $4 }'; }
pct() { awk -v m="$1" -v p="$2" 'BEGIN { printf "%+.1f %%", 100 * (p - m) / m }'; }
rows=$tmp/rows.md
: >"$rows"
errs=""
for g in $PER_HOST; do
    "$H" up 2 >/dev/null || exit 1
    gpt "$tmp/base$g.json" "$g"
    read -r bstep bcomm bexp < <(measured "$tmp/base$g.json")
    echo "2 hosts x $g: unshaped base: step $bstep ms, comm $bcomm ms, exposed $bexp ms"
    echo "| 2 x $g | unshaped (base) | $bstep ($bexp) | $bcomm | | | | | |" >>"$rows"
    settings=""
    for rate in $RATES; do settings="$settings $rate $rate:tight"; done
    for s in $settings; do
        rate=${s%%:*}
        if [ "$s" != "$rate" ]; then
            "$H" down >/dev/null   # `up` at the same rate would keep the usual shaping
            DDP_HOSTS_TBF_LATENCY=5ms DDP_HOSTS_TBF_BURST=0 "$H" up 2 --rate "$rate" >/dev/null || exit 1
            label="$rate, tbf burst 32 KiB, queue 5 ms"
        else
            "$H" up 2 --rate "$rate" >/dev/null || exit 1
            label="$rate, tbf burst 4 ms, queue 50 ms"
        fi
        gpt "$tmp/run.json" "$g"
        read -r mstep mcomm mexp < <(measured "$tmp/run.json")
        read -r astep acomm aexp < <(predicted "$tmp/base$g.json" "$g" "$(gbps "$rate")")
        read -r pstep pcomm pexp < <(predicted "$tmp/run.json" "$g" "$(gbps "$rate")")
        ea=$(pct "$mstep" "$astep"); eb=$(pct "$mstep" "$pstep")
        errs="$errs $(awk -v m="$mstep" -v a="$astep" -v b="$pstep" 'BEGIN { printf "%.2f %.2f", 100 * (a - m) / m, 100 * (b - m) / m }')"
        line="| 2 x $g | $label | $mstep ($mexp) | $mcomm | $pcomm | $(pct "$mcomm" "$pcomm") | $astep ($aexp) | $ea | $pstep ($pexp) | $eb |"
        echo "$line"
        echo "$line" >>"$rows"
    done
done
{
    echo "## The scaling model across hosts (tools/scaling.py against 2 namespace hosts)"
    echo
    echo "\`$CMDLINE\` on $(date -u +%Y-%m-%d), $(getconf _NPROCESSORS_ONLN) CPUs shared by both hosts (load average at the end:"
    echo "$(cut -d' ' -f1-3 /proc/loadavg)). The tiny GPT (3.34 MB of fp32 gradients, buckets of at most $BUCKET_MB MiB) through"
    echo "the MPI backend, $STEPS steps a run; ms are scaling.py's medians over the steps after the first."
    echo "Predicted: \`--algo ring --ranks-per-node G --nics-per-node 1 --inter-gbps RATE --inter-latency-us 50"
    echo "--intra-gbps 80 --intra-latency-us 5\` on 2G ranks; A from the unshaped run of the same layout, B"
    echo "from the shaped run itself with its communication and wait taken out. Step ms (exposed ms);"
    echo "comm: the sum of the step's bucket allreduces (measured on rank 0; predicted by the ring formula)."
    echo
    echo "| hosts x ranks | link | measured step (exposed) | measured comm | ring's comm | error | A: predicted step (exposed) | error | B: predicted step (exposed) | error |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    cat "$rows"
} >"$out"
echo "$errs" | tr ' ' '\n' | awk 'NF { v = $1 < 0 ? -$1 : $1; s += v; n++; if (v > mx) mx = v }
    END { if (n) printf "\nStep time error over both predictions: mean |%.1f %%|, worst %.1f %% (%d predictions).\n", s / n, mx, n }' >>"$out"
cat "$out"
if [ $WRITE = 1 ]; then
    python3 - "$out" <<'PY'
import re, sys
new = open(sys.argv[1]).read().rstrip() + "\n"
path = "bench/RESULTS.md"
text = open(path).read()
block = "<!-- scaling-hosts:begin -->\n" + new + "<!-- scaling-hosts:end -->"
if "<!-- scaling-hosts:begin -->" in text:
    text = re.sub(r"<!-- scaling-hosts:begin -->.*?<!-- scaling-hosts:end -->", lambda m: block, text, flags=re.S)
else:
    text = text.rstrip() + "\n\n" + block + "\n"
open(path, "w").write(text)
PY
fi
