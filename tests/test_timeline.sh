#!/usr/bin/env bash
# test_timeline.sh — a 2-rank run with DDP_TIMELINE writes ONE valid Chrome trace holding both
# ranks and every kind of event, in a sensible order; trace_svg.py draws it.
# Usage: tests/test_timeline.sh [BUILD_DIR]
set -u
B=${1:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! DDP_TIMELINE="$tmp/trace.json" timeout 60 "$B/ddprun" -n 2 "$B/minimal" >"$tmp/out" 2>&1; then
  echo "FAIL timeline_run: $(tail -n 3 "$tmp/out")"; exit 1
fi
python3 - "$tmp/trace.json" <<'PY'
import json, sys
from collections import defaultdict
ok = True
def check(cond, name, why):
    global ok
    print(("PASS %s" % name) if cond else ("FAIL %s: %s" % (name, why)))
    ok = ok and cond
try:
    trace = json.load(open(sys.argv[1]))
    events = trace["traceEvents"]
    check(True, "timeline_is_valid_json", "")
except Exception as e:
    check(False, "timeline_is_valid_json", e); sys.exit(1)
ranks = {e["pid"] for e in events}
check(ranks == {0, 1}, "timeline_one_file_both_ranks", "pids %s" % sorted(ranks))
cats = defaultdict(set)
for e in events:
    if e.get("ph") != "M": cats[e["pid"]].add(e["cat"])
want = {"forward", "backward", "ready", "comm", "exposed", "optimizer", "step", "user_comm"}
check(all(want <= cats[r] for r in (0, 1)), "timeline_has_every_event_kind", {r: sorted(want - cats[r]) for r in (0, 1)})
names = {(e["pid"], e.get("tid"), e["args"]["name"]) for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
check({(0, 0, "compute"), (0, 1, "comm"), (1, 0, "compute"), (1, 1, "comm")} <= names, "timeline_compute_and_comm_threads", names)
order_ok, counted = True, 0
for r in (0, 1):
    ready = {(e["args"]["step"], e["args"]["bucket"]): e["ts"] for e in events if e["pid"] == r and e.get("cat") == "ready"}
    for e in events:
        if e["pid"] == r and e.get("cat") == "comm":
            key = (e["args"]["step"], e["args"]["bucket"])
            counted += 1
            order_ok &= key in ready and e["ts"] + 1.0 >= ready[key] and e["tid"] == 1
check(order_ok and counted >= 600, "timeline_allreduce_after_bucket_ready", "%d allreduces checked" % counted)
steps = {e["args"]["step"] for e in events if e.get("cat") == "step"}
check(steps == set(range(300)), "timeline_every_step_recorded", "%d steps" % len(steps))
sys.exit(0 if ok else 1)
PY
rc=$?
if python3 tools/trace_svg.py "$tmp/trace.json" -o "$tmp/trace.svg" >/dev/null 2>&1 && grep -q "rank 1 comm" "$tmp/trace.svg"; then
  echo "PASS timeline_draws_as_svg"
else
  echo "FAIL timeline_draws_as_svg: trace_svg.py failed"; rc=1
fi
# The outer sync's exchanges (replica groups of one rank; streaming, each fragment's exchange on
# its own thread for one step): an event each on the "outer exchange" lane, on every rank
if OUTER=5 OUTER_DELAY=1 DDP_TIMELINE="$tmp/outer.json" timeout 60 "$B/ddprun" -n 2 "$B/test_fault" 20 >"$tmp/out" 2>&1 &&
   python3 - "$tmp/outer.json" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
lane = {(e["pid"], e["tid"]) for e in ev if e.get("ph") == "M" and e["name"] == "thread_name" and e["args"]["name"] == "outer exchange"}
outer = [e for e in ev if e.get("cat") == "outer"]
# sent at inner steps 5, 10, 15, 20; merged (and recorded) one step later: 6, 11, 16 (20's lands after the run)
ok = lane == {(0, 3), (1, 3)} and all(sorted(e["args"]["fragment"] for e in outer if e["pid"] == r) == [0, 0, 0] for r in (0, 1)) \
     and all(e["tid"] == 3 and e["dur"] >= 0 and e["args"]["bytes"] > 0 for e in outer)
sys.exit(0 if ok else 1)
PY
then echo "PASS timeline_outer_exchanges_on_their_lane"
else echo "FAIL timeline_outer_exchanges_on_their_lane: $(tail -n 2 "$tmp/out")"; rc=1
fi
# DDP_TIMELINE on rank 1 only: a named disagreement at ddp_commit, not a stall at shutdown
start=$(date +%s)
DDP_TIMEOUT=20 timeout 60 "$B/ddprun" -n 2 sh -c '[ "$RANK" = 1 ] && export DDP_TIMELINE="$1"; exec "$2"' sh "$tmp/half.json" "$B/minimal" >"$tmp/out" 2>&1
r=$? took=$(($(date +%s) - start))
if [ $r -ne 0 ] && [ $took -lt 15 ] && grep -q "the timeline (DDP_TIMELINE or ddp_desc.timeline_path) is set on rank 1 and not on rank 0" "$tmp/out"; then
  echo "PASS timeline_on_some_ranks_refused_at_commit"
else
  echo "FAIL timeline_on_some_ranks_refused_at_commit: exit $r after $took s: $(grep -m2 -i error "$tmp/out")"; rc=1
fi
exit $rc
