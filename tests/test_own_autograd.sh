#!/usr/bin/env bash
# test_own_autograd.sh — examples/own_autograd.c (hand-written backward, no tape, all parameters
# in one buffer, its own optimizer): 2 ranks at batch 4 train the model 1 rank trains at batch 8
# (every step's loss and the final parameters, to float32 rounding), with gradient accumulation,
# with a stacked tensor registered whole, and with ddp_adamw_step; the ranks end bit-identical;
# the same built with -Ofast (fast math).
# Also the launcher's lines: no "[rank 0] rank 0: ..." twice, and DDP_LOG=debug quiet about rank
# 0's store on a clean exit. Usage: tests/test_own_autograd.sh [BUILD_DIR]
set -u
B=${1:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
EX="$B/own_autograd"
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }

# compare NAME REF_OUT REF_PARAMS OUT PARAMS: per-step losses and parameters within rounding
compare() {
    python3 - "$@" <<'PY'
import re, struct, sys
name, ro, rp, o, p = sys.argv[1:6]
def losses(f): return [float(x) for x in re.findall(r"step \d+ loss (\S+)", open(f).read())]
def params(f):
    b = open(f, "rb").read(); return struct.unpack("<%df" % (len(b) // 4), b)
a, b = losses(ro), losses(o)
pa, pb = params(rp), params(p)
why = []
if len(a) == 0 or len(a) != len(b): why.append("steps %d vs %d" % (len(a), len(b)))
else:
    worst = max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b))
    if worst > 1e-5: why.append("loss differs by %.3g relative" % worst)
if len(pa) != len(pb) or not pa: why.append("parameter files %d vs %d floats" % (len(pa), len(pb)))
else:
    scale = max(abs(x) for x in pa)
    dmax = max(abs(x - y) for x, y in zip(pa, pb))
    if dmax > 1e-5 * scale: why.append("parameters differ by %.3g (max |p| %.3g)" % (dmax, scale))
if "replicas identical: yes" not in open(o).read(): why.append("ranks not bit-identical")
if why: print("FAIL %s: %s" % (name, "; ".join(why)))
else: print("PASS %s (loss %.7f after %d steps, max parameter difference %.2g)" % (name, b[-1], len(b), dmax))
PY
}

timeout 120 "$EX" --batch 8 --save "$tmp/p1" >"$tmp/o1" 2>&1 || fail own_autograd_one_rank "$(tail -n 3 "$tmp/o1")"
timeout 120 "$B/ddprun" -n 2 "$EX" --batch 4 --save "$tmp/p2" >"$tmp/o2" 2>&1 || fail own_autograd_two_ranks "$(tail -n 3 "$tmp/o2")"
compare own_autograd_2_ranks_batch_4_equals_1_rank_batch_8 "$tmp/o1" "$tmp/p1" "$tmp/o2" "$tmp/p2"
timeout 120 "$B/ddprun" -n 2 "$EX" --batch 4 --accum 2 --layout stacked --save "$tmp/p3" >"$tmp/o3" 2>&1 ||
    fail own_autograd_accum_stacked "$(tail -n 3 "$tmp/o3")"
compare own_autograd_2_ranks_accumulating_stacked_equals_1_rank "$tmp/o1" "$tmp/p1" "$tmp/o3" "$tmp/p3"
timeout 120 "$EX" --batch 8 --adamw --save "$tmp/p4" >"$tmp/o4" 2>&1 || fail own_autograd_adamw_one_rank "$(tail -n 3 "$tmp/o4")"
timeout 120 "$B/ddprun" -n 2 "$EX" --batch 4 --adamw --save "$tmp/p5" >"$tmp/o5" 2>&1 || fail own_autograd_adamw "$(tail -n 3 "$tmp/o5")"
compare own_autograd_adamw_2_ranks_equals_1_rank "$tmp/o4" "$tmp/p4" "$tmp/o5" "$tmp/p5"
# built with -Ofast (fast math): still 2 ranks = 1 rank to rounding, replicas bit-identical
if [ -x "$B/own_autograd_fastmath" ]; then
    timeout 120 "$B/own_autograd_fastmath" --batch 8 --save "$tmp/p6" >"$tmp/o6" 2>&1 || fail own_autograd_fastmath_one_rank "$(tail -n 3 "$tmp/o6")"
    timeout 120 "$B/ddprun" -n 2 "$B/own_autograd_fastmath" --batch 4 --accum 2 --save "$tmp/p7" >"$tmp/o7" 2>&1 ||
        fail own_autograd_fastmath_two_ranks "$(tail -n 3 "$tmp/o7")"
    compare own_autograd_ofast_2_ranks_equals_1_rank "$tmp/o6" "$tmp/p6" "$tmp/o7" "$tmp/p7"
    timeout 120 "$B/own_autograd_fastmath" --batch 8 --adamw --save "$tmp/p8" >"$tmp/o8" 2>&1 || fail own_autograd_fastmath_adamw "$(tail -n 3 "$tmp/o8")"
    timeout 120 "$B/ddprun" -n 2 "$B/own_autograd_fastmath" --batch 4 --adamw --save "$tmp/p9" >"$tmp/o9" 2>&1 ||
        fail own_autograd_fastmath_adamw_two_ranks "$(tail -n 3 "$tmp/o9")"
    compare own_autograd_ofast_adamw_2_ranks_equals_1_rank "$tmp/o8" "$tmp/p8" "$tmp/o9" "$tmp/p9"
else echo "SKIP own_autograd_ofast_2_ranks_equals_1_rank: $B/own_autograd_fastmath not built"; fi
# the loss went down (the example trains)
python3 - "$tmp/o1" <<'PY'
import re, sys
l = [float(x) for x in re.findall(r"step \d+ loss (\S+)", open(sys.argv[1]).read())]
first, last = sum(l[:5]) / 5, sum(l[-5:]) / 5
print(("PASS own_autograd_trains (mean loss %.3f -> %.3f)" if last < 0.8 * first else "FAIL own_autograd_trains: mean loss %.3f -> %.3f") % (first, last))
PY

# ddprun: a rank's own "rank R: " is not repeated after the "[rank R] " prefix
"$B/ddprun" -n 2 sh -c 'echo "rank $RANK: the message" >&2; echo "ddp rank $RANK warning: w" >&2; echo "rank 9: kept" >&2' >"$tmp/px" 2>&1
if grep -q '^\[rank 0\] the message$' "$tmp/px" && grep -q '^\[rank 1\] ddp warning: w$' "$tmp/px" &&
   grep -q '^\[rank 1\] rank 9: kept$' "$tmp/px" && ! grep -q '\] rank [01]: ' "$tmp/px"; then
    pass ddprun_no_double_rank_prefix
else fail ddprun_no_double_rank_prefix "$(tr '\n' '|' <"$tmp/px")"; fi
# DDP_LOG=debug on a clean 2-rank run: no lost store, no "failed or exited" (5 runs: it was a race)
bad=0
for i in 1 2 3 4 5; do
    DDP_LOG=debug timeout 60 "$B/ddprun" -n 2 "$EX" --steps 2 >"$tmp/dbg" 2>&1 || bad=1
    grep -qi 'failed or exited\|lost the connection' "$tmp/dbg" && bad=1
done
if [ $bad = 0 ]; then pass debug_log_clean_exit_says_no_failure
else fail debug_log_clean_exit_says_no_failure "$(grep -i 'failed or exited\|lost' "$tmp/dbg" | head -n 2)"; fi
