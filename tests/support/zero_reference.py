#!/usr/bin/python3
"""zero_reference.py -- PyTorch's ZeroRedundancyOptimizer(AdamW) on the problem of
tests/test_shard.c's PyTorch comparison, over gloo, on WORLD processes; rank 0 writes the final
parameters (float32, registration order, no padding) to OUT.

The problem, as the C side builds it: parameters p0..p4 of 9000, 50, 6000, 3000, 700 floats,
p1 and p3 without weight decay, initial values 0.5 * test_value(77 + k, i); at step t rank r's
gradient of element i of pk is scale * (p * p * 0.5 - test_value(1000 t + 100000 r, 100000 k + i)),
scale 0.01 on every third step (t % 3 == 0), else 1; gradients averaged over the ranks (sum,
then divided), clipped to global norm 5 (torch.nn.utils.clip_grad_norm_), then AdamW (lr 0.01,
weight decay 0.1, PyTorch's default betas and eps) sharded by ZeroRedundancyOptimizer.
test_value is testlib.h's hash, in uint64 arithmetic.

Usage: /usr/bin/python3 tests/support/zero_reference.py OUT [WORLD (2)] [STEPS (8)]"""
import os
import socket
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.optim import ZeroRedundancyOptimizer

SIZES = [9000, 50, 6000, 3000, 700]
NO_DECAY = [False, True, False, True, False]
M64 = (1 << 64) - 1


def test_value(stream, index):
    """testlib.h's test_value for a vector of indices: a float32 in [-1, 1)."""
    idx = np.asarray(index, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64((stream * 0x9E3779B97F4A7C15) & M64) + idx * np.uint64(0xBF58476D1CE4E5B9) + np.uint64(0x94D049BB133111EB)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return ((z >> np.uint64(40)).astype(np.float32) / np.float32(8388608.0) - np.float32(1.0)).astype(np.float32)


def run(rank, world, port, out, steps):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    params = [torch.nn.Parameter(torch.from_numpy(np.float32(0.5) * test_value(77 + k, np.arange(n)))) for k, n in enumerate(SIZES)]
    groups = [{"params": [p for p, nd in zip(params, NO_DECAY) if not nd]},
              {"params": [p for p, nd in zip(params, NO_DECAY) if nd], "weight_decay": 0.0}]
    opt = ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, lr=0.01, weight_decay=0.1)
    for t in range(steps):
        scale = 0.01 if t % 3 == 0 else 1.0
        with torch.no_grad():
            for k, p in enumerate(params):
                v = torch.from_numpy(test_value(1000 * t + 100000 * rank, 100000 * k + np.arange(SIZES[k])))
                g = (p * p * 0.5 - v) * scale
                dist.all_reduce(g)
                p.grad = g / world
        torch.nn.utils.clip_grad_norm_(params, 5.0)
        opt.step()
    if rank == 0:
        with open(out, "wb") as f:
            for p in params:
                f.write(p.detach().numpy().astype(np.float32).tobytes())
    dist.barrier()
    dist.destroy_process_group()


def main():
    out = sys.argv[1]
    world = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(world, port, out, steps), nprocs=world, join=True)


if __name__ == "__main__":
    main()
