#!/usr/bin/python3
"""gloo_allreduce.py - the PyTorch/gloo baseline for bench_allreduce.c.

    /usr/bin/python3 bench/gloo_allreduce.py -n 2 [--sizes 64K,...] [--iters auto|N]

With -n N the script starts N ranks of itself (RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a
free MASTER_PORT in their environment) and waits for them; started with RANK/WORLD_SIZE/
MASTER_ADDR/MASTER_PORT already set (by any launcher) it is one rank. Each rank uses
torch.distributed with the gloo backend, one intra-op thread, and dist.all_reduce(SUM) on
float32 CPU tensors.

Per size (bytes of float32), exactly as bench_allreduce.c: a correctness check on
rank-dependent integers, a calibration on zeros that doubles as warm-up (k = 1, 4, 16, ...
until a batch takes >= 50 ms), then `iters` timed allreduces after a barrier, iters chosen
for about --target-s seconds; the time is the slowest rank's (ReduceOp.MAX) / iters. Rank 0
prints
    allreduce impl=gloo ranks=2 bytes=26214400 iters=40 time_us=5123.4 busbw=5.117
with busbw = bytes / time * 2(n-1)/n in GB/s (1e9), 0 for one rank.
"""
import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import time

DEFAULT_SIZES = "64K,256K,1M,4M,16M,25M,64M,256M"
MIN_ITERS = 3
MAX_ITERS = 1000000


def parse_sizes(spec):
    """'64K,1M,4096' -> bytes (K/M/G are powers of 1024; 'KiB'/'MB' spellings accepted)."""
    out = []
    for item in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(I?B)?\s*", item, re.IGNORECASE)
        if not m:
            raise ValueError("bad size '%s'" % item)
        v = int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]
        if v <= 0 or v % 4:
            raise ValueError("size '%s' is not a positive multiple of 4 bytes" % item)
        out.append(v)
    return out


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(n, argv):
    """Start n ranks of this script and wait; the first failure stops the others."""
    port = str(free_port())
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv, env=env))
    rc = 0
    try:
        alive = list(procs)
        while alive:
            for p in list(alive):
                code = p.poll()
                if code is None:
                    continue
                alive.remove(p)
                if code != 0 and rc == 0:
                    rc = code if code > 0 else 128 - code
                    for q in alive:
                        q.send_signal(signal.SIGTERM)
            time.sleep(0.05)
    except KeyboardInterrupt:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait()
        return 130
    return rc


def worker(args):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = parse_sizes(args.sizes)
    max_n = max(sizes) // 4
    storage = torch.zeros(max_n, dtype=torch.float32)   # touched once, reused for every size
    tmax = torch.zeros(1, dtype=torch.float64)

    def timed_run(buf, k):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(k):
            dist.all_reduce(buf)
        tmax[0] = time.perf_counter() - t0
        dist.all_reduce(tmax, op=dist.ReduceOp.MAX)
        return float(tmax[0])

    ranks_sum = world * (world + 1) // 2
    for nbytes in sizes:
        n = nbytes // 4
        buf = storage[:n]

        # 1. correctness: element j of rank s holds (j % 251 + 1) * (s + 1); the sum is exact.
        pattern = torch.remainder(torch.arange(n, dtype=torch.int32), 251).add_(1)
        buf.copy_(pattern * (rank + 1))
        dist.all_reduce(buf)
        want = (pattern * ranks_sum).to(torch.float32)
        if not torch.equal(buf, want):
            bad = int(torch.nonzero(buf != want)[0])
            sys.stderr.write("gloo_allreduce: rank %d: WRONG RESULT at %d bytes: element %d is %g, expected %g\n"
                             % (rank, nbytes, bad, float(buf[bad]), float(want[bad])))
            sys.stderr.flush()
            os._exit(1)
        del pattern, want

        # 2. calibrate (doubles as warm-up) on zeros.
        buf.zero_()
        k = 1
        while True:
            t = timed_run(buf, k)
            if t >= 0.05 or k >= MAX_ITERS // 4:
                break
            k *= 4
        per = t / k
        if args.iters != "auto":
            iters = int(args.iters)
        else:
            iters = max(MIN_ITERS, min(MAX_ITERS, int(args.target_s / max(per, 1e-9))))

        # 3. measure.
        t = timed_run(buf, iters)
        per = t / iters
        busbw = nbytes / per * 2.0 * (world - 1) / world / 1e9 if world > 1 else 0.0
        if rank == 0:
            print("allreduce impl=gloo ranks=%d bytes=%d iters=%d time_us=%.1f busbw=%.3f"
                  % (world, nbytes, iters, per * 1e6, busbw), flush=True)

    dist.barrier()
    dist.destroy_process_group()
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--nproc", type=int, default=0, help="start this many ranks (default: be one rank)")
    ap.add_argument("--sizes", default=DEFAULT_SIZES)
    ap.add_argument("--iters", default="auto")
    ap.add_argument("--target-s", type=float, default=0.5)
    args = ap.parse_args()
    try:
        parse_sizes(args.sizes)
        if args.iters != "auto" and int(args.iters) <= 0:
            raise ValueError("bad --iters")
    except ValueError as e:
        ap.error(str(e))
    if args.nproc > 0 and "RANK" not in os.environ:
        argv = ["--sizes", args.sizes, "--iters", args.iters, "--target-s", str(args.target_s)]
        return launch(args.nproc, argv)
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return worker(args)


if __name__ == "__main__":
    sys.exit(main())
