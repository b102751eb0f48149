#!/usr/bin/env bash
# bench_gpt.sh — training throughput of the tiny GPT, side by side in one run:
#   ours (build/train_gpt, OpenBLAS 1 thread) on 1 rank and on 2 ranks (ddprun), and PyTorch
#   (1 intra-op thread per process) on 1 rank and on 2 ranks with DDP over gloo.
# ours on 2 ranks also runs with --shard-optimizer (ddp_desc.shard_optimizer, ZeRO-1), in the same round.
# Config: 4 layers, 4 heads, width 128, context 64, batch 4 per rank (weak scaling: 2 ranks do
# twice the work per step). Each run's rate comes from its median step time (ours: the median
# of 10-step means); each configuration runs REPS times, interleaved, and the table shows the
# median run. tokens/s is global;
# scaling efficiency = tokens/s(2 ranks) / (2 x tokens/s(1 rank)).
# A host under the VM that slows one vCPU or both for seconds at a time moves every number, so
# each round also gives its own ratios of runs made back to back (1 rank, two independent 1-rank
# runs, 2 ranks): their medians compare runs that saw the same host. The host's steal time (CPU
# taken by other guests, /proc/stat) is printed per round.
# Usage: bench/bench_gpt.sh [BUILD_DIR]    env: REPS (3), STEPS (110, first 10 untimed), DATA
set -u
B=${1:-build}
cd "$(dirname "$0")/.." || exit 1
DATA=${DATA:-../shared/data/tinyshakespeare.txt}
[ -f "$DATA" ] || DATA=$B/fortunes.txt
[ -f "$DATA" ] || { echo "bench_gpt: no data (set DATA=FILE or run make $B/fortunes.txt)"; exit 1; }
REPS=${REPS:-3}
STEPS=${STEPS:-110}
SKIP=10
CFG=(--layers 4 --heads 4 --dim 128 --seq 64 --batch 4)
PY=/usr/bin/python3
# One OpenBLAS thread per rank, as for PyTorch (1 intra-op thread): weak scaling compares like with
# like. (train_gpt alone uses the CPUs its ranks share: OPENBLAS_NUM_THREADS overrides that.)
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

median() { sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

# ours N -> global tokens/s from the median of the progress lines after step SKIP. A line comes
# every 10 steps ("step i/n | ... | X ms | ...", X the mean step since the line before), the way
# a user runs it: train_gpt averages the loss across ranks only for a line. The median of the
# lines keeps a stray job on the machine from skewing the result.
ours() {
    local n=$1 log=${2:-$tmp/ours.log}
    "$B/ddprun" -n "$n" "$B/train_gpt" --data "$DATA" "${CFG[@]}" --steps "$STEPS" --warmup 10 --eval-every 0 \
        --eval-batches 1 --sample 0 --log-every 10 ${OURS_FLAGS:-} >"$log" 2>&1 || { echo "0"; return; }
    sed -E 's/^\[rank [0-9]+\] //' "$log" | awk -F'|' -v skip=$SKIP '
        /^step +[0-9]+\/[0-9]+ \| loss/ { split($1, s, /[ \/]+/); if (s[2] > skip) print $5 + 0 }' |
        median | awk -v tok=$((n * 4 * 64)) '{ printf "%.0f\n", ($1 > 0) ? tok / ($1 / 1000) : 0 }'
}

# The bound on weak scaling that the machine itself sets: two independent 1-rank runs at once
# (no communication at all), their tokens/s added. Two cores that slow each other down (shared
# caches, memory bandwidth, a busy host under the VM) lower it below 2x one run alone.
pair() {
    local a b
    ours 1 "$tmp/pair_a.log" >"$tmp/pair_a" &
    b=$(ours 1 "$tmp/pair_b.log")
    wait
    a=$(cat "$tmp/pair_a")
    echo $((a + b))
}

# cpu_ticks -> "total steal" from /proc/stat; steal_pct BEFORE AFTER -> steal share in between (%)
cpu_ticks() { awk '/^cpu / { t = 0; for (i = 2; i <= 9; i++) t += $i; print t, $9 }' /proc/stat; }
steal_pct() { echo "$1 $2" | awk '{ printf "%.1f", ($3 > $1) ? 100 * ($4 - $2) / ($3 - $1) : 0 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.4f\n", (b > 0) ? a / b : 0 }'; }

have_torch=1
$PY -c "import torch" 2>/dev/null || have_torch=0
torch_run() {
    local n=$1 port r
    if [ $have_torch -eq 0 ]; then echo "-"; return; fi
    port=$((29600 + RANDOM % 2000))
    for ((r = n - 1; r >= 0; r--)); do
        OMP_NUM_THREADS=1 RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            $PY bench/gpt_torch.py --data "$DATA" "${CFG[@]}" --steps 45 --skip 5 >"$tmp/torch$r.log" 2>&1 &
    done
    wait
    sed -n 's/^torch tokens\/s \([0-9]*\).*/\1/p' "$tmp/torch0.log" | head -n 1 | grep . || echo 0
}


echo "bench_gpt: $(getconf _NPROCESSORS_ONLN) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "config: 4 layers, 4 heads, width 128, context 64, batch 4 per rank; data $DATA; $REPS interleaved runs each"
for ((i = 1; i <= REPS; i++)); do
    c0=$(cpu_ticks)
    o1=$(ours 1); op=$(pair); o2=$(ours 2); oz=$(OURS_FLAGS=--shard-optimizer ours 2); os=$(DDP_STAGED_GRADS=1 ours 2)
    steal=$(steal_pct "$c0" "$(cpu_ticks)")
    t1=$(torch_run 1); t2=$(torch_run 2)
    echo "  run $i: ours 1 rank $o1, two independent 1-rank runs $op, ours 2 ranks $o2 (sharded optimizer $oz, staged buckets $os), torch 1 rank $t1, torch 2 ranks (gloo) $t2 tokens/s; host steal during ours ${steal}%"
    echo "$o1" >>"$tmp/o1"; echo "$o2" >>"$tmp/o2"; echo "$oz" >>"$tmp/oz"; ratio "$oz" $((2 * o1)) >>"$tmp/r_oz"; echo "$os" >>"$tmp/os"; echo "$op" >>"$tmp/op"; echo "$t1" >>"$tmp/t1"; echo "$t2" >>"$tmp/t2"
    ratio "$o2" $((2 * o1)) >>"$tmp/r_o2"; ratio "$op" $((2 * o1)) >>"$tmp/r_op"; ratio "$o2" "$op" >>"$tmp/r_o2op"
done
O1=$(median <"$tmp/o1"); O2=$(median <"$tmp/o2"); OZ=$(median <"$tmp/oz"); OS=$(median <"$tmp/os"); OP=$(median <"$tmp/op")
echo
echo "| implementation | 1 rank (tokens/s) | 2 ranks (tokens/s, global) | weak scaling 1→2 |"
echo "|---|---:|---:|---:|"
awk -v a="$O1" -v b="$OP" 'BEGIN { printf "| the machine'"'"'s bound: two independent 1-rank runs at once, no communication | %.0f | %.0f | %.1f%% |\n", a, b, 100 * b / (2 * a) }'
awk -v a="$O1" -v b="$O2" 'BEGIN { printf "| ddp.h train_gpt (OpenBLAS, 1 thread/rank) | %.0f | %.0f | %.1f%% |\n", a, b, 100 * b / (2 * a) }'
awk -v a="$O1" -v b="$OZ" 'BEGIN { printf "| the same, AdamW state sharded (--shard-optimizer, ZeRO-1) | %.0f | %.0f | %.1f%% |\n", a, b, 100 * b / (2 * a) }'
awk -v a="$O1" -v b="$OS" 'BEGIN { printf "| the same, buckets through the staging slots (DDP_STAGED_GRADS=1) | %.0f | %.0f | %.1f%% |\n", a, b, 100 * b / (2 * a) }'
echo
echo "Runs made back to back (each round: 1 rank, the pair, 2 ranks), medians of their ratios:"
awk -v a="$(median <"$tmp/r_op")" -v b="$(median <"$tmp/r_o2")" -v c="$(median <"$tmp/r_o2op")" 'BEGIN {
    printf "  the machine: pair / (2 x 1 rank) %.1f%%\n  weak scaling: 2 ranks / (2 x 1 rank) %.1f%%\n", 100 * a, 100 * b
    printf "  ddp.h against the machine: 2 ranks / pair %.1f%%\n", 100 * c }'
echo "  per round, 2 ranks / (2 x 1 rank): $(tr '\n' ' ' <"$tmp/r_o2")"
echo "  sharded (--shard-optimizer): 2 ranks / (2 x 1 rank) median $(median <"$tmp/r_oz" | awk '{ printf "%.1f%%", 100 * $1 }'); per round: $(tr '\n' ' ' <"$tmp/r_oz")"
echo
if [ $have_torch -eq 1 ]; then
    T1=$(median <"$tmp/t1"); T2=$(median <"$tmp/t2")
    awk -v a="$T1" -v b="$T2" 'BEGIN { printf "| PyTorch %s (1 thread/rank; 2 ranks: DDP over gloo) | %.0f | %.0f | %.1f%% |\n", "'"$($PY -c 'import torch; print(torch.__version__)')"'", a, b, (b > 0 && a > 0) ? 100 * b / (2 * a) : 0 }'
    awk -v o1="$O1" -v o2="$O2" -v t1="$T1" -v t2="$T2" 'BEGIN { if (t1 > 0 && t2 > 0) printf "\nours / PyTorch: %.2fx at 1 rank, %.2fx at 2 ranks\n", o1 / t1, o2 / t2 }'
else
    echo "(PyTorch skipped: $PY has no torch; Debian: apt-get install python3-torch)"
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
