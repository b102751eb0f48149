#!/usr/bin/env bash
# run.sh — every CPU test; the last line is "N passed, N failed".
# Multi-rank tests run as real processes under ddprun. Usage: tests/run.sh [BUILD_DIR]
set -u
B=${1:-build}
cd "$(dirname "$0")/.." || exit 1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
passed=0 failed=0 skipped=0

# Run one test command; count its PASS/FAIL lines. A command that fails without saying FAIL
# (a crash, a hang cut by the timeout) counts as one failure of its own.
run() {
    local name=$1; shift
    echo "== $name"
    timeout 300 "$@" >"$log" 2>&1
    local rc=$?
    grep -E "(^|\] )(PASS|FAIL|SKIP) " "$log" | sed -E 's/^\[rank [0-9 ]+\] //'
    local p f
    skipped=$((skipped + $(grep -cE "(^|\] )SKIP " "$log")))
    p=$(grep -cE "(^|\] )PASS " "$log")
    f=$(grep -cE "(^|\] )FAIL " "$log")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "FAIL $name: exited with status $rc"
        tail -n 5 "$log" | sed 's/^/    /'
        f=1
    fi
    passed=$((passed + p)); failed=$((failed + f))
}

run unit "$B/test_unit"
run "sampler: counts, cover, permutation, large n, resume, bad input" "$B/test_sampler"
for n in 2 3; do run "sampler, $n processes" "$B/ddprun" -n "$n" "$B/test_sampler"; done
for n in 1 2 3 4; do run "collectives, $n rank(s)" "$B/ddprun" -n "$n" "$B/test_collectives"; done
for n in 1 2 4; do run "equivalence, $n rank(s)" "$B/ddprun" -n "$n" "$B/test_equivalence"; done
for n in 1 2 3 4; do run "sharded optimizer (ZeRO-1) = unsharded, bit for bit, $n rank(s)" "$B/ddprun" -n "$n" "$B/test_shard"; done
run "sharded optimizer vs PyTorch ZeroRedundancyOptimizer(AdamW) over gloo, 2 and 3 ranks" tests/test_shard_torch.sh "$B"
for n in 1 2 3 4; do run "sharded gradients (ZeRO-2) = unsharded, bit for bit (fp32, accumulation, find_unused, skip_nonfinite, bf16 wire, staged, bf16 parameters), released pages not resident, views fixed, $n rank(s)" "$B/ddprun" -n "$n" "$B/test_zero2"; done
z2ckpt=$(mktemp -u)
run "sharded gradients (ZeRO-2) on the MPI backend (mpirun -n 3, hierarchical and flat) = unsharded, bit for bit, released pages" tests/test_zero2_mpi.sh "$B"
run "ZeRO-2 checkpoints: saved at ZeRO-2 on 2 ranks, resumed at NONE and ZeRO-2 on 2, loaded at NONE, ZeRO-1 and ZeRO-2 on 1 and 4 ranks, bit for bit" \
    bash -c "'$B/ddprun' -n 2 '$B/test_zero2' save '$z2ckpt' && '$B/ddprun' -n 1 '$B/test_zero2' load '$z2ckpt' && '$B/ddprun' -n 4 '$B/test_zero2' load '$z2ckpt'; rc=\$?; rm -f '$z2ckpt'; exit \$rc"
run "tiny GPT trainer --shard-optimizer = unsharded, bit for bit, 2 and 3 ranks, and 4 ranks in 2 DiLoCo groups of 2; --shard parameters on 4 ranks in shard groups and in DiLoCo groups of 2 = unsharded with --units" tests/test_shard_gpt.sh "$B"
for n in 1 2 3 4; do run "sharded parameters (ZeRO-3) = unsharded, bit for bit, $n rank(s): tape, accumulation, bf16, clipping, unused, own autograd; released pages; prefetch on = off (and none when off); commit under a data cap holds no whole copy; bad input" "$B/ddprun" -n "$n" "$B/test_zero3"; done
run "sharded parameters' checkpoints across world sizes and levels (PARAMETERS on 2 -> NONE on 1, NONE on 1 -> PARAMETERS on 3)" tests/test_zero3_ckpt.sh "$B"
run "sharded parameters (ZeRO-3) on the MPI backend: mpirun -n 1..4 (and 3 flat) = unsharded, bit for bit (tape, accumulation, bf16, clipping, unused, own autograd, prefetch on = off, checkpoints across levels and world sizes); hybrid (shard_group 2) on 2 namespace hosts x 2 ranks = ZeRO-1 in the same groups" tests/test_zero3_mpi.sh "$B"
for n in 2 3; do run "bf16 reduction, $n ranks" "$B/ddprun" -n "$n" "$B/test_bf16"; done
run "replica groups: 4 thread-ranks in 2 groups of 2 and 6 in 2 of 3, each group's average only (bit for bit; fp32, bf16, bf16 wire, in place and staged), replicas equal after the outer sync" "$B/test_groups"
run "replica groups with process ranks: ddprun -n 4 (CPU backend), mpirun -n 4 (MPI backend, hierarchical and flat)" tests/test_groups.sh "$B"
run "shard_optimizer (ZeRO-1) within replica groups: 4 thread-ranks in 2 groups of 2, DiLoCo H=2 and streaming, clipping, one group skipping a step, in place and staged: parameters, m and v = unsharded, bit for bit; bf16 parameters refused by name; groups of one not sharded; ZeRO-3 within the groups (DiLoCo, streaming, fp32 and bf16, groups of one) the same bits, a lone parameter write refused" "$B/test_groups_shard"
run "hybrid sharding (shard_group): 4 thread-ranks in 2 groups of 2, 6 in 3 of 2 and in 2 of 3, accumulation, clipping, an unused parameter, skip_nonfinite, fp32 and bf16 parameters, in place and staged: every step = unsharded, bit for bit; saved hybrid, resumed unsharded, hybrid and at 2 ranks, an unsharded file resumed hybrid; ZeRO-3 within the groups (4 in 2 of 2, 6 in 3 of 2 and 2 of 3, fp32 and bf16) the same; bad input named" "$B/test_hybrid"
run "hybrid sharding on the MPI backend: mpirun across 2 namespace hosts x 2 ranks, a shard group a host (fp32: the unsharded hierarchical bits every step; bf16: every rank the same bits, within a derived bound; checkpoints); groups across hosts refused by name" tests/test_hybrid.sh "$B"
run "overlap, 2 ranks" "$B/ddprun" -n 2 "$B/test_overlap"
run "stragglers: a slow rank named by every rank, its wait in the stats and on the timeline, 3 thread-ranks" "$B/test_straggler"
run "timeline" tests/test_timeline.sh "$B"
run "svg tools" tests/test_svg_tools.sh
run "failures" tests/test_failures.sh "$B"
run "DDP_* variables through the GPT trainer: a variable that is set wins, overrides said, invalid values refused" tests/test_env.sh "$B"
run "ddprun" tests/test_ddprun.sh "$B/ddprun"
run "ranks on several namespace hosts (tools/hosts.sh): own /dev/shm, stranger refused, CPU backend refused, NCCL set-up, a host killed or cut off, a silent nameserver" tests/test_hosts.sh "$B"
run "the MPI backend on one host (mpirun) = the CPU backend bit for bit: bf16 parameters, sharded optimizer, both, flat and hierarchical; checkpoints across backends" tests/test_mpi_parity.sh "$B"
run "the MPI backend on 2 namespace hosts (mpirun): equivalence hierarchical and flat, collectives, GPT, ddprun refused, a host killed or cut off" tests/test_mpi_hosts.sh "$B"
run "Slurm on 2 namespace hosts (slurmctld, slurmd, munged): srun CPU and MPI (PMIx), equivalence, GPT, two steps at once, the sbatch example, scancel, a node killed" tests/test_slurm.sh "$B"
run "minimal example, 2 ranks" "$B/ddprun" -n 2 "$B/minimal"
# -Ofast builds keep the NaN guard (non-finite found by bits): gcc and clang, a NaN/Inf in one rank
for cc in gcc clang; do
    if [ -x "$B/test_fastmath_$cc" ]; then run "NaN guard under $cc -Ofast, 2 ranks" "$B/ddprun" -n 2 "$B/test_fastmath_$cc"
    else echo "SKIP fastmath_$cc: $B/test_fastmath_$cc not built (no $cc)"; skipped=$((skipped + 1)); fi
done
run "public structs with garbage in a flag, enum or number field: refused, zero-initialize" "$B/test_structs"
run "own autograd (no tape): its error words, ddp_consume_grads, bucket plan, no-overlap warning, 2 ranks" "$B/ddprun" -n 2 "$B/test_own_path"
run "outer sync (DiLoCo, streaming, averaging): float64 reference within its derived bound, 2 and 3 groups of thread-ranks; one group = plain training bit for bit; own SGD, H = 1 = DDP; replicas meet at each sync; the fragment schedule; bad input refused" "$B/test_outer"
run "own-autograd example: 2 ranks = 1 rank at 2x batch, accumulation, stacked tensor, own optimizer and AdamW; ddprun lines" tests/test_own_autograd.sh "$B"
# Checkpoints (ddp_save / ddp_load): saved on 2 ranks, loaded on 3, 1 and 2; refusals; another model.
# ZeRO-1 (ddp_desc.shard_optimizer): the *-sharded phases SKIP until ddp.h has it and the build
# defines DDP_HAS_SHARD_OPTIMIZER; then: the unsharded checkpoint loaded sharded on 3 ranks, and
# one saved sharded on 2 ranks loaded unsharded on 3 and on 1.
ckdir=$(mktemp -d)
run "checkpoint saved on 2 ranks" "$B/ddprun" -n 2 "$B/test_checkpoint" save "$ckdir"
for n in 3 1 2; do run "checkpoint of 2 ranks loaded on $n" "$B/ddprun" -n "$n" "$B/test_checkpoint" resume "$ckdir"; done
run "checkpoint refusals, 3 ranks" "$B/ddprun" -n 3 "$B/test_checkpoint" errors "$ckdir"
run "checkpoint of another model, 2 ranks" "$B/ddprun" -n 2 "$B/test_checkpoint" other "$ckdir"
run "checkpoint of 2 ranks loaded sharded on 3" "$B/ddprun" -n 3 "$B/test_checkpoint" resume-sharded "$ckdir"
rm -rf "$ckdir"; ckdir=$(mktemp -d)
run "checkpoint saved sharded on 2 ranks" "$B/ddprun" -n 2 "$B/test_checkpoint" save-sharded "$ckdir"
if [ -s "$ckdir/ck" ]; then
    for n in 3 1; do run "sharded checkpoint of 2 ranks loaded unsharded on $n" "$B/ddprun" -n "$n" "$B/test_checkpoint" resume "$ckdir"; done
fi
rm -rf "$ckdir"
run "outer sync checkpoints (thread-ranks, groups of 1): resume bit for bit between outer steps and with a fragment in flight, 2 -> 3 and 3 -> 2 groups, another schedule, outer off, a file without outer state" "$B/test_outer_checkpoint"
run "embedding: NULL contexts, messages, thread-ranks, host copies" "$B/test_embed"
run "host program: cancel in every phase, progress, thread-ranks exiting mid-backward, uneven inputs (ddp_join)" "$B/test_host"
run "engine example: ranks as threads, progress, cancel, join" sh -c '"$1" && "$1" --batches 60 --cancel-after 0 && echo PASS engine_example_cancels_and_joins && { "$1" --batches abc 2>/dev/null; [ $? = 2 ]; } && { "$1" --bogus 5 2>/dev/null; [ $? = 2 ]; } && echo PASS engine_example_bad_arguments_refused' sh "$B/engine"
# (a background job of sh starts with SIGINT ignored until the engine sets its handler: a signal
#  that comes before that is lost, and --batches 300 lets that try end by itself)
run "engine example: Ctrl-C during ddp_init is a cancel on every rank, not a lost peer (20 tries)" sh -c 'for i in $(seq 20); do "$1" --ranks 3 --cancel-after 0 --batches 300 >"$2" 2>&1 & p=$!; sleep 0.00$((1 + i % 4)); kill -INT $p; wait $p; rc=$?; if [ $rc != 0 ] && [ $rc != 130 ]; then echo "FAIL engine_cancel_during_init_is_a_cancel: try $i, exit $rc: $(grep -m1 -i error "$2")"; exit 1; fi; done; echo PASS engine_cancel_during_init_is_a_cancel' sh "$B/engine" "$(mktemp)"
run "neural texture example: thread-ranks, previews, PNGs, PSNR, time-limit cancel" tests/test_texture.sh "$B"
run "Windows build under Wine: unit tests, thread-ranks and processes = Linux bit for bit, checkpoints, timeline, engine and texture examples" tests/test_windows.sh "$B"
run "include order" tests/test_include_order.sh
run "make run and make help" tests/test_make.sh
for n in 1 2 4; do run "tiny GPT vs PyTorch, N ranks vs 1, $n rank(s)" "$B/ddprun" -n "$n" "$B/test_gpt"; done
run "tiny GPT trainer: resume, checkpoints, data errors, sampling" tests/test_gpt.sh "$B"
run "tiny GPT, CUDA model emulated on the host: vs PyTorch, vs the CPU model, determinism, fused attention" "$B/test_gpt_gpu_emulated"
run "tiny GPT trainer, CUDA model emulated on the host" env TRAIN_GPT="$B/train_gpt_emulated" TEST_PREFIX=gpt_emulated_cuda tests/test_gpt.sh "$B"
run "rank 0 killed while writing a checkpoint, 3 ranks" tests/test_checkpoint_crash.sh "$B"
run "ddprun --max-restarts through random kills: resume, same final checkpoint" tests/test_restart.sh "$B"
run "NCCL backend on a fake GPU (tests/fakegpu): training = CPU backend, collectives, faults; hybrid sharding (the group's reduce-scatter, each part across the groups: within a derived bound of the exact average, the parts' bytes across the groups); ZeRO-3 (sharded parameters: the same bits as unsharded, granules mapped and released; within shard groups = hybrid ZeRO-1; DiLoCo groups of one; groups of several refused)" "$B/test_fake_nccl"
run "bf16 parameters, fp32 master: float64 reference, CPU = NCCL on the fake GPU, sharded, checkpoints" "$B/test_bf16_params"
run "uneven inputs (ddp_join) at ZeRO-1, ZeRO-2, ZeRO-3 (CPU) and hybrid = unsharded, bit for bit, 1-4 thread-ranks, CPU and NCCL on the fake GPU; checkpoints after the join load unsharded; the refusals named" "$B/test_shard_join"
# The GPU kernels' arithmetic on the host: built wherever nvcc is, needs no GPU.
if [ -x "$B/gpu/test_kernel_math_host" ]; then run "gpu kernel math on the host" "$B/gpu/test_kernel_math_host"; fi
if [ -x "$B/gpu/test_kernel_math_host_fastmath" ]; then run "gpu kernel math on the host, --use_fast_math / -ffinite-math-only (NaN steps still skipped)" "$B/gpu/test_kernel_math_host_fastmath"; fi
run "gpu_paths.sh: NCCL and cuBLAS in toolkit and wheel layouts" tests/test_gpu_paths.sh
run "GPU machine's check scripts, dry run (no GPU: every step SKIPs)" tests/test_gpu_check.sh "$B"
run "gpu" tests/gpu/run.sh "$B"
if [ "$skipped" -gt 0 ]; then echo "$passed passed, $failed failed, $skipped skipped"
else echo "$passed passed, $failed failed"; fi
[ "$failed" -eq 0 ]
