#!/usr/bin/env bash
# test_env.sh — every DDP_* variable reaches the tiny GPT trainer (examples/gpt/train_gpt.c), which
# sets some descriptor fields itself: a variable that is set wins over the program's field, rank 0
# says when it overrode one, and an invalid value is refused by name whoever would have won
# (ENVIRONMENT in ddp.h). Tiny shapes, 2 steps: each run is a fraction of a second.
# Usage: tests/test_env.sh [BUILD_DIR]
set -u
B=${1:-build}
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh   # free_port
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; fails=$((fails + 1)); }
unset DDP_LOG DDP_TIMEOUT DDP_TIMELINE DDP_JOB_ID DDP_JOB_TOKEN DDP_CHECK_READY DDP_SHARD_OPTIMIZER DDP_PARAM_DTYPE \
      DDP_STAGED_GRADS DDP_MPI_FLAT DDP_MPI_TUNE RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
A=(--data ddp.h --layers 1 --heads 1 --dim 16 --seq 8 --batch 2 --steps 2 --sample 0 --eval-every 0 --eval-batches 1)
T=$B/train_gpt

# expect NAME WANT_RC PATTERN [VAR=VALUE...] -- COMMAND...: run it, check the exit (0, or "fail" for
# any non-zero but a timeout) and that the output holds PATTERN (grep -E).
expect() {
  local name=$1 want=$2 pattern=$3 rc; shift 3
  local vars=()
  while [ "$1" != "--" ]; do vars+=("$1"); shift; done; shift
  env "${vars[@]}" timeout 60 "$@" >"$tmp/out" 2>&1; rc=$?
  if { [ "$want" = 0 ] && [ "$rc" -eq 0 ]; } || { [ "$want" = fail ] && [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]; }; then
    if grep -qE -- "$pattern" "$tmp/out"; then pass "$name"; return; fi
  fi
  fail "$name" "rc=$rc, wanted $want and /$pattern/: $(grep -v ' step ' "$tmp/out" | tail -n 3)"
}

# DDP_PARAM_DTYPE: the trainer used to set param_dtype itself and never saw the variable.
expect param_dtype_bf16_reaches_trainer_refused_without_cuda_model fail \
  "DDP_PARAM_DTYPE=bf16 asks for bf16 parameters, which need the CUDA model" DDP_PARAM_DTYPE=bf16 -- "$T" "${A[@]}"
expect param_dtype_bogus_refused_by_name fail "DDP_PARAM_DTYPE='bogus' is neither fp32 nor bf16" \
  DDP_PARAM_DTYPE=bogus -- "$T" "${A[@]}"
expect param_dtype_fp32_trains 0 "parameters fp32" DDP_PARAM_DTYPE=fp32 -- "$T" "${A[@]}"
if [ -x "$B/train_gpt_emulated" ]; then
  expect param_dtype_bf16_trains_bf16_cuda_model_emulated 0 "parameters bf16" DDP_PARAM_DTYPE=bf16 -- "$B/train_gpt_emulated" "${A[@]}"
  expect param_dtype_fp32_wins_over_bf16_flag_and_says_so 0 \
    "DDP_PARAM_DTYPE=fp32 over the program's ddp_desc.param_dtype = DDP_DTYPE_BF16" \
    DDP_PARAM_DTYPE=fp32 -- "$B/train_gpt_emulated" "${A[@]}" --bf16
  grep -q "parameters fp32" "$tmp/out" || fail param_dtype_fp32_wins_over_bf16_flag_trains_fp32 "$(grep ddp.h: "$tmp/out")"
  expect param_dtype_bogus_refused_though_the_flag_set_it fail "DDP_PARAM_DTYPE='bogus' is neither" \
    DDP_PARAM_DTYPE=bogus -- "$B/train_gpt_emulated" "${A[@]}" --bf16
else
  echo "SKIP param_dtype_bf16_trains_bf16_cuda_model_emulated: no $B/train_gpt_emulated"
fi

# DDP_SHARD_OPTIMIZER, alone and against --shard-optimizer (2 ranks: sharding needs peers to mean anything)
expect shard_optimizer_1_reaches_trainer 0 "optimizer sharded" DDP_SHARD_OPTIMIZER=1 -- "$B/ddprun" -n 2 "$T" "${A[@]}"
expect shard_optimizer_0_wins_over_flag_and_says_so 0 "DDP_SHARD_OPTIMIZER=0 over the program's ddp_desc.shard_optimizer = 1" \
  DDP_SHARD_OPTIMIZER=0 -- "$B/ddprun" -n 2 "$T" "${A[@]}" --shard-optimizer
grep -q "optimizer unsharded" "$tmp/out" || fail shard_optimizer_0_wins_over_flag_trains_unsharded "$(grep ddp.h: "$tmp/out")"
expect shard_optimizer_bogus_refused_though_the_flag_set_it fail "DDP_SHARD_OPTIMIZER='bogus' is neither 0 nor 1" \
  DDP_SHARD_OPTIMIZER=bogus -- "$T" "${A[@]}" --shard-optimizer

# DDP_TIMEOUT: resolved, and what a rank that never comes costs
expect timeout_reaches_trainer 0 "timeout 7.5 s" DDP_TIMEOUT=7.5 -- "$T" "${A[@]}"
expect timeout_bogus_refused fail "DDP_TIMEOUT='soon' is not a number" DDP_TIMEOUT=soon -- "$T" "${A[@]}"
p=$(free_port)
expect timeout_bounds_the_rendezvous fail "rank\(s\) 1 never arrived .* within 1 s" \
  DDP_TIMEOUT=1 RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$p" DDP_JOB_ID="env-$$" -- "$T" "${A[@]}"

# DDP_LOG
expect log_reaches_trainer 0 "log info" DDP_LOG=info -- "$T" "${A[@]}"
expect log_bogus_refused fail "DDP_LOG='loud' is none of debug, info, warn, error, off" DDP_LOG=loud -- "$T" "${A[@]}"

# DDP_TIMELINE
expect timeline_reaches_trainer 0 "timeline $tmp/tl.json" DDP_TIMELINE="$tmp/tl.json" -- "$T" "${A[@]}"
[ -s "$tmp/tl.json" ] && pass timeline_written || fail timeline_written "no $tmp/tl.json"
expect timeline_unwritable_refused fail "the timeline '/nonexistent-ddp-dir/t.json' .* cannot be written" \
  DDP_TIMELINE=/nonexistent-ddp-dir/t.json -- "$T" "${A[@]}"

# DDP_CHECK_READY (a debugging run on one rank)
expect check_ready_reaches_trainer 0 "check_ready 1" DDP_CHECK_READY=1 -- "$T" "${A[@]}"
expect check_ready_bogus_refused fail "DDP_CHECK_READY='yes' is neither 0 nor 1" DDP_CHECK_READY=yes -- "$T" "${A[@]}"

# DDP_JOB_ID and DDP_JOB_TOKEN: rank 1 of another job, or with another token, is refused by rank 0's store
expect job_id_reaches_trainer 0 "job 'my-job'" DDP_JOB_ID=my-job -- "$T" "${A[@]}"
by_hand_pair() {   # by_hand_pair NAME PATTERN RANK0_VAR RANK1_VAR: rank 1 refused; rank 0 then stopped
  local p; p=$(free_port)
  env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$p" DDP_TIMEOUT=20 "$3" "$T" "${A[@]}" >/dev/null 2>&1 & local r0=$!
  sleep 0.3
  expect "$1" fail "$2" RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$p" DDP_TIMEOUT=5 "$4" -- "$T" "${A[@]}"
  kill "$r0" 2>/dev/null; wait "$r0" 2>/dev/null
}
by_hand_pair job_id_mismatch_refused "belongs to another job \('job-a-$$'\); this rank is in job 'job-b-$$'" \
  DDP_JOB_ID="job-a-$$" DDP_JOB_ID="job-b-$$"
by_hand_pair job_token_mismatch_refused "could not prove that it knows this rank's job token" \
  DDP_JOB_TOKEN=0123456789abcdef0123 DDP_JOB_TOKEN=fedcba9876543210fedc

# DDP_STAGED_GRADS (CPU backend): the same bits through the staging slots; a typo is refused
expect staged_grads_unset 0 "params fnv1a" -- "$B/ddprun" -n 2 "$T" "${A[@]}"
want=$(sed -n 's/.*params fnv1a \([0-9a-f]*\).*/\1/p' "$tmp/out")
expect staged_grads_1_same_bits 0 "params fnv1a $want" DDP_STAGED_GRADS=1 -- "$B/ddprun" -n 2 "$T" "${A[@]}"
expect staged_grads_bogus_refused fail "DDP_STAGED_GRADS='yes' is neither 0 nor 1" DDP_STAGED_GRADS=yes -- "$B/ddprun" -n 2 "$T" "${A[@]}"

# DDP_MPI_FLAT, DDP_MPI_TUNE: read by the MPI backend; a typo is refused on every backend
expect mpi_flat_bogus_refused fail "DDP_MPI_FLAT='yes' is neither 0 nor 1" DDP_MPI_FLAT=yes -- "$T" "${A[@]}"
expect mpi_tune_bogus_refused fail "DDP_MPI_TUNE='off' is neither 0 nor 1" DDP_MPI_TUNE=off -- "$T" "${A[@]}"

exit $((fails > 0))
