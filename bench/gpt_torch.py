#!/usr/bin/python3
"""gpt_torch.py — the tiny GPT of examples/gpt in PyTorch, timed the way bench_gpt.sh times ours.

Same architecture (byte-level GPT-2 block stack, tied head, no dropout), AdamW, clipping, random
windows of the data file; 1 intra-op thread per process. With WORLD_SIZE > 1 in the environment
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: torchrun's variables, set by hand) it wraps the
model in DistributedDataParallel over gloo (NCCL with --device cuda). Prints one line: "torch tokens/s N"
(global, from the median step time).
--device cuda runs it on the GPU (bench/gpu/bench_gpt_gpu.sh), in fp32 with TF32 off unless --tf32
(the same two settings as build/gpu/train_gpt), or with --bf16 under bf16 autocast (fp32
parameters and AdamW; matmuls in bf16 with fp32 accumulation, softmax, LayerNorm and the loss
in fp32 by autocast's rules: the PyTorch user's mixed precision, against train_gpt --bf16);
attention stays the explicit causal softmax of a [T, T] matrix, as ours.

    /usr/bin/python3 bench/gpt_torch.py --data FILE [--layers 4 --heads 4 --dim 128 --seq 64 --batch 4]
    python3 bench/gpt_torch.py --device cuda [--tf32 | --bf16] --data FILE --layers 12 --heads 12 --dim 768 --seq 1024 --batch 8
"""
import contextlib
import argparse
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        hs = C // self.NH
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, self.NH, hs).transpose(1, 2)
        k = k.view(B, T, self.NH, hs).transpose(1, 2)
        v = v.view(B, T, self.NH, hs).transpose(1, 2)
        att = F.softmax(((q @ k.transpose(-2, -1)) / math.sqrt(hs)).masked_fill(~mask[:T, :T], float("-inf")), dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, NH, C, T):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(256, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.lnf = nn.LayerNorm(C)
        self.mask = torch.tril(torch.ones(T, T, dtype=torch.bool))   # not a buffer: gloo cannot broadcast bool
        for name, p in self.named_parameters():   # GPT-2 init, as gpt.h
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L) if name.endswith(("proj.weight",)) else 0.02)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x, self.mask)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--skip", type=int, default=10, help="untimed first steps")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--tf32", action="store_true", help="cuda: TF32 tensor-core matmuls (default: fp32)")
    ap.add_argument("--bf16", action="store_true", help="cuda: bf16 autocast around forward and loss (default: fp32)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (default: eager)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    cuda = a.device == "cuda"
    if a.bf16 and (not cuda or a.tf32):
        raise SystemExit("gpt_torch.py: --bf16 is a CUDA mode and excludes --tf32")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
        torch.backends.cudnn.allow_tf32 = a.tf32
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    torch.manual_seed(1337)
    model = GPT(a.layers, a.heads, a.dim, a.seq).to(device)
    model.mask = model.mask.to(device)
    if a.compile:   # the step's first calls compile (untimed with --skip >= 2)
        model = torch.compile(model)
    if world > 1:
        torch.distributed.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    data = torch.frombuffer(bytearray(open(a.data, "rb").read()), dtype=torch.uint8)
    g = torch.Generator().manual_seed(1000 + rank)
    times = []
    if world > 1:
        torch.distributed.barrier()
    for step in range(a.steps):
        t0 = time.perf_counter()
        ix = torch.randint(0, len(data) - a.seq - 1, (a.batch,), generator=g)
        w = torch.stack([data[i:i + a.seq + 1] for i in ix.tolist()]).long().to(device)
        # (a disabled autocast still asserts CUDA in a CPU-only PyTorch 1.13: no context then)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16) if a.bf16 else contextlib.nullcontext():
            loss = model(w[:, :-1], w[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss.item()   # the step is done when its loss is known (DDP: gradients were averaged)
        times.append(time.perf_counter() - t0)
    if world > 1:
        torch.distributed.barrier()
    timed = sorted(times[a.skip:])
    median = timed[len(timed) // 2] if len(timed) % 2 else 0.5 * (timed[len(timed) // 2 - 1] + timed[len(timed) // 2])
    if rank == 0:   # the median step time, like bench_gpt.sh reads ours
        print("torch tokens/s %.0f (%d rank(s), median of %d steps, %.1f ms, loss %.3f, %s%s)"
              % (world * a.batch * a.seq / median, world, len(timed), 1e3 * median, loss.item(), device,
                 (", tf32" if a.tf32 else ", bf16 autocast" if a.bf16 else "") + (", torch.compile" if a.compile else "")))
    if world > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
