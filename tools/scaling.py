#!/usr/bin/env python3
"""scaling.py - will it scale? Predict a data-parallel step on N = 1 .. 1024 ranks from one
measured step (a ddp.h DDP_TIMELINE trace) and a description of the network.

usage: tools/scaling.py TRACE.json [--rank R] [--step N] [fabric] [workload] [outer] [-o OUT.svg]
                        [--csv OUT.csv] [--ranks 1,2,4,...] [--title TEXT]
       tools/scaling.py --compute-ms C --grad-bytes BYTES [fabric] [outer] ...   (no trace)

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

WITHOUT A TRACE
  --compute-ms C with --grad-bytes BYTES: a step of C ms of compute whose gradients are all ready
  only at its end (buckets of --bucket-mb): DDP's prediction then hides nothing under backward (an
  upper bound of its step; a trace gives the overlap).

THE OUTER SYNC (--outer average|diloco|streaming: ddp.h's desc.outer, next to DDP's prediction)
  The N ranks split into G = N / S replica groups of S ranks (--group-size S, default
  --ranks-per-node). Inside a group every inner step is DDP on S ranks: inner = the step above
  with N = S (S = 1: the compute C alone). Across groups only the parameters meet: n floats (the
  gradient bytes / 4, or --params n) encoded as --outer-wire W (fp32: 4n bytes; bf16: 2n; int8:
  n + 4 ceil(n / q), one fp32 scale per --quant-block q values), a fragment of n / F of them at a
  time (F = --fragments; 1 for average and diloco). ddp.h sends it as G broadcasts, one from each
  group's first rank to all N ranks, one after another (>>outer), so a fragment's exchange is
    X = G x Tb(w / F, N),  Tb(w, N) = ceil(log2 nodes) a_out + w / B_out     (across nodes, if > 1)
                                    + ceil(log2 m) a_in + w / B_in            (inside one, m > 1)
  with nodes = ceil(N / G'), G' = --ranks-per-node, m = min(N, G'): a pipelined broadcast (the
  root's bytes cross each link once, one latency a tree level); flat: Tb = a + w / B. On the MPI
  backend with groups of one rank ddp.h sends one MPI_Allgather instead (--outer-exchange
  allgather): a ring in which every link carries both directions at once,
    X = (G - 1) x (a + w / F / B)   (a, B: across nodes when the N ranks span nodes). Plus L / F,
  --outer-local-ms L: encoding, decoding G copies and the merge, per whole-model sync (default 0).
    average, diloco: step = inner + (X + L) / H           (the exchange blocks; every H steps)
    streaming:       step = inner + F max(0, X + L / F - tau x inner) / H
                     (a fragment every H / F steps, overlapped with tau = --outer-delay inner steps;
                     --no-overlap: a ddp.h whose exchange blocks at the send step, tau taken as 0)
  Efficiency = step(1) / step, as for DDP. Not modelled: the outer optimizer's effect on the loss
  per token (the tokens a step are the same: N x the batch); contention of the exchange with compute;
  stragglers: between syncs nothing holds the groups together, so the group ahead waits at the
  barrier each exchange begins with for the one behind (bench/RESULTS.md, "Issue 26: across slow
  links", measures it; ddp_outer_status names the group).

OUTPUT
  A table on stdout (N, step ms, comm ms, exposed ms, efficiency %; with --outer also the outer
  mode's step ms, its exchange ms per sync or fragment, and its efficiency, "-" where S does not
  divide N), the same as CSV with --csv, and an SVG (OUT.svg, default TRACE with .scaling.svg): step time and exposed communication
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

    def ring_hop_s(self, nbytes, n):
        """Seconds for one hop of a ring over n ranks: nbytes over the slowest link it crosses
        (across nodes when the ranks span nodes), one latency."""
        if self.algo == "flat" or n > self.g:
            return self.a_out + nbytes / self.b_out
        return self.a_in + nbytes / self.b_in

    def broadcast_s(self, nbytes, n):
        """Seconds for a broadcast of nbytes from one rank to n (pipelined: the bytes cross each
        link once; one latency per tree level)."""
        if n <= 1:
            return 0.0
        if self.algo == "flat":
            return self.a_out + nbytes / self.b_out
        t, nodes, inside = 0.0, int(math.ceil(n / self.g)), min(n, self.g)
        if nodes > 1:
            t += math.ceil(math.log2(nodes)) * self.a_out + nbytes / self.b_out
        if inside > 1:
            t += math.ceil(math.log2(inside)) * self.a_in + nbytes / self.b_in
        return t

    def describe(self):
        if self.algo == "flat":
            return "flat: %.3g ms + bytes / %.3g Gbit/s per allreduce" % (self.a_out * 1e3, self.b_out * 8 / 1e9)
        s = "%s, %d rank(s)/node: inside %.4g Gbit/s, %.3g us" % (self.algo, self.g, self.b_in * 8 / 1e9, self.a_in * 1e6)
        s += "; across %.4g Gbit/s x %d NIC(s), %.3g us" % (self.b_out * 8 / 1e9, self.nics, self.a_out * 1e6)
        if self.eff < 1:
            s += " (rates x %.2f)" % self.eff
        return s


# ---------------------------------------------------------------- the workload, re-made

def bucket_sizes(grad_bytes, bucket_mb):
    """ddp.h's buckets for grad_bytes: the first 1 MiB (or the cap), then the cap each."""
    cap = bucket_mb * 1024 * 1024
    if grad_bytes / cap > 1e6:
        die("--grad-bytes %g in buckets of --bucket-mb %g is %.3g buckets, more than 1e6" % (grad_bytes, bucket_mb, grad_bytes / cap))
    sizes, left, first = [], float(grad_bytes), min(1024 * 1024, cap)
    while left > 0:
        b = min(left, first if not sizes else cap)
        sizes.append(b)
        left -= b
    return sizes


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
        sizes = bucket_sizes(grad_bytes, bucket_mb)
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


class Outer:
    """The outer sync's settings (ddp.h's desc.outer) for the prediction."""
    def __init__(self, mode, group_size, inner_steps, fragments, delay, wire, quant_block, local_ms, overlap, exchange="broadcast"):
        if mode not in ("average", "diloco", "streaming"):
            die("--outer must be average, diloco or streaming, not %r" % (mode,))
        if wire not in ("fp32", "bf16", "int8"):
            die("--outer-wire must be fp32, bf16 or int8, not %r" % (wire,))
        self.mode, self.wire = mode, wire
        self.s = number("--group-size", group_size, 1, 1 << 20, integer=True)
        self.h = number("--inner-steps", inner_steps, 1, 1 << 30, integer=True)
        self.f = number("--fragments", fragments, 1, 1 << 20, integer=True)
        self.tau = number("--outer-delay", delay, 0, 1 << 30, integer=True)
        self.q = number("--quant-block", quant_block, 1, 1 << 20, integer=True)
        self.local_us = number("--outer-local-ms", local_ms, 0, 1e9) * 1e3
        self.overlap = overlap
        if exchange not in ("broadcast", "allgather"):
            die("--outer-exchange must be broadcast or allgather, not %r" % (exchange,))
        if exchange == "allgather" and self.s != 1:
            die("--outer-exchange allgather: ddp.h gathers so only with groups of one rank (--group-size 1)")
        self.exchange = exchange
        if mode != "streaming" and (self.f != 1 or self.tau != 0):
            die("--fragments and --outer-delay are streaming DiLoCo's: use --outer streaming")
        if self.f > self.h or self.tau >= self.h // self.f:
            die("--fragments %d over --inner-steps %d with --outer-delay %d: ddp.h needs F <= H and delay < H / F"
                % (self.f, self.h, self.tau))

    def wire_bytes(self, n):
        if self.wire == "fp32":
            return 4.0 * n
        if self.wire == "bf16":
            return 2.0 * n
        return n + 4.0 * math.ceil(n / self.q)

    def predict(self, step, fabric, n_ranks, floats):
        """(step us, exchange us per fragment) on n_ranks, or None where S does not divide them."""
        if n_ranks % self.s:
            return None
        groups = n_ranks // self.s
        inner = predict(step, fabric, self.s)[0]
        frag = self.wire_bytes(floats / self.f)
        if n_ranks <= 1:
            x = 0.0
        elif self.exchange == "allgather":
            x = (groups - 1) * fabric.ring_hop_s(frag, n_ranks) * 1e6
        else:
            x = groups * fabric.broadcast_s(frag, n_ranks) * 1e6
        local = self.local_us / self.f
        if self.mode != "streaming":
            return inner + (x + local) / self.h, x
        hidden = self.tau * inner if self.overlap else 0.0
        return inner + self.f * max(0.0, x + local - hidden) / self.h, x

    def describe(self, floats):
        s = "%s: groups of %d rank(s), every %d inner steps, wire %s%s" % (
            self.mode, self.s, self.h, self.wire, " (blocks of %d)" % self.q if self.wire == "int8" else "")
        if self.mode == "streaming":
            s += ", %d fragment(s) (one every %d steps), delay %d%s" % (
                self.f, self.h // self.f, self.tau, "" if self.overlap else ", exchange not overlapped (--no-overlap)")
        s += "; %.0f floats: %.3g MB a %s" % (floats, self.wire_bytes(floats / self.f) / 1e6,
                                              "fragment" if self.f > 1 else "sync")
        if self.local_us:
            s += ", %.3g ms local work a whole-model sync" % (self.local_us / 1e3)
        return s


def parse_ranks(text):
    try:
        ranks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        die("--ranks must be a comma-separated list of integers, not %r" % text)
    if not ranks or ranks[0] < 1 or ranks[-1] > 1 << 20:
        die("--ranks must list numbers 1 .. 1048576")
    return ranks


# ---------------------------------------------------------------- the picture

def draw(rows, title, subtitle, path, outer_name=None):
    W, H = 760, 470
    L, R, T, B = 70, 70, 70, 60
    pw, ph = W - L - R, H - T - B
    ns = [r[0] for r in rows]
    xmin, xmax = math.log2(ns[0]), math.log2(ns[-1]) if ns[-1] > ns[0] else math.log2(ns[0]) + 1
    outer_rows = [r for r in rows if len(r) > 6 and r[6] is not None]
    ymax = max([r[1] for r in rows] + [r[6] for r in outer_rows]) / 1000.0
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
    if outer_rows:   # the outer mode's step (purple) and efficiency (dashed green)
        out.append('<polyline points="%s" fill="none" stroke="#9467bd" stroke-width="2"/>'
                   % " ".join("%s,%s" % (num(X(r[0])), num(Y(r[6] / 1000.0))) for r in outer_rows))
        out.append('<polyline points="%s" fill="none" stroke="#2ca02c" stroke-width="2" stroke-dasharray="6 3"/>'
                   % " ".join("%s,%s" % (num(X(r[0])), num(Ye(r[8]))) for r in outer_rows))
        for r in outer_rows:
            out.append('<circle cx="%s" cy="%s" r="2.5" fill="#9467bd"><title>%s</title></circle>' % (
                num(X(r[0])), num(Y(r[6] / 1000.0)), esc("N=%d, %s: step %.2f ms, exchange %.2f ms, efficiency %.1f %%" % (
                    r[0], outer_name, r[6] / 1e3, r[7] / 1e3, r[8]))))
    for r in rows:
        out.append('<circle cx="%s" cy="%s" r="2.5" fill="#4c78a8"><title>%s</title></circle>' % (
            num(X(r[0])), num(Y(r[1] / 1000.0)),
            esc("N=%d: step %.2f ms, comm %.2f ms, exposed %.2f ms, efficiency %.1f %%" % (
                r[0], r[1] / 1e3, r[2] / 1e3, r[3] / 1e3, r[5]))))
    lx, ly = L + 8, T + 14
    legend = [("#4c78a8", "step time", ""), ("#9aa0a6", "compute (no communication)", "4 3"),
              ("#e45756", "exposed communication", ""), ("#2ca02c", "efficiency (right axis)", "")]
    if outer_rows:
        legend += [("#9467bd", "%s: step time" % outer_name, ""), ("#2ca02c", "%s: efficiency" % outer_name, "6 3")]
    for color, label, dash in legend:
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
    ap.add_argument("trace", nargs="?")
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
    ap.add_argument("--compute-ms", type=float, help="without a trace: the step's compute (ms); needs --grad-bytes")
    ap.add_argument("--outer", help="average, diloco or streaming: ddp.h's outer sync beside DDP")
    ap.add_argument("--group-size", type=int, help="ranks a replica group (default: --ranks-per-node)")
    ap.add_argument("--inner-steps", type=int)
    ap.add_argument("--fragments", type=int, default=1)
    ap.add_argument("--outer-delay", type=int, default=0)
    ap.add_argument("--outer-wire", help="fp32, bf16 or int8 (default bf16; average: fp32)")
    ap.add_argument("--quant-block", type=int, default=64)
    ap.add_argument("--outer-local-ms", type=float, default=0.0)
    ap.add_argument("--no-overlap", action="store_true")
    ap.add_argument("--outer-exchange", default="broadcast", help="broadcast (default) or allgather (MPI, groups of one rank)")
    ap.add_argument("--params", type=float, help="floats the outer sync sends (default: gradient bytes / 4)")
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
    outer = None
    if a.outer is not None:
        if a.inner_steps is None:
            die("--outer %s needs --inner-steps H" % a.outer)
        outer = Outer(a.outer, a.group_size if a.group_size is not None else fabric.g, a.inner_steps, a.fragments,
                      a.outer_delay, a.outer_wire or ("fp32" if a.outer == "average" else "bf16"), a.quant_block,
                      a.outer_local_ms, not a.no_overlap, a.outer_exchange)
    elif any(v is not None for v in (a.group_size, a.inner_steps, a.outer_wire, a.params)) or a.no_overlap:
        die("--group-size, --inner-steps, --outer-wire, --params and --no-overlap describe the outer sync: add --outer MODE")
    if a.params is not None:
        number("--params", a.params, 0, 1e15, lo_open=True)

    events = None
    if a.trace is None:
        # no trace: a step of compute C whose gradients are ready only at its end
        if a.compute_ms is None or a.grad_bytes is None:
            die("give a trace (TRACE.json), or --compute-ms C and --grad-bytes BYTES")
        if a.ready_at_end is not None:
            die("--ready-at-end needs a trace (its readiness curve)")
        c = number("--compute-ms", a.compute_ms, 0, 1e9, lo_open=True) * 1e3
        number("--grad-bytes", a.grad_bytes, 0, 1e15, lo_open=True)
        bk = [{"id": i, "bytes": b, "ready": c} for i, b in enumerate(bucket_sizes(a.grad_bytes, a.bucket_mb))]
        steps = [{"step": 0, "period": c, "compute": c, "bwd_start": 0.0, "bwd_end": c, "exposed": 0.0, "user_us": 0.0,
                  "user_bytes": [], "buckets": bk, "comm": 0.0, "clock": "host"}]
        measured = steps
    else:
        if a.compute_ms is not None:
            die("--compute-ms is for a prediction without a trace (--compute-scale scales a trace's compute)")
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
        row = (n, t, comm, exp_, max(0.0, user), 100.0 * base / t if t > 0 else 0.0)
        if outer:
            floats = a.params if a.params is not None else sum(b["bytes"] for b in steps[0]["buckets"]) / 4.0
            po = [outer.predict(s, fabric, n, floats) for s in steps]
            if po[0] is None:
                row += (None, None, None)
            else:
                ot = statistics.median(p[0] for p in po)
                row += (ot, statistics.median(p[1] for p in po), 100.0 * base / ot if ot > 0 else 0.0)
        rows.append(row)

    med = lambda key, ss=measured: statistics.median(s[key] for s in ss)
    mb = [sum(b["bytes"] for b in s["buckets"]) for s in measured]
    print("# %s" % fabric.describe())
    if outer:
        print("# outer: %s" % outer.describe(a.params if a.params is not None else
                                              sum(b["bytes"] for b in steps[0]["buckets"]) / 4.0))
    clock = measured[0]["clock"]
    # on the GPU clock the step's start (the host's first event) and backward are on two clocks
    # that meet only at the lane's anchor: only backward's length means something there
    bwd = ("backward ends at %.2f ms" % (med("bwd_end") / 1e3) if clock == "host" else
           "backward %.2f ms on the GPU" % (statistics.median(s["bwd_end"] - s["bwd_start"] for s in measured) / 1e3))
    if events is None:
        print("# given: compute %.2f ms, %.2f MB of gradients in %d bucket(s), all ready when the compute ends "
              "(no overlap: DDP's step is an upper bound)" % (med("compute") / 1e3, statistics.median(mb) / 1e6,
                                                               len(measured[0]["buckets"])))
    else:
        print("# measured: rank %d, %d step(s) used; step %.2f ms of which compute %.2f ms (%s); "
              "%d bucket(s), %.2f MB of gradients; measured comm %.2f ms, exposed %.2f ms" % (
                  a.rank, len(measured), med("period") / 1e3, med("compute") / 1e3, bwd,
                  len(measured[0]["buckets"]), statistics.median(mb) / 1e6, med("comm") / 1e3, med("exposed") / 1e3))
    if clock != "host" and events is not None:
        nr = len(trace_ranks(events))
        print("# GPU trace (NCCL backend): %s; bucket readiness from the comm lane's starts%s" % (
                            "backward and exposed from the 'backward (gpu)' and 'exposed comm (gpu)' spans" if clock == "gpu"
                            else "no GPU spans in this trace: backward ends at the last allreduce's start, exposed is "
                                 "the last allreduce",
                            " (%d ranks: a start is only an upper bound of readiness)" % nr if nr > 1 else ""))
    nb = len(steps[0]["buckets"])
    gb = sum(b["bytes"] for b in steps[0]["buckets"])
    if events is not None and (a.compute_scale != 1 or a.grad_bytes):
        print("# modelled: compute x %.4g: %.2f ms, backward ends at %.2f ms; %d bucket(s) of at most %g MiB, %.2f MB of "
              "gradients%s" % (a.compute_scale, med("compute", steps) / 1e3, med("bwd_end", steps) / 1e3, nb,
                               a.bucket_mb if a.grad_bytes else float("nan"), gb / 1e6,
                               ", %.1f %% of them ready only when backward ends" % (100 * a.ready_at_end)
                               if a.ready_at_end is not None else ""))
    head = "%6s %12s %12s %12s %11s" % ("ranks", "step_ms", "comm_ms", "exposed_ms", "efficiency")
    print(head + ("  %14s %14s %16s" % (a.outer + "_ms", "exchange_ms", a.outer + "_eff") if outer else ""))

    def outer_cols(r, fmt, dash):
        if not outer:
            return ""
        if r[6] is None:
            return dash
        return fmt % (r[6] / 1e3, r[7] / 1e3, r[8])
    for r in rows:
        print("%6d %12.3f %12.3f %12.3f %10.1f%%" % (r[0], r[1] / 1e3, r[2] / 1e3, r[3] / 1e3, r[5]) +
              outer_cols(r, "  %14.3f %14.3f %15.1f%%", "  %14s %14s %16s" % ("-", "-", "-")))
    if a.csv:
        try:
            with open(a.csv, "w") as f:
                f.write("ranks,step_ms,comm_ms,exposed_ms,efficiency_pct%s\n" % (
                    ",outer_step_ms,outer_exchange_ms,outer_efficiency_pct" if outer else ""))
                for r in rows:
                    f.write("%d,%.4f,%.4f,%.4f,%.2f%s\n" % (r[0], r[1] / 1e3, r[2] / 1e3, r[3] / 1e3, r[5],
                                                          outer_cols(r, ",%.4f,%.4f,%.2f", ",,,")))
        except OSError as e:
            die("cannot write %s: %s" % (a.csv, e.strerror or e))
    out = a.output or (os.path.splitext(a.trace)[0] + ".scaling.svg" if a.trace else "scaling.svg")
    draw(rows, a.title, "%s; %d bucket(s), %.1f MB of gradients" % (fabric.describe(), nb, gb / 1e6), out,
         a.outer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
