#!/usr/bin/env bash
# test_gpu_fault.sh — a rank SIGKILLed in the middle of training on the NCCL backend: the other
# rank must stop with a named error (the rank, what happened) within DDP_TIMEOUT, not hang in a
# collective that can never finish. build/gpu/train_gpt on 2 ranks started by hand (ddprun would
# stop the survivor itself), on one GPU through tools/nccl_one_gpu.sh. Twice: rank 1 killed
# (rank 0, which serves the rendezvous store, sees its connection drop) and rank 0 killed (rank
# 1 loses the store). Two checks a case: the survivor stops with ddp.h's error in time, and that
# error names the rank that was lost. SKIP without a GPU.
# Usage: tests/gpu/test_gpu_fault.sh [BUILD_DIR]
set -u
B=${1:-build}
cd "$(dirname "$0")/../.." || exit 1
BIN=$B/gpu/train_gpt
[ -x "$BIN" ] && [ -x "$B/gpu/gpu_count" ] || { echo "SKIP gpu_rank_killed: $BIN or $B/gpu/gpu_count not built"; exit 0; }
gpus=$(timeout 60 "$B/gpu/gpu_count" 2>/dev/null)
case "$gpus" in '' | *[!0-9]*) gpus=0 ;; esac
[ "$gpus" -ge 1 ] || { echo "SKIP gpu_rank_killed: no GPU (gpu_count: 0)"; exit 0; }
share=()
[ "$gpus" -ge 2 ] || share=(tools/nccl_one_gpu.sh)
TIMEOUT=20   # DDP_TIMEOUT: the longest a survivor may wait for a peer that stopped answering
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done; rm -rf "$tmp"; }
trap cleanup EXIT
fails=0

free_port() {   # a port nobody listens on, from a range of its own
    local p
    for p in $(seq $((29700 + $$ % 200)) 29999); do
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
    done
    echo 29699
}

for victim in 1 0; do
    survivor=$((1 - victim))
    name="gpu_rank${victim}_killed_rank${survivor}_stops_with_an_error_within_${TIMEOUT}s"
    port=$(free_port)
    pids=()
    for r in 0 1; do
        # exec chain (wrapper, then the trainer): the pid is the rank itself, so SIGKILL kills the rank
        RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            DDP_JOB_TOKEN="fault-$$-$victim" DDP_TIMEOUT=$TIMEOUT \
            "${share[@]}" "$BIN" --data ddp.h --layers 2 --heads 2 --dim 64 --seq 32 --batch 4 --steps 1000000 \
            --warmup 2 --eval-every 0 --sample 0 --log-every 1 >"$tmp/out$r" 2>&1 &
        pids+=($!)
    done
    # Kill once training runs (rank 0 prints a line a step): both ranks are inside collectives then.
    for _ in $(seq 900); do   # 90 s for CUDA and NCCL to come up
        grep -qE "^step +5/" "$tmp/out0" 2>/dev/null && break
        kill -0 "${pids[0]}" 2>/dev/null && kill -0 "${pids[1]}" 2>/dev/null || break
        sleep 0.1
    done
    if ! grep -qE "^step +5/" "$tmp/out0"; then
        echo "FAIL $name: the 2 ranks never reached step 5; rank 0 said: $(tail -n 3 "$tmp/out0" | tr '\n' ' ') rank 1 said: $(tail -n 3 "$tmp/out1" | tr '\n' ' ')"
        fails=$((fails + 1))
        for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
        wait 2>/dev/null
        continue
    fi
    t0=$(date +%s.%N)
    kill -KILL "${pids[$victim]}"
    wait "${pids[$victim]}" 2>/dev/null
    limit=$((TIMEOUT + 15))   # the timeout, then shutdown
    rc=""
    for _ in $(seq $((limit * 10))); do
        if ! kill -0 "${pids[$survivor]}" 2>/dev/null; then wait "${pids[$survivor]}"; rc=$?; break; fi
        sleep 0.1
    done
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    # train_gpt prints ddp.h's error on stderr ("rank S: what happened") and exits 1
    msg=$(grep -m1 -E "^rank $survivor: " "$tmp/out$survivor")
    if [ -z "$rc" ]; then
        echo "FAIL $name: rank $survivor still running $secs s after rank $victim was killed; its last lines: $(tail -n 3 "$tmp/out$survivor" | tr '\n' ' ')"
        ps -o pid=,etimes=,stat=,wchan:24=,args= -p "${pids[$survivor]}" 2>/dev/null | sed 's/^/    running: /'
        timeout 10 nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null | sed 's/^/    on the GPU: /'
        fails=$((fails + 1))
    elif [ "$rc" -ne 0 ] && [ -n "$msg" ]; then
        echo "PASS $name"
        echo "  (rank $survivor exited $rc after $secs s: $msg)"
        # Which rank failed is the first thing a user needs (the CPU backend always says it).
        if grep -qE "rank $victim([^0-9]|$)" <<<"${msg#rank $survivor: }"; then echo "PASS gpu_rank${victim}_killed_error_names_rank${victim}"
        else echo "FAIL gpu_rank${victim}_killed_error_names_rank${victim}: rank $survivor's error does not say which rank was lost: $msg"; fails=$((fails + 1)); fi
    else
        echo "FAIL $name: rank $survivor exited $rc after $secs s without a ddp.h error; its last lines: $(tail -n 4 "$tmp/out$survivor" | tr '\n' ' ')"
        fails=$((fails + 1))
    fi
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
    wait 2>/dev/null
done
[ "$fails" -eq 0 ]
