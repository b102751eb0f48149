#!/usr/bin/env bash
# overlap.sh — does bucketing hide communication under backward? Three measurements, one run:
#   1. bench_overlap, blocking vs bucketed, with a slow network injected (comm < compute per bucket)
#   2. the bucket-cap sweep at a fixed model size -> CSV -> bench/sweep.svg
#   3. a timeline of one bucketed step -> bench/overlap_trace.svg
# and replaces the <!-- overlap:begin --> ... <!-- overlap:end --> section of bench/RESULTS.md.
# Usage: bench/overlap.sh [--no-write]
set -u
cd "$(dirname "$0")/.." || exit 1
B=${BUILD:-build}
WRITE=1
[ "${1:-}" = "--no-write" ] && WRITE=0
make -s "$B/ddprun" "$B/bench_overlap" || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
strip() { sed -E 's/^\[rank 0\] //' | grep -v '^\[rank'; }

OVERLAP_ARGS="--layers 8 --layer-mb 4 --compute-ms 20 --latency-ms 1 --gbps 0.5 --steps 9"
SWEEP_ARGS="--layers 50 --layer-mb 1 --compute-ms 2 --latency-ms 2 --gbps 1 --steps 7 --sweep 1,2,5,10,25,50,100"
echo "== overlap: $OVERLAP_ARGS"
"$B/ddprun" -n 2 "$B/bench_overlap" $OVERLAP_ARGS --timeline "$tmp/trace.json" 2>&1 | strip | tee "$tmp/overlap.txt"
echo "== sweep: $SWEEP_ARGS"
"$B/ddprun" -n 2 "$B/bench_overlap" $SWEEP_ARGS 2>&1 | strip | tee "$tmp/sweep.csv"
python3 tools/sweep_svg.py "$tmp/sweep.csv" -o bench/sweep.svg \
    --title "Step time vs bucket cap: 2 ranks, 50 MiB, 2 ms + 1 GB/s network" || exit 1
python3 tools/trace_svg.py "$tmp/trace.json" -o bench/overlap_trace.svg \
    --title "bench_overlap: 8 layers x 4 MiB, 2 ranks, one bucketed step" || exit 1
[ "$WRITE" -eq 1 ] || exit 0

{
    echo "<!-- overlap:begin -->"
    echo "## Overlap: bucketed allreduce under backward"
    echo
    echo "- Command: \`bench/overlap.sh\` (\`make bench\`); $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- Machine: $(lscpu | sed -n 's/^Model name: *//p'), $(getconf _NPROCESSORS_ONLN) CPUs; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "- Model: a synthetic stack of layers with a fixed amount of arithmetic in each backward;"
    echo "  every allreduce is slowed by ddp.h's injected network (\`inject_comm_latency_ms\`,"
    echo "  \`inject_comm_gbps\`), standing in for a slow interconnect. Medians over the steps."
    echo
    echo "### Blocking vs bucketed (\`build/ddprun -n 2 build/bench_overlap $OVERLAP_ARGS\`)"
    echo
    echo '```'
    cat "$tmp/overlap.txt"
    echo '```'
    echo
    echo "### Bucket-cap sweep (\`build/ddprun -n 2 build/bench_overlap $SWEEP_ARGS\`)"
    echo
    echo "| bucket cap (MiB) | buckets | step ms | compute ms | comm ms | exposed ms |"
    echo "|---:|---:|---:|---:|---:|---:|"
    tail -n +2 "$tmp/sweep.csv" | awk -F, '{ printf "| %s | %s | %.1f | %.1f | %.1f | %.1f |\n", $1, $6, $2, $5, $3, $4 }'
    echo
    echo "![step time vs bucket cap](sweep.svg)"
    echo
    echo "One bucketed step of the overlap run (compute and comm lane per rank; the red band is the"
    echo "communication left exposed at the end of backward):"
    echo
    echo "![timeline](overlap_trace.svg)"
    echo "<!-- overlap:end -->"
} >"$tmp/section.md"
python3 - "$tmp/section.md" <<'PY'
import re, sys
section = open(sys.argv[1]).read().rstrip("\n")
path = "bench/RESULTS.md"
text = open(path).read()
if "<!-- overlap:begin -->" in text:
    text = re.sub(r"<!-- overlap:begin -->.*?<!-- overlap:end -->", lambda m: section, text, flags=re.S)
else:
    text = text.rstrip("\n") + "\n\n" + section + "\n"
open(path, "w").write(text)
PY
echo "wrote the overlap section of bench/RESULTS.md"
