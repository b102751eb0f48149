#!/usr/bin/env bash
# test_svg_tools.sh — tools/trace_svg.py, tools/sweep_svg.py and tools/scaling.py on synthetic input.
# One line per check, "PASS name" or "FAIL name: why"; exit status 1 if any check failed.
# Usage: tests/test_svg_tools.sh [--keep DIR]   (--keep: also copy the SVGs made into DIR)
set -u
cd "$(dirname "$0")/.." || exit 1
keep=
if [ "${1:-}" = "--keep" ]; then keep=${2:?--keep needs a directory}; fi

PY=python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0

pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); }
# check NAME COMMAND...: PASS when the command succeeds.
check() { local n=$1; shift; if "$@" >/dev/null 2>&1; then pass "$n"; else fail "$n" "${WHY:-'$*' failed}"; fi; WHY=; }
WHY=
# has NAME FILE STRING: the file contains STRING literally.
has() { WHY="'$3' not found in $(basename "$2")" check "$1" grep -qF -- "$3" "$2"; }
hasnt() { if grep -qF -- "$3" "$2"; then fail "$1" "'$3' found in $(basename "$2")"; else pass "$1"; fi; }
wellformed() { WHY="$(basename "$2") is not well-formed XML" check "$1" $PY -c 'import sys, xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])' "$2"; }
# bad NAME TOOL ARGS...: the tool exits with status 2 and says what is wrong on stderr.
bad() {
    local n=$1; shift
    "$PY" "$@" >"$tmp/bad.out" 2>"$tmp/bad.err"
    local rc=$?
    if [ "$rc" -ne 2 ]; then fail "$n" "exit status $rc, expected 2"
    elif ! grep -qE "^((trace|sweep)_svg(\.py)?|scaling): error: " "$tmp/bad.err"; then
        fail "$n" "no error message from the tool on stderr: $(head -c 200 "$tmp/bad.err")"
    else pass "$n"; fi
}

# ---------------------------------------------------------------- synthetic trace
# 2 ranks, steps 0-2 complete plus a step 3 cut off mid-backward (so the default must be step 2).
# Per rank and step, times in ms from the step's start:
#   load batch (cat "data", unknown) 0-1, forward 1-9, backward ops 5..0 back to back from 9 with
#   durations 6 5 7 8 6 9 (rank 1: op 0 takes 8), so backward ends at 50 (rank 1: 49).
#   Buckets 0-3 are ready after ops 5, 3, 1, 0. The comm thread starts each allreduce 0.05 ms
#   after max(ready, previous allreduce end); durations 2, 8, 9 and 3.5 + (2 - step) ms, and an
#   allreduce ends at the same time on both ranks (the collective waits for the later rank).
#   Step 2: b0 15.05-17.05, b1 27.05-35.05, b2 41.05-50.05, b3 50.10-53.60 (both ranks).
#   wait for comm: backward end -> 53.60: rank 0 3.60 ms, rank 1 4.60 ms; then a 3 us grad norm
#   (a sliver), adamw 4 ms. comm = 2 + 8 + 9 + 3.5 = 22.50 ms; overlap rank 0 = 1 - 3.6/22.5 =
#   84.0 %, rank 1 = 1 - 4.6/22.5 = 79.6 %. compute (forward + backward) = 8 + 41 = 49.00 ms
#   (rank 1: 48.00 ms). Step 1: b3 takes 4.5 ms, so exposed 4.60 / 5.60 ms.
cat >"$tmp/gen_trace.py" <<'EOF'
import json, sys
ev = []
for r in range(2):
    ev.append({"name": "process_name", "ph": "M", "pid": r, "args": {"name": "rank %d" % r}})
    ev.append({"name": "thread_name", "ph": "M", "pid": r, "tid": 0, "args": {"name": "compute"}})
    ev.append({"name": "thread_name", "ph": "M", "pid": r, "tid": 1, "args": {"name": "comm"}})
params = {5: "head.weight head.bias", 4: "fc2.bias", 3: "fc2.weight", 2: "fc1.bias",
          1: "fc1.weight", 0: "embed.weight"}
bucket_after = {5: 0, 3: 1, 1: 2, 0: 3}
ar_ms = [2.0, 8.0, 9.0, None]
US = 1000.0

def X(r, tid, name, cat, start, dur, step, **a):
    a["step"] = step
    ev.append({"name": name, "cat": cat, "ph": "X", "pid": r, "tid": tid,
               "ts": round(start * US, 3), "dur": round(dur * US, 3), "args": a})

for step in range(4):
    base = 1000.0 + 100.0 * step           # ms; rank clocks differ by 25 us
    ready = {0: {}, 1: {}}
    bw_end = {}
    for r in range(2):
        o = base + 0.025 * r
        X(r, 0, "load batch", "data", o + 0, 1, step)
        X(r, 0, "forward", "forward", o + 1, 8, step)
        t = 9.0
        for op, d in zip([5, 4, 3, 2, 1, 0], [6, 5, 7, 8, 6, 9 if r == 0 else 8]):
            if step == 3 and op == 2:
                break                       # the trace ends in the middle of step 3
            X(r, 0, "backward op %d" % op, "backward", o + t, d, step, params=params[op])
            t += d
            if op in bucket_after:
                b = bucket_after[op]
                ready[r][b] = t
                ev.append({"name": "bucket %d ready" % b, "cat": "ready", "ph": "i", "s": "t",
                           "pid": r, "tid": 0, "ts": round((o + t) * US, 3),
                           "args": {"step": step, "bucket": b}})
        bw_end[r] = t
    if step == 3:
        break
    prev = {0: 0.0, 1: 0.0}
    for b in range(4):
        dur = ar_ms[b] if ar_ms[b] is not None else 3.5 + (2 - step)
        starts = {r: max(ready[r][b], prev[r]) + 0.05 for r in range(2)}
        end = max(starts.values()) + dur
        for r in range(2):
            o = base + 0.025 * r
            X(r, 1, "allreduce bucket %d" % b, "comm", o + starts[r], end - starts[r], step,
              bucket=b, bytes=[262144, 4194304, 4718592, 1835008][b])
            prev[r] = end
    for r in range(2):
        o = base + 0.025 * r
        X(r, 0, "wait for comm", "exposed", o + bw_end[r], prev[r] - bw_end[r], step)
        X(r, 0, "grad norm", "optimizer", o + prev[r], 0.003, step)
        X(r, 0, "adamw", "optimizer", o + prev[r] + 0.003, 4.0, step)
        X(r, 2, "step", "step", o, prev[r] + 4.003, step)
json.dump({"displayTimeUnit": "ms", "traceEvents": ev}, sys.stdout)
EOF
$PY "$tmp/gen_trace.py" >"$tmp/trace.json" || { echo "FAIL generate trace: generator failed"; exit 1; }

# ---------------------------------------------------------------- trace_svg.py
T=tools/trace_svg.py
check "trace_svg is executable" test -x "$T"
check "sweep_svg is executable" test -x tools/sweep_svg.py

if $PY "$T" "$tmp/trace.json" -o "$tmp/trace.svg" >"$tmp/out" 2>"$tmp/err"; then
    pass "trace_svg exits 0"
else
    fail "trace_svg exits 0" "status $?: $(head -c 300 "$tmp/err")"
fi
S=$tmp/trace.svg
wellformed "trace_svg output is well-formed XML" "$S"
has "title names step 2 (last complete) and 2 ranks" "$S" "ddp.h step 2 — 2 ranks"
for r in 0 1; do
    has "lane label rank $r compute" "$S" ">rank $r compute<"
    has "lane label rank $r comm" "$S" ">rank $r comm<"
done
has "exposed label rank 0 (3.60 ms)" "$S" ">exposed 3.60 ms<"
has "exposed label rank 1 (4.60 ms)" "$S" ">exposed 4.60 ms<"
has "summary overlap rank 0 (84.0%)" "$S" ">overlap 84.0%<"
has "summary overlap rank 1 (79.6%)" "$S" ">overlap 79.6%<"
has "summary comm 22.50 ms" "$S" ">comm 22.50 ms<"
has "summary compute rank 0 (forward+backward 49.00 ms)" "$S" ">compute 49.00 ms<"
has "summary compute rank 1 (48.00 ms)" "$S" ">compute 48.00 ms<"
has "hatched exposed band" "$S" 'fill="url(#hatch)"'
has "ready marker labelled b3" "$S" ">b3<"
has "tooltip with args" "$S" "params: fc1.weight"
hasnt "events of other steps ignored (step 1)" "$S" ">exposed 5.60 ms<"
hasnt "events of other steps ignored (step 0)" "$S" ">exposed 6.60 ms<"
cat >"$tmp/rects.py" <<'EOF'
import sys, xml.dom.minidom
d = xml.dom.minidom.parse(sys.argv[1])
r = [e for e in d.getElementsByTagName("rect") if e.getAttribute("class").startswith("ev ")]
w = [float(e.getAttribute("width")) for e in r]
ok = len(r) == int(sys.argv[2]) and min(w) >= 1.0
print(len(r), min(w)); sys.exit(0 if ok else 1)
EOF
# per rank: load batch, forward, 6 backward, 4 allreduce, wait, grad norm, adamw = 15 boxes
WHY="expected 30 event boxes, each at least 1 px wide" check "30 event boxes, slivers at least 1 px" $PY "$tmp/rects.py" "$S" 30
has "unknown category drawn as other" "$S" 'class="ev cat-other"'

# A GPU trace (NCCL backend): the comm lane holds "backward (gpu)" and "exposed comm (gpu)" from
# the GPU's events; the host never waits, so the summary's exposed time is the GPU-side one.
cat >"$tmp/gen_gpu.py" <<'EOF'
import json, sys
ev = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "rank 0"}}]
def X(tid, name, cat, start, dur):
    ev.append({"name": name, "cat": cat, "ph": "X", "pid": 0, "tid": tid, "ts": start * 1e3,
               "dur": dur * 1e3, "args": {"step": 1}})
X(0, "forward", "forward", 0.0, 3.0)
X(0, "backward op 1", "backward", 3.0, 0.2)
X(1, "backward (gpu)", "gpu_backward", 3.1, 6.0)
X(1, "allreduce bucket 0", "comm", 5.0, 3.0)
X(1, "allreduce bucket 1", "comm", 8.2, 2.4)
X(1, "exposed comm (gpu)", "gpu_exposed", 9.1, 1.5)
X(2, "step", "step", 0.0, 11.0)
json.dump({"traceEvents": ev}, sys.stdout)
EOF
$PY "$tmp/gen_gpu.py" >"$tmp/gpu.json"
$PY "$T" "$tmp/gpu.json" -o "$tmp/gpu.svg" >/dev/null 2>"$tmp/err" || fail "GPU trace: trace_svg exits 0" "$(head -c 300 "$tmp/err")"
wellformed "GPU trace: well-formed XML" "$tmp/gpu.svg"
has "GPU trace: backward on the GPU has its own colour" "$tmp/gpu.svg" 'class="ev cat-gpu_backward"'
has "GPU trace: legend names backward on the GPU" "$tmp/gpu.svg" ">backward on the GPU<"
has "GPU trace: legend names exposed comm on the GPU" "$tmp/gpu.svg" ">exposed comm on the GPU<"
hasnt "GPU trace: no GPU span drawn as other" "$tmp/gpu.svg" 'class="ev cat-other"'
has "GPU trace: the GPU's exposed span labelled (1.50 ms)" "$tmp/gpu.svg" ">exposed 1.50 ms<"
has "GPU trace: summary overlap from the GPU's exposed time (1 - 1.5/5.4)" "$tmp/gpu.svg" ">overlap 72.2%<"

$PY "$T" "$tmp/trace.json" --step 1 -o "$tmp/step1.svg" >/dev/null 2>&1
has "--step 1: rank 1 exposed 5.60 ms" "$tmp/step1.svg" ">exposed 5.60 ms<"
hasnt "--step 1: no step-2 numbers" "$tmp/step1.svg" ">exposed 3.60 ms<"
has "--step 1: title" "$tmp/step1.svg" "ddp.h step 1 — 2 ranks"

cp "$tmp/trace.json" "$tmp/copy.json"
$PY "$T" "$tmp/copy.json" --width 700 --title 'custom <title> & "quotes"' >/dev/null 2>&1
check "default output is TRACE.svg" test -s "$tmp/copy.svg"
wellformed "escaped custom title is well-formed" "$tmp/copy.svg"
has "custom title escaped" "$tmp/copy.svg" "custom &lt;title&gt; &amp; &quot;quotes&quot;"
check "--width 700 honoured" grep -q 'width="700"' "$tmp/copy.svg"

if [ -x /usr/bin/python3 ]; then
    WHY="/usr/bin/python3 failed" check "trace_svg runs under /usr/bin/python3" \
        /usr/bin/python3 "$T" "$tmp/trace.json" -o "$tmp/sys.svg"
fi

bad "missing trace file exits 2" "$T" "$tmp/nope.json"
printf '{"traceEvents": [ {"name": oops' >"$tmp/invalid.json"
bad "invalid JSON exits 2" "$T" "$tmp/invalid.json"
echo '{"traceEvents": []}' >"$tmp/empty.json"
bad "empty trace exits 2" "$T" "$tmp/empty.json"
bad "missing step exits 2" "$T" "$tmp/trace.json" --step 99 -o "$tmp/x.svg"
has "missing step is named on stderr" "$tmp/bad.err" "step 99"

# ---------------------------------------------------------------- sweep_svg.py
# Two runs per cap; extra columns must be ignored. Mean step_ms per cap:
#   1: 62.0  2: 57.0  5: 54.0  10: 52.5  25: 51.0 (best)  50: 53.0  100: 58.0
cat >"$tmp/sweep.csv" <<'EOF'
world,bucket_cap_mb,step_ms,comm_ms,exposed_ms,compute_ms,note
2,1,61.5,30.1,9.0,49.2,small buckets
2,1,62.5,30.5,9.6,49.0,
2,2,56.8,26.0,4.2,49.1,
2,2,57.2,26.4,4.4,48.9,
2,5,53.7,24.0,1.6,49.0,
2,5,54.3,24.2,1.8,49.2,
2,10,52.3,23.1,0.4,49.1,
2,10,52.7,23.3,0.6,48.9,
2,25,50.6,22.4,0.1,48.8,
2,25,51.4,22.6,0.3,49.0,
2,50,52.8,22.2,3.5,49.1,
2,50,53.2,22.0,3.9,49.3,
2,100,57.6,21.9,8.6,49.0,one bucket
2,100,58.4,22.1,9.2,49.2,
EOF
W=tools/sweep_svg.py
if $PY "$W" "$tmp/sweep.csv" -o "$tmp/sweep.svg" >"$tmp/out" 2>"$tmp/err"; then
    pass "sweep_svg exits 0"
else
    fail "sweep_svg exits 0" "status $?: $(head -c 300 "$tmp/err")"
fi
wellformed "sweep_svg output is well-formed XML" "$tmp/sweep.svg"
has "sweep default title" "$tmp/sweep.svg" ">Step time vs bucket cap<"
has "best cap is 25 MiB" "$tmp/sweep.svg" "best: 25 MiB"
has "compute-only reference line" "$tmp/sweep.svg" "compute only"
has "tick at cap 100" "$tmp/sweep.svg" ">100<"
has "x axis label" "$tmp/sweep.svg" "bucket cap (MiB"
$PY "$W" "$tmp/sweep.csv" >/dev/null 2>&1
check "sweep default output is SWEEP.svg" test -s "$tmp/sweep.svg"
if [ -x /usr/bin/python3 ]; then
    WHY="/usr/bin/python3 failed" check "sweep_svg runs under /usr/bin/python3" \
        /usr/bin/python3 "$W" "$tmp/sweep.csv" -o "$tmp/sys_sweep.svg" --title "x & y"
fi

bad "missing CSV exits 2" "$W" "$tmp/nope.csv"
cut -d, -f1,2,4- "$tmp/sweep.csv" >"$tmp/nostep.csv"
bad "CSV without step_ms exits 2" "$W" "$tmp/nostep.csv"
has "missing column is named on stderr" "$tmp/bad.err" "step_ms"
printf 'bucket_cap_mb,step_ms,comm_ms,exposed_ms,compute_ms\n25,fast,1,1,1\n' >"$tmp/nan.csv"
bad "non-numeric CSV value exits 2" "$W" "$tmp/nan.csv"
printf 'bucket_cap_mb,step_ms,comm_ms,exposed_ms,compute_ms\n' >"$tmp/norows.csv"
bad "CSV without rows exits 2" "$W" "$tmp/norows.csv"

# ---------------------------------------------------------------- tools/scaling.py
# One rank, steps 0-3 of 50 ms each (the next step starts at +50 ms): forward 0-10 ms, backward
# ops 10-40 ms, bucket 0 (1e6 bytes) ready at 20 ms, bucket 1 (4e6 bytes) at 40 ms, a measured
# wait for comm 40-45 ms, adamw 45-50. Compute C = 50 - 5 = 45 ms. By hand:
#   flat 1 ms + bytes / 8 Gbit/s (1e9 B/s): b0 20-22 ms, b1 40-45 ms: exposed 5, step 50.000 ms,
#     efficiency 45/50 = 90.0 %, comm 2 + 5 = 7.000 ms;
#   ring, 1 rank per node, 8 Gbit/s, no latency, N=4: T = 2*3/4 * b / 1e9: b0 1.5 ms, b1 6 ms:
#     exposed 6, step 51.000 ms, efficiency 88.2 %;
#   hierarchical, 2 ranks/node, 80 Gbit/s inside, one 8 Gbit/s NIC per node, N=4: b1 = 4e6/1e10
#     (inside) + 2 * (2e6) / (2 * 5e8) (across, each rank's half of the NIC) = 0.4 + 4 ms:
#     exposed 4.4, step 49.400 ms, efficiency 91.1 %;
#   --compute-scale 2 with flat: C 90, b1 ready at 80 ms: exposed 5, step 95.000 ms, 94.7 %.
cat >"$tmp/gen_scaling.py" <<'EOF'
import json, sys
ev = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "rank 0"}}]
MS = 1000.0
for s in range(4):
    t = 1000 * MS + s * 50 * MS
    def X(name, cat, a, b, tid=0, **kw):
        ev.append({"name": name, "cat": cat, "pid": 0, "tid": tid, "ph": "X", "ts": t + a * MS,
                   "dur": (b - a) * MS, "args": dict({"step": s}, **kw)})
    X("step", "step", 0, 45, tid=2)
    X("forward", "forward", 0, 10)
    for k, a in enumerate((10, 20, 30)):
        X("backward op %d" % (2 - k), "backward", a, a + 10)
    for b, (ready, nbytes) in enumerate(((20, 1000000), (40, 4000000))):
        ev.append({"name": "bucket %d ready" % b, "cat": "ready", "pid": 0, "tid": 0, "ph": "i", "s": "t",
                   "ts": t + ready * MS, "args": {"step": s, "bucket": b}})
        X("allreduce bucket %d" % b, "comm", ready, ready + 1, tid=1, bucket=b, bytes=nbytes)
    X("wait for comm", "exposed", 40, 45)
    X("adamw", "optimizer", 45, 50)
json.dump({"traceEvents": ev}, open(sys.argv[1], "w"))
EOF
$PY "$tmp/gen_scaling.py" "$tmp/scal.json"
S=tools/scaling.py
row() { awk -v n="$1" '$1 == n { print $2, $3, $4, $5 }' "$2"; }   # step comm exposed efficiency
# same NAME GOT WANT
same() { if [ "$2" = "$3" ]; then pass "$1"; else fail "$1" "got '$2', want '$3'"; fi; }
if $PY $S "$tmp/scal.json" --algo flat --inter-latency-us 1000 --inter-gbps 8 --ranks 1,2,1024 -o "$tmp/scal.svg" \
    --csv "$tmp/scal.csv" >"$tmp/scal.out" 2>"$tmp/err"; then pass "scaling exits 0"
else fail "scaling exits 0" "status $?: $(head -c 300 "$tmp/err")"; fi
same "scaling: 1 rank is the compute alone (45 ms)" "$(row 1 "$tmp/scal.out")" "45.000 0.000 0.000 100.0%"
same "scaling: flat network, 2 ranks: 50 ms, comm 7, exposed 5, 90 %" "$(row 2 "$tmp/scal.out")" "50.000 7.000 5.000 90.0%"
same "scaling: a flat network does not depend on N" "$(row 1024 "$tmp/scal.out")" "50.000 7.000 5.000 90.0%"
has "scaling: the measured step is summarized" "$tmp/scal.out" "step 50.00 ms of which compute 45.00 ms (backward ends at 40.00 ms); 2 bucket(s), 5.00 MB of gradients; measured comm 2.00 ms, exposed 5.00 ms"
has "scaling: CSV row" "$tmp/scal.csv" "2,50.0000,7.0000,5.0000,90.00"
wellformed "scaling SVG is well-formed XML" "$tmp/scal.svg"
has "scaling SVG says the last point" "$tmp/scal.svg" "at N=1024: 50.0 ms per step, 5.0 ms exposed, efficiency 90.0 %"
has "scaling SVG has the exposed band" "$tmp/scal.svg" "<title>exposed communication</title>"
$PY $S "$tmp/scal.json" --algo ring --inter-gbps 8 --ranks 4 -o "$tmp/ring.svg" >"$tmp/ring.out" 2>&1
same "scaling: ring of 4: 51 ms, exposed 6, 88.2 %" "$(row 4 "$tmp/ring.out")" "51.000 7.500 6.000 88.2%"
printf '{"algo": "ring", "ranks_per_node": 2, "intra_gbps": 80, "inter_gbps": 8, "nics_per_node": 1}\n' >"$tmp/fabric.json"
$PY $S "$tmp/scal.json" --fabric "$tmp/fabric.json" --ranks 2,4 -o "$tmp/hier.svg" >"$tmp/hier.out" 2>&1
same "scaling: 2 nodes of 2, one NIC each: 49.4 ms, exposed 4.4, 91.1 %" "$(row 4 "$tmp/hier.out")" "49.400 5.500 4.400 91.1%"
# N=2 fits in one node: only its links, 4e6 / 1e10 = 0.4 ms for b1 after 40 ms: exposed 0.4
same "scaling: inside one node only the node's links count" "$(row 2 "$tmp/hier.out")" "45.400 0.500 0.400 99.1%"
$PY $S "$tmp/scal.json" --algo flat --inter-latency-us 1000 --inter-gbps 8 --ranks 2 --compute-scale 2 -o "$tmp/x2.svg" >"$tmp/x2.out" 2>&1
same "scaling: --compute-scale 2 stretches compute and readiness" "$(row 2 "$tmp/x2.out")" "95.000 7.000 5.000 94.7%"
# Re-made buckets: the measured 5e6 bytes become 10e6 in 2 MiB buckets (the first 1 MiB): 1 MiB,
# 4 x 2 MiB, 562816 bytes. Readiness from the measured buckets: 20 % of the bytes by a third of
# backward (10-40 ms), all by its end, linear between: the buckets are ready at 15.243, 22.864,
# 28.107, 33.350, 38.593 and 40 ms and take 1.049, 4 x 2.097 and 0.563 ms at 1e9 B/s: the fifth
# ends at 40.690, the last at 41.253: exposed 1.253 ms, step 46.253 ms.
$PY $S "$tmp/scal.json" --algo flat --inter-gbps 8 --ranks 2 --grad-bytes 10000000 --bucket-mb 2 -o "$tmp/rb.svg" >"$tmp/rb.out" 2>&1
has "scaling: re-made buckets are counted" "$tmp/rb.out" "6 bucket(s) of at most 2 MiB, 10.00 MB of gradients"
same "scaling: re-made buckets from the readiness curve" "$(row 2 "$tmp/rb.out" | cut -d' ' -f1,3)" "46.253 1.253"
# --ready-at-end 0.5: half the bytes wait for backward's end; the rest keeps the measured shape
# scaled to 0.5 (0.5 by a third of backward): buckets 0 and 1 ready at 12.097 and 16.291 ms, the
# other four at 40 ms: 3 x 2.097 + 0.563 = 6.854 ms exposed, step 51.854 ms, 86.8 %.
$PY $S "$tmp/scal.json" --algo flat --inter-gbps 8 --ranks 2 --grad-bytes 10000000 --bucket-mb 2 --ready-at-end 0.5 -o "$tmp/re.svg" >"$tmp/re.out" 2>&1
same "scaling: --ready-at-end holds a share back to backward's end" "$(row 2 "$tmp/re.out")" "51.854 10.000 6.854 86.8%"
bad "scaling: --ready-at-end without --grad-bytes exits 2" $S "$tmp/scal.json" --inter-gbps 1 --ready-at-end 0.3

bad "scaling: missing trace exits 2" $S "$tmp/nope.json" --inter-gbps 1
bad "scaling: no bandwidth exits 2" $S "$tmp/scal.json"
bad "scaling: unknown algorithm exits 2" $S "$tmp/scal.json" --algo mesh --inter-gbps 1
printf '{"algo": "ring", "inter_gbs": 8}\n' >"$tmp/badfabric.json"
bad "scaling: unknown fabric key exits 2" $S "$tmp/scal.json" --fabric "$tmp/badfabric.json"
has "scaling: the unknown key is named" "$tmp/bad.err" "inter_gbs"
bad "scaling: absent step exits 2" $S "$tmp/scal.json" --inter-gbps 1 --step 9
bad "scaling: absent rank exits 2" $S "$tmp/scal.json" --inter-gbps 1 --rank 3
bad "scaling: bad rank list exits 2" $S "$tmp/scal.json" --inter-gbps 1 --ranks 0,2
# values that are not finite numbers in range: a named error (exit 2), never a traceback or a
# run without end
printf '{"ranks_per_node": 2, "intra_gbps": "fast", "inter_gbps": 1}\n' >"$tmp/strfabric.json"
bad "scaling: a string bandwidth in the fabric exits 2" $S "$tmp/scal.json" --fabric "$tmp/strfabric.json"
has "scaling: the string bandwidth is named" "$tmp/bad.err" "intra_gbps must be a finite number, not 'fast'"
printf '{"ranks_per_node": null, "inter_gbps": 1}\n' >"$tmp/nullfabric.json"
bad "scaling: a null in the fabric exits 2" $S "$tmp/scal.json" --fabric "$tmp/nullfabric.json"
bad "scaling: --compute-scale 1e308 exits 2" $S "$tmp/scal.json" --inter-gbps 1 --compute-scale 1e308
bad "scaling: 1e15 gradient bytes in 25 MiB buckets exits 2 at once" $S "$tmp/scal.json" --inter-gbps 1 --grad-bytes 1e15
has "scaling: the bucket count is named" "$tmp/bad.err" "more than 1e6"
bad "scaling: --nics-per-node 0 exits 2" $S "$tmp/scal.json" --inter-gbps 1 --nics-per-node 0
$PY -c 'import json,sys; d=json.load(open(sys.argv[1])); ev=d["traceEvents"] if isinstance(d,dict) else d
for e in ev:
    if "dur" in e: e["dur"]=None
json.dump(d,open(sys.argv[2],"w"))' "$tmp/scal.json" "$tmp/nulldur.json"
bad "scaling: events with dur null exit 2" $S "$tmp/nulldur.json" --inter-gbps 1

# ---------------------------------------------------------------- tools/scaling.py: the outer sync
# The same trace (C = 45 ms, 5e6 gradient bytes = 1.25e6 floats), flat 1 ms + bytes / 1e9 B/s.
#   diloco, groups of 1, H 10, bf16: 2.5e6 bytes a sync, each of the 2 groups' broadcasts
#     1 + 2.5 = 3.5 ms: exchange 7 ms, step 45 + 7 / 10 = 45.7 ms, 98.5 %;
#   streaming F 2, int8: 625000 floats + 4 x ceil(625000 / 64) = 664064 bytes a fragment, exchange
#     2 x 1.664064 = 3.328 ms, step 45 + 2 x 3.328128 / 10 = 45.666 ms; delay 4: 4 x 45 ms hide
#     it (45.000); --no-overlap: 45.666 again;
#   average, groups of 2 on 4 ranks, H 4: inner = DDP on 2 (50 ms), fp32 5e6 bytes: 2 x 6 ms,
#     step 50 + 12 / 4 = 53 ms, 45 / 53 = 84.9 %; 3 ranks: not groups of 2 ("-");
#   no trace, 20 ms and 4e6 bytes: buckets of 1048576 and 2951424 bytes ready at 20 ms: exposed
#     2.048576 + 3.951424 = 6 ms, DDP 26 ms (76.9 %); diloco H 100: 2 x (1 + 2) ms / 100: 20.060 ms.
outer() { $PY $S "$tmp/scal.json" --algo flat --inter-latency-us 1000 --inter-gbps 8 -o "$tmp/outer.svg" "$@"; }
outer --ranks 2 --outer diloco --group-size 1 --inner-steps 10 --csv "$tmp/outer.csv" >"$tmp/o1.out" 2>&1
same "scaling: diloco beside DDP, 2 groups of 1, H 10, bf16" "$(row 2 "$tmp/o1.out")" "50.000 7.000 5.000 90.0%"
same "scaling: diloco's step, exchange and efficiency" "$(awk '$1 == 2 { print $6, $7, $8 }' "$tmp/o1.out")" "45.700 7.000 98.5%"
has "scaling: diloco in the CSV" "$tmp/outer.csv" "2,50.0000,7.0000,5.0000,90.00,45.7000,7.0000,98.47"
has "scaling: the outer settings are said" "$tmp/o1.out" "# outer: diloco: groups of 1 rank(s), every 10 inner steps, wire bf16; 1250000 floats: 2.5 MB a sync"
wellformed "scaling SVG with the outer lines is well-formed XML" "$tmp/outer.svg"
has "scaling SVG has the outer step line" "$tmp/outer.svg" "diloco: step time"
st() { awk '$1 == 2 { print $6, $7 }' "$1"; }
outer --ranks 2 --outer streaming --group-size 1 --inner-steps 10 --fragments 2 --outer-wire int8 >"$tmp/o2.out" 2>&1
same "scaling: streaming, 2 int8 fragments, no delay" "$(st "$tmp/o2.out")" "45.666 3.328"
outer --ranks 2 --outer streaming --group-size 1 --inner-steps 10 --fragments 2 --outer-wire int8 --outer-delay 4 >"$tmp/o3.out" 2>&1
same "scaling: streaming, the delay hides the exchange" "$(st "$tmp/o3.out")" "45.000 3.328"
outer --ranks 2 --outer streaming --group-size 1 --inner-steps 10 --fragments 2 --outer-wire int8 --outer-delay 4 --no-overlap >"$tmp/o4.out" 2>&1
same "scaling: streaming --no-overlap exposes it" "$(st "$tmp/o4.out")" "45.666 3.328"
outer --ranks 3,4 --outer average --group-size 2 --inner-steps 4 >"$tmp/o5.out" 2>&1
same "scaling: average, groups of 2: inner DDP on 2 + fp32 exchange / H" "$(awk '$1 == 4 { print $6, $7, $8 }' "$tmp/o5.out")" "53.000 12.000 84.9%"
same "scaling: a group size that does not divide N is a dash" "$(awk '$1 == 3 { print $6, $7, $8 }' "$tmp/o5.out")" "- - -"
$PY $S --compute-ms 20 --grad-bytes 4e6 --algo flat --inter-gbps 8 --inter-latency-us 1000 --ranks 2 --outer diloco --group-size 1 \
    --inner-steps 100 -o "$tmp/nt.svg" >"$tmp/nt.out" 2>&1
same "scaling: no trace: DDP with every bucket ready at the end" "$(row 2 "$tmp/nt.out")" "26.000 6.000 6.000 76.9%"
same "scaling: no trace: diloco H 100" "$(st "$tmp/nt.out")" "20.060 6.000"
# MPI with groups of one rank: one MPI_Allgather, (G - 1) hops of a ring, both directions at once
$PY $S --compute-ms 20 --grad-bytes 4e6 --algo flat --inter-gbps 8 --inter-latency-us 1000 --ranks 2,3 --outer diloco \
    --group-size 1 --inner-steps 10 --outer-exchange allgather -o "$tmp/ag.svg" --csv "$tmp/ag.csv" >"$tmp/ag.out" 2>&1
has "scaling: the allgather exchange of 2 groups is one hop (1 ms + 2 MB at 1 GB/s)" "$tmp/ag.csv" ",20.3000,3.0000,"
has "scaling: the allgather exchange of 3 groups is two hops" "$tmp/ag.csv" ",20.6000,6.0000,"
bad "scaling: --outer-exchange allgather with groups of 2 exits 2" $S "$tmp/scal.json" --inter-gbps 1 --outer diloco --inner-steps 10 \
    --group-size 2 --outer-exchange allgather
bad "scaling: --inner-steps without --outer exits 2" $S "$tmp/scal.json" --inter-gbps 1 --inner-steps 10
bad "scaling: --outer without --inner-steps exits 2" $S "$tmp/scal.json" --inter-gbps 1 --outer diloco
bad "scaling: fragments with diloco exit 2" $S "$tmp/scal.json" --inter-gbps 1 --outer diloco --inner-steps 10 --fragments 2
bad "scaling: a delay of H / F exits 2" $S "$tmp/scal.json" --inter-gbps 1 --outer streaming --inner-steps 10 --fragments 2 --outer-delay 5
bad "scaling: an unknown wire exits 2" $S "$tmp/scal.json" --inter-gbps 1 --outer diloco --inner-steps 10 --outer-wire fp16
bad "scaling: no trace and no --compute-ms exits 2" $S --inter-gbps 1 --grad-bytes 1e6
has "scaling: what is missing is said" "$tmp/bad.err" "give a trace (TRACE.json), or --compute-ms C and --grad-bytes BYTES"

# ---------------------------------------------------------------- tools/scaling.py on GPU traces
# The NCCL backend's trace: host times on the compute lane (enqueue: forward 0-2 ms, backward ops
# 2-6, buckets "ready" at 3 and 5 ms, adamw 6-7), the GPU clock on the comm lane: backward (gpu)
# 2-40 ms, bucket 0 (1e6 bytes) starts at 20 ms, bucket 1 (4e6) at 40 ms and takes 1 ms,
# exposed (gpu) 40-41. Steps 50 ms apart: C = 50 - 1 = 49 ms. Flat 1 ms + bytes / 1e9 B/s on 2
# ranks: b0 20-22, b1 40-45: exposed 5, step 54.000, comm 7.000, 49/54 = 90.7 % (from the host's
# ready instants and backward it would be b1 5-10, exposed 4 after backward's host end at 6).
#   --old: the same without the GPU spans (an older ddp.h) and b1 taking 0.5 ms: backward ends at
#     b1's start (40), exposed 0.5, C = 49.5: step 54.500, 49.5/54.5 = 90.8 %.
#   --ranks2: a second rank whose b1 starts at 42: readiness is the latest start, b1 42-47,
#     exposed 47 - 40 = 7, step 56.000, 49/56 = 87.5 %.
cat >"$tmp/gen_gpu.py" <<'EOF'
import json, sys
ev, MS = [], 1000.0
old, two = "--old" in sys.argv, "--ranks2" in sys.argv
for r in ((0, 1) if two else (0,)):
    ev.append({"name": "process_name", "ph": "M", "pid": r, "args": {"name": "rank %d" % r}})
    for s in range(4):
        t = 1000 * MS + s * 50 * MS
        def X(name, cat, a, b, tid=0, **kw):
            ev.append({"name": name, "cat": cat, "pid": r, "tid": tid, "ph": "X", "ts": t + a * MS,
                       "dur": (b - a) * MS, "args": dict({"step": s}, **kw)})
        X("forward", "forward", 0, 2)
        for k, a in enumerate((2, 3, 4, 5)):
            X("backward op %d" % (3 - k), "backward", a, a + 1)
        if not old:
            X("backward (gpu)", "gpu_backward", 2, 40, tid=1)
        for b, (host, gpu, nbytes) in enumerate(((3, 20, 1000000), (5, 42 if r else 40, 4000000))):
            ev.append({"name": "bucket %d ready" % b, "cat": "ready", "pid": r, "tid": 0, "ph": "i", "s": "t",
                       "ts": t + host * MS, "args": {"step": s, "bucket": b}})
            X("allreduce bucket %d" % b, "comm", gpu, gpu + (0.01 if b == 0 else 0.5 if old else 1), tid=1,
              bucket=b, bytes=nbytes)
        if not old:
            X("exposed comm (gpu)", "gpu_exposed", 40, 41, tid=1)
        X("adamw", "optimizer", 6, 7)
json.dump({"traceEvents": ev}, open(sys.argv[1], "w"))
EOF
$PY "$tmp/gen_gpu.py" "$tmp/gpu.json"
$PY "$tmp/gen_gpu.py" "$tmp/gpuold.json" --old
$PY "$tmp/gen_gpu.py" "$tmp/gpu2.json" --ranks2
$PY "$tmp/gen_gpu.py" "$tmp/gpuold2.json" --old --ranks2
flat="--algo flat --inter-latency-us 1000 --inter-gbps 8 --ranks 1,2"
$PY $S "$tmp/gpu.json" $flat -o "$tmp/gpu.svg" >"$tmp/gpu.out" 2>"$tmp/err" || fail "scaling: a GPU trace exits 0" "$(head -c 300 "$tmp/err")"
same "scaling: GPU trace, 1 rank: the period less the GPU's exposed span" "$(row 1 "$tmp/gpu.out")" "49.000 0.000 0.000 100.0%"
same "scaling: GPU trace: readiness from the comm lane, backward from the GPU span" "$(row 2 "$tmp/gpu.out")" "54.000 7.000 5.000 90.7%"
has "scaling: GPU trace: backward's length on the GPU" "$tmp/gpu.out" "compute 49.00 ms (backward 38.00 ms on the GPU); 2 bucket(s), 5.00 MB of gradients; measured comm 1.01 ms, exposed 1.00 ms"
has "scaling: GPU trace: says where the numbers come from" "$tmp/gpu.out" "from the 'backward (gpu)' and 'exposed comm (gpu)' spans"
$PY $S "$tmp/gpuold.json" $flat -o "$tmp/gpuold.svg" >"$tmp/gpuold.out" 2>"$tmp/err" || fail "scaling: an older GPU trace exits 0" "$(head -c 300 "$tmp/err")"
same "scaling: GPU trace without spans: backward ends at the last allreduce's start" "$(row 2 "$tmp/gpuold.out")" "54.500 7.000 5.000 90.8%"
has "scaling: GPU trace without spans: says so" "$tmp/gpuold.out" "no GPU spans in this trace"
$PY $S "$tmp/gpu2.json" $flat -o "$tmp/gpu2.svg" >"$tmp/gpu2.out" 2>"$tmp/err" || fail "scaling: a 2-rank GPU trace exits 0" "$(head -c 300 "$tmp/err")"
same "scaling: GPU trace, 2 ranks: the latest comm start over the ranks" "$(row 2 "$tmp/gpu2.out")" "56.000 7.000 7.000 87.5%"
has "scaling: GPU trace, 2 ranks: readiness is an upper bound" "$tmp/gpu2.out" "2 ranks: a start is only an upper bound of readiness"
bad "scaling: 2-rank GPU trace without spans exits 2" $S "$tmp/gpuold2.json" $flat -o "$tmp/x.svg"
has "scaling: 2-rank GPU trace without spans: says what is missing" "$tmp/bad.err" "did not record 'backward (gpu)' and 'exposed comm (gpu)'"
# A real one: steps 3-7 (and step 8's start) of the GPT-2-small-sized GPT on one H100, TF32, batch 8
# (DDP_TIMELINE of build/gpu/train_gpt, a ddp.h without the GPU spans; backward ops other than
# the first and last cut out to keep it small). The reference below reads the file itself.
G=tests/gpt2s_h100_tf32_steps3-7.json
$PY $S $G --fabric bench/fabric_8xh100_ib400.json --ranks 1,8,512 -o "$tmp/h100.svg" >"$tmp/h100.out" 2>"$tmp/err" ||
    fail "scaling: the H100 trace exits 0" "$(head -c 300 "$tmp/err")"
ref=$($PY - $G <<'EOF'
import json, statistics, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") != "M"]
start = {}
for e in ev:
    s = e["args"]["step"]
    start[s] = min(start.get(s, e["ts"]), e["ts"])
def level(b, k, a, bw):
    return 0.0 if k <= 1 else 2 * (k - 1) * (a + b / (k * bw))
def T(b, n):   # 8 GPUs a node: NVLink 3600 Gbit/s, 3 us; a 400 Gbit/s NIC each, 6 us; 80 %; ring
    if n <= 1:
        return 0.0
    t = level(b, min(n, 8), 3e-6, 3600e9 / 8 * 0.8)
    return t + (level(b / 8, n // 8, 6e-6, 400e9 / 8 * 0.8) if n > 8 else 0.0)
out = []
for n in (1, 8, 512):
    rows = []
    for s in (4, 5, 6, 7):   # the complete steps after the first
        comm = sorted((e for e in ev if e["args"]["step"] == s and e["cat"] == "comm"), key=lambda e: e["args"]["bucket"])
        last = max(comm, key=lambda e: e["ts"])
        compute = start[s + 1] - start[s] - last["dur"]
        end = 0.0
        for e in comm:
            end = max(end, e["ts"]) + 1e6 * T(e["args"]["bytes"], n)
        rows.append(compute + (max(0.0, end - last["ts"]) if n > 1 else 0.0))
    out.append("%.3f" % (statistics.median(rows) / 1e3))
print(" ".join(out))
EOF
)
got="$(row 1 "$tmp/h100.out" | cut -d' ' -f1) $(row 8 "$tmp/h100.out" | cut -d' ' -f1) $(row 512 "$tmp/h100.out" | cut -d' ' -f1)"
same "scaling: the H100 trace's step on 1, 8 and 512 GPUs equals an independent reading of it" "$got" "$ref"
has "scaling: the H100 trace's buckets" "$tmp/h100.out" "17 bucket(s), 344.16 MB of gradients"

if [ -n "$keep" ]; then mkdir -p "$keep" && cp "$tmp"/trace.svg "$tmp"/sweep.svg "$tmp"/scal.svg "$tmp"/trace.json "$tmp"/sweep.csv "$keep"/; fi
[ "$failed" -eq 0 ]
