#!/usr/bin/env python3
"""sweep_svg.py - plot step time against bucket cap from a sweep CSV, as an SVG picture.

usage: tools/sweep_svg.py SWEEP.csv [-o OUT.svg] [--title TEXT]

SWEEP.csv has a header line and at least the columns
    bucket_cap_mb, step_ms, comm_ms, exposed_ms, compute_ms
(in any order; other columns are ignored). Several rows may share a cap: the plot shows the
mean of each column and a min-max whisker. x is the cap in MiB on a log scale, with a tick at
every cap present; y is milliseconds from 0. Lines: step_ms (bold), exposed_ms, comm_ms, and a
dashed horizontal "compute only" reference at the mean compute_ms over all rows. The cap with
the lowest mean step_ms is marked "best". Hovering over a point in a browser shows its numbers.

Output: OUT.svg, by default SWEEP with its suffix replaced by .svg. A missing file, a missing
column, a value that is not a number, or a cap that is not positive is reported on stderr with
exit status 2. Python 3 standard library only.
"""

import argparse
import csv
import io
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svgkit import MUTED, FAINT, GRID, esc, num, text_w, nice_step, tick_decimals, read_text, svg_open  # noqa: E402

PROG = "sweep_svg"
REQUIRED = ["bucket_cap_mb", "step_ms", "comm_ms", "exposed_ms", "compute_ms"]

# the same look as trace_svg.py
TEXT2 = "#374151"
PLOT_BG = "#fbfbfc"

SERIES = [  # column, legend label, colour, line width, marker radius
    ("step_ms", "step time", "#1f2937", 3.0, 5.0),
    ("comm_ms", "allreduce (comm)", "#f58518", 2.0, 4.0),
    ("exposed_ms", "exposed comm wait", "#e45756", 2.0, 4.0),
]
COMPUTE_COLOR = "#4c78a8"
BEST_COLOR = "#2ca02c"


def die(msg):
    sys.stderr.write("%s: error: %s\n" % (PROG, msg))
    sys.exit(2)


def fmt_cap(c):
    """25.0 -> '25', 0.5 -> '0.5', 1.25 -> '1.25'."""
    s = "%.4g" % c
    if "e" in s:
        s = "%g" % c
    return s


# ---------------------------------------------------------------- reading

def read_sweep(path):
    text = read_text(path, die)
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        die("%s is empty (expected a header line with %s)" % (path, ", ".join(REQUIRED)))
    try:
        rows = list(csv.reader(io.StringIO("\n".join(lines))))
    except csv.Error as e:
        die("%s is not valid CSV: %s" % (path, e))
    header = [h.strip().lower() for h in rows[0]]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        die("%s lacks column%s %s (its header has: %s; needed: %s)"
            % (path, "s" if len(missing) > 1 else "", ", ".join(missing),
               ", ".join(h for h in header if h) or "nothing", ", ".join(REQUIRED)))
    idx = {c: header.index(c) for c in REQUIRED}
    data = []
    for n, row in enumerate(rows[1:], start=2):
        rec = {}
        for c in REQUIRED:
            i = idx[c]
            cell = row[i].strip() if i < len(row) else ""
            try:
                v = float(cell)
            except ValueError:
                v = float("nan")
            if not math.isfinite(v):
                die("%s, data row %d: %s is %s, not a number"
                    % (path, n - 1, c, repr(cell) if cell else "missing"))
            if v < 0 or (c == "bucket_cap_mb" and v <= 0):
                die("%s, data row %d: %s is %s; it must be %s"
                    % (path, n - 1, c, cell, "positive" if c == "bucket_cap_mb" else ">= 0"))
            rec[c] = v
        data.append(rec)
    if not data:
        die("%s has a header but no data rows" % path)
    return data


def aggregate(data):
    """{cap: {col: (mean, lo, hi)}, ...}, number of rows per cap."""
    by = {}
    for rec in data:
        by.setdefault(rec["bucket_cap_mb"], []).append(rec)
    agg, counts = {}, {}
    for cap, recs in by.items():
        agg[cap] = {}
        for c in REQUIRED[1:]:
            vals = [r[c] for r in recs]
            agg[cap][c] = (sum(vals) / len(vals), min(vals), max(vals))
        counts[cap] = len(recs)
    return agg, counts


# ---------------------------------------------------------------- drawing

def render(data, title, source):
    agg, counts = aggregate(data)
    caps = sorted(agg)
    compute_mean = sum(r["compute_ms"] for r in data) / len(data)
    best = min(caps, key=lambda c: (agg[c]["step_ms"][0], c))

    W, H = 960, 600
    ML, MR, MT, MB = 84, 40, 116, 78
    PW, PH = W - ML - MR, H - MT - MB

    # x: log scale with padding; one cap alone sits in the middle
    lo, hi = math.log10(caps[0]), math.log10(caps[-1])
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    pad = (hi - lo) * 0.07
    lo, hi = lo - pad, hi + pad

    def X(cap):
        return ML + (math.log10(cap) - lo) / (hi - lo) * PW

    ymax_data = max([agg[c][col][2] for c in caps for col in ("step_ms", "comm_ms", "exposed_ms")]
                    + [compute_mean])
    ystep = nice_step(max(ymax_data, 1e-6) * 1.08, 8)
    ymax = ystep * math.ceil(max(ymax_data, 1e-6) * 1.08 / ystep)
    ydec = tick_decimals(ystep)

    def Y(v):
        return MT + PH - v / ymax * PH

    out = []
    o = out.append
    svg_open(out, W, H, title)
    o('<rect width="100%" height="100%" fill="#ffffff"/>')

    # title block
    o('<text x="24" y="36" font-size="20" font-weight="bold">%s</text>' % esc(title))
    multi = max(counts.values()) > 1
    sub = "%d row%s, %d cap%s" % (len(data), "" if len(data) == 1 else "s",
                                   len(caps), "" if len(caps) == 1 else "s")
    sub += "; points are means, whiskers span min\u2013max" if multi else "; one run per cap"
    o('<text x="24" y="58" font-size="12.5" fill="%s">%s</text>' % (MUTED, esc(sub)))
    if source:
        o('<text x="%d" y="36" font-size="11" fill="%s" text-anchor="end">%s</text>'
          % (W - MR, FAINT, esc(source)))

    # legend
    ly = 86
    lx = 24.0
    for col, label, color, lw, mr in SERIES:
        o('<line x1="%s" x2="%s" y1="%d" y2="%d" stroke="%s" stroke-width="%s"/>'
          % (num(lx), num(lx + 24), ly - 4, ly - 4, color, num(lw)))
        o('<circle cx="%s" cy="%d" r="%s" fill="%s" stroke="#ffffff" stroke-width="1.2"/>'
          % (num(lx + 12), ly - 4, num(mr - 0.5), color))
        o('<text x="%s" y="%d" fill="%s">%s</text>' % (num(lx + 30), ly, TEXT2, esc(label)))
        lx += 30 + text_w(label, 12) + 22
    o('<line x1="%s" x2="%s" y1="%d" y2="%d" stroke="%s" stroke-width="2" stroke-dasharray="6 4"/>'
      % (num(lx), num(lx + 24), ly - 4, ly - 4, COMPUTE_COLOR))
    o('<text x="%s" y="%d" fill="%s">compute only (mean compute_ms)</text>'
      % (num(lx + 30), ly, TEXT2))

    # plot area, grid, axes
    o('<rect x="%d" y="%d" width="%d" height="%d" fill="%s"/>' % (ML, MT, PW, PH, PLOT_BG))
    o('<g stroke="%s" stroke-width="1">' % GRID)
    k = 0
    yticks = []
    while k * ystep <= ymax * (1 + 1e-9):
        yticks.append(k * ystep)
        k += 1
    for v in yticks:
        o('<line x1="%d" x2="%d" y1="%s" y2="%s"/>' % (ML, ML + PW, num(Y(v)), num(Y(v))))
    for c in caps:
        o('<line x1="%s" x2="%s" y1="%d" y2="%d"/>' % (num(X(c)), num(X(c)), MT, MT + PH))
    o('</g>')
    o('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s"/>' % (ML, ML + PW, MT + PH, MT + PH, FAINT))
    o('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s"/>' % (ML, ML, MT, MT + PH, FAINT))
    for v in yticks:
        o('<text x="%d" y="%s" text-anchor="end" font-size="11" fill="%s">%s</text>'
          % (ML - 8, num(Y(v) + 4), MUTED, "%.*f" % (ydec, v)))
    last_end = -1e9
    for c in caps:
        lab = fmt_cap(c)
        x = X(c)
        o('<line x1="%s" x2="%s" y1="%d" y2="%d" stroke="%s"/>'
          % (num(x), num(x), MT + PH, MT + PH + 5, FAINT))
        w = text_w(lab, 11)
        if x - w / 2 > last_end + 4:        # drop a label that would collide with the previous
            o('<text x="%s" y="%d" text-anchor="middle" font-size="11" fill="%s">%s</text>'
              % (num(x), MT + PH + 19, MUTED, esc(lab)))
            last_end = x + w / 2
    o('<text x="%s" y="%d" text-anchor="middle" font-size="12" fill="%s">'
      'bucket cap (MiB, log scale)</text>' % (num(ML + PW / 2.0), H - 30, MUTED))
    o('<text transform="translate(%d %s) rotate(-90)" text-anchor="middle" font-size="12" '
      'fill="%s">milliseconds per step</text>' % (30, num(MT + PH / 2.0), MUTED))

    # compute-only reference
    yc = Y(compute_mean)
    o('<g><title>%s</title>' % esc("compute only: mean compute_ms %.2f ms over %d rows"
                                   % (compute_mean, len(data))))
    o('<line x1="%d" x2="%d" y1="%s" y2="%s" stroke="%s" stroke-width="2" stroke-dasharray="6 4"/>'
      % (ML, ML + PW, num(yc), num(yc), COMPUTE_COLOR))
    o('<text x="%d" y="%s" text-anchor="end" font-size="11.5" fill="%s" stroke="#ffffff" '
      'stroke-width="3" stroke-linejoin="round" paint-order="stroke">compute only %.2f ms</text>'
      % (ML + PW - 6, num(yc - 6), COMPUTE_COLOR, compute_mean))
    o('</g>')

    # series: whiskers, line, markers (step last so that it is on top)
    for col, label, color, lw, mr in reversed(SERIES):
        pts = [(X(c), Y(agg[c][col][0])) for c in caps]
        for c in caps:
            m, a, b = agg[c][col]
            if b - a > 1e-12:
                x = X(c)
                o('<g stroke="%s" stroke-width="1.3" stroke-opacity="0.8">'
                  '<line x1="%s" x2="%s" y1="%s" y2="%s"/>'
                  '<line x1="%s" x2="%s" y1="%s" y2="%s"/>'
                  '<line x1="%s" x2="%s" y1="%s" y2="%s"/></g>'
                  % (color, num(x), num(x), num(Y(a)), num(Y(b)),
                     num(x - 4), num(x + 4), num(Y(a)), num(Y(a)),
                     num(x - 4), num(x + 4), num(Y(b)), num(Y(b))))
        if len(pts) > 1:
            o('<polyline points="%s" fill="none" stroke="%s" stroke-width="%s" '
              'stroke-linejoin="round" stroke-linecap="round"/>'
              % (" ".join("%s,%s" % (num(x), num(y)) for x, y in pts), color, num(lw)))
        for c, (x, y) in zip(caps, pts):
            m, a, b = agg[c][col]
            tip = "%s at %s MiB\nmean %.2f ms" % (col, fmt_cap(c), m)
            if counts[c] > 1:
                tip += " over %d rows\nmin %.2f ms, max %.2f ms" % (counts[c], a, b)
            o('<circle cx="%s" cy="%s" r="%s" fill="%s" stroke="#ffffff" stroke-width="1.5">'
              '<title>%s</title></circle>' % (num(x), num(y), num(mr), color, esc(tip)))

    # best cap
    bx, by = X(best), Y(agg[best]["step_ms"][0])
    o('<circle cx="%s" cy="%s" r="10" fill="none" stroke="%s" stroke-width="2.2"/>'
      % (num(bx), num(by), BEST_COLOR))
    lab = "best: %s MiB (%.2f ms/step)" % (fmt_cap(best), agg[best]["step_ms"][0])
    lw = text_w(lab, 12.5)
    top_of_best = Y(agg[best]["step_ms"][2])          # clear the whisker
    ty = top_of_best - 34
    if ty < MT + 16:
        ty = max(by, Y(agg[best]["step_ms"][1])) + 44
    tx = min(max(bx - lw / 2.0, ML + 6), ML + PW - lw - 6)
    o('<line x1="%s" x2="%s" y1="%s" y2="%s" stroke="%s" stroke-width="1.2"/>'
      % (num(bx), num(bx), num(ty + (4 if ty < by else -14)),
         num(by + (-11 if ty < by else 11)), BEST_COLOR))
    o('<text x="%s" y="%s" font-size="12.5" font-weight="bold" fill="%s" stroke="#ffffff" '
      'stroke-width="4" stroke-linejoin="round" paint-order="stroke">%s</text>'
      % (num(tx), num(ty), BEST_COLOR, esc(lab)))

    o('</svg>')
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="sweep_svg.py",
        description="Plot step time against bucket cap from a sweep CSV, as an SVG picture.")
    ap.add_argument("csv", help="CSV with columns " + ", ".join(REQUIRED))
    ap.add_argument("-o", "--output", help="output SVG (default: CSV with suffix .svg)")
    ap.add_argument("--title", help="title (default: 'Step time vs bucket cap')")
    a = ap.parse_args(argv)

    data = read_sweep(a.csv)
    title = a.title if a.title is not None else "Step time vs bucket cap"
    svg = render(data, title, os.path.basename(a.csv))
    out = a.output or os.path.splitext(a.csv)[0] + ".svg"
    try:
        with open(out, "w", encoding="utf-8") as f:
            f.write(svg)
    except OSError as e:
        die("cannot write %s: %s" % (out, e.strerror or e))
    sys.stdout.write("%s: wrote %s\n" % (PROG, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
