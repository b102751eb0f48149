#!/usr/bin/env bash
# zero_steps.sh — the tiny GPT's step time at every sharding level against DDP, at N = 2 and 4
# ranks, ZeRO-3 with its prefetch on and off, in one run (issue 27's evidence; bench/RESULTS.md).
#   Levels, in this order each round: none (DDP), optimizer (ZeRO-1), gradients (ZeRO-2),
#   parameters (ZeRO-3, prefetch on), parameters --prefetch off. Every run declares the model's
#   units (--units), so every level has the same buckets and must end with the same bits.
#   Interleaved: ROUNDS rounds of the five levels back to back (ABCDE ABCDE ...), so whatever else
#   loads the machine hits every level alike. A run's step time is the median of its progress
#   lines after step SKIP (each line the mean step since the one before); a level's is the median
#   of its runs. Checked: at each N the final parameters' hash (train_gpt's "params fnv1a") and
#   last loss line are the same at every level and round, else the script says so and fails.
#   Beside the times: minor page faults a step and rank (GNU time over ddprun and its ranks: the
#   commit / decommit of ZeRO-3's pages shows here),
#   and from one timeline run of each level (DDP_TIMELINE, rank 0, steps after SKIP) the ms a step
#   in ddp_adamw_step (ZeRO-1/2: with the all-gather; ZeRO-3: with its closing barrier), waiting
#   for the gradients' communication (exposed), copying units on the rank's thread (gathers not
#   prefetched), on the prefetch thread, and releasing units (decommits).
#   Writes the table between <!-- zero-steps:begin --> and <!-- zero-steps:end --> of
#   bench/RESULTS.md (unless --no-write), with the command, the machine and its load.
# Usage: bench/zero_steps.sh [BUILD_DIR] [--no-write]
#   env: ROUNDS (5), STEPS (60), SKIP (10), NS ("2 4"), DATA
set -u
B=build
WRITE=1
for a in "$@"; do
    case "$a" in
        --no-write) WRITE=0 ;;
        -*) echo "zero_steps: unknown option $a"; exit 2 ;;
        *) B=$a ;;
    esac
done
cd "$(dirname "$0")/.." || exit 1
DATA=${DATA:-../shared/data/tinyshakespeare.txt}
[ -f "$DATA" ] || DATA=$B/fortunes.txt
[ -f "$DATA" ] || { echo "zero_steps: no data (set DATA=FILE or run make $B/fortunes.txt)"; exit 1; }
ROUNDS=${ROUNDS:-5}
STEPS=${STEPS:-60}
SKIP=${SKIP:-10}
NS=${NS:-2 4}
CFG=(--layers 4 --heads 4 --dim 128 --seq 64 --batch 8 --units --warmup 5 --eval-every 0 --eval-batches 1 --sample 0 --log-every 10)
LEVELS=(none optimizer gradients parameters parameters_off)
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
for f in "$B/ddprun" "$B/train_gpt"; do [ -x "$f" ] || { echo "zero_steps: $f missing (make $f)"; exit 1; }; done
TIME=/usr/bin/time
[ -x "$TIME" ] || TIME=
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
CPUS=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 1)   # the CPUs this job may run on (its affinity; nproc obeys OMP_NUM_THREADS), not the machine's
ONLINE=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo "$CPUS")

median() { sort -n | awk '{ a[NR] = $1 } END { if (!NR) print 0; else print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
flags() { case "$1" in parameters_off) echo "--shard parameters --prefetch off" ;; *) echo "--shard $1" ;; esac; }

# run N LEVEL LOG [env...]: one training run; prints "median_ms minor_faults"
run() {
    local n=$1 lvl=$2 log=$3 ms faults=0
    shift 3
    if [ -n "$TIME" ]; then
        env "$@" "$TIME" -f "faults %R" -o "$log.time" "$B/ddprun" -n "$n" "$B/train_gpt" --data "$DATA" "${CFG[@]}" \
            --steps "$STEPS" $(flags "$lvl") >"$log" 2>&1
    else
        env "$@" "$B/ddprun" -n "$n" "$B/train_gpt" --data "$DATA" "${CFG[@]}" --steps "$STEPS" $(flags "$lvl") >"$log" 2>&1
    fi || { echo "zero_steps: N=$n $lvl failed:" >&2; tail -5 "$log" >&2; echo "0 0"; return; }
    [ -n "$TIME" ] && faults=$(awk '/^faults/ { print $2 }' "$log.time")
    ms=$(sed -E 's/^\[rank [0-9]+\] //' "$log" | awk -F'|' -v skip="$SKIP" '
        /^step +[0-9]+\/[0-9]+ \| loss/ { split($1, s, /[ \/]+/); if (s[2] > skip) print $5 + 0 }' | median)
    echo "$ms ${faults:-0}"
}
# the run's end: the parameters' hash and the last progress line's loss
bits() { sed -E 's/^\[rank [0-9]+\] //' "$1" | awk '/^params fnv1a/ { h = $3 } /^step +[0-9]+\/[0-9]+ \| loss/ { l = $5 } END { print h " " l }'; }

load0=$(cut -d' ' -f1-3 /proc/loadavg)
start=$(date -u +%H:%M)
bad=0
for n in $NS; do
    ref=
    for r in $(seq 1 "$ROUNDS"); do
        for lvl in "${LEVELS[@]}"; do
            log=$tmp/n${n}_${lvl}_$r.log
            read -r ms f < <(run "$n" "$lvl" "$log")
            echo "$ms" >>"$tmp/ms_${n}_$lvl"
            echo "$f" >>"$tmp/f_${n}_$lvl"
            b=$(bits "$log")
            [ -z "$ref" ] && ref=$b
            if [ "$b" != "$ref" ] || [ "$ms" = 0 ]; then
                echo "zero_steps: N=$n $lvl round $r ends with '$b', the first run with '$ref'"; bad=1
            fi
            printf 'N=%s round %s %-15s %8.2f ms/step  %s\n' "$n" "$r" "$lvl" "$ms" "$b"
        done
        cut -d' ' -f1 /proc/loadavg >>"$tmp/load_$n"
    done
    echo "$ref" >"$tmp/ref_$n"
    # one timeline run of each level (after the timed rounds)
    for lvl in "${LEVELS[@]}"; do
        run "$n" "$lvl" "$tmp/tl_${n}_$lvl.log" DDP_TIMELINE="$tmp/tl_${n}_$lvl.json" >/dev/null
        python3 - "$tmp/tl_${n}_$lvl.json" "$SKIP" >"$tmp/tl_${n}_$lvl" <<'EOF' || echo "- - - - - -" >"$tmp/tl_${n}_$lvl"
import json, sys
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
skip = int(sys.argv[2])
own = pre = rel = opt = exp = 0.0
steps = set()
for e in ev:
    a = e.get("args") or {}
    if e.get("pid") != 0 or a.get("step", -1) <= skip or "dur" not in e: continue
    steps.add(a["step"])
    if e.get("cat") == "gather":
        if a.get("prefetched"): pre += e["dur"]
        else: own += e["dur"]
    elif e.get("cat") == "release": rel += e["dur"]
    elif e.get("cat") == "optimizer": opt += e["dur"]
    elif e.get("cat") == "exposed": exp += e["dur"]
k = max(len(steps), 1)
print("%.2f %.2f %.2f %.2f %.2f %d" % (opt / 1e3 / k, exp / 1e3 / k, own / 1e3 / k, pre / 1e3 / k, rel / 1e3 / k, len(steps)))
EOF
    done
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)

section=$tmp/section
{
    echo "### Step time at every level, N = 2 and 4, ZeRO-3's prefetch on and off (\`bench/zero_steps.sh\`)"
    echo
    echo "Run $(date -u +%Y-%m-%d) $start-$(date -u +%H:%M) UTC on $(uname -n): $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $CPUS CPU(s) for this job ($ONLINE online), CPU backend, fp32, \`OPENBLAS_NUM_THREADS=1\`. Load average (1, 5, 15 min) $load0 at the start, $load1 at the end."
    echo "Command: \`ROUNDS=$ROUNDS STEPS=$STEPS SKIP=$SKIP NS=\"$NS\" bench/zero_steps.sh $B\`: each run \`$B/ddprun -n N $B/train_gpt --data $DATA ${CFG[*]} --steps $STEPS --shard LEVEL [--prefetch off]\`; $ROUNDS rounds of the five levels interleaved; a run's ms/step the median of its progress lines after step $SKIP, a level's the median of its runs."
    echo
    echo "| N | level | ms/step | against none | minor faults / step / rank | rank 0 ms/step (timeline): optimizer, exposed comm, own gathers, prefetched copies, releases |"
    echo "|---|---|---|---|---|---|"
    for n in $NS; do
        base=$(median <"$tmp/ms_${n}_none")
        for lvl in "${LEVELS[@]}"; do
            ms=$(median <"$tmp/ms_${n}_$lvl")
            fl=$(median <"$tmp/f_${n}_$lvl")
            tl="-"
            [ -f "$tmp/tl_${n}_$lvl" ] && tl=$(awk '{ if ($1 == "-") print "-"; else printf "%s, %s, %s, %s, %s", $1, $2, $3, $4, $5 }' "$tmp/tl_${n}_$lvl")
            name=$lvl
            case $lvl in
                none) name="none (DDP)" ;; optimizer) name="optimizer (ZeRO-1)" ;; gradients) name="gradients (ZeRO-2)" ;;
                parameters) name="parameters (ZeRO-3), prefetch on" ;; parameters_off) name="parameters (ZeRO-3), prefetch off" ;;
            esac
            awk -v n="$n" -v name="$name" -v ms="$ms" -v b="$base" -v f="$fl" -v steps="$STEPS" -v tl="$tl" -v cpus="$CPUS" 'BEGIN {
                printf "| %s%s | %s | %.2f | %s | %.0f | %s |\n", n, (n > cpus) ? " (oversubscribed)" : "", name, ms,
                    (name ~ /^none/) ? "-" : sprintf("%+.1f %%", 100 * (ms / b - 1)), f / steps / n, tl }'
        done
    done
    echo
    for n in $NS; do
        echo "N = $n: every level and round ends with the same bits (params fnv1a, last loss): $(cat "$tmp/ref_$n")$( [ $bad -ne 0 ] && echo ' - NOT at every level: see the script output')."
    done
    for n in $NS; do [ "$n" -gt "$CPUS" ] && echo "N = $n runs $n ranks (and their communication and prefetch threads) on $CPUS CPU(s): oversubscribed, the ranks take turns on the cores, so its times measure the scheduler as much as the levels."; done
    echo "Load average after each round: $(for n in $NS; do printf 'N=%s: %s; ' "$n" "$(tr '\n' ' ' <"$tmp/load_$n")"; done)"
} >"$section"
cat "$section"

if [ $WRITE -eq 1 ]; then
    RESULTS=bench/RESULTS.md
    if grep -q '^<!-- zero-steps:begin -->' "$RESULTS" && grep -q '^<!-- zero-steps:end -->' "$RESULTS"; then
        awk -v sec="$section" '
            /^<!-- zero-steps:begin -->/ { print; while ((getline line < sec) > 0) print line; skip = 1; next }
            /^<!-- zero-steps:end -->/ { skip = 0 }
            !skip { print }' "$RESULTS" >"$tmp/results" && cat "$tmp/results" >"$RESULTS"
    else
        { echo; echo '<!-- zero-steps:begin -->'; cat "$section"; echo '<!-- zero-steps:end -->'; } >>"$RESULTS"
    fi
    echo "wrote the zero-steps section of $RESULTS"
fi
exit $bad
