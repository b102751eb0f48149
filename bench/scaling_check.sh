#!/usr/bin/env bash
# scaling_check.sh — tools/scaling.py against measurements: the tiny GPT on 2 CPU-backend ranks
# of this host, its allreduces slowed to an emulated network by ddp.h (inject_comm_latency_ms /
# inject_comm_gbps: each allreduce takes at least latency + bytes / bandwidth). The model sees
# one trace without the emulation (the base: what compute costs, when each bucket is ready) and
# predicts each setting's step time with --algo flat; the table sets that against the step time
# measured with the emulation on. This checks the model's overlap arithmetic (buckets in order,
# each when ready, the exposed tail), not its ring/tree cost formulas: bench/scaling_hosts.sh
# sets those against allreduces across namespace hosts (the MPI backend).
# Two predictions per setting: A from the base run (compute measured in another run: on a busy
# machine its noise is in the error), B from the run itself with its measured communication and
# wait taken out (the compute of the same run: what is left is the model of the communication).
# Usage: bench/scaling_check.sh [BUILD_DIR]   (STEPS=40 steps per run, BUCKET_MB=0.5: 9 buckets)
set -eu
B=${1:-build}
cd "$(dirname "$0")/.."
STEPS=${STEPS:-40}
BUCKET_MB=${BUCKET_MB:-0.5}
SETTINGS=${SETTINGS:-"0.2:0.05 0.5:0.2 1:0.1 2:0.5 5:0.2 10:0.05"}   # latency_ms:GB/s (inject_comm_gbps is in 1e9 bytes/s)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -f "$B/fortunes.txt" ] || make -s "$B/fortunes.txt"
run() { # OUT.json [train_gpt options]
    local out=$1; shift
    DDP_TIMELINE=$out "$B/ddprun" -n 2 "$B/train_gpt" --data "$B/fortunes.txt" --steps "$STEPS" --log-every "$STEPS" \
        --eval-every 0 --sample 0 --bucket-mb "$BUCKET_MB" "$@" >/dev/null
}
# header numbers of a trace: "STEP_MS EXPOSED_MS" (median over its steps after the first)
measured() { python3 tools/scaling.py "$1" --algo flat --inter-gbps 1 --ranks 1 -o /dev/null |
    sed -n 's/.*measured: .* step \([0-9.]*\) ms of which.* exposed \([0-9.]*\) ms$/\1 \2/p'; }
# predicted "STEP_MS EXPOSED_MS" on 2 ranks from TRACE for latency LAT ms and GB/s (scaling.py: Gbit/s)
predicted() { python3 tools/scaling.py "$1" --algo flat --inter-latency-us "$(awk -v l="$2" 'BEGIN { print l * 1000 }')" \
    --inter-gbps "$(awk -v g="$3" 'BEGIN { print g * 8 }')" --ranks 2 -o /dev/null | awk '$1 == 2 { print $2, $4 }'; }
pct() { awk -v m="$1" -v p="$2" 'BEGIN { printf "%+.1f%%", 100 * (p - m) / m }'; }
run "$tmp/base.json"
read -r bstep bexp < <(measured "$tmp/base.json")
echo "base (no emulation): step $bstep ms, exposed $bexp ms; $(python3 tools/scaling.py "$tmp/base.json" --algo flat --inter-gbps 1 --ranks 1 -o /dev/null | sed -n 's/.*; \([0-9]* bucket(s), [0-9.]* MB of gradients\).*/\1/p')"
echo "A: predicted from the base run's compute and readiness; B: from the run's own (its measured comm and wait removed)"
printf "%-8s %-7s | %9s %9s | %9s %7s | %9s %7s | %8s %8s\n" lat_ms GB/s meas_step meas_exp A_step A_err B_step B_err B_exp B_exp_err
errs_a="" errs_b=""
for s in $SETTINGS; do
    lat=${s%%:*} gbps=${s##*:}
    run "$tmp/run.json" --inject-latency-ms "$lat" --inject-gbps "$gbps"
    read -r mstep mexp < <(measured "$tmp/run.json")
    read -r astep _ < <(predicted "$tmp/base.json" "$lat" "$gbps")
    read -r bstep2 bexp2 < <(predicted "$tmp/run.json" "$lat" "$gbps")
    ea=$(pct "$mstep" "$astep"); eb=$(pct "$mstep" "$bstep2")
    errs_a="$errs_a $ea"; errs_b="$errs_b $eb"
    printf "%-8s %-7s | %9s %9s | %9s %7s | %9s %7s | %8s %8s\n" "$lat" "$gbps" "$mstep" "$mexp" "$astep" "$ea" "$bstep2" "$eb" "$bexp2" \
        "$(awk -v m="$mexp" -v p="$bexp2" 'BEGIN { printf "%+.2fms", p - m }')"
done
summary() { echo "$2" | tr ' ' '\n' | awk -v w="$1" 'NF { gsub(/[+%]/, ""); v = $1 < 0 ? -$1 : $1; s += v; n++; if (v > mx) mx = v }
    END { printf "%s: step time error mean |%.1f%%|, worst %.1f%% over %d settings\n", w, s / n, mx, n }'; }
summary A "$errs_a"
summary B "$errs_b"
