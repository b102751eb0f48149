#!/usr/bin/env python3
"""scaling.py - will it scale? Predict a data-parallel step on N = 1 .. 1024 ranks from one
measured step (a ddp.h DDP_TIMELINE trace) and a description of the network.

usage: tools/scaling.py TRACE.json [--rank R] [--step N] [fabric] [workload] [-o OUT.svg]
                        [--csv OUT.csv] [--ranks 1,2,4,...] [--title TEXT]

THE MODEL (weak scaling: every rank keeps its batch, so N ranks do N times the work)
  From the trace, for the chosen rank and step (default: rank 0, every complete step after the
  first, the median taken): the step's period P (from its start to the next step's start), the
  end of backward E, each gradient bucket's ready time r_i (the latest over the ranks in the
  trace: its allreduce cannot start before every rank has it) and size b_i (bytes), the measured
  exposed wait X (the "wait for comm" event) and the user collectives U (e.g. a logged loss).
  What is not communication, C = P - X - U, is taken as the same on N ranks (the compute of one
  rank's batch; ddp.h's own costs included).
  On N ranks each bucket's allreduce takes T(b_i, N) (the fabric, below); buckets go one after
  another in bucket order, each no sooner than it is ready: s_i = max(r_i, e_(i-1)), e_i = s_i +
  T(b_i, N). Exposed communication = max(0, e_last - E); the step = C + exposed + sum T(u, N) over
  the user collectives. Efficiency(N) = step(1) / step(N) (throughput per rank vs one rank, which
  communicates nothing). Not modelled: contention between communication and compute for the same
  cores or memory, stragglers (one slow rank delays all), congestion beyond the stated links.

GPU TRACES (ddp.h's NCCL backend)
  There the compute lane holds HOST times (when the program enqueued its kernels) and nothing
  waits on the host, so the host events say nothing about backward or the exposed tail. What is
  on the GPU clock is the comm lane (tid 1): each bucket's allreduce from the comm stream's CUDA
  events, anchored at the host's start of backward. From it, for each step:
    backward  the 'backward (gpu)' span (cat gpu_backward: the compute stream's step_begin to
              step_finish events), E = its end;
    exposed   the 'exposed comm (gpu)' span (cat gpu_exposed: step_finish to the last bucket's
              end), X = its length;
    r_i       the start of bucket i's allreduce on the comm lane (the latest over the ranks). On
              one rank nothing is sent, so it is the moment the compute stream reached the
              bucket's ready event: its readiness on the GPU. With more ranks a start also waits
              for the previous bucket's allreduce and the slowest peer: only an upper bound of
              readiness (the prediction is then pessimistic about overlap; the table says so);
    P         the host's step starts (the host cannot run ahead of its GPU for long).
  A trace from a ddp.h before those spans (no host wait, no step events, no GPU spans) is read
  on one rank only: backward ends at the last allreduce's start (the last bucket is ready when
  backward's last op is; ops after it would be missed) and X is the last allreduce's length. On
  more ranks such a trace is refused: the end of backward cannot be told from the comm lane.

THE FABRIC (--fabric FILE.json with the same keys, or the options)
  --algo ring|tree|flat   ring: T = 2(n-1)(a + b/(n B)) per level; tree: T = 2 ceil(log2 n) a + 2 b/B;
                          flat: T = a + b/B whatever N: what ddp.h's inject_comm_latency_ms /
                          inject_comm_gbps emulate (used to validate the model on one host)
  --ranks-per-node G      (1) ranks on one node: with N > G the allreduce is hierarchical, as NCCL's
                          ring over nodes: a reduce-scatter and all-gather inside the node
                          (2(G-1)(a_in + b/(G B_in))) around an allreduce of b/G among the N/G nodes
                          on every rank's share of the node's NICs (B_out x nics / G)
  --intra-gbps B_in --intra-latency-us a_in     links inside a node (Gbit/s per rank, one way)
  --inter-gbps B_out --inter-latency-us a_out   a node's NIC (Gbit/s) and the latency across nodes
  --nics-per-node K       (G) NICs per node sharing the inter-node traffic
  --efficiency F          (1) the fraction of each link's rate an allreduce reaches

THE WORKLOAD (to ask about a model that was not measured; each is an assumption to state)
  --compute-scale X       multiply every compute time (C, E, the ready times) by X
  --grad-bytes BYTES      the model's gradient bytes in all; buckets are re-made (--bucket-mb) with
                          the measured readiness: the fraction of bytes ready by each fraction of
                          backward is kept, interpolated linearly
  --bucket-mb MB          bucket cap for re-made buckets (25, ddp.h's default; the first bucket 1)
  --ready-at-end F        with --grad-bytes: a share F of the bytes is ready only when backward ends
                          (a tied token embedding: GPT-2 small's wte + wpe are 0.317 of its bytes);
                          the rest keeps the measured readiness curve

OUTPUT
  A table on stdout (N, step ms, comm ms, exposed ms, efficiency %), the same as CSV with --csv,
  and an SVG (OUT.svg, default TRACE with .scaling.svg): step time and exposed communication
  against N (log scale), and the efficiency. Bad input: a message on stderr, exit status 2.
  Python 3 standard library only.
"""

import argparse
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svgkit import INK, MUTED, FAINT, GRID, esc, num, read_text, svg_open  # noqa: E402

PROG = "scaling"


def die(msg):
    sys.stderr.write("%s: error: %s\n" % (PROG, msg))
    sys.exit(2)


def number(name, v, lo=None, hi=None, lo_open=False, integer=False):
    """A fabric or flag value: a finite number (not a string, null or true/false) in [lo, hi]."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        die("%s must be a finite number, not %r" % (name, v))
    if integer and v != int(v):
        die("%s must be a whole number, not %r" % (name, v))
    if lo is not None and (v <= lo if lo_open else v < lo):
        die("%s must be %s %s, not %r" % (name, ">" if lo_open else ">=", lo, v))
    if hi is not None and v > hi:
        die("%s must be at most %s, not %r" % (name, hi, v))
    return int(v) if integer else float(v)


# ---------------------------------------------------------------- the measured step

def load_events(path):
    text = read_text(path, die)
    try:
        data = json.loads(text)
    except ValueError as e:
        die("%s is not valid JSON: %s" % (path, e))
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list) or not events:
        die("%s holds no trace events" % path)
    events = [e for e in events if isinstance(e, dict)]
    for e in events:   # a timeline ddp.h wrote has numbers here; anything else is named, not a traceback
        for k in ("ts", "dur"):
            v = e.get(k, 0)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                die("%s: an event (%s) has %s %r, not a number" % (path, e.get("name", "unnamed"), k, v))
    return events


def step_of(e):
    a = e.get("args")
    return a.get("step") if isinstance(a, dict) else None


def measure_steps(events, rank):
    """Per complete step of `rank`: the numbers the model needs (times in us from the step's start)."""
    mine = [e for e in events if e.get("pid") == rank and e.get("ph") in ("X", "i") and
            isinstance(e.get("ts"), (int, float)) and step_of(e) is not None]
    if not mine:
        ranks = sorted({e.get("pid") for e in events if e.get("ph") == "X"}, key=str)
        die("no events of rank %s in the trace (ranks there: %s)" % (rank, ", ".join(map(str, ranks)) or "none"))
    # A bucket's allreduce starts when the LAST rank has it ready: the latest ready instant of each
    # (step, bucket) over every rank of the trace (ddp.h's trace has one clock for all ranks).
    latest = {}
    for e in events:
        a = e.get("args")
        if e.get("cat") == "ready" and isinstance(a, dict) and "bucket" in a and isinstance(e.get("ts"), (int, float)):
            k = (a.get("step"), a["bucket"])
            latest[k] = max(latest.get(k, e["ts"]), e["ts"])
    by_step = {}
    for e in mine:
        by_step.setdefault(step_of(e), []).append(e)
    starts = {}
    for s, evs in by_step.items():
        st = [e["ts"] for e in evs if e.get("cat") == "step"]
        starts[s] = min(st) if st else min(e["ts"] for e in evs)
    gpu = gpu_kind(events, mine)
    if gpu == "old" and len(trace_ranks(events)) > 1:
        die("rank %s's steps have no host 'wait for comm' and no GPU spans: an NCCL trace from a ddp.h "
            "that did not record 'backward (gpu)' and 'exposed comm (gpu)'; with %d ranks the end of backward "
            "on the GPU cannot be told from the comm lane (record it again with this ddp.h)" % (rank, len(trace_ranks(events))))
    if gpu:
        # the comm lane is on the GPU clock: a bucket's allreduce starts when the comm stream got
        # past the bucket's ready event (and the previous bucket); the latest start over the ranks
        latest = {}
        for e in events:
            a = e.get("args")
            if e.get("cat") == "comm" and e.get("ph") == "X" and isinstance(a, dict) and "bucket" in a and \
                    isinstance(e.get("ts"), (int, float)):
                k = (a.get("step"), a["bucket"])
                latest[k] = max(latest.get(k, e["ts"]), e["ts"])
    steps = []
    for s in sorted(by_step):
        evs = by_step[s]
        t0 = starts[s]
        back = [e for e in evs if e.get("cat") == "backward" and e.get("ph") == "X"]
        waits = [e for e in evs if e.get("cat") == "exposed" and e.get("ph") == "X"]
        comms = [e for e in evs if e.get("cat") == "comm" and e.get("ph") == "X" and "bucket" in (e.get("args") or {})]
        if gpu == "spans":
            back = [e for e in evs if e.get("cat") == "gpu_backward" and e.get("ph") == "X"]
            waits = [e for e in evs if e.get("cat") == "gpu_exposed" and e.get("ph") == "X"]
        elif gpu == "old" and back and comms:
            # no device spans: backward on the GPU starts at the lane's anchor (the host's start of
            # backward) and ends, at the latest, when the last bucket got ready, which on one
            # rank is the last allreduce's start; what it ran past that is the exposed tail
            b0 = min(e["ts"] for e in back)
            b1 = max(e["ts"] for e in comms)
            c1 = max(e["ts"] + e.get("dur", 0) for e in comms)
            back = [{"ts": b0, "dur": b1 - b0}]
            waits = [{"ts": b1, "dur": max(0.0, c1 - b1)}]
        if not back or not waits:
            continue   # cut off, or not a training step
        end = max(e["ts"] + e.get("dur", 0) for e in evs)
        period = (starts[s + 1] - t0) if s + 1 in starts else end - t0
        buckets = {}
        for e in evs:
            a = e.get("args") or {}
            if e.get("cat") == ("comm" if gpu else "ready") and "bucket" in a:
                buckets.setdefault(a["bucket"], {})["ready"] = latest[(s, a["bucket"])] - t0
            if e.get("cat") == "comm" and "bucket" in a:
                b = buckets.setdefault(a["bucket"], {})
                b["bytes"] = a.get("bytes", 0)
                b["measured"] = e.get("dur", 0)
        buckets = [dict(buckets[k], id=k) for k in sorted(buckets) if "ready" in buckets[k] and "bytes" in buckets[k]]
        users = [(e.get("args") or {}).get("bytes", 4) for e in evs if e.get("cat") == "user_comm"]
        user_us = sum(e.get("dur", 0) for e in evs if e.get("cat") == "user_comm")
        exposed = sum(e.get("dur", 0) for e in waits)
        steps.append({
            "step": s, "period": period, "bwd_end": max(e["ts"] + e.get("dur", 0) for e in back) - t0,
            "bwd_start": min(e["ts"] for e in back) - t0, "exposed": exposed, "user_us": user_us,
            "user_bytes": users, "buckets": buckets,
            "comm": sum(b.get("measured", 0) for b in buckets),
            "compute": period - exposed - user_us,
        })
    if not steps:
        die("no complete training step of rank %s in the trace (a step needs backward ops and a "
            "'wait for comm' event, or on the NCCL backend 'backward (gpu)' and 'exposed comm (gpu)' "
            "or the comm lane's allreduces)" % rank)
    for st in steps:
        st["clock"] = {"spans": "gpu", "old": "gpu-derived"}.get(gpu, "host")
    return steps


def trace_ranks(events):
    return sorted({e.get("pid") for e in events if e.get("ph") == "X"}, key=str)


def gpu_kind(events, mine):
    """How the trace tells the GPU's side of a step: "spans" (ddp.h's NCCL backend records
    'backward (gpu)' and 'exposed comm (gpu)'), "old" (an NCCL trace from before them: allreduces
    and backward ops but neither a host wait nor a step event), None (a host-clock trace)."""
    cats = {e.get("cat") for e in mine}
    if "gpu_backward" in cats or "gpu_exposed" in cats:
        return "spans"
    if "comm" in cats and "backward" in cats and not ({"exposed", "step"} & cats):
        return "old"
    return None


# ---------------------------------------------------------------- the fabric

class Fabric:
    def __init__(self, algo="ring", ranks_per_node=1, intra_gbps=None, intra_latency_us=0.0,
                 inter_gbps=None, inter_latency_us=0.0, nics_per_node=None, efficiency=1.0):
        if algo not in ("ring", "tree", "flat"):
            die("algo must be ring, tree or flat, not %r" % (algo,))
        self.algo = algo
        self.g = number("ranks_per_node", ranks_per_node, 1, 1 << 20, integer=True)
        self.eff = number("efficiency", efficiency, 0, 1, lo_open=True)
        self.nics = number("nics_per_node", nics_per_node, 1, 1 << 20, integer=True) if nics_per_node is not None else self.g
        if inter_gbps is None and intra_gbps is None:
            die("the fabric needs --inter-gbps (and --intra-gbps with --ranks-per-node > 1)")
        if inter_gbps is None:
            inter_gbps, inter_latency_us = intra_gbps, intra_latency_us
        if intra_gbps is None:
            intra_gbps, intra_latency_us = inter_gbps, inter_latency_us
        for name, v in (("intra_gbps", intra_gbps), ("inter_gbps", inter_gbps)):
            number(name, v, 0, 1e9, lo_open=True)
        for name, v in (("intra_latency_us", intra_latency_us), ("inter_latency_us", inter_latency_us)):
            number(name, v, 0, 1e9)
        self.b_in = float(intra_gbps) * 1e9 / 8 * self.eff      # bytes/s
        self.b_out = float(inter_gbps) * 1e9 / 8 * self.eff
        self.a_in = float(intra_latency_us) * 1e-6
        self.a_out = float(inter_latency_us) * 1e-6

    def level(self, nbytes, n, a, bw):
        if n <= 1:
            return 0.0
        if self.algo == "tree":
            return 2 * math.ceil(math.log2(n)) * a + 2 * nbytes / bw
        return 2 * (n - 1) * (a + nbytes / (n * bw))

    def allreduce_s(self, nbytes, n):
        """Seconds for an allreduce of nbytes among n ranks."""
        if n <= 1:
            return 0.0
        if self.algo == "flat":   # ddp.h's injected network: one latency + bytes / bandwidth
            return self.a_out + nbytes / self.b_out
        if n <= self.g:
            return self.level(nbytes, n, self.a_in, self.b_in)
        nodes = int(math.ceil(n / self.g))
        share = self.b_out * min(self.nics, self.g) / self.g   # each local rank's part of the NICs
        return self.level(nbytes, self.g, self.a_in, self.b_in) + self.level(nbytes / self.g, nodes, self.a_out, share)

    def describe(self):
        if self.algo == "flat":
            return "flat: %.3g ms + bytes / %.3g Gbit/s per allreduce" % (self.a_out * 1e3, self.b_out * 8 / 1e9)
        s = "%s, %d rank(s)/node: inside %.4g Gbit/s, %.3g us" % (self.algo, self.g, self.b_in * 8 / 1e9, self.a_in * 1e6)
        s += "; across %.4g Gbit/s x %d NIC(s), %.3g us" % (self.b_out * 8 / 1e9, self.nics, self.a_out * 1e6)
        if self.eff < 1:
            s += " (rates x %.2f)" % self.eff
        return s


# ---------------------------------------------------------------- the workload, re-made

def remake(step, compute_scale, grad_bytes, bucket_mb, ready_at_end=None):
    """The step with compute scaled and, with grad_bytes, buckets re-made from the readiness curve."""
    s = dict(step)
    k = compute_scale
    s["compute"] = step["compute"] * k
    s["bwd_end"] = step["bwd_end"] * k
    s["bwd_start"] = step["bwd_start"] * k
    bk = [dict(b, ready=b["ready"] * k) for b in step["buckets"]]
    if grad_bytes:
        total = float(sum(b["bytes"] for b in bk))
        if total <= 0:
            die("the measured step has no gradient bytes to re-make buckets from")
        t0, t1 = s["bwd_start"], s["bwd_end"]
        # readiness: (fraction of backward elapsed, fraction of bytes ready), from the measured buckets
        pts, acc = [(0.0, 0.0)], 0.0
        for b in sorted(bk, key=lambda b: b["ready"]):
            acc += b["bytes"] / total
            x = min(1.0, max(0.0, (b["ready"] - t0) / (t1 - t0))) if t1 > t0 else 1.0
            pts.append((max(x, pts[-1][0]), acc))
        if ready_at_end is not None:
            # A share F of the bytes is finished only by backward's last op (a tied embedding): the
            # rest keeps the measured shape, scaled to 1 - F, and F joins at the end.
            before = [p for p in pts if p[0] < 1.0]
            top = before[-1][1] if before else 0.0
            k = (1.0 - ready_at_end) / top if top > 0 else 0.0
            pts = [(x, y * k) for x, y in before] + [(1.0, 1.0 - ready_at_end), (1.0, 1.0)]

        def time_for(frac):
            for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
                if frac <= y1 + 1e-12:
                    x = x1 if y1 == y0 else x0 + (x1 - x0) * (frac - y0) / (y1 - y0)
                    return t0 + x * (t1 - t0)
            return t1
        cap = bucket_mb * 1024 * 1024
        if grad_bytes / cap > 1e6:
            die("--grad-bytes %g in buckets of --bucket-mb %g is %.3g buckets, more than 1e6" % (grad_bytes, bucket_mb, grad_bytes / cap))
        sizes, left, first = [], float(grad_bytes), min(1024 * 1024, cap)
        while left > 0:
            b = min(left, first if not sizes else cap)
            sizes.append(b)
            left -= b
        bk, done = [], 0.0
        for i, b in enumerate(sizes):
            done += b
            bk.append({"id": i, "bytes": b, "ready": time_for(done / grad_bytes)})
    s["buckets"] = bk
    return s


# ---------------------------------------------------------------- the prediction

def predict(step, fabric, n):
    """(step us, comm us, exposed us) on n ranks."""
    if n <= 1:
        return step["compute"], 0.0, 0.0
    end, comm = 0.0, 0.0
    for b in sorted(step["buckets"], key=lambda b: b["id"]):
        t = fabric.allreduce_s(b["bytes"], n) * 1e6
        end = max(end, b["ready"]) + t
        comm += t
    exposed = max(0.0, end - step["bwd_end"]) if step["buckets"] else 0.0
    user = sum(fabric.allreduce_s(u, n) * 1e6 for u in step["user_bytes"])
    return step["compute"] + exposed + user, comm + user, exposed


def parse_ranks(text):
    try:
        ranks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        die("--ranks must be a comma-separated list of integers, not %r" % text)
    if not ranks or ranks[0] < 1 or ranks[-1] > 1 << 20:
        die("--ranks must list numbers 1 .. 1048576")
    return ranks


# ---------------------------------------------------------------- the picture

def draw(rows, title, subtitle, path):
    W, H = 760, 470
    L, R, T, B = 70, 70, 70, 60
    pw, ph = W - L - R, H - T - B
    ns = [r[0] for r in rows]
    xmin, xmax = math.log2(ns[0]), math.log2(ns[-1]) if ns[-1] > ns[0] else math.log2(ns[0]) + 1
    ymax = max(r[1] for r in rows) / 1000.0
    ystep = 10 ** math.floor(math.log10(ymax)) if ymax > 0 else 1
    for m in (1, 2, 2.5, 5, 10):
        if ymax / (m * ystep) <= 6:
            ystep *= m
            break
    ytop = ystep * math.ceil(ymax / ystep) if ymax > 0 else 1

    def X(n):
        return L + pw * (math.log2(n) - xmin) / (xmax - xmin)

    def Y(ms):
        return T + ph * (1 - ms / ytop)

    def Ye(pct):
        return T + ph * (1 - pct / 100.0)
    out = []
    svg_open(out, W, H, title)
    out.append('<rect width="%d" height="%d" fill="#ffffff"/>' % (W, H))
    out.append('<text x="%d" y="24" font-size="15" font-weight="bold">%s</text>' % (L, esc(title)))
    out.append('<text x="%d" y="42" fill="%s">%s</text>' % (L, MUTED, esc(subtitle)))
    v = 0.0
    while v <= ytop + 1e-9:
        y = Y(v)
        out.append('<line x1="%d" x2="%d" y1="%s" y2="%s" stroke="%s"/>' % (L, L + pw, num(y), num(y), GRID))
        out.append('<text x="%d" y="%s" text-anchor="end" fill="%s">%s</text>' % (L - 6, num(y + 4), MUTED, esc("%g" % v)))
        v += ystep
    for pct in (0, 25, 50, 75, 100):
        out.append('<text x="%d" y="%s" fill="#2ca02c">%d%%</text>' % (L + pw + 6, num(Ye(pct) + 4), pct))
    for n in ns:
        if n & (n - 1) == 0 or n == ns[0] or n == ns[-1]:
            out.append('<text x="%s" y="%d" text-anchor="middle" fill="%s">%d</text>' % (num(X(n)), T + ph + 16, MUTED, n))
    out.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s"/>' % (L, L + pw, T + ph, T + ph, FAINT))
    out.append('<text x="%s" y="%d" text-anchor="middle" fill="%s">ranks (log scale)</text>' % (num(L + pw / 2), H - 18, INK))
    out.append('<text x="16" y="%s" transform="rotate(-90 16 %s)" text-anchor="middle">ms per step</text>' % (num(T + ph / 2), num(T + ph / 2)))
    out.append('<text x="%d" y="%s" transform="rotate(90 %d %s)" text-anchor="middle" fill="#2ca02c">efficiency</text>'
               % (W - 14, num(T + ph / 2), W - 14, num(T + ph / 2)))
    # the compute floor, the exposed band on top of it, the step line, the efficiency line
    comp = [(X(r[0]), Y((r[1] - r[3] - r[4]) / 1000.0)) for r in rows]
    step = [(X(r[0]), Y(r[1] / 1000.0)) for r in rows]
    band = step + list(reversed(comp))
    out.append('<polygon points="%s" fill="#e45756" fill-opacity="0.35"><title>exposed communication</title></polygon>'
               % " ".join("%s,%s" % (num(x), num(y)) for x, y in band))
    out.append('<polyline points="%s" fill="none" stroke="#9aa0a6" stroke-width="1.5" stroke-dasharray="4 3"/>'
               % " ".join("%s,%s" % (num(x), num(y)) for x, y in comp))
    out.append('<polyline points="%s" fill="none" stroke="#4c78a8" stroke-width="2"/>'
               % " ".join("%s,%s" % (num(x), num(y)) for x, y in step))
    out.append('<polyline points="%s" fill="none" stroke="#2ca02c" stroke-width="2"/>'
               % " ".join("%s,%s" % (num(X(r[0])), num(Ye(r[5]))) for r in rows))
    for r in rows:
        out.append('<circle cx="%s" cy="%s" r="2.5" fill="#4c78a8"><title>%s</title></circle>' % (
            num(X(r[0])), num(Y(r[1] / 1000.0)),
            esc("N=%d: step %.2f ms, comm %.2f ms, exposed %.2f ms, efficiency %.1f %%" % (
                r[0], r[1] / 1e3, r[2] / 1e3, r[3] / 1e3, r[5]))))
    lx, ly = L + 8, T + 14
    for color, label, dash in (("#4c78a8", "step time", ""), ("#9aa0a6", "compute (no communication)", "4 3"),
                               ("#e45756", "exposed communication", ""), ("#2ca02c", "efficiency (right axis)", "")):
        out.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="%s"%s/>' % (
            lx, lx + 18, ly - 4, ly - 4, color, "6" if label.startswith("exposed") else "2",
            ' stroke-dasharray="%s"' % dash if dash else ""))
        out.append('<text x="%d" y="%d">%s</text>' % (lx + 24, ly, esc(label)))
        ly += 16
    last = rows[-1]
    note = "at N=%d: %.1f ms per step, %.1f ms exposed, efficiency %.1f %%" % (last[0], last[1] / 1e3, last[3] / 1e3, last[5])
    out.append('<text x="%d" y="58" fill="%s" font-size="11">%s</text>' % (L, MUTED, esc(note)))
    out.append('</svg>')
    try:
        with open(path, "w") as f:
            f.write("\n".join(out) + "\n")
    except OSError as e:
        die("cannot write %s: %s" % (path, e.strerror or e))


# ---------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(prog=PROG, description="Predict step time and scaling efficiency from a ddp.h timeline.")
    ap.add_argument("trace")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--step", type=int, default=None, help="one step (default: the median of every complete step after the first)")
    ap.add_argument("--fabric", help="JSON file with the fabric's keys (algo, ranks_per_node, intra_gbps, ...)")
    ap.add_argument("--algo")
    ap.add_argument("--ranks-per-node", type=int)
    ap.add_argument("--intra-gbps", type=float)
    ap.add_argument("--intra-latency-us", type=float)
    ap.add_argument("--inter-gbps", type=float)
    ap.add_argument("--inter-latency-us", type=float)
    ap.add_argument("--nics-per-node", type=int)
    ap.add_argument("--efficiency", type=float)
    ap.add_argument("--compute-scale", type=float, default=1.0)
    ap.add_argument("--grad-bytes", type=float)
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--ready-at-end", type=float)
    ap.add_argument("--ranks", default=",".join(str(1 << k) for k in range(11)))
    ap.add_argument("-o", "--output")
    ap.add_argument("--csv")
    ap.add_argument("--title", default="Predicted scaling")
    a = ap.parse_args(argv)

    keys = {}
    if a.fabric:
        try:
            keys = json.loads(read_text(a.fabric, die))
        except ValueError as e:
            die("%s is not valid JSON: %s" % (a.fabric, e))
        if not isinstance(keys, dict):
            die("%s must hold a JSON object" % a.fabric)
        known = {"algo", "ranks_per_node", "intra_gbps", "intra_latency_us", "inter_gbps", "inter_latency_us",
                 "nics_per_node", "efficiency"}
        unknown = sorted(set(keys) - known)
        if unknown:
            die("%s: unknown key(s) %s (known: %s)" % (a.fabric, ", ".join(unknown), ", ".join(sorted(known))))
    for k in ("algo", "ranks_per_node", "intra_gbps", "intra_latency_us", "inter_gbps", "inter_latency_us",
              "nics_per_node", "efficiency"):
        v = getattr(a, k)
        if v is not None:
            keys[k] = v
    fabric = Fabric(**keys)
    number("--compute-scale", a.compute_scale, 0, 1e6, lo_open=True)
    if a.grad_bytes is not None:
        number("--grad-bytes", a.grad_bytes, 0, 1e15, lo_open=True)
    number("--bucket-mb", a.bucket_mb, 0, 1e9, lo_open=True)
    if a.ready_at_end is not None and (a.grad_bytes is None or not 0 <= a.ready_at_end < 1):
        die("--ready-at-end needs --grad-bytes and a share in [0, 1), not %r" % a.ready_at_end)
    ranks = parse_ranks(a.ranks)

    events = load_events(a.trace)
    steps = measure_steps(events, a.rank)
    if a.step is not None:
        steps = [s for s in steps if s["step"] == a.step]
        if not steps:
            die("step %d is not a complete step of rank %d in the trace" % (a.step, a.rank))
    elif len(steps) > 1:
        steps = steps[1:]   # the first step warms up (allocations, first touches)
    measured = steps
    steps = [remake(s, a.compute_scale, a.grad_bytes, a.bucket_mb, a.ready_at_end) for s in steps]

    rows = []
    base = statistics.median(predict(s, fabric, 1)[0] for s in steps)
    for n in ranks:
        preds = [predict(s, fabric, n) for s in steps]
        t = statistics.median(p[0] for p in preds)
        comm = statistics.median(p[1] for p in preds)
        exp_ = statistics.median(p[2] for p in preds)
        user = t - exp_ - statistics.median(s["compute"] for s in steps)
        rows.append((n, t, comm, exp_, max(0.0, user), 100.0 * base / t if t > 0 else 0.0))

    med = lambda key, ss=measured: statistics.median(s[key] for s in ss)
    mb = [sum(b["bytes"] for b in s["buckets"]) for s in measured]
    print("# %s" % fabric.describe())
    clock = measured[0]["clock"]
    # on the GPU clock the step's start (the host's first event) and backward are on two clocks
    # that meet only at the lane's anchor: only backward's length means something there
    bwd = ("backward ends at %.2f ms" % (med("bwd_end") / 1e3) if clock == "host" else
           "backward %.2f ms on the GPU" % (statistics.median(s["bwd_end"] - s["bwd_start"] for s in measured) / 1e3))
    print("# measured: rank %d, %d step(s) used; step %.2f ms of which compute %.2f ms (%s); "
          "%d bucket(s), %.2f MB of gradients; measured comm %.2f ms, exposed %.2f ms" % (
              a.rank, len(measured), med("period") / 1e3, med("compute") / 1e3, bwd,
              len(measured[0]["buckets"]), statistics.median(mb) / 1e6, med("comm") / 1e3, med("exposed") / 1e3))
    if clock != "host":
        nr = len(trace_ranks(events))
        print("# GPU trace (NCCL backend): %s; bucket readiness from the comm lane's starts%s" % (
                            "backward and exposed from the 'backward (gpu)' and 'exposed comm (gpu)' spans" if clock == "gpu"
                            else "no GPU spans in this trace: backward ends at the last allreduce's start, exposed is "
                                 "the last allreduce",
                            " (%d ranks: a start is only an upper bound of readiness)" % nr if nr > 1 else ""))
    nb = len(steps[0]["buckets"])
    gb = sum(b["bytes"] for b in steps[0]["buckets"])
    if a.compute_scale != 1 or a.grad_bytes:
        print("# modelled: compute x %.4g: %.2f ms, backward ends at %.2f ms; %d bucket(s) of at most %g MiB, %.2f MB of "
              "gradients%s" % (a.compute_scale, med("compute", steps) / 1e3, med("bwd_end", steps) / 1e3, nb,
                               a.bucket_mb if a.grad_bytes else float("nan"), gb / 1e6,
                               ", %.1f %% of them ready only when backward ends" % (100 * a.ready_at_end)
                               if a.ready_at_end is not None else ""))
    print("%6s %12s %12s %12s %11s" % ("ranks", "step_ms", "comm_ms", "exposed_ms", "efficiency"))
    for r in rows:
        print("%6d %12.3f %12.3f %12.3f %10.1f%%" % (r[0], r[1] / 1e3, r[2] / 1e3, r[3] / 1e3, r[5]))
    if a.csv:
        try:
            with open(a.csv, "w") as f:
                f.write("ranks,step_ms,comm_ms,exposed_ms,efficiency_pct\n")
                for r in rows:
                    f.write("%d,%.4f,%.4f,%.4f,%.2f\n" % (r[0], r[1] / 1e3, r[2] / 1e3, r[3] / 1e3, r[5]))
        except OSError as e:
            die("cannot write %s: %s" % (a.csv, e.strerror or e))
    out = a.output or os.path.splitext(a.trace)[0] + ".scaling.svg"
    draw(rows, a.title, "%s; %d bucket(s), %.1f MB of gradients" % (fabric.describe(), nb, gb / 1e6), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
