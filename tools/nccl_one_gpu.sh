#!/bin/sh
# nccl_one_gpu.sh PROGRAM ARGS... — run one rank of several that share one GPU over NCCL.
#   build/ddprun -n 2 tools/nccl_one_gpu.sh build/gpu/train_gpt ...
# NCCL refuses two ranks of a communicator on one GPU ("Duplicate GPU detected") unless it is
# NCCL >= 2.30.3 and NCCL_MULTI_RANK_GPU_ENABLE=1. Any version lets them in when each rank
# claims a host of its own: NCCL compares (host hash, GPU bus id), and NCCL_HOSTID replaces the
# host hash. Ranks on different "hosts" talk through the network transport, so it is pinned to
# NCCL's TCP sockets on loopback (no InfiniBand, no shared-memory or peer-to-peer transport, which
# assume the ranks really share a host). Slow (the two processes also take turns on the GPU),
# but the same code path as two GPUs: for tests and `make run` on a one-GPU machine.
# Needs RANK (ddprun, torchrun, mpirun's OMPI_COMM_WORLD_RANK or Slurm's SLURM_PROCID).
# NCCL_HOSTID is always this rank's own; the other variables keep a value the caller set.
set -u
rank=${RANK:-${OMPI_COMM_WORLD_RANK:-${SLURM_PROCID:-}}}
if [ -z "$rank" ]; then
    echo "nccl_one_gpu.sh: no RANK in the environment (start it under a launcher: ddprun -n 2 $0 PROGRAM ...)" >&2
    exit 2
fi
if [ $# -eq 0 ]; then echo "usage: nccl_one_gpu.sh PROGRAM ARGS..." >&2; exit 2; fi
export NCCL_HOSTID="ddp-rank-$rank"   # one inherited value would put every rank on one "host" again
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}"
export NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-1}"
export NCCL_NET="${NCCL_NET:-Socket}"   # NCCL's own sockets, not a network plugin the image may carry
export NCCL_SHM_DISABLE="${NCCL_SHM_DISABLE:-1}"
export NCCL_P2P_DISABLE="${NCCL_P2P_DISABLE:-1}"
# NCCL >= 2.30.3 allows ranks on one GPU only with this; older versions ignore the variable.
export NCCL_MULTI_RANK_GPU_ENABLE="${NCCL_MULTI_RANK_GPU_ENABLE:-1}"
exec "$@"
