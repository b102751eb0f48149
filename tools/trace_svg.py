#!/usr/bin/env python3
"""trace_svg.py - draw one training step of a ddp.h trace as an SVG timeline.

usage: tools/trace_svg.py TRACE.json [-o OUT.svg] [--step N] [--width PX] [--title TEXT]

TRACE.json is the Chrome/Perfetto trace that ddp.h writes (object form with "traceEvents", or a
bare array of events). Every rank (event "pid") gets two lanes, "compute" (tid 0) and "comm"
(tid 1); the step's "X" events are drawn as rectangles coloured by category, "ready" instants as
small markers, and the exposed communication ("wait for comm", cat "exposed") as a red, hatched
band across both lanes of its rank. A GPU trace (the NCCL backend) also has, on the comm lane,
the GPU's own "backward (gpu)" span (cat gpu_backward, drawn pale behind the allreduces) and
"exposed comm (gpu)" (cat gpu_exposed, hatched like the host's wait). Hovering over an event in a browser shows its name, duration
and args. The summary under the title gives, per rank, the step, compute (forward + backward ops),
comm (all "comm" events), exposed ("exposed" events, or "gpu_exposed" ones where the host has
none) and overlap = 100 x (1 - exposed/comm),
clamped to 0-100 % (the wait can outlast a rank's own comm when it also waits for a slower rank).

Which step: --step N, or by default the LAST COMPLETE step: the highest args.step in which every
rank of the trace has its "step" event (or, for traces without those, a "wait for comm" event).
A trace cut off in the middle of a step therefore shows the step before it, which has warmed up
by then. If no step is complete, the last step is drawn with a warning.

Output: OUT.svg, by default TRACE with its suffix replaced by .svg. Bad input (missing or
unreadable file, invalid JSON, no events, no such step) is reported on stderr with exit status 2.
Python 3 standard library only.
"""

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svgkit import INK, MUTED, FAINT, GRID, esc, num, text_w, nice_step, tick_decimals, read_text, svg_open  # noqa: E402

PROG = "trace_svg"

LANE_BG = "#f6f7f9"   # lane background
EXPOSED_RED = "#d62728"

# category -> (fill, legend label); anything else is drawn as "other"
CATS = {
    "forward":   ("#9aa0a6", "forward"),
    "backward":  ("#4c78a8", "backward"),
    "comm":      ("#f58518", "allreduce (comm)"),
    "exposed":   ("#e45756", "exposed comm wait"),
    "optimizer": ("#54a24b", "optimizer"),
    "straggler": ("#b279a2", "wait for a straggler (\"wait for rank N\")"),
    # the NCCL backend's comm lane: the step's device-side spans, from the GPU's own events
    "gpu_backward": ("#b7cde3", "backward on the GPU"),
    "gpu_exposed":  ("#e45756", "exposed comm on the GPU"),
    "other":     ("#cfd4da", "other"),
}
CAT_ORDER = ["forward", "backward", "gpu_backward", "comm", "straggler", "exposed", "gpu_exposed", "optimizer", "other"]
EXPOSED_CATS = ("exposed", "gpu_exposed")


def die(msg):
    sys.stderr.write("%s: error: %s\n" % (PROG, msg))
    sys.exit(2)


def warn(msg):
    sys.stderr.write("%s: warning: %s\n" % (PROG, msg))


# ---------------------------------------------------------------- small helpers

def luminance(hex_color):
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) / 255.0 for i in (0, 2, 4))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def fmt_ms(us):
    """Microseconds as 'X.XX ms'; more decimals below 1 ms so that short steps stay readable."""
    ms = us / 1000.0
    dec = 2
    if 0 < ms < 0.995:
        dec = min(4, 2 + int(math.ceil(-math.log10(ms) - 1e-9)))
    return "%.*f ms" % (dec, ms)


def fmt_dur(us):
    if us < 1000:
        return "%.1f \u00b5s" % us
    return "%.3f ms" % (us / 1000.0)


# ---------------------------------------------------------------- reading the trace

def load_events(path):
    text = read_text(path, die)
    if not text.strip():
        die("%s is empty" % path)
    try:
        obj = json.loads(text)
    except ValueError as e:
        obj = None
        # A trace whose writer was stopped mid-run may lack its closing brackets; Chrome's viewer
        # accepts that, so try the two obvious closings before giving up.
        stripped = text.rstrip().rstrip(",")
        for closing in ("]}", "]"):
            try:
                obj = json.loads(stripped + closing)
                warn("%s was not closed (truncated trace?); read it with '%s' appended"
                     % (path, closing))
                break
            except ValueError:
                pass
        if obj is None:
            die("%s is not valid JSON: %s" % (path, e))
    if isinstance(obj, dict):
        events = obj.get("traceEvents")
        if not isinstance(events, list):
            die("%s has no \"traceEvents\" array" % path)
    elif isinstance(obj, list):
        events = obj
    else:
        die("%s is not a Chrome trace (expected an object or an array)" % path)
    return [e for e in events if isinstance(e, dict)]


def as_number(v):
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, str):
        try:
            f = float(v)
            return f if math.isfinite(f) else None
        except ValueError:
            return None
    return None


def as_int(v):
    f = as_number(v)
    if f is None or f != int(f):
        return None
    return int(f)


class Ev(object):
    __slots__ = ("name", "cat", "ph", "pid", "tid", "ts", "dur", "args", "step")


def parse_events(raw):
    evs = []
    for e in raw:
        ph = e.get("ph")
        if ph not in ("X", "i", "I"):
            continue                      # metadata, counters, flows: not drawn
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        step = as_int(args.get("step"))
        ts = as_number(e.get("ts"))
        pid = as_int(e.get("pid"))
        if step is None or ts is None or pid is None:
            continue
        ev = Ev()
        ev.name = str(e.get("name", ""))
        ev.cat = str(e.get("cat", "")) if e.get("cat") is not None else ""
        ev.ph = "X" if ph == "X" else "i"
        ev.pid = pid
        ev.tid = as_int(e.get("tid"))
        ev.ts = ts
        d = as_number(e.get("dur")) if ph == "X" else 0.0
        ev.dur = max(0.0, d) if d is not None else 0.0
        ev.args = args
        ev.step = step
        evs.append(ev)
    return evs


def is_step_event(ev):
    return ev.ph == "X" and ev.cat == "step"


def is_wait_event(ev):
    return ev.ph == "X" and (ev.name == "wait for comm" or ev.cat == "exposed")


def compact_list(values):
    """[0,1,2,3,7,9,10] -> '0-3, 7, 9-10'."""
    values = sorted(set(values))
    out, i = [], 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else "%d-%d" % (values[i], values[j]))
        i = j + 1
    return ", ".join(out)


def choose_step(evs, requested):
    steps = sorted(set(ev.step for ev in evs))
    if requested is not None:
        if requested not in steps:
            die("step %d is not in the trace (steps present: %s)" % (requested, compact_list(steps)))
        return requested
    ranks = set(ev.pid for ev in evs)
    have_step = {}
    have_wait = {}
    for ev in evs:
        if is_step_event(ev):
            have_step.setdefault(ev.step, set()).add(ev.pid)
        if is_wait_event(ev):
            have_wait.setdefault(ev.step, set()).add(ev.pid)
    complete = [s for s in steps
                if have_step.get(s, set()) >= ranks or have_wait.get(s, set()) >= ranks]
    if complete:
        return complete[-1]
    warn("no step has a 'step' or 'wait for comm' event on every rank; drawing the last one, %d"
         % steps[-1])
    return steps[-1]


# ---------------------------------------------------------------- layout

def pack_rows(events):
    """Assign overlapping events of one lane to sub-rows; returns (list of (ev,row), nrows)."""
    ends = []
    placed = []
    for ev in sorted(events, key=lambda e: (e.ts, -e.dur)):
        for r, end in enumerate(ends):
            if ev.ts >= end - 1e-6:
                ends[r] = ev.ts + ev.dur
                placed.append((ev, r))
                break
        else:
            ends.append(ev.ts + ev.dur)
            placed.append((ev, len(ends) - 1))
    return placed, max(1, len(ends))


ABBREV = {"bucket": "b", "op": "op", "layer": "L"}


def short_labels(ev):
    """Candidate in-box labels, longest first."""
    words = ev.name.split()
    out = [ev.name]
    if len(words) > 2:
        out.append(" ".join(words[-2:]))
    if len(words) > 1 and words[-1].isdigit():
        out.append(ABBREV.get(words[-2], "#") + words[-1])
    return out


def instant_label(ev):
    b = as_int(ev.args.get("bucket"))
    if b is not None:
        return "b%d" % b
    return ev.name.split()[0] if ev.name else ""


def tooltip(ev, t0):
    lines = [ev.name or "(unnamed)"]
    if ev.ph == "X":
        lines.append("%s, %s" % (ev.cat or "no category", fmt_dur(ev.dur)))
        lines.append("starts at +%.3f ms, ends at +%.3f ms"
                     % ((ev.ts - t0) / 1000.0, (ev.ts + ev.dur - t0) / 1000.0))
    else:
        lines.append("%s, at +%.3f ms" % (ev.cat or "instant", (ev.ts - t0) / 1000.0))
    for k in sorted(ev.args):
        v = ev.args[k]
        if isinstance(v, (dict, list)):
            v = json.dumps(v, sort_keys=True)
        if k == "bytes" and as_number(v) is not None:
            b = as_number(v)
            v = "%d (%.2f MiB)" % (b, b / 1048576.0) if b == int(b) else v
        lines.append("%s: %s" % (k, v))
    return "\n".join(lines)


def render(evs, step, width, title, source):
    sel = [ev for ev in evs if ev.step == step]
    ranks = sorted(set(ev.pid for ev in sel))
    t0 = min(ev.ts for ev in sel)
    t1 = max(ev.ts + ev.dur for ev in sel)
    span = max(t1 - t0, 1.0)

    per = {}
    for r in ranks:
        mine = [ev for ev in sel if ev.pid == r]
        boxes = [ev for ev in mine if ev.ph == "X" and not is_step_event(ev)]
        comp = [ev for ev in boxes if ev.tid != 1]
        comm_lane = [ev for ev in boxes if ev.tid == 1]
        comm_ms = sum(ev.dur for ev in mine if ev.ph == "X" and ev.cat == "comm") / 1000.0
        # the host's wait for comm; a GPU trace's host does not wait, its GPU-side span says it
        exposed_ms = sum(ev.dur for ev in mine if ev.ph == "X" and ev.cat == "exposed") / 1000.0
        if not any(ev.ph == "X" and ev.cat == "exposed" for ev in mine):
            exposed_ms = sum(ev.dur for ev in mine if ev.ph == "X" and ev.cat == "gpu_exposed") / 1000.0
        compute_ms = sum(ev.dur for ev in mine
                         if ev.ph == "X" and ev.cat in ("backward", "forward")) / 1000.0
        per[r] = {
            "compute": comp, "comm": comm_lane,
            "instants": [ev for ev in mine if ev.ph == "i"],
            "steps": [ev for ev in mine if is_step_event(ev)],
            "exposed": [ev for ev in mine if ev.ph == "X" and ev.cat in EXPOSED_CATS],
            "compute_ms": compute_ms, "comm_ms": comm_ms, "exposed_ms": exposed_ms,
        }

    cats_present = set()
    for ev in sel:
        if ev.ph == "X" and not is_step_event(ev):
            cats_present.add(ev.cat if ev.cat in CATS else "other")
    has_ready = any(ev.ph == "i" for ev in sel)

    # --- geometry
    W = max(480, int(width))
    lane_labels = ["rank %d compute" % r for r in ranks] + ["rank %d comm" % r for r in ranks]
    ML = int(max(text_w(s, 12) for s in lane_labels) + 34)
    MR = 28
    PW = W - ML - MR

    def X(ts):
        return ML + (ts - t0) / span * PW

    TITLE_Y = 36
    sum_y0 = 62
    SUM_LH = 19
    legend_y = sum_y0 + SUM_LH * len(ranks) + 10

    # legend items, wrapped onto as many rows as the width needs
    items = [c for c in CAT_ORDER if c in cats_present or c in ("backward", "comm", "exposed")]
    if has_ready:
        items.append("ready")
    legend = []
    lx, lrow = 24.0, 0
    for it in items:
        label = "bucket ready" if it == "ready" else CATS[it][1]
        iw = 19 + text_w(label, 12)
        if lx > 24 and lx + iw > W - MR:
            lx, lrow = 24.0, lrow + 1
        legend.append((it, label, lx, legend_y + 20 * lrow))
        lx += iw + 20
    top = legend_y + 30 + 20 * lrow
    HEAD = 24      # bracket and labels above a rank's lanes
    LANE = 30
    MID = 17       # gap between compute and comm lanes (ready markers)
    GAP = 26       # between ranks
    block = HEAD + LANE + MID + LANE
    plot_top = top
    plot_bottom = top + len(ranks) * block + (len(ranks) - 1) * GAP
    axis_y = plot_bottom + 8
    H = axis_y + 52

    out = []
    o = out.append
    svg_open(out, W, H, title)
    o('<defs>'
      '<pattern id="hatch" width="7" height="7" patternUnits="userSpaceOnUse" '
      'patternTransform="rotate(45)">'
      '<rect width="7" height="7" fill="%s" fill-opacity="0.10"/>'
      '<line x1="0" y1="0" x2="0" y2="7" stroke="%s" stroke-width="2.6" stroke-opacity="0.55"/>'
      '</pattern></defs>' % (EXPOSED_RED, EXPOSED_RED))
    o('<rect width="100%" height="100%" fill="#ffffff"/>')

    # --- title, source, summary
    o('<text x="24" y="%d" font-size="20" font-weight="bold">%s</text>' % (TITLE_Y, esc(title)))
    if source:
        o('<text x="%d" y="%d" font-size="11" fill="%s" text-anchor="end">%s</text>'
          % (W - MR, TITLE_Y, FAINT, esc(source)))

    rows = []
    for r in ranks:
        p = per[r]
        if p["comm_ms"] > 0:
            # clamped: the wait can outlast this rank's comm when it also waits for a slower rank
            ov = "overlap %.1f%%" % min(100.0, max(0.0, 100.0 * (1.0 - p["exposed_ms"] / p["comm_ms"])))
        else:
            ov = "overlap n/a"
        step_ms = max((ev.dur for ev in p["steps"]), default=None)
        rows.append(["rank %d" % r,
                     "step " + fmt_ms(step_ms) if step_ms is not None else "",
                     "compute " + fmt_ms(p["compute_ms"] * 1000.0),
                     "comm " + fmt_ms(p["comm_ms"] * 1000.0),
                     "exposed " + fmt_ms(p["exposed_ms"] * 1000.0),
                     ov])
    ncol = len(rows[0])
    colw = [max(text_w(row[c], 12.5) for row in rows) for c in range(ncol)]
    xs = [24.0]
    for c in range(1, ncol):
        xs.append(xs[-1] + colw[c - 1] + (18 if c > 1 else 14) if colw[c - 1] > 0 else xs[-1])
    # a narrow picture shrinks the summary rather than cutting it off
    scale = min(1.0, (W - MR - 24) / (xs[-1] + colw[-1] - 24))
    sum_fs = 12.5 * scale
    xs = [24 + (x - 24) * scale for x in xs]
    for i, row in enumerate(rows):
        y = sum_y0 + i * SUM_LH
        for c, cell in enumerate(row):
            if not cell:
                continue
            attrs = ''
            if c == 0:
                attrs = ' font-weight="bold"'
            elif cell.startswith("exposed") and per[ranks[i]]["exposed_ms"] > 0:
                attrs = ' fill="%s"' % EXPOSED_RED
            elif c > 0:
                attrs = ' fill="#374151"'
            o('<text x="%s" y="%d" font-size="%s"%s>%s</text>'
              % (num(xs[c]), y, num(sum_fs), attrs, esc(cell)))
    o('<line x1="24" x2="%d" y1="%d" y2="%d" stroke="%s"/>'
      % (W - MR, legend_y - 16, legend_y - 16, GRID))

    # --- legend
    for it, label, lx, ly in legend:
        if it == "ready":
            o('<path d="M%s %d l5 0 l-5 7 l-5 -7 z" fill="#374151"/>' % (num(lx + 7), ly - 9))
        else:
            o('<rect x="%s" y="%d" width="14" height="11" rx="2" fill="%s"/>'
              % (num(lx), ly - 10, CATS[it][0]))
            if it == "exposed":
                o('<rect x="%s" y="%d" width="14" height="11" rx="2" fill="url(#hatch)" '
                  'stroke="%s" stroke-width="0.8"/>' % (num(lx), ly - 10, EXPOSED_RED))
        o('<text x="%s" y="%d" font-size="12" fill="#374151">%s</text>'
          % (num(lx + 19), ly, esc(label)))

    # --- lanes (backgrounds and labels)
    geo = {}
    for i, r in enumerate(ranks):
        y0 = top + i * (block + GAP)
        cy = y0 + HEAD
        my = cy + LANE
        ky = my + MID
        geo[r] = (y0, cy, ky)
        for name, ly in (("compute", cy), ("comm", ky)):
            o('<rect x="%d" y="%d" width="%d" height="%d" fill="%s"/>' % (ML, ly, PW, LANE, LANE_BG))
            o('<text x="%d" y="%s" text-anchor="end" font-size="12" fill="#374151">%s</text>'
              % (ML - 12, num(ly + LANE / 2.0 + 4), esc("rank %d %s" % (r, name))))
        if i > 0:
            sy = y0 - GAP / 2.0
            o('<line x1="16" x2="%d" y1="%s" y2="%s" stroke="%s" stroke-dasharray="2 3"/>'
              % (W - MR, num(sy), num(sy), GRID))

    # --- time grid
    tstep = nice_step(span / 1000.0, max(4, PW // 85))
    dec = tick_decimals(tstep)
    k = 0
    o('<g stroke="%s" stroke-width="1">' % GRID)
    ticks = []
    while k * tstep <= span / 1000.0 * (1 + 1e-9):
        ticks.append(k * tstep)
        k += 1
    for t in ticks:
        x = X(t0 + t * 1000.0)
        o('<line x1="%s" x2="%s" y1="%d" y2="%d"/>' % (num(x), num(x), plot_top, plot_bottom))
    o('</g>')
    o('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s"/>' % (ML, ML + PW, axis_y, axis_y, FAINT))
    for t in ticks:
        x = X(t0 + t * 1000.0)
        o('<line x1="%s" x2="%s" y1="%d" y2="%d" stroke="%s"/>'
          % (num(x), num(x), axis_y, axis_y + 5, FAINT))
        o('<text x="%s" y="%d" text-anchor="middle" font-size="11" fill="%s">%s</text>'
          % (num(x), axis_y + 18, MUTED, "%.*f" % (dec, t)))
    o('<text x="%s" y="%d" text-anchor="middle" font-size="12" fill="%s">'
      'time since the start of step %d (ms)</text>' % (num(ML + PW / 2.0), axis_y + 40, MUTED, step))

    # --- events
    for r in ranks:
        y0, cy, ky = geo[r]
        p = per[r]

        # step bracket and its label
        step_label_end = ML
        for sev in p["steps"]:
            x1, x2 = X(sev.ts), X(sev.ts + sev.dur)
            by = y0 + 15
            o('<g><title>%s</title>' % esc(tooltip(sev, t0)))
            o('<path d="M%s %d L%s %d L%s %d L%s %d" fill="none" stroke="%s" stroke-width="1.2"/>'
              % (num(x1), by + 5, num(x1), by, num(x2), by, num(x2), by + 5, FAINT))
            lab = "step %d \u00b7 %s" % (step, fmt_ms(sev.dur))
            lw = text_w(lab, 11) + 8
            o('<rect x="%s" y="%d" width="%s" height="14" fill="#ffffff"/>'
              % (num(x1 + 6), by - 9, num(lw)))
            o('<text x="%s" y="%d" font-size="11" fill="%s">%s</text>'
              % (num(x1 + 10), by + 2, MUTED, esc(lab)))
            o('</g>')
            step_label_end = max(step_label_end, x1 + 6 + lw)

        for lane, ly in (("compute", cy), ("comm", ky)):
            placed, nrows = pack_rows(p[lane])
            rh = float(LANE - 4) / nrows
            for ev, row in placed:
                cat = ev.cat if ev.cat in CATS else "other"
                fill = CATS[cat][0]
                x1 = X(ev.ts)
                w = X(ev.ts + ev.dur) - x1
                if w < 1.0:
                    w = 1.0                     # a sliver for what is shorter than a pixel
                elif w > 3.0:
                    w -= 0.75                   # hairline gap between neighbours
                yy = ly + 2 + row * rh
                hh = rh - (1 if nrows > 1 else 0)
                rx = 2 if w > 6 else 0
                o('<g class="ev"><title>%s</title>' % esc(tooltip(ev, t0)))
                o('<rect class="ev cat-%s" x="%s" y="%s" width="%s" height="%s" rx="%d" fill="%s"/>'
                  % (esc(cat), num(x1), num(yy), num(w), num(hh), rx, fill))
                fs = 10.5 if hh >= 18 else max(7.0, hh - 4)
                if hh >= 10 and cat not in EXPOSED_CATS:
                    for lab in short_labels(ev):
                        if text_w(lab, fs) + 8 <= w:
                            tc = "#ffffff" if luminance(fill) < 0.5 else INK
                            o('<text x="%s" y="%s" text-anchor="middle" font-size="%s" fill="%s">%s</text>'
                              % (num(x1 + w / 2.0), num(yy + hh / 2.0 + fs * 0.36), num(fs), tc, esc(lab)))
                            break
                o('</g>')

        # exposed spans: hatched band across both lanes, on top, plus the label above
        for ev in p["exposed"]:
            x1 = X(ev.ts)
            w = max(1.5, X(ev.ts + ev.dur) - x1)
            o('<rect x="%s" y="%d" width="%s" height="%d" fill="url(#hatch)" stroke="%s" '
              'stroke-width="1" stroke-dasharray="3 2" pointer-events="none"/>'
              % (num(x1), cy - 2, num(w), ky + LANE - cy + 4, EXPOSED_RED))
            lab = "exposed " + fmt_ms(ev.dur)
            lw = text_w(lab, 11.5) * 1.1     # bold
            cx = x1 + w / 2.0
            lx = min(max(cx - lw / 2.0, step_label_end + 6), ML + PW - lw)
            o('<rect x="%s" y="%d" width="%s" height="15" fill="#ffffff"/>'
              % (num(lx - 4), y0 + 1, num(lw + 8)))
            o('<text x="%s" y="%d" font-size="11.5" font-weight="bold" fill="%s">%s</text>'
              % (num(lx), y0 + 13, EXPOSED_RED, esc(lab)))
            step_label_end = max(step_label_end, lx + lw + 4)

        # ready markers at the bottom edge of their lane, labelled where there is room
        last_end = -1e9
        for ev in sorted(p["instants"], key=lambda e: e.ts):
            ly = ky if ev.tid == 1 else cy
            x = X(ev.ts)
            b = ly + LANE
            o('<g><title>%s</title>' % esc(tooltip(ev, t0)))
            o('<path d="M%s %s l4.5 0 l-4.5 7 l-4.5 -7 z" fill="#374151" stroke="#ffffff" '
              'stroke-width="0.6"/>' % (num(x), num(b + 0.5)))
            lab = instant_label(ev)
            lw = text_w(lab, 9.5)
            if lab and x + 6 > last_end and x + 6 + lw <= ML + PW + MR - 2:
                o('<text x="%s" y="%s" font-size="9.5" fill="%s" stroke="#ffffff" '
                  'stroke-width="2.5" stroke-linejoin="round" paint-order="stroke">%s</text>'
                  % (num(x + 6), num(b + 11), MUTED, esc(lab)))
                last_end = x + 6 + lw + 5
            o('</g>')

    o('</svg>')
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="trace_svg.py",
        description="Draw one training step of a ddp.h Chrome trace as an SVG timeline.",
        epilog="Default step: the last step that every rank completed (has a 'step' or "
               "'wait for comm' event).")
    ap.add_argument("trace", help="trace JSON written by ddp.h")
    ap.add_argument("-o", "--output", help="output SVG (default: TRACE with suffix .svg)")
    ap.add_argument("--step", type=int, help="step to draw (args.step); default: last complete")
    ap.add_argument("--width", type=int, default=1200, help="picture width in px (default 1200)")
    ap.add_argument("--title", help="title (default: 'ddp.h step N \u2014 R ranks')")
    a = ap.parse_args(argv)

    raw = load_events(a.trace)
    evs = parse_events(raw)
    if not evs:
        die("%s has no events with args.step to draw" % a.trace)
    step = choose_step(evs, a.step)
    nranks = len(set(ev.pid for ev in evs if ev.step == step))
    title = a.title if a.title is not None else "ddp.h step %d \u2014 %d rank%s" % (
        step, nranks, "" if nranks == 1 else "s")
    svg = render(evs, step, a.width, title, os.path.basename(a.trace))

    out = a.output
    if not out:
        base, ext = os.path.splitext(a.trace)
        out = (base if ext else a.trace) + ".svg"
    try:
        with open(out, "w", encoding="utf-8") as f:
            f.write(svg)
    except OSError as e:
        die("cannot write %s: %s" % (out, e.strerror or e))
    sys.stdout.write("%s: wrote %s (step %d, %d rank%s)\n"
                     % (PROG, out, step, nranks, "" if nranks == 1 else "s"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
