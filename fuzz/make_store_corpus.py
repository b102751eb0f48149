#!/usr/bin/env python3
"""Seed corpus for fuzz_store: well-formed conversations with the rendezvous store, so the
fuzzer starts from inputs that get past the handshake. fuzz_store fixes the server's nonce
(0x5a bytes), so a seed can carry the client's proof of the job token, made here as ddp.h
makes it (see the handshake at the top of ddp.h's rendezvous section). Usage: make_store_corpus.py DIR"""
import hashlib, hmac, os, struct, sys

MAGIC = 0x53504444
HELLO, SET, GET, ADD, CHECK, AUTH = 1, 2, 3, 4, 5, 6
TOKEN, JOB_ID = b"fuzz-token", b""
NONCE_S = b"\x5a" * 32

def frame(op, key=b"", val=b""):
    return struct.pack("<IIII", MAGIC, op, len(key), len(val)) + key + val

def handshake(rank=1, job_id=JOB_ID, token=TOKEN, nonce_c=bytes(range(32))):
    key = hmac.new(token, b"ddp.h store key\0" + job_id, hashlib.sha256).digest()
    hello = struct.pack("<i", rank) + nonce_c
    proof = hmac.new(key, b"client\0" + hello + NONCE_S, hashlib.sha256).digest()
    return frame(HELLO, job_id, hello) + frame(AUTH, b"", proof)

hello = handshake()
hello_only = hello[:16 + 36]
seeds = {
    "hello": hello,
    "hello_secondary": handshake(rank=-1),
    "bad_token": handshake(token=b"wrong"),
    "gives_up": hello_only + frame(AUTH),
    "other_job": handshake(job_id=b"Slurm job 7 step 0"),
    "set_get": hello + frame(SET, b"rank/1", b"4 1234") + frame(GET, b"rank/1", b"100"),
    "add": hello + frame(ADD, b"claim/1", b"1") + frame(ADD, b"claim/1", b"-7"),
    "check": hello + frame(CHECK, b"shm") + frame(SET, b"shm", b"/ddp-1-abc") + frame(CHECK, b"shm"),
    "get_missing": hello + frame(GET, b"never", b"0"),
    "truncated": hello + frame(SET, b"layout/0", b"x" * 64)[:40],
    "before_hello": frame(SET, b"k", b"v"),
}
os.makedirs(sys.argv[1], exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(sys.argv[1], name), "wb") as f:
        f.write(data)
