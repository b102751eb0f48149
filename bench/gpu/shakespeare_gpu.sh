#!/usr/bin/env bash
# bench/gpu/shakespeare_gpu.sh BUILD_DIR RANKS — the quality target of nanoGPT's shakespeare_char
# on the GPU: tools/shakespeare_char.sh's whole run (1 rank, or 2 ranks sharing the GPU), then one
#   RESULT shakespeare_char ranks=R val=V train_s=S wall_s=W
# and PASS when the final validation loss is <= 1.47 and training took less than nanoGPT's
# 3 minutes on an A100 (180 s), else FAIL with both numbers. No GPU: one SKIP line.
set -u
B=${1:-build}
RANKS=${2:-1}
cd "$(dirname "$0")/../.." || exit 1
name=shakespeare_char_${RANKS}rank
gpus=$("$B/gpu/gpu_count" 2>/dev/null || echo 0)
case "$gpus" in '' | *[!0-9]*) gpus=0 ;; esac
[ "$gpus" -gt 0 ] || { echo "SKIP gpu: no GPU (gpu_count says 0)"; exit 0; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
t0=$(date +%s.%N)
tools/shakespeare_char.sh "$B" --ranks "$RANKS" --sample 0 2>&1 | tee "$log"
wall=$(echo "$(date +%s.%N) - $t0" | bc 2>/dev/null || echo "?")
read -r val secs <<<"$(sed -n 's/.*done: step [0-9]* | val loss \([0-9.]*\) | \([0-9.]*\) s training.*/\1 \2/p' "$log" | tail -n 1)"
echo "RESULT shakespeare_char ranks=$RANKS val=${val:-none} train_s=${secs:-none} wall_s=$wall"
if [ -z "${val:-}" ]; then echo "FAIL $name: no final validation loss (the run did not finish)"; exit 1; fi
if awk -v v="$val" -v s="$secs" 'BEGIN { exit !(v <= 1.47 && s < 180) }'; then
    echo "PASS $name (val $val <= 1.47, $secs s < 180 s)"
else
    echo "FAIL $name: val $val (target <= 1.47), $secs s of training (target < 180 s, nanoGPT on an A100)"
fi
