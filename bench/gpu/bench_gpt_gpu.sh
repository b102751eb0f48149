#!/usr/bin/env bash
# bench_gpt_gpu.sh — GPT-2-small-sized training on one GPU: build/gpu/train_gpt (ddp.h, NCCL
# backend, 1 rank) next to the same model in PyTorch (bench/gpt_torch.py --device cuda), per
# precision: bf16 (ours --bf16: bf16 weights, gradients and activations, fp32 master weights;
# PyTorch: bf16 autocast), tf32 (both with TF32 matmuls), fp32 (TF32 off). Reports tokens/s,
# the ratio, MFU.
#
# Config: 12 layers, 12 heads, width 768, context 1024 (GPT-2 small's shape; byte vocabulary
# 256, so ~85M parameters instead of 124M), batch 8. Each run trains STEPS steps; the rate comes
# from the median step time after the first SKIP. Both sides: AdamW, clip 1.0, explicit causal
# attention over a [T, T] matrix, and one host wait per step (our loss/norm read, torch's .item()).
# MFU = tokens/s x FLOPs per token / peak, FLOPs per token = 6 N + 12 L C T (N: every
# parameter, the byte vocabulary's small head included; 12 L C T: attention's two T x T matmuls,
# forward and backward, without the causal saving — PaLM's formula). Peak (dense, no sparsity):
# H100 SXM and H200 (the same chip) 67 TFLOP/s fp32 (non-tensor), 495 TFLOP/s TF32, 989 TFLOP/s
# bf16; H100 PCIe 51 / 378 / 756; A100 19.5 / 156 / 312. Another GPU: set PEAK_FP32, PEAK_TF32
# and PEAK_BF16 (TFLOP/s).
#
# Made for a short GPU window: the precisions run in the order given (bf16 first by default),
# each run (ours, PyTorch) under its own time limit, each run's log kept (LOG_DIR), and each
# table row and RESULT line printed as soon as its runs are done — a hang costs that run only.
# Usage: bench/gpu/bench_gpt_gpu.sh [BUILD_DIR]
#   env: PRECISIONS ("bf16 tf32 fp32": which, in that order), IMPLS ("ours torch"; add "compile"
#        for torch.compile next to eager), RUN_LIMIT_S (180: each run's limit; the compiled run
#        gets twice that), LOG_DIR (each run's log, kept: $OUT/bench_gpt_gpu where OUT is set,
#        else BUILD_DIR/bench_gpt_gpu), STREAM (1: each run's lines also go to stdout, prefixed),
#        STEPS (30), SKIP (5), BATCH (8), DATA, PY, LAYERS HEADS DIM SEQ (12 12 768 1024), and
#        OURS_ENV (e.g. GPT_KERNELS=2: set for our runs only), TAG (added to each precision's
#        name in the rows, logs and RESULT lines, e.g. _kernels2)
set -u
B=${1:-build}
cd "$(dirname "$0")/../.." || exit 1
BIN=$B/gpu/train_gpt
PRECISIONS=${PRECISIONS:-bf16 tf32 fp32}
IMPLS=${IMPLS:-ours torch}
for p in $PRECISIONS; do
    case $p in bf16 | tf32 | fp32) ;; *) echo "FAIL gpu GPT benchmark: PRECISIONS names '$p' (bf16, tf32, fp32)"; exit 2 ;; esac
done
for i in $IMPLS; do
    case $i in ours | torch | compile) ;; *) echo "FAIL gpu GPT benchmark: IMPLS names '$i' (ours, torch, compile)"; exit 2 ;; esac
done
RUN_LIMIT_S=${RUN_LIMIT_S:-180}
case $RUN_LIMIT_S in '' | *[!0-9]*) echo "FAIL gpu GPT benchmark: RUN_LIMIT_S '$RUN_LIMIT_S' is not a number of seconds"; exit 2 ;; esac
[ -x "$BIN" ] || { echo "SKIP gpu GPT benchmark: $BIN not built (no nvcc when make ran)"; exit 0; }
name=$(timeout 30 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
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
if [ -n "${OUT:-}" ]; then LOG_DIR=${LOG_DIR:-$OUT/bench_gpt_gpu}; else LOG_DIR=${LOG_DIR:-$B/bench_gpt_gpu}; fi
mkdir -p "$LOG_DIR" || exit 1
STREAM=${STREAM:-0}
TAG=${TAG:-}
case $TAG in *[!A-Za-z0-9_.-]*) echo "FAIL gpu GPT benchmark: TAG '$TAG': letters, digits, _ . - only"; exit 2 ;; esac

median() { sort -n | awk '{ a[NR] = $1 } END { if (NR) print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

# run LOG LIMIT CMD...: CMD under its limit (its whole process group), its output to LOG (and,
# with STREAM=1, to stdout prefixed by the log's name as it comes). Status: CMD's, 124 when cut.
run() {
    local log=$1 limit=$2 tag rc
    shift 2
    tag=$(basename "$log" .log)
    echo "# $(date -u +%H:%M:%S) limit ${limit}s: $*" >"$log"
    if [ "$STREAM" = 1 ]; then
        timeout -k 5 "$limit" "$@" 2>&1 </dev/null | tee -a "$log" | sed -u "s/^/  [$tag] /"
        rc=${PIPESTATUS[0]}
    else
        timeout -k 5 "$limit" "$@" >>"$log" 2>&1 </dev/null
        rc=$?
    fi
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "# cut after ${limit}s (RUN_LIMIT_S)" >>"$log"
    return $rc
}

# ours PREC FLAGS... -> median step ms (0 on failure, "cut" when it ran out of time)
ours() {
    local prec=$1 log rc
    shift
    log=$LOG_DIR/$prec$TAG-ours.log
    # shellcheck disable=SC2086  # OURS_ENV is words (VAR=value ...)
    run "$log" "$RUN_LIMIT_S" env ${OURS_ENV:-} "$BIN" --data "$DATA" --layers $L --heads $NH --dim $C --seq $T --batch "$BATCH" \
        --steps "$STEPS" --warmup 10 --eval-every 0 --eval-batches 1 --sample 0 --log-every 1 "$@" >&2
    rc=$?
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then echo cut; return; fi
    [ $rc -eq 0 ] || { echo 0; return; }
    awk -F'|' -v skip="$SKIP" '/^step +[0-9]+\/[0-9]+ \| loss/ { split($1, s, /[ \/]+/); if (s[2] > skip) print $5 + 0 }' \
        "$log" | median | grep . || echo 0
}

PY=${PY:-}
if [ -z "$PY" ]; then
    for p in python3 /opt/torch/.venv/bin/python3 /usr/bin/python3; do
        if timeout 120 "$p" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then PY=$p; break; fi
    done
fi
# theirs PREC IMPL FLAGS... -> median step ms, "-" without a CUDA PyTorch, 0 on failure, "cut"
theirs() {
    local prec=$1 impl=$2 log rc limit=$RUN_LIMIT_S extra=()
    shift 2
    [ -n "$PY" ] || { echo "-"; return; }
    [ "$impl" = compile ] && { extra=(--compile); limit=$((2 * RUN_LIMIT_S)); }
    log=$LOG_DIR/$prec$TAG-$impl.log
    run "$log" "$limit" env PYTHONUNBUFFERED=1 "$PY" bench/gpt_torch.py --device cuda --data "$DATA" --layers $L --heads $NH --dim $C \
        --seq $T --batch "$BATCH" --steps "$STEPS" --skip "$SKIP" "${extra[@]}" "$@" >&2
    rc=$?
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then echo cut; return; fi
    [ $rc -eq 0 ] || { echo 0; return; }
    sed -n 's/^torch tokens\/s [0-9]* (.*steps, \([0-9.]*\) ms.*/\1/p' "$log" | head -n 1 | grep . || echo 0
}

params=$((256 * C + T * C + L * (12 * C * C + 13 * C) + 2 * C))   # gpt.h's registration: wte, wpe, blocks, lnf
flops=$(awk -v n="$params" -v l=$L -v c=$C -v t=$T 'BEGIN { printf "%.0f", 6 * n + 12 * l * c * t }')
tok=$((BATCH * T))
torch_version=$([ -n "$PY" ] && timeout 120 "$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)
echo "bench_gpt_gpu: $name; peak $PEAK_FP32 TFLOP/s fp32, $PEAK_TF32 TFLOP/s TF32, $PEAK_BF16 TFLOP/s bf16 (dense); data $DATA"
echo "config: $L layers, $NH heads, width $C, context $T, batch $BATCH, vocab 256: $params parameters," \
     "$(awk -v f="$flops" 'BEGIN { printf "%.3f", f / 1e9 }') GFLOP per token (6N + 12LCT); $STEPS steps, median after $SKIP"
echo "precisions: $PRECISIONS; implementations: $IMPLS; each run limited to ${RUN_LIMIT_S}s; logs in $LOG_DIR"
[ -n "$PY" ] || echo "SKIP PyTorch column: no python3 with a CUDA-enabled torch (set PY=...)"

row() {   # precision, implementation, ms, peak
    awk -v p="$1" -v impl="$2" -v ms="$3" -v peak="$4" -v tok="$tok" -v f="$flops" 'BEGIN {
        if (ms == "-") { printf "| %s | %s | skipped | | |\n", p, impl; exit }
        if (ms == "cut") { printf "| %s | %s | cut at its time limit | | |\n", p, impl; exit }
        if (ms <= 0) { printf "| %s | %s | failed | | |\n", p, impl; exit }
        r = tok / (ms / 1000)
        mfu = peak > 0 ? sprintf("%.1f%%", 100 * r * f / (peak * 1e12)) : "?"
        printf "| %s | %s | %.0f | %.1f | %s |\n", p, impl, r, ms, mfu }'
}
rate() { awk -v ms="$1" -v tok="$tok" 'BEGIN { if (ms != "-" && ms != "cut" && ms > 0) printf "%.0f", tok / (ms / 1000); else print "-" }'; }
status=0
echo
echo "| precision | implementation | tokens/s | step ms | MFU |"
echo "|---|---|---:|---:|---:|"
for prec in $PRECISIONS; do
    flag=(); peak=$PEAK_FP32
    [ $prec = tf32 ] && { flag=(--tf32); peak=$PEAK_TF32; }
    [ $prec = bf16 ] && { flag=(--bf16); peak=$PEAK_BF16; }   # ours --bf16; PyTorch bf16 autocast
    o=-; t=-; c=-; loss=-
    for impl in $IMPLS; do
        case $impl in
        ours)
            o=$(ours $prec "${flag[@]}")
            case $o in 0 | cut) status=1; echo "FAIL gpu GPT benchmark $prec: our trainer $([ "$o" = cut ] && echo "was cut at ${RUN_LIMIT_S}s" || echo failed); its last lines:"
                                tail -n 8 "$LOG_DIR/$prec$TAG-ours.log" | sed 's/^/    | /' ;; esac
            row $prec$TAG "ddp.h build/gpu/train_gpt, 1 rank${OURS_ENV:+ ($OURS_ENV)}" "$o" "$peak"
            loss=$(grep -oE "^step +$STEPS/$STEPS \| loss [0-9.]+" "$LOG_DIR/$prec$TAG-ours.log" | sed 's/.*loss //'); loss=${loss:--} ;;
        torch)
            t=$(theirs $prec torch "${flag[@]}")
            how=eager; [ $prec = bf16 ] && how="eager, bf16 autocast"
            row $prec$TAG "PyTorch ${torch_version:+$torch_version }($how)" "$t" "$peak" ;;
        compile)
            c=$(theirs $prec compile "${flag[@]}")
            how=torch.compile; [ $prec = bf16 ] && how="torch.compile, bf16 autocast"
            row $prec$TAG "PyTorch ${torch_version:+$torch_version }($how)" "$c" "$peak"
            case $c in 0 | cut) echo "NOTE torch.compile $prec did not give a number ($c): $(tail -n 2 "$LOG_DIR/$prec$TAG-compile.log" | tr '\n' ' ' | cut -c1-300)" ;; esac ;;
        esac
    done
    ro=$(rate "$o"); rt=$(rate "$t"); rc=$(rate "$c")
    awk -v p="$prec$TAG" -v o="$ro" -v t="$rt" -v c="$rc" -v g="$name" -v loss="$loss" -v has_c="$([[ " $IMPLS " == *" compile "* ]] && echo 1)" 'BEGIN {
        ratio = (o != "-" && t != "-") ? sprintf("%.2f", o / t) : "-"
        extra = has_c ? sprintf(" compile_tokens_per_s=%s ratio_compile=%s", c, (o != "-" && c != "-") ? sprintf("%.2f", o / c) : "-") : ""
        printf "RESULT gpu=\"%s\" gpt2small_%s ours_tokens_per_s=%s torch_tokens_per_s=%s ratio=%s%s ours_loss_last_step=%s\n", g, p, o, t, ratio, extra, loss }'
done
exit $status
