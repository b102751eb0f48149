#!/usr/bin/env python3
"""outer_svg.py - validation loss against wall-clock for bench/outer_hosts.sh: one panel a link
rate, one line a run (DDP, DiLoCo H=..., streaming, each labelled from its name), one rank alone (grey, dashed) in each panel.
The time axis is logarithmic (1-2-5 ticks), the same in every panel: DDP on a slow link takes ten
times as long as the rest, which a linear axis would squeeze into a corner.

usage: bench/outer_svg.py CURVES.txt OUT.svg TITLE
  CURVES.txt: lines "RATE RUN SECONDS LOSS" (RATE "one" for the one-host run), in time order a run.
Python 3 standard library only; bad input: a message on stderr, exit status 2.
"""
import math
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from svgkit import GRID, INK, MUTED, esc, nice_step, num, read_text, svg_open, tick_decimals  # noqa: E402

COLORS = {"ddp": "#e45756", "diloco10": "#4c78a8", "diloco50": "#72b7b2", "diloco200": "#54a24b",
          "streaming": "#b279a2", "streaming_int8": "#f58518"}
# colours for runs named by their settings (bench/outer_hosts.sh: dilocoH..., streamHfFtT...), in order of appearance
SPARE = ["#9d755d", "#eeca3b", "#ff9da6", "#79706e", "#bab0ac", "#d67195", "#439894", "#8f6d31"]
LABELS = {"ddp": "DDP", "streaming": "streaming (H=50, F=5, bf16)", "streaming_int8": "streaming, int8", "one": "one rank"}


def label(run):
    """A run's legend text from its name: dilocoH / streamHfFtT / streaming, then _lrX _mY _int8."""
    if run in LABELS:
        return LABELS[run]
    m = re.match(r"^(?:diloco(\d+)|stream(\d+)f(\d+)t(\d+))((?:_lr[\d.]+|_m[\d.]+|_int8)*)$", run)
    if not m:
        return run
    text = ("DiLoCo H=%s" % m.group(1)) if m.group(1) else ("streaming H=%s, F=%s, \u03c4=%s" % m.group(2, 3, 4))
    extra = [("lr " + t[2:]) if t.startswith("lr") else ("mom. " + t[1:]) if t.startswith("m") else t
             for t in m.group(5).split("_") if t]
    return text + (" (" + ", ".join(extra) + ")" if extra else "")


def color(run):
    if run not in COLORS:
        COLORS[run] = SPARE[(len(COLORS) - 6) % len(SPARE)]
    return COLORS[run]


def die(msg):
    sys.stderr.write("outer_svg: error: %s\n" % msg)
    sys.exit(2)


def main():
    if len(sys.argv) != 4:
        die("usage: outer_svg.py CURVES.txt OUT.svg TITLE")
    curves = {}
    for i, line in enumerate(read_text(sys.argv[1], die).splitlines(), 1):
        f = line.split()
        if not f:
            continue
        try:
            t, loss = float(f[2]), float(f[3])
        except (IndexError, ValueError):
            die("%s line %d is not 'RATE RUN SECONDS LOSS': %r" % (sys.argv[1], i, line))
        if math.isfinite(t) and math.isfinite(loss):
            curves.setdefault(f[0], {}).setdefault(f[1], []).append((t, loss))
    one = curves.pop("one", {}).get("one", [])
    rates = list(curves)
    if not rates:
        die("%s holds no 2-host run" % sys.argv[1])
    pts = [p for r in curves.values() for c in r.values() for p in c] + one
    pts = [p for p in pts if p[0] > 0]
    if not pts:
        die("%s holds no point after 0 s" % sys.argv[1])
    xmax, xmin = max(p[0] for p in pts), min(p[0] for p in pts)
    ylo, yhi = min(p[1] for p in pts), max(p[1] for p in pts)
    ys = nice_step(max(yhi - ylo, 1e-3), 5)
    ybot, ytop = ys * math.floor(ylo / ys), ys * math.ceil(yhi / ys)
    # decades of 1-2-5 ticks covering [xmin, xmax]
    lo, hi = 10 ** math.floor(math.log10(xmin)), 10 ** math.ceil(math.log10(xmax))
    ticks = [m * 10 ** e for e in range(int(round(math.log10(lo))), int(round(math.log10(hi))) + 1) for m in (1, 2, 5)]
    ticks = [t for t in ticks if lo <= t <= hi]
    while len(ticks) > 2 and ticks[1] <= xmin:
        ticks.pop(0)
    while len(ticks) > 2 and ticks[-2] >= xmax:
        ticks.pop()
    xbot, xtop = math.log10(ticks[0]), math.log10(ticks[-1])
    PW, PH, L, T, GAP = 420, 300, 60, 70, 50
    W, H = L + len(rates) * (PW + GAP) + 300, T + PH + 60
    out = []
    svg_open(out, W, H, sys.argv[3])
    out.append('<rect width="%d" height="%d" fill="#ffffff"/>' % (W, H))
    out.append('<text x="%d" y="24" font-size="15" font-weight="bold">%s</text>' % (L, esc(sys.argv[3])))
    out.append('<text x="%d" y="42" fill="%s">validation loss (fixed windows) against training seconds, validations left '
               'out; each line ends at its final evaluation</text>' % (L, MUTED))
    for k, rate in enumerate(rates):
        x0 = L + k * (PW + GAP)

        def X(t):
            return x0 + PW * (math.log10(max(t, ticks[0])) - xbot) / (xtop - xbot)

        def Y(v):
            return T + PH * (1 - (v - ybot) / (ytop - ybot))
        out.append('<text x="%s" y="%d" font-weight="bold">link %s</text>' % (num(x0), T - 8, esc(rate)))
        d = tick_decimals(ys)
        v = ybot
        while v <= ytop + 1e-9:
            out.append('<line x1="%s" x2="%s" y1="%s" y2="%s" stroke="%s"/>' % (num(x0), num(x0 + PW), num(Y(v)), num(Y(v)), GRID))
            out.append('<text x="%s" y="%s" text-anchor="end" fill="%s">%.*f</text>' % (num(x0 - 5), num(Y(v) + 4), MUTED, d, v))
            v += ys
        for t in ticks:
            out.append('<line x1="%s" x2="%s" y1="%d" y2="%d" stroke="%s"/>' % (num(X(t)), num(X(t)), T, T + PH, GRID))
            out.append('<text x="%s" y="%d" text-anchor="middle" fill="%s">%g</text>' % (num(X(t)), T + PH + 16, MUTED, t))
        out.append('<text x="%s" y="%d" text-anchor="middle" fill="%s">seconds of training (log scale)</text>' % (
            num(x0 + PW / 2), T + PH + 36, INK))
        lines = list(curves[rate].items()) + ([("one", one)] if one else [])
        for run, c in lines:
            c_ = color(run) if run != "one" else "#9aa0a6"
            dash = ' stroke-dasharray="5 4"' if run == "one" else ""
            out.append('<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s><title>%s</title></polyline>' % (
                " ".join("%s,%s" % (num(X(a)), num(Y(b))) for a, b in c), c_, dash, esc(label(run))))
            a, b = c[-1]
            out.append('<circle cx="%s" cy="%s" r="3" fill="%s"><title>%s</title></circle>' % (
                num(X(a)), num(Y(b)), c_, esc("%s at %s: final val loss %.4f after %.1f s" % (label(run), rate, b, a))))
    lx, ly = L + len(rates) * (PW + GAP) - 20, T + 10
    seen = []
    for r in curves.values():
        seen += [run for run in r if run not in seen]
    seen += ["one"] if one else []
    for run in seen:
        dash = ' stroke-dasharray="5 4"' if run == "one" else ""
        out.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"%s/>' % (
            lx, lx + 18, ly - 4, ly - 4, color(run) if run != "one" else "#9aa0a6", dash))
        out.append('<text x="%d" y="%d">%s</text>' % (lx + 24, ly, esc(label(run))))
        ly += 16
    out.append("</svg>")
    try:
        with open(sys.argv[2], "w") as f:
            f.write("\n".join(out) + "\n")
    except OSError as e:
        die("cannot write %s: %s" % (sys.argv[2], e.strerror or e))


if __name__ == "__main__":
    main()
