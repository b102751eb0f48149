#!/usr/bin/env bash
# outer_hosts.sh — DDP against DiLoCo and streaming DiLoCo across slow links (issue 26): the tiny
# GPT (or --model's shape) on 2 or 3 namespace hosts (tools/hosts.sh) x 1 or 2 ranks, the MPI
# backend (build/mpi/train_gpt under mpirun), links shaped by tbf to each --rates value, every run
# trained to the same token budget.
#
#   bench/outer_hosts.sh [BUILD_DIR] [--rates "100mbit 1gbit"] [--steps 400] [--runs "..."]
#                        [--int8-at "100mbit"] [--eval-every 50] [--hosts 2] [--ranks-per-host 1]
#                        [--model "TRAINER FLAGS"] [--base-steps 60] [--port 32600] [--tag NAME]
#                        [--no-write]
#
# Runs (--runs picks among them, in the order given): ddp (--outer off: every step averages the
# gradients across the link); diloco10, diloco50, diloco200 (--outer diloco --inner-steps H, bf16
# outer gradients, outer lr 0.7 momentum 0.9); streaming (--outer streaming --inner-steps 50
# --fragments 5 --outer-delay 5, bf16); and at the rates --int8-at names, streaming_int8 (the
# same, int8 blockwise: its effect on the loss, where the bytes matter most). Any other setting by
# its name: dilocoH or streamHfFtT (--inner-steps H --fragments F --outer-delay T), each followed
# by any of _lrX (--outer-lr X, default 0.7), _mY (--outer-momentum Y, default 0.9) and _int8
# (--outer-wire int8): e.g. diloco50_lr1_m0.5, stream10f5t1_int8. By default: ddp, diloco10,
# diloco50, diloco200, streaming and the settings bench/RESULTS.md found best for short runs,
# diloco50_lr1_m0.5, diloco20_lr1_m0.5_int8, stream25f5t2_lr1_m0.5_int8. Groups of --ranks-per-host
# ranks (--group-size; DDP inside a host's shared memory, the outer sync across): each host a
# replica. --hosts 3: h1..h3. --model: trainer flags for another shape (e.g. "--layers 6 --dim
# 256"), in every run and in the bases. First, on unshaped links: one rank alone on h1 (the base
# of the scaling efficiency and of the loss per wall-clock second) and a short DDP run on every
# rank with DDP_TIMELINE (--base-steps; the base the scaling model predicts from: compute and
# bucket readiness).
# Each run: wall-clock (training, validations left out), tokens/s (ranks x batch x seq a step),
# scaling efficiency = tokens/s / (ranks x one rank's tokens/s), the share of the wall not spent
# waiting for communication, the final validation loss, and tools/scaling.py's prediction of the
# step (ring, --ranks-per-host a node, the link's rate, 50 us latency; inside a host an assumed
# 40 Gbit/s, 5 us; --outer MODE --group-size ... for the outer runs) beside the measured step.
# Results: a table per rate and bench/outer_hosts.svg (validation loss against wall-clock);
# they replace the section between <!-- outer-hosts:begin --> and <!-- outer-hosts:end --> of
# bench/RESULTS.md (unless --no-write); --tag NAME: bench/outer_hosts_NAME.svg and the markers
# <!-- outer-hosts-NAME:begin/end --> instead (appended at the end where they are missing). The
# logs, the base trace and the curves stay in BUILD_DIR/outer_hosts[_NAME]/. A SKIP line where
# mpirun, mpicc or the namespaces are missing. DDP_HOSTS_PREFIX: OUTER_HOSTS_PREFIX (default
# i26b) + this shell's pid; the store's ports from --port + 1 on (or OUTER_HOSTS_PORT).
set -u
cd "$(dirname "$0")/.." || exit 1
B=build
[ $# -gt 0 ] && [ "${1#-}" = "$1" ] && { B=$1; shift; }
RATES="100mbit 1gbit"
INT8_AT="100mbit"
STEPS=400
EVAL_EVERY=50
RUNS="ddp diloco10 diloco50 diloco200 streaming diloco50_lr1_m0.5 diloco20_lr1_m0.5_int8 stream25f5t2_lr1_m0.5_int8"
WRITE=1
NHOSTS=2
RPH=1
MODEL=""
BASE_STEPS=60
PORT0=${OUTER_HOSTS_PORT:-32600}
TAG=""
# the command as given (BUILD_DIR too; arguments with spaces or empty quoted), for the results
CMDLINE="bench/outer_hosts.sh$([ "$B" != build ] && printf ' %s' "$B")"
for a in "$@"; do case $a in "" | *" "*) CMDLINE="$CMDLINE \"$a\"" ;; *) CMDLINE="$CMDLINE $a" ;; esac; done
usage() {
    echo "usage: $0 [BUILD_DIR] [--rates R] [--steps N] [--runs \"ddp diloco10 ...\"] [--int8-at \"RATES\"] [--eval-every N]" >&2
    echo "       [--hosts 2|3] [--ranks-per-host 1|2] [--model \"FLAGS\"] [--base-steps N] [--port P] [--tag NAME] [--no-write]" >&2
    exit 2
}
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || case $1 in --no-write) ;; *) usage ;; esac
    case $1 in
    --rates) RATES=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --int8-at) INT8_AT=$2; shift 2 ;;
    --eval-every) EVAL_EVERY=$2; shift 2 ;;
    --hosts) NHOSTS=$2; shift 2 ;;
    --ranks-per-host) RPH=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --base-steps) BASE_STEPS=$2; shift 2 ;;
    --port) PORT0=$2; shift 2 ;;
    --tag) TAG=$2; shift 2 ;;
    --no-write) WRITE=0; shift ;;
    *) usage ;;
    esac
done
case $NHOSTS in 2 | 3) ;; *) echo "outer_hosts: --hosts $NHOSTS: 2 or 3 (tools/hosts.sh)" >&2; exit 2 ;; esac
case $RPH in [1-9]) ;; *) echo "outer_hosts: --ranks-per-host $RPH: 1 to 9" >&2; exit 2 ;; esac
case $TAG in "" | [a-z0-9]*) ;; *) echo "outer_hosts: --tag $TAG: letters and digits" >&2; exit 2 ;; esac
case "$STEPS$BASE_STEPS$PORT0" in *[!0-9]*) echo "outer_hosts: --steps, --base-steps and --port take whole numbers" >&2; exit 2 ;; esac
NRANKS=$((NHOSTS * RPH))
# the trainer's flags for a run (scaling.py takes the same names); empty for ddp; "?" for a name
# that is no run
flags_of() {
    local r=$1 f="" lr="" m="" wire=""
    case $r in
    ddp) return ;;
    streaming) echo "--outer streaming --group-size $RPH --inner-steps 50 --fragments 5 --outer-delay 5"; return ;;
    streaming_int8) echo "--outer streaming --group-size $RPH --inner-steps 50 --fragments 5 --outer-delay 5 --outer-wire int8"; return ;;
    esac
    if [[ $r =~ ^diloco([1-9][0-9]*)(.*)$ ]]; then
        f="--outer diloco --group-size $RPH --inner-steps ${BASH_REMATCH[1]}"
    elif [[ $r =~ ^stream([1-9][0-9]*)f([1-9][0-9]*)t([0-9]+)(.*)$ ]]; then
        f="--outer streaming --group-size $RPH --inner-steps ${BASH_REMATCH[1]} --fragments ${BASH_REMATCH[2]} --outer-delay ${BASH_REMATCH[3]}"
        BASH_REMATCH[2]=${BASH_REMATCH[4]}
    else
        echo "?"; return
    fi
    local rest=${BASH_REMATCH[2]}
    while [ -n "$rest" ]; do
        if [[ $rest =~ ^_lr([0-9]+(\.[0-9]+)?)(.*)$ ]]; then lr=${BASH_REMATCH[1]}; rest=${BASH_REMATCH[3]}
        elif [[ $rest =~ ^_m([0-9]+(\.[0-9]+)?)(.*)$ ]]; then m=${BASH_REMATCH[1]}; rest=${BASH_REMATCH[3]}
        elif [[ $rest =~ ^_int8(.*)$ ]]; then wire=int8; rest=${BASH_REMATCH[1]}
        else echo "?"; return
        fi
    done
    echo "$f${lr:+ --outer-lr $lr}${m:+ --outer-momentum $m}${wire:+ --outer-wire $wire}"
}
# the flags scaling.py takes (the outer lr and momentum change the loss, not the time)
model_flags_of() { flags_of "$1" | sed 's/ --outer-lr [0-9.]*//; s/ --outer-momentum [0-9.]*//'; }
for r in $RUNS; do
    [ "$(flags_of "$r")" != "?" ] ||
        { echo "outer_hosts: unknown run '$r' (ddp, dilocoH, streaming, streaming_int8, streamHfFtT; + _lrX _mY _int8)" >&2; exit 2; }
done
. tests/lib.sh
bench_mpi_begin outer_hosts "$B" "$B/mpi/train_gpt"
BATCH=8
SEQ=64
T0=$(date +%s)
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
hosts_begin "outer_hosts bench" "${OUTER_HOSTS_PREFIX:-i26b}" "$NHOSTS"
port=$PORT0
# every rank: h1:R,h2:R[,h3:R]
ALL=$(for ((i = 1; i <= NHOSTS; i++)); do printf "%sh%d:%d" "$([ $i -gt 1 ] && echo ,)" $i "$RPH"; done)
OUT=$B/outer_hosts${TAG:+_$TAG}
SVG=bench/outer_hosts${TAG:+_$TAG}.svg
# shellcheck disable=SC2206
COMMON=(--data "$DATA" --steps "$STEPS" --batch "$BATCH" --seq "$SEQ" --eval-every "$EVAL_EVERY" --eval-batches 16
        --sample 0 --log-every 50 $MODEL)
# gpt LOG HOSTS [extra mpirun -x ... and trainer flags after --]: train_gpt across HOSTS
gpt() {
    local log=$1 hosts=$2 xs=()
    shift 2
    while [ $# -gt 0 ] && [ "$1" != -- ]; do xs+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    port=$((port + 1))
    hosts_mpirun "$hosts" 900 "$port" --mca btl tcp,self --mca btl_tcp_if_include eth0 -x OPENBLAS_NUM_THREADS=1 "${xs[@]}" \
        "$B/mpi/train_gpt" "${COMMON[@]}" "$@" >"$log" 2>&1 ||
        { echo "train_gpt on $hosts failed ($*): $(tail -n 5 "$log")" >&2; exit 1; }
}
gbps() { case $1 in *gbit) echo "${1%gbit}" ;; *mbit) awk -v m="${1%mbit}" 'BEGIN { print m / 1000 }' ;; esac; }
# "WALL_S VAL_LOSS SYNCS" of a log (wall: the training without the validations)
summary() {
    local wall val syncs
    wall=$(sed -n 's/.*done: step [0-9]* | val loss [0-9.]* | [0-9.]* s training | \([0-9.]*\) s without the validations.*/\1/p' "$1")
    val=$(sed -n 's/.*done: step [0-9]* | val loss \([0-9.]*\).*/\1/p' "$1")
    syncs=$(grep -c "outer step .*merged fragment" "$1")
    echo "${wall:-nan} ${val:-nan} $syncs"
}
# "EXCHANGE_MS STRAGGLER_MS WAITED_MS" of a log: DDP: the mean allreduce time of a step (its log
# lines' comm) and its exposed wait x the steps; diloco: the mean exchange of a merge and their sum
# (a delay of 0 blocks the step for it); streaming: the mean exchange and what the steps waited for
# them in all; groups of several ranks add the inner steps' exposed wait (its mean x the steps).
comm_of() {
    case $2 in
    ddp) awk '/^(\[rank 0\] )?step +[0-9]+\/[0-9]+ \|/ { n = $0; sub(/^(\[rank 0\] )?step +/, "", n); sub(/\/.*/, "", n); if (n + 0 > 1) {
                  match($0, /comm [0-9.]+/); c += substr($0, RSTART + 5, RLENGTH - 5)
                  match($0, /exposed [0-9.]+/); e += substr($0, RSTART + 8, RLENGTH - 8); k++ } }
              END { if (k) printf "%.1f - %.1f\n", c / k, e / k * s; else print "nan - nan" }' s="$3" "$1" ;;
    *) awk '/^(\[rank 0\] )?step +[0-9]+\/[0-9]+ \|/ && match($0, /exposed [0-9.]+/) { n = $0; sub(/^(\[rank 0\] )?step +/, "", n); sub(/\/.*/, "", n)
                # groups of several ranks: the exposed DDP wait of the inner steps inside the group
                if (n + 0 > 1) { ie += substr($0, RSTART + 8, RLENGTH - 8); ik++ } }
            /outer step .*merged fragment/ { match($0, /exchange [0-9.]+/); x += substr($0, RSTART + 9, RLENGTH - 9); k++
                # rank 0 waited at the barrier of the exchange where the other group arrived last
                if (match($0, /last at the exchange: group [1-9][0-9]*, \+[0-9.]+/)) { l = substr($0, RSTART, RLENGTH); sub(/.*\+/, "", l); sw += l } }
            /waited for exchanges/ { match($0, /waited for exchanges [0-9.]+/); w = substr($0, RSTART + 21, RLENGTH - 21) }
            END { if (!k) { print "nan - nan"; exit } printf "%.1f %.0f %.1f\n", x / k, sw / k, (d ? w : x) + (ik ? ie / ik * s : 0) }' \
            s="$3" d="$(case " $(flags_of "$2") " in *" --outer streaming "*) echo 1 ;; *) echo 0 ;; esac)" "$1" ;;
    esac
}
# the val curve of a log: "SECONDS LOSS" lines (the last one: the final evaluation at the run's wall time)
curve() {
    sed -n 's/.*step *[0-9]* | val loss \([0-9.]*\) | \([0-9.]*\) s training$/\2 \1/p' "$1"
    read -r w v _ < <(summary "$1")
    echo "$w $v"
}

# ---- the bases, on unshaped links
echo "== one rank alone on h1 ($STEPS steps)"
gpt "$tmp/one.log" h1:1 -- ; read -r one_wall one_val _ < <(summary "$tmp/one.log")
one_tps=$(awk -v w="$one_wall" -v s="$STEPS" -v b=$BATCH -v t=$SEQ 'BEGIN { printf "%.0f", s * b * t / w }')
one_ms=$(awk -v w="$one_wall" -v s="$STEPS" 'BEGIN { printf "%.2f", 1000 * w / s }')
echo "one host: $one_wall s, $one_tps tokens/s, $one_ms ms a step, val loss $one_val"
curve "$tmp/one.log" >"$tmp/curve_one.txt"
echo "== DDP on $ALL, unshaped, with DDP_TIMELINE (the model's base)"
gpt "$tmp/base.log" "$ALL" -x DDP_TIMELINE="$tmp/base.json" -- --steps "$BASE_STEPS" --eval-every 0 --log-every 1000
base_line=$(python3 tools/scaling.py "$tmp/base.json" --algo flat --inter-gbps 1 --ranks 1 -o /dev/null | grep '^# measured')
echo "$base_line"

rows=$tmp/rows.md
: >"$rows"
: >"$tmp/curves.txt"
for rate in $RATES; do
    "$H" down >/dev/null 2>&1
    "$H" up "$NHOSTS" --rate "$rate" >"$tmp/up.log" 2>&1 || { echo "hosts up failed: $(cat "$tmp/up.log")"; exit 1; }
    A1=$("$H" addr h1)
    G=$(gbps "$rate")
    ddp_val=""
    runs=$RUNS
    case " $INT8_AT " in *" $rate "*) case " $runs " in *" streaming_int8 "*) ;; *) runs="$runs streaming_int8" ;; esac ;; esac
    for run in $runs; do
        # shellcheck disable=SC2046
        gpt "$tmp/$rate-$run.log" "$ALL" -- $(flags_of "$run")
        read -r wall val syncs < <(summary "$tmp/$rate-$run.log")
        [ "$run" = ddp ] && ddp_val=$val
        # shellcheck disable=SC2046
        load=$(cut -d' ' -f1 /proc/loadavg)
        read -r xm xw waited < <(comm_of "$tmp/$rate-$run.log" "$run" "$STEPS")
        # the model: "C STEP EXCHANGE" (C: its step on 1 rank, the base's compute; EXCHANGE: DDP's
        # allreduces of a step, or the outer exchange of a sync or fragment)
        # shellcheck disable=SC2046
        read -r pc pred px < <(python3 tools/scaling.py "$tmp/base.json" --algo ring --ranks-per-node "$RPH" --nics-per-node 1 \
            --inter-gbps "$G" --inter-latency-us 50 --intra-gbps 40 --intra-latency-us 5 --ranks "1,$NRANKS" $(model_flags_of "$run") \
            $([ "$run" = ddp ] || [ "$RPH" -gt 1 ] || echo --outer-exchange allgather) -o /dev/null |
            awk -v o="$([ "$run" = ddp ] && echo 0 || echo 1)" -v n="$NRANKS" '$1 == 1 { c = $2 } $1 == n { print c, (o ? $6 : $2), (o ? $7 : $3) }')
        line=$(awk -v run="$run" -v rate="$rate" -v w="$wall" -v s="$STEPS" -v b=$BATCH -v t=$SEQ -v one="$one_tps" -v onems="$one_ms" -v n="$NRANKS" \
            -v val="$val" -v dv="${ddp_val:-}" -v p="$pred" -v pc="$pc" -v px="$px" -v xm="$xm" -v xw="$xw" -v waited="$waited" \
            -v syncs="$syncs" -v load="$load" 'BEGIN {
                ms = 1000 * w / s; tps = n * s * b * t / w; eff = 100 * tps / (n * one)
                peff = 100 * onems / p; err = 100 * (p - ms) / ms
                # B: this run'"'"'s own compute (its wall less the communication it waited for) + the model'"'"'s communication
                pb = (1000 * w - waited) / s + (p - pc); errb = 100 * (pb - ms) / ms
                dval = (dv != "" && run != "ddp") ? sprintf("%+.1f %%", 100 * (val - dv) / dv) : "-"
                xs = xw == "-" ? xm : sprintf("%s (%s waiting)", xm, xw)
                own = 100 * (1000 * w - waited) / (1000 * w)
                printf "| %s | %s | %s | %s | %.1f | %.0f | %.1f %% | %.1f %% | %s | %s | %s / %.1f | %.1f, %.1f %% (%+.0f %%) | %.1f (%+.0f %%) |\n",
                    rate, run, syncs, load, w, tps, eff, own, val, dval, xs, px, p * s / 1000, peff, err, pb * s / 1000, errb }')
        echo "$line"
        echo "$line" >>"$rows"
        curve "$tmp/$rate-$run.log" | sed "s/^/$rate $run /" >>"$tmp/curves.txt"
    done
done
"$H" down >/dev/null 2>&1
T1=$(date +%s)
# the logs, the base trace and the curves stay in BUILD_DIR/outer_hosts/ (ignored by git)
mkdir -p "$OUT" && cp "$tmp"/*.log "$tmp"/base.json "$tmp"/curve_one.txt "$OUT/" 2>/dev/null
sed "s/^/one one /" "$tmp/curve_one.txt" >>"$tmp/curves.txt"
cp "$tmp/curves.txt" "$OUT/"
SHAPE=${MODEL:-the tiny GPT}
python3 bench/outer_svg.py "$tmp/curves.txt" "$SVG" \
    "Validation loss against wall-clock: $SHAPE on $NHOSTS hosts x $RPH rank(s), $STEPS steps, same tokens" || exit 1

out=$tmp/section.md
GB=$(echo "$base_line" | grep -o '[0-9.]* MB of gradients' | head -n 1)
{
    if [ -z "$TAG" ]; then
        echo "## Issue 26: across slow links (DDP, DiLoCo, streaming DiLoCo on $NHOSTS namespace hosts)"
    else
        echo "### Issue 26, $TAG: $NHOSTS hosts x $RPH rank(s)${MODEL:+, $MODEL}"
    fi
    echo
    echo "\`$CMDLINE\` on $(date -u +%Y-%m-%d), $(getconf _NPROCESSORS_ONLN) CPUs ($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n 1))"
    echo "shared by every host and by other jobs on the machine (load average $LOAD0 at the start, $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "at the end; $((T1 - T0)) s in all). $NHOSTS hosts x $RPH rank(s) = $NRANKS ranks (mpirun, MPI backend, btl tcp), links shaped by tbf both"
    echo "ways (tools/hosts.sh: no latency added); OpenBLAS 1 thread a rank. The GPT (${MODEL:-4 layers, width 128},"
    echo "context $SEQ, batch $BATCH a rank, ${GB:-? MB of gradients} in fp32) on $(basename "$DATA"), $STEPS steps of $NRANKS x $BATCH x $SEQ"
    echo "tokens for every run across the hosts (the same token budget), AdamW lr 1e-3 cosine to 1e-4, warmup 100;"
    echo "validation: 16 x $NRANKS x $BATCH fixed windows every $EVAL_EVERY steps and at the end. Outer runs: groups of $RPH rank(s)"
    echo "(each host a replica$([ "$RPH" -gt 1 ] && echo ": DDP inside it over the host's shared memory")). The runs' names give their settings:"
    echo "dilocoH: --outer diloco --inner-steps H; streamHfFtT: --outer streaming --inner-steps H --fragments F --outer-delay T;"
    echo "streaming: stream50f5t5; then _lrX: outer lr X (else 0.7), _mY: outer Nesterov momentum Y (else 0.9), _int8: int8"
    echo "blockwise outer gradients (else bf16)."
    echo
    echo "One rank alone on h1 (unshaped): $one_wall s for $STEPS steps of $BATCH x $SEQ tokens, $one_tps tokens/s"
    echo "($one_ms ms a step), final validation loss $one_val (1/$NRANKS of the tokens of the other runs)."
    echo "The model's base (DDP on $ALL unshaped, $BASE_STEPS steps, DDP_TIMELINE): ${base_line#\# }."
    echo
    echo "Wall: training seconds (validations left out). Efficiency: tokens/s over $NRANKS x one rank's (one rank"
    echo "measured once, at the start: on a loaded machine it can land above 100 %). Compute share: the"
    echo "run's wall less what it waited for communication (its log), over its wall: the efficiency"
    echo "against its own compute, which the load moves far less."
    echo "Merges: fragments merged (DiLoCo: outer steps). Load: the machine's 1-minute load average at the"
    echo "run's end ($(getconf _NPROCESSORS_ONLN) CPUs; above that the ranks' compute waits for other jobs). vs DDP: the final validation"
    echo "loss against DDP's at the same link. Exchange: DDP's allreduces of a step (the log's comm), the"
    echo "outer exchange of a sync or fragment (the log's exchange: from the barrier that starts it to its"
    echo "end; in brackets: what rank 0 waited there for another host, its straggler), measured / the"
    echo "model's. The model: tools/scaling.py from the base trace, \`--algo ring --ranks-per-node $RPH"
    echo "--inter-gbps RATE --inter-latency-us 50 --intra-gbps 40 --intra-latency-us 5 --ranks $NRANKS\` (+ \`--outer MODE"
    echo "--group-size $RPH --inner-steps H ...$([ "$RPH" = 1 ] && echo " --outer-exchange allgather")\`). A: its step x $STEPS, and the efficiency against one"
    echo "rank's measured step (error: A's wall against the measured one). B: the run's own compute (its wall less what it"
    echo "waited for communication, from its log) plus the model's communication: only the model of the"
    echo "communication is tested."
    echo
    echo "| link | run | merges | load | wall s | tokens/s | efficiency | compute share | final val loss | vs DDP | exchange ms | A: wall s, efficiency (error) | B: wall s (error) |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    cat "$rows"
    echo
    echo "![validation loss against wall-clock]($(basename "$SVG"))"
} >"$out"
cat "$out"
if [ $WRITE = 1 ]; then
    python3 - "$out" "outer-hosts${TAG:+-$TAG}" <<'PY'
import re, sys
new = open(sys.argv[1]).read().rstrip() + "\n"
mark = sys.argv[2]
path = "bench/RESULTS.md"
text = open(path).read()
block = "<!-- %s:begin -->\n" % mark + new + "<!-- %s:end -->" % mark
if "<!-- %s:begin -->" % mark in text:
    text = re.sub(r"<!-- %s:begin -->.*?<!-- %s:end -->" % (mark, mark), lambda m: block, text, flags=re.S)
else:
    text = text.rstrip() + "\n\n" + block + "\n"
open(path, "w").write(text)
PY
fi
