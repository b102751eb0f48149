#!/usr/bin/env python3
"""Seed corpus for fuzz_store: well-formed conversations with the rendezvous store, so the
fuzzer starts from inputs that get past the job token. Usage: make_store_corpus.py DIR"""
import os, struct, sys

MAGIC = 0x53504444
HELLO, SET, GET, ADD, CHECK = 1, 2, 3, 4, 5

def frame(op, key=b"", val=b""):
    return struct.pack("<IIII", MAGIC, op, len(key), len(val)) + key + val

hello = frame(HELLO, b"fuzz-token", b"1")
seeds = {
    "hello": hello,
    "bad_token": frame(HELLO, b"wrong", b"1"),
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
