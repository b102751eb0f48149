#!/usr/bin/python3
"""outer_reference.py -- the float64 reference of ddp.h's outer sync (desc.outer: DiLoCo,
streaming DiLoCo, periodic averaging) on tests/test_outer.c's problem, and for every value it
computes, a bound on how far ddp.h's float32 arithmetic may be from it.

THE PROBLEM (test_outer.c builds the same): parameters p0, p1, p2 of 37, 50, 23 floats laid out
as ddp.h's flat buffer does (each starts on a multiple of 16 floats; padding is zero and stays
zero): 144 floats, 9 blocks of 16. p1 has no weight decay. Initial value of flat element i:
0.5 * test_value(77, i) (testlib.h's hash). World = G groups of S ranks; group g is ranks
g*S .. g*S+S-1. At inner step t (0, 1, ...) rank r's gradient of flat element i (a parameter's,
not padding) is p_i * p_i * 0.5 - test_value(1000 t + 100000 r + 1, i); a group averages its
ranks' gradients (within a group, plain DDP). Inner optimizer: AdamW (lr 0.02, weight decay
0.1, beta1 0.9, beta2 0.999, eps 1e-8, no clipping) or the program's own SGD (lr 0.1, no
momentum: p -= lr * g).

THE ALGORITHM (ddp.h's manual, OUTER SYNC, and the notes of issue 26), after every inner step
t = 1, 2, ... (counting steps from 1):
  1. the fragment in flight, if its landing step is t: merged (4.);
  2. fragment f is due when (t + f * H // F) % H == 0; fragments are the float ranges
     [units * f // F * 16, units * (f + 1) // F * 16) of the flat buffer, units = 144 / 16;
  3. sent: every group's outer gradient delta = theta - p over the fragment (theta: the outer
     copy, the initial parameters at first), or, when lr == 1, momentum == 0 and the wire is fp32
     (the "plain mean"), p itself; encoded for the wire, decoded by every rank, summed in group
     order; it lands at t + delay (delay 0: merged at once);
  4. merge: g = sum / G; plain mean: theta = g; else Nesterov as torch.optim.SGD(nesterov=True,
     dampening 0): buf = mu * buf + g (buf starts at 0), g = g + mu * buf; theta -= lr * g.
     Then every rank's parameters p = mix * p + (1 - mix) * theta (mix 0: p = theta).
  Wires: fp32 (the value), bf16 (round to nearest even), int8 blockwise (blocks of quant_block
  from the fragment's start: scale = max|x| / 127, q = round-half-even(x / scale) clamped to
  [-127, 127], decoded q * scale; scale 0: q = 0).

WHAT IS FLOAT64 AND WHAT IS NOT: the hyperparameters are the float32 numbers ddp.h holds (0.7f
is 0.699999988079071), then everything is float64 except the wire: the reference rounds its
outer gradient to float32 and encodes and decodes it exactly as ddp.h does, in float32
arithmetic (numpy.float32), because the encoding is not continuous: bf16 and int8 rounding of
two nearby values can differ by a whole quantum, and only the same arithmetic on the same
float32 input gives the same code.

THE BOUND (why float32 ddp.h must be within it). Running error analysis (Wilkinson): every
float32 operation of ddp.h returns its exact result times (1 + e), |e| <= u = 2^-24 (IEEE 754
round to nearest, no underflow at these magnitudes; a fused multiply-add rounds once, which the
bound of two roundings covers). Each quantity x of ddp.h is carried here as (X, E): X the
float64 value of the reference and E >= |x_ddp - X|. For an operation z = a op b of ddp.h:
  a + b:  E_z = E_a + E_b + u (|Z| + E_a + E_b)           (|fl(w) - w| <= u |w|, |w - Z| <= E_a + E_b)
  a * b:  E_z = |A| E_b + |B| E_a + E_a E_b + u (|Z| + that)
  a / b:  E_z = (E_a + |Z| E_b) / (|B| - E_b) + u (|Z| + that)             (needs |B| > E_b)
  sqrt a: E_z = min(sqrt(E_a), E_a / (sqrt(A - E_a) + sqrt(A))) + u (|Z| + that)
  c * a for a constant c of ddp.h's own computing (1 - beta, the bias corrections, which it
  rounds to float32 once): the constant's own rounding u |c| is one more term.
The wire: fl32 rounding and the encodings are monotone (nondecreasing) functions of their
input, so ddp.h's code for an input within [X - E, X + E] lies between the codes of the two
ends; E after decoding is the larger distance of those two codes from the reference's own. For
int8 the block's scale is bracketed the same way (amax between the largest |X| - E and the
largest |X| + E of the block), and q * scale between the corners of (q range) x (scale range).
Where no rounding boundary lies within E, both ends give the reference's own code and the wire
adds no error at all; where one does, the bound grows by one quantum there, as it must.
The group average of S > 1 ranks' gradients (ddp.h's allreduce, sum and scale in any order):
S + 1 roundings, E <= gamma_{S+1} * mean |g_r| with gamma_k = k u / (1 - k u).
The reference's own float64 rounding (2^-53 per operation, 2^29 times below u) is covered by
inflating the bound by 1e-6 relative and 1e-12 absolute.
The bound is per element, rigorous to first order and second order where it is cheap, and
tight where nothing rounds across a boundary: ddp.h's error in practice is a fraction of it
(test_outer prints the worst ratio and how many values' bounds reach 1e-5, i.e. where a wire
boundary was within reach: a few per cent at most), and an error in the algorithm is many
bounds away: test_outer checks that ddp.h's runs fall outside the bound of each MUTANT below
(a wrong schedule, heavy-ball instead of Nesterov momentum, no delay, no mix, bf16 truncation,
a wrong int8 scale, unaligned fragments, no division by the groups).

Usage: outer_reference.py OUT CONFIG...
  CONFIG: comma-separated key=value: mode (average|diloco|streaming), S (group size), G
  (groups), H, F, delay, mix, wire (fp32|bf16|int8), qb (quant_block), inner (adamw|sgd), lr,
  mom (outer), steps; mutant (one of MUTANTS: a deliberately wrong variant). OUT gets, for each config in order, for each step 1..steps, for each
  group 0..G-1: the 144 parameters then their 144 bounds, float64 little-endian."""
import sys

import numpy as np

SIZES = [37, 50, 23]
NO_DECAY = [False, True, False]
ALIGN = 16
U = 2.0 ** -24
M64 = (1 << 64) - 1
F32 = np.float32

INNER_ADAMW = dict(lr=F32(0.02), wd=F32(0.1), b1=F32(0.9), b2=F32(0.999), eps=F32(1e-8))
INNER_SGD_LR = F32(0.1)


def test_value(stream, index):
    """testlib.h's test_value for a vector of indices: a float32 in [-1, 1)."""
    idx = np.asarray(index, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64((stream * 0x9E3779B97F4A7C15) & M64) + idx * np.uint64(0xBF58476D1CE4E5B9) + np.uint64(0x94D049BB133111EB)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return ((z >> np.uint64(40)).astype(np.float32) / np.float32(8388608.0) - np.float32(1.0)).astype(np.float32)


def layout():
    offsets, at = [], 0
    for n in SIZES:
        offsets.append(at)
        at += (n + ALIGN - 1) // ALIGN * ALIGN
    return offsets, at


OFFSETS, COUNT = layout()
MASK = np.zeros(COUNT, dtype=bool)       # the parameters' elements (not padding)
DECAY = np.zeros(COUNT)                  # 1 where weight decay applies
for _k, (_o, _n) in enumerate(zip(OFFSETS, SIZES)):
    MASK[_o:_o + _n] = True
    DECAY[_o:_o + _n] = 0.0 if NO_DECAY[_k] else 1.0


# ---- running error analysis: (value, bound) pairs, each operation one float32 rounding ----
def rnd(z, e):
    """A float32 rounding of a result z known to within e: the bound of the rounded result."""
    return e + U * (np.abs(z) + e)


def add(a, ea, b, eb):
    z = a + b
    return z, rnd(z, ea + eb)


def sub(a, ea, b, eb):
    z = a - b
    return z, rnd(z, ea + eb)


def mul(a, ea, b, eb):
    z = a * b
    return z, rnd(z, np.abs(a) * eb + np.abs(b) * ea + ea * eb)


def div(a, ea, b, eb):
    z = a / b
    room = np.abs(b) - eb
    if np.any(room <= 0):
        raise ValueError("a divisor's bound reaches zero: the bound cannot be derived")
    return z, rnd(z, (ea + np.abs(z) * eb) / room)


def sqrt(a, ea):
    z = np.sqrt(a)
    lo = np.sqrt(np.maximum(a - ea, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        lin = np.where(lo + z > 0, ea / (lo + z), np.inf)
    return z, rnd(z, np.minimum(np.sqrt(ea), lin))


def const(c):
    """A constant ddp.h computes in double and rounds to float32 once: value and bound."""
    return float(c), U * abs(float(c))


# ---- the wire, in float32 exactly as ddp.h encodes ----
def bf16(x32):
    bits = x32.astype(np.float32).view(np.uint32).astype(np.uint64)
    if "bf16_truncated" in MUTANT:
        r = (bits >> np.uint64(16)) << np.uint64(16)
    else:
        r = ((bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)) << np.uint64(16)
    return r.astype(np.uint32).view(np.float32).astype(np.float64)


def int8_scale(amax):
    """A block's scale from its largest |x| (a float32): max |x| / 127 in float32."""
    return np.float32(np.float32(amax) / np.float32(128.0 if "int8_over_128" in MUTANT else 127.0))


def int8_q(x32, scale):
    """The codes: x / scale in float32, rounded half to even, clamped to [-127, 127]."""
    return np.clip(np.rint((x32 / scale).astype(np.float32)), -127, 127)


def int8_value(q, scale):
    """Decoded: q * scale multiplied in float32, as ddp.h's decode does."""
    return (q.astype(np.float32) * np.float32(scale)).astype(np.float32).astype(np.float64)


def wire(kind, qb, x, e):
    """Fragment values x (float64) known to within e: the reference's decoded values, and the
    bound of ddp.h's decoded values around them."""
    x32 = x.astype(np.float32)
    lo32, hi32 = (x - e).astype(np.float32), (x + e).astype(np.float32)
    if kind == "fp32":
        ref = x32.astype(np.float64)
        return ref, np.maximum(np.abs(hi32 - ref), np.abs(ref - lo32))
    if kind == "bf16":
        ref, v_lo, v_hi = bf16(x32), bf16(lo32), bf16(hi32)
        assert np.all(v_lo <= ref) and np.all(ref <= v_hi), "bf16: the reference's own code is outside its bracket"
        return ref, np.maximum(v_hi - ref, ref - v_lo)
    ref, bound = np.zeros(x.size), np.zeros(x.size)
    for b0 in range(0, x.size, qb):
        sl = slice(b0, min(b0 + qb, x.size))
        scale = int8_scale(np.max(np.abs(x32[sl])))
        ref[sl] = int8_value(int8_q(x32[sl], scale), scale) if scale != 0 else 0.0
        if not np.any(e[sl] > 0):
            continue                       # ddp.h's input is exactly the reference's
        amax_lo = np.float32(np.max(np.maximum(np.abs(x[sl]) - e[sl], 0.0)))
        amax_hi = np.float32(np.max(np.abs(x[sl]) + e[sl]))
        s_lo, s_hi = int8_scale(amax_lo), int8_scale(amax_hi)
        if s_lo == 0:                      # the scale may be 0 (all q 0) or tiny (q up to 127)
            bound[sl] = np.abs(ref[sl]) + 127.0 * float(s_hi)
            continue
        ends = []
        for xs in (lo32[sl], hi32[sl]):
            for s in (s_lo, s_hi):
                ends.append(int8_q(xs, s))
        q_lo, q_hi = np.minimum.reduce(ends), np.maximum.reduce(ends)
        corners = [int8_value(q, s) for q in (q_lo, q_hi) for s in (s_lo, s_hi)]
        v_lo, v_hi = np.minimum.reduce(corners), np.maximum.reduce(corners)
        if np.any(ref[sl] < v_lo) or np.any(ref[sl] > v_hi):
            raise AssertionError("int8: the reference's own code is outside its bracket")
        bound[sl] = np.maximum(v_hi - ref[sl], ref[sl] - v_lo)
    return ref, bound


# ---- the run ----
# Deliberately wrong variants (config key mutant=NAME), which test_outer.c must see ddp.h miss:
# proof that the comparison can fail for each kind of error.
MUTANTS = ("heavy_ball", "offsets_f_times_H_over_F", "no_delay", "no_mix", "bf16_truncated", "int8_over_128",
           "unaligned_fragments", "no_division_by_groups")
MUTANT = set()


def parse(text):
    c = dict(mode="diloco", S=1, G=2, H=4, F=1, delay=0, mix=0.0, wire="bf16", qb=64, inner="adamw",
             lr=None, mom=None, steps=8)
    for kv in text.split(","):
        k, v = kv.split("=")
        c[k] = v if k in ("mode", "wire", "inner", "mutant") else float(v) if k in ("mix", "lr", "mom") else int(v)
    if c["mode"] == "average":
        c["lr"], c["mom"] = 1.0, 0.0
    c["lr"] = float(F32(0.7 if c["lr"] is None else c["lr"]))
    c["mom"] = float(F32(0.9 if c["mom"] is None else c["mom"]))
    c["mix"] = float(F32(c["mix"]))
    return c


def run(c):
    MUTANT.clear()
    if c.get("mutant"):
        if c["mutant"] not in MUTANTS:
            raise ValueError("no mutant " + c["mutant"])
        MUTANT.add(c["mutant"])
    G, S, H, F, steps = c["G"], c["S"], c["H"], c["F"], c["steps"]
    init = (np.float32(0.5) * test_value(77, np.arange(COUNT))).astype(np.float64) * MASK
    p = [init.copy() for _ in range(G)]                 # each group's replica
    ep = [np.zeros(COUNT) for _ in range(G)]
    m = [np.zeros(COUNT) for _ in range(G)]
    em = [np.zeros(COUNT) for _ in range(G)]
    v = [np.zeros(COUNT) for _ in range(G)]
    ev = [np.zeros(COUNT) for _ in range(G)]
    theta, etheta = init.copy(), np.zeros(COUNT)        # the same on every rank
    buf, ebuf = np.zeros(COUNT), np.zeros(COUNT)
    units = COUNT // ALIGN
    frag = [units * f // F * ALIGN for f in range(F + 1)]
    if "unaligned_fragments" in MUTANT:
        frag = [COUNT * f // F for f in range(F + 1)]
    plain_mean = c["lr"] == 1.0 and c["mom"] == 0.0 and c["wire"] == "fp32"
    flight = None                                       # (fragment, lands at, sum, bound)
    out = []

    def merge(f, total, etotal):
        nonlocal theta, etheta, buf, ebuf
        lo, hi = frag[f], frag[f + 1]
        if G > 1 and "no_division_by_groups" not in MUTANT:
            g, eg = div(total, etotal, float(G), 0.0)
        else:
            g, eg = total, etotal
        th, eth = theta[lo:hi].copy(), etheta[lo:hi].copy()
        if plain_mean:
            th, eth = g, eg
        else:
            if c["mom"] > 0:
                mb, emb = mul(buf[lo:hi], ebuf[lo:hi], c["mom"], 0.0)
                b, eb = add(mb, emb, g, eg)
                buf[lo:hi], ebuf[lo:hi] = b, eb
                mb, emb = mul(b, eb, c["mom"], 0.0)
                g, eg = (b, eb) if "heavy_ball" in MUTANT else add(g, eg, mb, emb)
            step, estep = mul(g, eg, c["lr"], 0.0)
            th, eth = sub(th, eth, step, estep)
        theta[lo:hi], etheta[lo:hi] = th, eth
        for k in range(G):
            if c["mix"] == 0 or "no_mix" in MUTANT:
                p[k][lo:hi], ep[k][lo:hi] = th, eth
            else:
                keep, ekeep = mul(p[k][lo:hi], ep[k][lo:hi], c["mix"], 0.0)
                w, ew = sub(1.0, 0.0, c["mix"], 0.0)             # ddp.h's (1 - mix), rounded
                take, etake = mul(th, eth, w, ew)
                p[k][lo:hi], ep[k][lo:hi] = add(keep, ekeep, take, etake)

    for t in range(steps):
        # the inner step of every group
        for k in range(G):
            gs, egs = [], []
            for j in range(S):
                r = k * S + j
                sq, esq = mul(p[k], ep[k], p[k], ep[k])
                half, ehalf = sq * 0.5, esq * 0.5              # exact: a power of two
                target = test_value(1000 * t + 100000 * r + 1, np.arange(COUNT)).astype(np.float64)
                gr, egr = sub(half, ehalf, target, 0.0)
                gs.append(gr * MASK)
                egs.append(egr * MASK)
            g = sum(gs) / S
            eg = sum(egs) / S
            if S > 1:
                gamma = (S + 1) * U / (1 - (S + 1) * U)
                eg = eg + gamma * sum(np.abs(x) + e for x, e in zip(gs, egs)) / S
            if c["inner"] == "sgd":
                step, estep = mul(g, eg, float(INNER_SGD_LR), 0.0)
                p[k], ep[k] = sub(p[k], ep[k], step, estep)
            else:
                o = INNER_ADAMW
                n = t + 1
                b1, b2 = float(o["b1"]), float(o["b2"])
                mb, emb = mul(m[k], em[k], b1, 0.0)
                gb, egb = mul(g, eg, *sub(1.0, 0.0, b1, 0.0))
                m[k], em[k] = add(mb, emb, gb, egb)
                vb, evb = mul(v[k], ev[k], b2, 0.0)
                gb, egb = mul(*sub(1.0, 0.0, b2, 0.0), g, eg)
                gg, egg = mul(gb, egb, g, eg)
                v[k], ev[k] = add(vb, evb, gg, egg)
                lrd, elrd = mul(float(o["lr"]), 0.0, DECAY * float(o["wd"]), 0.0)
                dec, edec = mul(lrd, elrd, p[k], ep[k])
                pk, epk = sub(p[k], ep[k], dec, edec)
                step_size, estep_size = const(float(o["lr"]) / (1.0 - b1 ** n))
                bc2, ebc2 = const(np.sqrt(1.0 - b2 ** n))
                num, enum_ = mul(step_size, estep_size, m[k], em[k])
                root, eroot = sqrt(v[k], ev[k])
                den, eden = div(root, eroot, bc2, ebc2)
                den, eden = add(den, eden, float(o["eps"]), 0.0)
                upd, eupd = div(num, enum_, den, eden)
                p[k], ep[k] = sub(pk, epk, upd, eupd)
                p[k], ep[k] = p[k] * MASK, ep[k] * MASK        # padding: exactly 0 in ddp.h
        n = t + 1                                             # inner steps taken
        if flight is not None and n >= flight[1]:
            merge(flight[0], flight[2], flight[3])
            flight = None
        due = [f for f in range(F) if (n + (f * (H // F) if "offsets_f_times_H_over_F" in MUTANT else f * H // F)) % H == 0]
        if due:
            f = due[0]
            lo, hi = frag[f], frag[f + 1]
            total, etotal = None, None
            for k in range(G):
                if plain_mean:
                    x, ex = p[k][lo:hi], ep[k][lo:hi]
                else:
                    x, ex = sub(theta[lo:hi], etheta[lo:hi], p[k][lo:hi], ep[k][lo:hi])
                d, ed = wire(c["wire"], c["qb"], x, ex)
                if total is None:
                    total, etotal = d, ed
                else:
                    total, etotal = add(total, etotal, d, ed)
            flight = (f, n + c["delay"], total, etotal)
            if c["delay"] == 0 or "no_delay" in MUTANT:
                merge(f, total, etotal)
                flight = None
        for k in range(G):
            out.append(p[k])
            out.append(ep[k] * (1 + 1e-6) + 1e-12 * MASK)
    return out


def main():
    if len(sys.argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    with open(sys.argv[1], "wb") as f:
        for text in sys.argv[2:]:
            for a in run(parse(text)):
                f.write(np.asarray(a, dtype="<f8").tobytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
