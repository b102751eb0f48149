#!/usr/bin/env bash
# bench_gpt_gpu.sh — GPT-2-small-sized training on one GPU: build/gpu/train_gpt (ddp.h, NCCL
# backend, 1 rank) next to the same model in PyTorch (bench/gpt_torch.py --device cuda), fp32
# with TF32 off, then both with TF32, then bf16 (ours --bf16: bf16 weights, gradients and
# activations, fp32 master weights; PyTorch: bf16 autocast). Reports tokens/s, the ratio, MFU.
#
# Config: 12 layers, 12 heads, width 768, context 1024 (GPT-2 small's shape; byte vocabulary
# 256, so ~85M parameters instead of 124M), batch 8. Each run trains STEPS steps; the rate comes
# from the median step time after the first SKIP. Both sides: AdamW, clip 1.0, explicit causal
# attention over a [T, T] matrix, and one host wait per step (our loss/norm read, torch's .item()).
# MFU = tokens/s x FLOPs per token / peak, FLOPs per token = 6 N + 12 L C T (N: every
# parameter; 12 L C T: attention's two T x T matmuls, forward and backward, without the
# causal saving — PaLM's formula). Peak (dense, no sparsity): H100 SXM and H200 (the same
# chip) 67 TFLOP/s fp32 (non-tensor), 495 TFLOP/s TF32, 989 TFLOP/s bf16; H100 PCIe 51 / 378 /
# 756; A100 19.5 / 156 / 312. Another GPU: set PEAK_FP32, PEAK_TF32 and PEAK_BF16 (TFLOP/s).
# Usage: bench/gpu/bench_gpt_gpu.sh [BUILD_DIR]   env: STEPS (30), SKIP (5), BATCH (8), DATA, PY,
#   LAYERS HEADS DIM SEQ (12 12 768 1024: another shape, e.g. to try the script on a small one)
set -u
B=${1:-build}
cd "$(dirname "$0")/../.." || exit 1
BIN=$B/gpu/train_gpt
[ -x "$BIN" ] || { echo "SKIP gpu GPT benchmark: $BIN not built (no nvcc when make ran)"; exit 0; }
name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
[ -n "$name" ] || { echo "SKIP gpu GPT benchmark: no GPU (nvidia-smi lists none)"; exit 0; }
STEPS=${STEPS:-30}
SKIP=${SKIP:-5}
BATCH=${BATCH:-8}
L=${LAYERS:-12} NH=${HEADS:-12} C=${DIM:-768} T=${SEQ:-1024}
DATA=${DATA:-../shared/data/tinyshakespeare.txt}
[ -f "$DATA" ] || DATA=$B/fortunes.txt
[ -f "$DATA" ] || DATA=ddp.h   # any file is bytes; throughput does not care what they say
case "$name" in
    *H200* | *H100*SXM* | *"H100 80GB HBM3"*) pf=67 pt=495 pb=989 ;;
    *H100*PCIe*) pf=51 pt=378 pb=756 ;;
    *A100*) pf=19.5 pt=156 pb=312 ;;
    *) pf=0 pt=0 pb=0 ;;
esac
PEAK_FP32=${PEAK_FP32:-$pf}
PEAK_TF32=${PEAK_TF32:-$pt}
PEAK_BF16=${PEAK_BF16:-$pb}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

median() { sort -n | awk '{ a[NR] = $1 } END { if (NR) print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

# ours [--tf32] -> median step ms (0 on failure); the log stays in $tmp/ours.log
ours() {
    "$BIN" --data "$DATA" --layers $L --heads $NH --dim $C --seq $T --batch "$BATCH" --steps "$STEPS" --warmup 10 \
        --eval-every 0 --eval-batches 1 --sample 0 --log-every 1 "$@" >"$tmp/ours.log" 2>&1 || { echo 0; return; }
    awk -F'|' -v skip="$SKIP" '/^step +[0-9]+\/[0-9]+ \| loss/ { split($1, s, /[ \/]+/); if (s[2] > skip) print $5 + 0 }' \
        "$tmp/ours.log" | median
}

PY=${PY:-}
if [ -z "$PY" ]; then
    for p in python3 /opt/torch/.venv/bin/python3 /usr/bin/python3; do
        if "$p" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then PY=$p; break; fi
    done
fi
# theirs [--tf32] -> median step ms, or "-" without a CUDA PyTorch
theirs() {
    [ -n "$PY" ] || { echo "-"; return; }
    "$PY" bench/gpt_torch.py --device cuda --data "$DATA" --layers $L --heads $NH --dim $C --seq $T --batch "$BATCH" \
        --steps "$STEPS" --skip "$SKIP" "$@" >"$tmp/torch.log" 2>&1 || { echo 0; return; }
    sed -n 's/^torch tokens\/s [0-9]* (.*steps, \([0-9.]*\) ms.*/\1/p' "$tmp/torch.log" | head -n 1 | grep . || echo 0
}

params=$((256 * C + T * C + L * (12 * C * C + 13 * C) + 2 * C))   # gpt.h's registration: wte, wpe, blocks, lnf
flops=$(awk -v n="$params" -v l=$L -v c=$C -v t=$T 'BEGIN { printf "%.0f", 6 * n + 12 * l * c * t }')
tok=$((BATCH * T))
echo "bench_gpt_gpu: $name; peak $PEAK_FP32 TFLOP/s fp32, $PEAK_TF32 TFLOP/s TF32, $PEAK_BF16 TFLOP/s bf16 (dense); data $DATA"
echo "config: $L layers, $NH heads, width $C, context $T, batch $BATCH, vocab 256: $params parameters," \
     "$(awk -v f="$flops" 'BEGIN { printf "%.3f", f / 1e9 }') GFLOP per token (6N + 12LCT); $STEPS steps, median after $SKIP"
[ -n "$PY" ] || echo "SKIP PyTorch column: no python3 with a CUDA-enabled torch (set PY=...)"

row() {   # precision, implementation, ms, peak
    awk -v p="$1" -v impl="$2" -v ms="$3" -v peak="$4" -v tok="$tok" -v f="$flops" 'BEGIN {
        if (ms == "-") { printf "| %s | %s | skipped | | |\n", p, impl; exit }
        if (ms <= 0) { printf "| %s | %s | failed | | |\n", p, impl; exit }
        r = tok / (ms / 1000)
        mfu = peak > 0 ? sprintf("%.1f%%", 100 * r * f / (peak * 1e12)) : "?"
        printf "| %s | %s | %.0f | %.1f | %s |\n", p, impl, r, ms, mfu }'
}
status=0
echo
echo "| precision | implementation | tokens/s | step ms | MFU |"
echo "|---|---|---:|---:|---:|"
torch_version=$([ -n "$PY" ] && "$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)
for prec in fp32 tf32 bf16; do
    flag=(); peak=$PEAK_FP32
    [ $prec = tf32 ] && { flag=(--tf32); peak=$PEAK_TF32; }
    [ $prec = bf16 ] && { flag=(--bf16); peak=$PEAK_BF16; }   # ours --bf16; PyTorch bf16 autocast
    o=$(ours "${flag[@]}"); [ "$o" = 0 ] && { status=1; cp "$tmp/ours.log" "$tmp/ours_failed.log"; }
    t=$(theirs "${flag[@]}")
    row $prec "ddp.h build/gpu/train_gpt, 1 rank" "$o" "$peak"
    how=eager; [ $prec = bf16 ] && how="eager, bf16 autocast"
    row $prec "PyTorch ${torch_version:+$torch_version }($how)" "$t" "$peak"
    loss=$(grep -oE "^step +$STEPS/$STEPS \| loss [0-9.]+" "$tmp/ours.log" | sed 's/.*loss //'); loss=${loss:--}   # bf16 vs fp32 after STEPS
    echo "$prec $o $t $loss" >>"$tmp/summary"
done
echo
while read -r prec o t loss; do
    awk -v p="$prec" -v o="$o" -v t="$t" -v tok="$tok" -v g="$name" -v loss="$loss" 'BEGIN {
        ours = o > 0 ? tok / (o / 1000) : 0; theirs = (t != "-" && t > 0) ? tok / (t / 1000) : 0
        ts = theirs > 0 ? sprintf("%.0f", theirs) : "-"
        ratio = (ours > 0 && theirs > 0) ? sprintf("%.2f", ours / theirs) : "-"
        printf "RESULT gpu=\"%s\" gpt2small_%s ours_tokens_per_s=%.0f torch_tokens_per_s=%s ratio=%s ours_loss_last_step=%s\n", g, p, ours, ts, ratio, loss }'
done <"$tmp/summary"
if [ $status -ne 0 ]; then echo "FAIL gpu GPT benchmark: our trainer failed; its log:"; tail -n 20 "$tmp/ours_failed.log"; fi
exit $status
