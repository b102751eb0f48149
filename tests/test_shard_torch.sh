#!/usr/bin/env bash
# test_shard_torch.sh — ddp.h's sharded AdamW (shard_optimizer) against PyTorch's
# ZeroRedundancyOptimizer(AdamW) over gloo on the same problem (tests/support/zero_reference.py), 2 and 3
# ranks; SKIP where /usr/bin/python3 has no torch. Usage: tests/test_shard_torch.sh [BUILD_DIR]
set -u
B=${1:-build}
cd "$(dirname "$0")/.." || exit 1
PY=/usr/bin/python3
if ! $PY -c "import torch, torch.distributed.optim" 2>/dev/null; then
    echo "SKIP shard_vs_pytorch_zero_redundancy_optimizer: $PY has no torch (Debian: apt-get install python3-torch)"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for n in 2 3; do
    if ! OMP_NUM_THREADS=1 $PY tests/support/zero_reference.py "$tmp/ref$n.bin" "$n" 8 >"$tmp/py$n.log" 2>&1; then
        echo "FAIL shard_vs_pytorch_zero_redundancy_optimizer_ranks$n: tests/support/zero_reference.py failed:"
        tail -n 5 "$tmp/py$n.log"
        continue
    fi
    SHARD_TORCH_REF="$tmp/ref$n.bin" "$B/ddprun" -n "$n" "$B/test_shard" 2>&1 | sed -E 's/^\[rank [0-9]+\] //' | sed "s/shard_vs_pytorch_zero_redundancy_optimizer/&_ranks$n/"
done
