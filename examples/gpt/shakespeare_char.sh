#!/usr/bin/env bash
# shakespeare_char.sh BUILD_DIR [--ranks 1|2] [--precision tf32|bf16|fp32] [train_gpt flags...]
#
# nanoGPT's `config/train_shakespeare_char.py`, run by train_gpt: 6 layers, 6 heads, width 384,
# context 256, batch 64, dropout 0.2, 5000 steps, lr 1e-3 with 100 warmup steps and a cosine to
# 1e-4, AdamW betas 0.9/0.99, weight decay 0.1, clipping at 1.0, validation every 250 steps on
# 200 batches. nanoGPT reaches a validation loss of 1.4697 in about 3 minutes on one A100
# (char-level, vocab 65; train_gpt is byte-level, vocab 256: the same text, the same positions).
#   GPU: the whole run, on 1 rank (--ranks 1, the default) or on 2 ranks sharing the GPU
#        (--ranks 2: batch 32 each, the same global batch, so the same training).
#   No GPU: the same command on the CPU backend stops after 3 steps (one such step takes seconds
#        to minutes on a few cores) and evaluates on 2 batches: it shows the configuration runs.
#   --precision: the GPU model's matmuls and storage: tf32 (the default: TF32 tensor cores, fp32
#        storage), bf16 (train_gpt --bf16: bf16 weights, activations and gradients, fp32 master
#        weights and accumulation; nanoGPT's own default on an A100), fp32 (TF32 off). The CPU
#        backend is fp32 whatever is asked (it says so). Env PRECISION sets the default.
# Flags after the options go to train_gpt last, so they override (e.g. --steps 200).
# Data: $SHAKESPEARE (default ../shared/data/tinyshakespeare.txt beside the repository).
set -u
B=${1:-build}
[ $# -gt 0 ] && shift
RANKS=1
PREC=${PRECISION:-tf32}
while [ $# -gt 0 ]; do
    case $1 in
    --ranks) RANKS=${2:-}; shift 2 || { RANKS=; shift; } ;;
    --precision) PREC=${2:-}; shift 2 || { PREC=; shift; } ;;
    *) break ;;
    esac
done
case $RANKS in 1|2) ;; *) echo "shakespeare_char.sh: --ranks must be 1 or 2 (got '$RANKS')" >&2; exit 2 ;; esac
case $PREC in
    tf32) PFLAG=(--tf32) ;;
    bf16) PFLAG=(--bf16) ;;
    fp32) PFLAG=() ;;
    *) echo "shakespeare_char.sh: --precision must be tf32, bf16 or fp32 (got '$PREC')" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/../.." || exit 1
DATA=${SHAKESPEARE:-../shared/data/tinyshakespeare.txt}
[ -f "$DATA" ] || { echo "shakespeare_char.sh: no data at '$DATA' (set SHAKESPEARE=PATH to tinyshakespeare.txt)" >&2; exit 2; }
CONFIG=(--data "$DATA" --layers 6 --heads 6 --dim 384 --seq 256 --batch $((64 / RANKS)) --dropout 0.2
        --steps 5000 --lr 1e-3 --min-lr 1e-4 --warmup 100 --beta1 0.9 --beta2 0.99 --wd 0.1 --clip 1
        --eval-every 250 --eval-batches 200 --log-every 50 --sample 300)
gpus=0
if [ -x "$B/gpu/train_gpt" ] && [ -x "$B/gpu/gpu_count" ]; then gpus=$("$B/gpu/gpu_count" 2>/dev/null || echo 0); fi
case "$gpus" in '' | *[!0-9]*) gpus=0 ;; esac
if [ "$gpus" -eq 0 ]; then
    echo "shakespeare_char: no GPU: the configuration on the CPU backend (fp32$([ "$PREC" != fp32 ] && echo ", not $PREC")), stopped after 3 steps"
    exec "$B/ddprun" -n "$RANKS" "$B/train_gpt" "${CONFIG[@]}" --stop-at 3 --eval-batches 2 --log-every 1 --sample 0 "$@"
fi
echo "shakespeare_char: precision $PREC, $RANKS rank(s)"
if [ "$RANKS" = 1 ]; then exec "$B/ddprun" -n 1 "$B/gpu/train_gpt" "${CONFIG[@]}" "${PFLAG[@]}" "$@"; fi
if [ "$gpus" -ge 2 ]; then exec "$B/ddprun" -n 2 "$B/gpu/train_gpt" "${CONFIG[@]}" "${PFLAG[@]}" "$@"; fi
echo "shakespeare_char: precision $PREC; 2 ranks share the one GPU (tools/nccl_one_gpu.sh)"
exec "$B/ddprun" -n 2 tools/nccl_one_gpu.sh "$B/gpu/train_gpt" "${CONFIG[@]}" "${PFLAG[@]}" "$@"
