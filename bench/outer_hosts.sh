#!/usr/bin/env bash
# outer_hosts.sh — DDP against DiLoCo and streaming DiLoCo across slow links (issue 26): the tiny
# GPT on 2 namespace hosts (tools/hosts.sh) x 1 rank, the MPI backend (build/mpi/train_gpt under
# mpirun), links shaped by tbf to each --rates value, every run trained to the same token budget.
#
#   bench/outer_hosts.sh [BUILD_DIR] [--rates "100mbit 1gbit"] [--steps 400] [--runs "..."]
#                        [--int8-at "100mbit"] [--eval-every 50] [--no-write]
#
# Runs (--runs picks among them, in this order): ddp (--outer off: every step averages the
# gradients across the link), diloco10, diloco50, diloco200 (--outer diloco --inner-steps H, bf16
# outer gradients, outer lr 0.7 momentum 0.9), streaming (--outer streaming --inner-steps 50
# --fragments 5 --outer-delay 5, bf16); and at the rates --int8-at names, streaming_int8 (the
# same, int8 blockwise: its effect on the loss, where the bytes matter most). Groups of one
# rank: each host is a replica. First, on unshaped links: one host alone (1 rank: the base of
# the scaling efficiency and of the loss per wall-clock second) and a short DDP run on both with
# DDP_TIMELINE (the base the scaling model predicts from: compute and bucket readiness).
# Each run: wall-clock (training, validations left out), tokens/s (2 x batch x seq a step),
# scaling efficiency = tokens/s / (2 x one host's tokens/s), the final validation loss, and
# tools/scaling.py's prediction of the step (ring, 1 rank a node, the link's rate, 50 us latency;
# --outer MODE --group-size 1 ... for the outer runs) beside the measured step.
# Results: a table per rate and bench/outer_hosts.svg (validation loss against wall-clock);
# they replace the section between <!-- outer-hosts:begin --> and <!-- outer-hosts:end --> of
# bench/RESULTS.md (unless --no-write); the logs, the base trace and the curves stay in
# BUILD_DIR/outer_hosts/. A SKIP line where mpirun, mpicc or the namespaces are
# missing. DDP_HOSTS_PREFIX: OUTER_HOSTS_PREFIX (default i26b) + this shell's pid.
set -u
cd "$(dirname "$0")/.." || exit 1
B=build
[ $# -gt 0 ] && [ "${1#-}" = "$1" ] && { B=$1; shift; }
RATES="100mbit 1gbit"
INT8_AT="100mbit"
STEPS=400
EVAL_EVERY=50
RUNS="ddp diloco10 diloco50 diloco200 streaming"
WRITE=1
CMDLINE="bench/outer_hosts.sh${*:+ $*}"
while [ $# -gt 0 ]; do
    case $1 in
    --rates) RATES=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --int8-at) INT8_AT=$2; shift 2 ;;
    --eval-every) EVAL_EVERY=$2; shift 2 ;;
    --no-write) WRITE=0; shift ;;
    *) echo "usage: $0 [BUILD_DIR] [--rates R] [--steps N] [--runs \"ddp diloco10 ...\"] [--int8-at \"RATES\"] [--eval-every N] [--no-write]" >&2; exit 2 ;;
    esac
done
for r in $RUNS; do
    case $r in ddp | diloco10 | diloco50 | diloco200 | streaming | streaming_int8) ;;
    *) echo "outer_hosts: unknown run '$r' (ddp diloco10 diloco50 diloco200 streaming streaming_int8)" >&2; exit 2 ;;
    esac
done
. tests/lib.sh
command -v mpirun >/dev/null || { echo "SKIP outer_hosts bench: no mpirun"; exit 0; }
[ -n "$(command -v mpicc)" ] || { echo "SKIP outer_hosts bench: no mpicc"; exit 0; }
make --no-print-directory B="$B" "$B/mpi/train_gpt" "$B/fortunes.txt" >/dev/null || exit 1
DATA=../shared/data/tinyshakespeare.txt
[ -f "$DATA" ] || DATA=$B/fortunes.txt
BATCH=8
SEQ=64
T0=$(date +%s)
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
hosts_begin "outer_hosts bench" "${OUTER_HOSTS_PREFIX:-i26b}" 2
port=32600
COMMON=(--data "$DATA" --steps "$STEPS" --batch "$BATCH" --seq "$SEQ" --eval-every "$EVAL_EVERY" --eval-batches 16
        --sample 0 --log-every 50)
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
# the trainer's flags for a run (scaling.py takes the same names)
flags_of() {
    case $1 in
    ddp) ;;
    diloco*) echo "--outer diloco --group-size 1 --inner-steps ${1#diloco}" ;;
    streaming) echo "--outer streaming --group-size 1 --inner-steps 50 --fragments 5 --outer-delay 5" ;;
    streaming_int8) echo "--outer streaming --group-size 1 --inner-steps 50 --fragments 5 --outer-delay 5 --outer-wire int8" ;;
    esac
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
# "EXCHANGE_MS WAITED_MS" of a log: DDP: the mean allreduce time of a step (its log lines' comm) and
# its exposed wait x the steps; diloco: the mean exchange of a merge and their sum (a delay of 0
# blocks the step for it); streaming: the mean exchange and what the steps waited for them in all.
comm_of() {
    case $2 in
    ddp) awk '/^(\[rank 0\] )?step +[0-9]+\/[0-9]+ \|/ { n = $0; sub(/^(\[rank 0\] )?step +/, "", n); sub(/\/.*/, "", n); if (n + 0 > 1) {
                  match($0, /comm [0-9.]+/); c += substr($0, RSTART + 5, RLENGTH - 5)
                  match($0, /exposed [0-9.]+/); e += substr($0, RSTART + 8, RLENGTH - 8); k++ } }
              END { if (k) printf "%.1f - %.1f\n", c / k, e / k * s; else print "nan - nan" }' s="$3" "$1" ;;
    *) awk '/outer step .*merged fragment/ { match($0, /exchange [0-9.]+/); x += substr($0, RSTART + 9, RLENGTH - 9); k++
                # rank 0 waited at the barrier of the exchange where the other group arrived last
                if (match($0, /last at the exchange: group [1-9][0-9]*, \+[0-9.]+/)) { l = substr($0, RSTART, RLENGTH); sub(/.*\+/, "", l); sw += l } }
            /waited for exchanges/ { match($0, /waited for exchanges [0-9.]+/); w = substr($0, RSTART + 21, RLENGTH - 21) }
            END { if (!k) { print "nan - nan"; exit } printf "%.1f %.0f %.1f\n", x / k, sw / k, (d ? w : x) }' d="$([ "${2#streaming}" != "$2" ] && echo 1 || echo 0)" "$1" ;;
    esac
}
# the val curve of a log: "SECONDS LOSS" lines (the last one: the final evaluation at the run's wall time)
curve() {
    sed -n 's/.*step *[0-9]* | val loss \([0-9.]*\) | \([0-9.]*\) s training$/\2 \1/p' "$1"
    read -r w v _ < <(summary "$1")
    echo "$w $v"
}

# ---- the bases, on unshaped links
echo "== one host alone ($STEPS steps)"
gpt "$tmp/one.log" h1:1 -- ; read -r one_wall one_val _ < <(summary "$tmp/one.log")
one_tps=$(awk -v w="$one_wall" -v s="$STEPS" -v b=$BATCH -v t=$SEQ 'BEGIN { printf "%.0f", s * b * t / w }')
one_ms=$(awk -v w="$one_wall" -v s="$STEPS" 'BEGIN { printf "%.2f", 1000 * w / s }')
echo "one host: $one_wall s, $one_tps tokens/s, $one_ms ms a step, val loss $one_val"
curve "$tmp/one.log" >"$tmp/curve_one.txt"
echo "== DDP on 2 unshaped hosts with DDP_TIMELINE (the model's base)"
gpt "$tmp/base.log" h1:1,h2:1 -x DDP_TIMELINE="$tmp/base.json" -- --steps 60 --eval-every 0 --log-every 1000
base_line=$(python3 tools/scaling.py "$tmp/base.json" --algo flat --inter-gbps 1 --ranks 1 -o /dev/null | grep '^# measured')
echo "$base_line"

rows=$tmp/rows.md
: >"$rows"
: >"$tmp/curves.txt"
for rate in $RATES; do
    "$H" down >/dev/null 2>&1
    "$H" up 2 --rate "$rate" >"$tmp/up.log" 2>&1 || { echo "hosts up failed: $(cat "$tmp/up.log")"; exit 1; }
    A1=$("$H" addr h1)
    G=$(gbps "$rate")
    ddp_val=""
    runs=$RUNS
    case " $INT8_AT " in *" $rate "*) case " $runs " in *" streaming_int8 "*) ;; *) runs="$runs streaming_int8" ;; esac ;; esac
    for run in $runs; do
        # shellcheck disable=SC2046
        gpt "$tmp/$rate-$run.log" h1:1,h2:1 -- $(flags_of "$run")
        read -r wall val syncs < <(summary "$tmp/$rate-$run.log")
        [ "$run" = ddp ] && ddp_val=$val
        # shellcheck disable=SC2046
        load=$(cut -d' ' -f1 /proc/loadavg)
        read -r xm xw waited < <(comm_of "$tmp/$rate-$run.log" "$run" "$STEPS")
        # the model: "C STEP EXCHANGE" (C: its step on 1 rank, the base's compute; EXCHANGE: DDP's
        # allreduces of a step, or the outer exchange of a sync or fragment)
        # shellcheck disable=SC2046
        read -r pc pred px < <(python3 tools/scaling.py "$tmp/base.json" --algo ring --ranks-per-node 1 --nics-per-node 1 \
            --inter-gbps "$G" --inter-latency-us 50 --ranks 1,2 $(flags_of "$run") \
            $([ "$run" = ddp ] || echo --outer-exchange allgather) -o /dev/null |
            awk -v o="$([ "$run" = ddp ] && echo 0 || echo 1)" '$1 == 1 { c = $2 } $1 == 2 { print c, (o ? $6 : $2), (o ? $7 : $3) }')
        line=$(awk -v run="$run" -v rate="$rate" -v w="$wall" -v s="$STEPS" -v b=$BATCH -v t=$SEQ -v one="$one_tps" -v onems="$one_ms" \
            -v val="$val" -v dv="${ddp_val:-}" -v p="$pred" -v pc="$pc" -v px="$px" -v xm="$xm" -v xw="$xw" -v waited="$waited" \
            -v syncs="$syncs" -v load="$load" 'BEGIN {
                ms = 1000 * w / s; tps = 2 * s * b * t / w; eff = 100 * tps / (2 * one)
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
mkdir -p "$B/outer_hosts" && cp "$tmp"/*.log "$tmp"/base.json "$tmp"/curve_one.txt "$B/outer_hosts/" 2>/dev/null
sed "s/^/one one /" "$tmp/curve_one.txt" >>"$tmp/curves.txt"
cp "$tmp/curves.txt" "$B/outer_hosts/"
python3 bench/outer_svg.py "$tmp/curves.txt" bench/outer_hosts.svg \
    "Validation loss against wall-clock: the tiny GPT on 2 hosts x 1 rank, $STEPS steps, same tokens" || exit 1

out=$tmp/section.md
{
    echo "## Issue 26: across slow links (DDP, DiLoCo, streaming DiLoCo on 2 namespace hosts)"
    echo
    echo "\`$CMDLINE\` on $(date -u +%Y-%m-%d), $(getconf _NPROCESSORS_ONLN) CPUs ($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n 1))"
    echo "shared by both hosts and by other jobs on the machine (load average $LOAD0 at the start, $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "at the end; $((T1 - T0)) s in all). 2 hosts x 1 rank (mpirun, MPI backend, btl tcp), links shaped by tbf both"
    echo "ways (tools/hosts.sh: no latency added); OpenBLAS 1 thread a rank. The tiny GPT (4 layers, width 128,"
    echo "context $SEQ, batch $BATCH a rank, 3.34 MB of fp32 gradients) on $(basename "$DATA"), $STEPS steps of 2 x $BATCH x $SEQ"
    echo "tokens for every 2-host run (the same token budget), AdamW lr 1e-3 cosine to 1e-4, warmup 100;"
    echo "validation: 16 x 2 x $BATCH fixed windows every $EVAL_EVERY steps and at the end. Outer runs: groups of 1 rank"
    echo "(each host a replica), outer Nesterov lr 0.7, momentum 0.9; bf16 outer gradients unless int8."
    echo "streaming: --inner-steps 50 --fragments 5 --outer-delay 5 (a fifth of the model every 10 steps)."
    echo
    echo "One host alone (1 rank, unshaped): $one_wall s for $STEPS steps of $BATCH x $SEQ tokens, $one_tps tokens/s"
    echo "($one_ms ms a step), final validation loss $one_val (half the tokens of the 2-host runs)."
    echo "The model's base (DDP on 2 unshaped hosts, 60 steps, DDP_TIMELINE): ${base_line#\# }."
    echo
    echo "Wall: training seconds (validations left out). Efficiency: tokens/s over 2 x one host's (one host"
    echo "measured once, at the start: on a loaded machine it can land above 100 %). Compute share: the"
    echo "run's wall less what it waited for communication (its log), over its wall: the efficiency"
    echo "against its own compute, which the load moves far less."
    echo "Merges: fragments merged (DiLoCo: outer steps). Load: the machine's 1-minute load average at the"
    echo "run's end (2 CPUs; above 2 the ranks' compute waits for other jobs). vs DDP: the final validation"
    echo "loss against DDP's at the same link. Exchange: DDP's allreduces of a step (the log's comm), the"
    echo "outer exchange of a sync or fragment (the log's exchange: from the barrier that starts it to its"
    echo "end; in brackets: what rank 0 waited there for the other host, its straggler), measured / the"
    echo "model's. The model: tools/scaling.py from the base trace, \`--algo ring"
    echo "--ranks-per-node 1 --inter-gbps RATE --inter-latency-us 50 --ranks 2\` (+ \`--outer MODE --group-size 1"
    echo "--inner-steps H ...\`). A: its step x $STEPS, and the efficiency against one host's measured step"
    echo "(error: A's wall against the measured one). B: the run's own compute (its wall less what it"
    echo "waited for communication, from its log) plus the model's communication: only the model of the"
    echo "communication is tested."
    echo
    echo "| link | run | merges | load | wall s | tokens/s | efficiency | compute share | final val loss | vs DDP | exchange ms | A: wall s, efficiency (error) | B: wall s (error) |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    cat "$rows"
    echo
    echo "![validation loss against wall-clock](outer_hosts.svg)"
} >"$out"
cat "$out"
if [ $WRITE = 1 ]; then
    python3 - "$out" <<'PY'
import re, sys
new = open(sys.argv[1]).read().rstrip() + "\n"
path = "bench/RESULTS.md"
text = open(path).read()
block = "<!-- outer-hosts:begin -->\n" + new + "<!-- outer-hosts:end -->"
if "<!-- outer-hosts:begin -->" in text:
    text = re.sub(r"<!-- outer-hosts:begin -->.*?<!-- outer-hosts:end -->", lambda m: block, text, flags=re.S)
else:
    text = text.rstrip() + "\n\n" + block + "\n"
open(path, "w").write(text)
PY
fi
