#!/usr/bin/python3
"""gpt_reference.py — the tiny GPT of examples/gpt in PyTorch, to check the C model against.

Loads the C model's initial parameters (build/train_gpt --dump-init), runs one fixed batch in
float64 and writes tests/gpt_reference.bin: the config, the batch, the initial parameters, the
logits, the loss, every parameter's gradient, the losses of 10 AdamW steps on that batch and the
parameters after them. tests/test_gpt.c compares the C model against it (no torch needed there).

    /usr/bin/python3 tests/support/gpt_reference.py [--train-gpt build/train_gpt] [--out tests/gpt_reference.bin]

Needs PyTorch (Debian: python3-torch). The file format, all little-endian:
    char[8] "GPTREF01"; int32 layers, heads, dim, seq, batch, vocab, steps; uint32 seed;
    float32 lr, beta1, beta2, eps, weight_decay, clip; int64 num_floats;
    int32 tokens[batch*(seq+1)]; float32 init[num_floats]; float32 logits[batch*seq*vocab];
    float32 loss; float32 grads[num_floats]; float32 step_losses[steps]; float32 final[num_floats]
"""
import argparse
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

LAYERS, HEADS, DIM, SEQ, BATCH, VOCAB, STEPS, SEED = 2, 2, 32, 16, 2, 256, 10, 1
LR, BETA1, BETA2, EPS, WD, CLIP = 3e-3, 0.9, 0.99, 1e-8, 0.1, 1.0


def param_shapes():
    """Registration order and shapes, exactly as examples/gpt/gpt.h registers them."""
    C = DIM
    shapes = [("wte", (VOCAB, C)), ("wpe", (SEQ, C))]
    for l in range(LAYERS):
        p = "h%d." % l
        shapes += [(p + "ln1.w", (C,)), (p + "ln1.b", (C,)),
                   (p + "attn.qkv.w", (3 * C, C)), (p + "attn.qkv.b", (3 * C,)),
                   (p + "attn.proj.w", (C, C)), (p + "attn.proj.b", (C,)),
                   (p + "ln2.w", (C,)), (p + "ln2.b", (C,)),
                   (p + "mlp.fc.w", (4 * C, C)), (p + "mlp.fc.b", (4 * C,)),
                   (p + "mlp.proj.w", (C, 4 * C)), (p + "mlp.proj.b", (C,))]
    shapes += [("lnf.w", (C,)), ("lnf.b", (C,))]
    return shapes


def forward(P, idx, targets):
    B, T = idx.shape
    C, NH = DIM, HEADS
    hs = C // NH
    x = P["wte"][idx] + P["wpe"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(LAYERS):
        p = "h%d." % l
        h = F.layer_norm(x, (C,), P[p + "ln1.w"], P[p + "ln1.b"], 1e-5)
        q, k, v = F.linear(h, P[p + "attn.qkv.w"], P[p + "attn.qkv.b"]).split(C, dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + F.linear(y, P[p + "attn.proj.w"], P[p + "attn.proj.b"])
        h = F.layer_norm(x, (C,), P[p + "ln2.w"], P[p + "ln2.b"], 1e-5)
        h = F.gelu(F.linear(h, P[p + "mlp.fc.w"], P[p + "mlp.fc.b"]), approximate="tanh")
        x = x + F.linear(h, P[p + "mlp.proj.w"], P[p + "mlp.proj.b"])
    x = F.layer_norm(x, (C,), P["lnf.w"], P["lnf.b"], 1e-5)
    logits = x @ P["wte"].t()                       # the head is tied to the token embedding
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    return logits, loss


def make_params(flat):
    P, at = {}, 0
    for name, shape in param_shapes():
        n = int(np.prod(shape))
        P[name] = torch.tensor(flat[at:at + n].reshape(shape), dtype=torch.float64, requires_grad=True)
        at += n
    assert at == flat.size, (at, flat.size)
    return P


def flat_of(tensors):
    return np.concatenate([t.detach().numpy().astype(np.float32).ravel() for t in tensors])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train-gpt", default="build/train_gpt")
    ap.add_argument("--out", default="tests/gpt_reference.bin")
    args = ap.parse_args()
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "init.bin")
        subprocess.run([args.train_gpt, "--dump-init", path, "--layers", str(LAYERS), "--heads", str(HEADS),
                        "--dim", str(DIM), "--seq", str(SEQ), "--batch", str(BATCH), "--seed", str(SEED)],
                       check=True, stdout=subprocess.DEVNULL)
        init = np.fromfile(path, dtype=np.float32)

    g = torch.Generator().manual_seed(1234)
    data = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    idx, targets = data[:, :-1], data[:, 1:]
    names = [n for n, _ in param_shapes()]

    # Logits, loss and every gradient at the initial parameters.
    P = make_params(init)
    logits, loss = forward(P, idx, targets)
    loss.backward()
    grads = flat_of([P[n].grad for n in names])

    # 10 AdamW steps on the same batch: matrices decay, vectors do not (as gpt.h flags them).
    P = make_params(init)
    decay = [P[n] for n in names if P[n].dim() >= 2]
    no_decay = [P[n] for n in names if P[n].dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(BETA1, BETA2), eps=EPS)
    step_losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        _, l = forward(P, idx, targets)
        l.backward()
        torch.nn.utils.clip_grad_norm_([P[n] for n in names], CLIP)
        opt.step()
        step_losses.append(l.item())
    final = flat_of([P[n] for n in names])

    with open(args.out, "wb") as f:
        f.write(b"GPTREF01")
        f.write(struct.pack("<7iI", LAYERS, HEADS, DIM, SEQ, BATCH, VOCAB, STEPS, SEED))
        f.write(struct.pack("<6f", LR, BETA1, BETA2, EPS, WD, CLIP))
        f.write(struct.pack("<q", init.size))
        f.write(data.numpy().astype("<i4").tobytes())
        f.write(init.astype("<f4").tobytes())
        f.write(logits.detach().numpy().astype("<f4").tobytes())
        f.write(struct.pack("<f", loss.item()))
        f.write(grads.astype("<f4").tobytes())
        f.write(np.array(step_losses, dtype="<f4").tobytes())
        f.write(final.astype("<f4").tobytes())
    print("wrote %s: %d parameters, loss %.6f, step losses %s (torch %s, float64)"
          % (args.out, init.size, loss.item(), " ".join("%.5f" % x for x in step_losses), torch.__version__))


if __name__ == "__main__":
    sys.exit(main())
