#!/usr/bin/env bash
# scaling_gpt2.sh — tools/scaling.py's predictions for a GPT-2-small-sized model trained with ddp.h on
# nodes of 8 H100s (NVLink inside a node, 400 Gbit/s InfiniBand across), 1 to 64 nodes.
# First (PART assumed), the step is the tiny GPT's, measured here on 2 CPU ranks (examples/gpt, 0.25 MiB buckets so the
# readiness of its gradients is seen finely), scaled by these ASSUMPTIONS (none is a measurement):
#   - model: GPT-2 small, 124,439,808 parameters, fp32 gradients (497.8 MB, ddp.h's default), 25 MiB
#     buckets; its tied token embedding and position table (31.65 % of the bytes) are finished only by
#     backward's last op (--ready-at-end 0.3165); the rest become ready as the tiny GPT's do (the same
#     architecture: blocks back to front);
#   - compute: 64 sequences of 1024 tokens per GPU per step (0.5 M tokens per step on 8 GPUs), 6 x
#     params + 12 x layers x width x context = 859.9 MFLOP per token, at 40 % of the H100 SXM's
#     published 989 TFLOP/s dense BF16 peak: 142.45 ms per step, the tiny GPT's compute (forward,
#     backward, optimizer and ddp.h's own costs) stretched to that length;
#   - fabric (bench/fabric_8xh100_ib400.json): NVLink 4 at 450 GB/s per GPU and direction (3600
#     Gbit/s), 3 us per hop; one 400 Gbit/s NIC per GPU, 6 us per hop across nodes; an allreduce
#     reaches 80 % of each rate; NCCL's ring (hierarchical: inside the node, then across nodes)
#     and, for comparison, its tree.
# Second, the prediction from a MEASURED step (PART measured): the GPT-2-small-sized GPT of this
# repo (12 layers, 12 heads, width 768, context 1024, byte vocabulary: 86.0 M parameters, 344.2 MB
# of fp32 gradients in its 17 real buckets of at most 25 MiB), batch 8 per GPU, TF32, on one H100
# with the NCCL backend: DDP_TIMELINE of `build/gpu/train_gpt --data ddp.h --layers 12 --heads 12
# --dim 768 --seq 1024 --batch 8 --steps 12 --warmup 2 --eval-every 0 --sample 0 --log-every 4
# --tf32` (55.0 ms a step). Measured there: the step, each bucket's size and its readiness on the
# GPU (the comm lane's starts: one rank sends nothing), backward's length on the GPU. The trace
# is H100_TRACE (default tests/gpt2s_h100_tf32_steps3-7.json, steps 3-7 cut from that run; the
# whole run's 11 steps give the same table within 0.01 ms). Not measured: the fabric (the same
# file and assumptions as above), NCCL's kernels taking SMs and memory bandwidth from backward
# (on one rank none ran), 8 GPUs in a node running as fast as that one.
# Usage: bench/scaling_gpt2.sh [BUILD_DIR] [OUT_DIR] [assumed|measured|both]
#   (writes OUT_DIR/scaling_gpt2_{ring,tree}.svg and OUT_DIR/scaling_gpt2_h100_{ring,tree}.svg)
set -eu
B=${1:-build}
OUT=${2:-bench}
PART=${3:-both}
cd "$(dirname "$0")/.."
case $PART in assumed|measured|both) ;; *) echo "scaling_gpt2.sh: PART must be assumed, measured or both, not '$PART'" >&2; exit 2 ;; esac
H100_TRACE=${H100_TRACE:-tests/gpt2s_h100_tf32_steps3-7.json}
if [ "$PART" != assumed ]; then
    for algo in ring tree; do
        python3 tools/scaling.py "$H100_TRACE" --fabric bench/fabric_8xh100_ib400.json --algo $algo \
            --ranks 1,8,16,32,64,128,256,512 \
            --title "GPT-2-small-sized GPT (86 M, byte vocab), measured H100 TF32 step, 8 x H100 per node ($algo): predicted" \
            -o "$OUT/scaling_gpt2_h100_$algo.svg"
    done
    [ "$PART" = measured ] && exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -f "$B/fortunes.txt" ] || make -s "$B/fortunes.txt"
DDP_TIMELINE=$tmp/tiny.json "$B/ddprun" -n 2 "$B/train_gpt" --data "$B/fortunes.txt" --steps 30 --log-every 30 \
    --eval-every 0 --sample 0 --bucket-mb 0.25 >/dev/null
c=$(python3 tools/scaling.py "$tmp/tiny.json" --algo flat --inter-gbps 1 --ranks 1 -o /dev/null |
    sed -n 's/.* of which compute \([0-9.]*\) ms.*/\1/p')
scale=$(awk -v c="$c" 'BEGIN { printf "%.4f", 142.45 / c }')
echo "tiny GPT measured: compute $c ms per step; scaled by $scale to 142.45 ms"
for algo in ring tree; do
    python3 tools/scaling.py "$tmp/tiny.json" --fabric bench/fabric_8xh100_ib400.json --algo $algo \
        --compute-scale "$scale" --grad-bytes 497759232 --bucket-mb 25 --ready-at-end 0.3165 \
        --ranks 1,8,16,32,64,128,256,512 --title "GPT-2 small, 8 x H100 per node, NVLink + 400G IB ($algo): predicted" \
        -o "$OUT/scaling_gpt2_$algo.svg"
done
