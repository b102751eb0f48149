#!/usr/bin/env bash
# bench/gpu/zero_2ranks.sh DDPRUN TRAIN_GPT [TRAIN_GPT ARGS...] — issue 27 on a GPU: 2 ranks sharing
# it (NCCL over loopback sockets, tools/nccl_one_gpu.sh), the same short run at each sharding
# level: --shard none, optimizer (ZeRO-1), gradients (ZeRO-2), parameters (ZeRO-3), parameters
# with --prefetch off; fp32, then bf16 (--bf16) while the time lasts. For each run one line:
#   ZERO prec level | final loss | params fnv1a | step ms (mean of the trainer's lines after the
#   first, the warm-up) | vs none | device MiB (a rank's peak: nvidia-smi's used_memory per pid,
#   sampled; and the GPU's memory.used peak, both ranks and the CUDA contexts, over its idle value)
# and a verdict per level against none of the same precision: the same parameters bit for bit
# (ddp.h's promise: same results at every level) — PASS zero_2ranks_PREC_LEVEL_equals_none or
# FAIL with both hashes. check_bf16.sh's step zero_2ranks runs it and greps the ZERO lines.
# env: ZERO_STEPS (30), ZERO_LOG_EVERY (5), ZERO_PRECISIONS ("fp32 bf16"), ZERO_BF16_BY_S (40: the
#      bf16 runs start only if the fp32 ones took less), ZERO_SAMPLE_S (0.5: nvidia-smi's period)
set -u
if [ $# -lt 2 ]; then echo "usage: $0 DDPRUN TRAIN_GPT [TRAIN_GPT ARGS...]" >&2; exit 2; fi
ddprun=$1 trainer=$2
shift 2
steps=${ZERO_STEPS:-30} every=${ZERO_LOG_EVERY:-5} by=${ZERO_BF16_BY_S:-40} period=${ZERO_SAMPLE_S:-0.5}
tmp=$(mktemp -d)
sampler=""
trap '[ -n "$sampler" ] && kill "$sampler" 2>/dev/null; rm -rf "$tmp"' EXIT
t0=$(date +%s)
fails=0

# nvidia-smi's compute processes, every $period s, as "pid MiB" lines into $1, and the first GPU's
# memory.used as "gpu MiB" (where a container hides the pids or their memory), until killed.
gpu_used() { timeout 5 nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | awk 'NR == 1 && $1 ~ /^[0-9]+$/ { print $1 }'; }
sample() {
    while :; do
        timeout 5 nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
            awk -F', *' '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ { print $1, $2 }' >>"$1"
        u=$(gpu_used); [ -n "$u" ] && echo "gpu $u" >>"$1"
        sleep "$period"
    done
}
idle=$(gpu_used)
echo "note: zero_2ranks: $steps steps a run, 2 ranks on one GPU; the GPU's memory.used before the runs: ${idle:-?} MiB"

printf 'ZERO %-4s %-26s | %-10s | %-16s | %8s | %7s | %s\n' prec level "loss" "params fnv1a" "step ms" "vs none" "device MiB (a rank's peak)"
for prec in ${ZERO_PRECISIONS:-fp32 bf16}; do
    if [ "$prec" != fp32 ] && [ $(($(date +%s) - t0)) -ge "$by" ]; then
        echo "note: zero_2ranks: no $prec runs (the fp32 ones took $(($(date +%s) - t0)) s; ZERO_BF16_BY_S $by)"
        continue
    fi
    flag=()
    [ "$prec" = bf16 ] && flag=(--bf16)
    base_hash="" base_ms=""
    for level in none optimizer gradients parameters parameters/off; do
        lv=${level%/off} pf=on
        [ "$level" = parameters/off ] && pf=off
        name=zero_2ranks_${prec}_${lv}$([ $pf = off ] && echo _prefetch_off)
        log=$tmp/$name.log mem=$tmp/$name.mem
        : >"$mem"
        sample "$mem" &
        sampler=$!
        "$ddprun" -n 2 tools/nccl_one_gpu.sh "$trainer" "$@" --steps "$steps" --log-every "$every" \
            --shard "$lv" --prefetch $pf "${flag[@]}" >"$log.raw" 2>&1
        rc=$?
        sed -E 's/^\[rank [0-9 ]+\] //' "$log.raw" >"$log"   # ddprun's rank prefix off
        kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null; sampler=""
        loss=$(grep -oE "^step +$steps/$steps \| loss [0-9.]+" "$log" | sed 's/.*loss //')
        hash=$(grep -m1 -oE "^params fnv1a [0-9a-f]+" "$log" | awk '{ print $3 }')
        # the step lines' mean ms (each the mean since the line before), the first interval left out
        ms=$(grep -E "^step +[0-9]+/$steps \| loss" "$log" | awk -F'|' 'NR > 1 { sub(/ ms.*/, "", $5); s += $5; n++ }
            END { if (n) printf "%.1f", s / n }')
        # a rank's peak: the largest used_memory seen for one pid (the two ranks are two pids)
        mib=$(awk -v idle="${idle:-0}" '$1 == "gpu" { if ($2 > g) g = $2; next } { if ($2 > m[$1]) m[$1] = $2 }
            END { for (p in m) { n++; if (m[p] > top) top = m[p] }
                  if (n) printf "%d (%d pid(s))", top, n; if (g) printf "%sGPU used %d, +%d over idle", n ? "; " : "", g, g - idle }' "$mem")
        [ "$lv" = none ] && { base_hash=$hash; base_ms=$ms; }
        ratio=$(awk -v a="${ms:-0}" -v b="${base_ms:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "-" }')
        printf 'ZERO %-4s %-26s | %-10s | %-16s | %8s | %7s | %s\n' "$prec" "$lv$([ $pf = off ] && echo ",no-prefetch")" \
            "${loss:-?}" "${hash:-?}" "${ms:-?}" "$ratio" "${mib:-not sampled}"
        case $level in none) want="optimizer unsharded" ;; optimizer) want="(ZeRO-1)" ;; gradients) want="(ZeRO-2)" ;;
            parameters) want="(ZeRO-3)" ;; *) want="(ZeRO-3, prefetch off)" ;; esac
        if [ $rc -ne 0 ] || [ -z "$hash" ]; then
            echo "FAIL $name: exit $rc, no final params hash; its last lines:"
            tail -n 6 "$log" | sed 's/^/    | /'
            fails=$((fails + 1))
        elif ! grep -m1 -E "^ddp.h: " "$log" | grep -qF "$want"; then
            echo "FAIL $name: the trainer does not say '$want': $(grep -m1 -E "^ddp.h: " "$log")"; fails=$((fails + 1))
        elif [ "$lv" != none ]; then
            if [ -z "$base_hash" ]; then echo "FAIL $name: no --shard none run to compare with"; fails=$((fails + 1))
            elif [ "$hash" = "$base_hash" ]; then echo "PASS ${name}_equals_none (params fnv1a $hash)"
            else echo "FAIL ${name}_equals_none: params fnv1a $hash, --shard none's $base_hash"; fails=$((fails + 1)); fi
        fi
        # what the trainer says of its sharding, once a run (the log is the evidence of which level ran)
        grep -m1 -E "^ddp.h: " "$log" | sed 's/^/    /'
    done
done
[ "$fails" -eq 0 ]
