#!/usr/bin/env bash
# test_gpt.sh — build/train_gpt as a user runs it, on 2 real ranks under ddprun:
#   checkpoint resume is bit-identical (train 2k steps == train k, save, resume, train k more),
#   with and without gradient accumulation; a checkpoint of another model or a damaged one is
#   refused; a missing, empty or too small data file is a clear error and a non-zero exit;
#   --dump-init and --sample work; and where nvcc built BUILD_DIR/gpu/train_gpt, its CPU path
#   (--cpu) trains bit for bit what build/train_gpt trains. Prints one PASS/FAIL line per check.
# Usage: tests/test_gpt.sh [BUILD_DIR]      (data: ddp.h itself, any file is bytes)
#   env: TRAIN_GPT (the trainer to test, default BUILD_DIR/train_gpt), GPT_TEST_RANKS (2),
#        TEST_PREFIX (what the check names start with instead of "gpt"), RANK_WRAPPER (a
#        command each rank of a multi-rank run starts through, e.g. tools/nccl_one_gpu.sh
#        for 2 ranks on one GPU)
set -u
B=${1:-build}
cd "$(dirname "$0")/.." || exit 1
BIN=${TRAIN_GPT:-$B/train_gpt}
N=${GPT_TEST_RANKS:-2}
read -r -a WRAP <<<"${RANK_WRAPPER:-}"
pfx=${TEST_PREFIX:-gpt}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
pass() { echo "PASS ${1/#gpt_/${pfx}_}"; }
fail() { echo "FAIL ${1/#gpt_/${pfx}_}: $2"; fails=$((fails + 1)); }

TINY=(--data ddp.h --layers 2 --heads 2 --dim 32 --seq 16 --batch 2 --eval-every 0 --eval-batches 2 --sample 0 --warmup 2 --lr 3e-3)
train() { timeout 120 "$B/ddprun" -n "$N" "${WRAP[@]}" "$BIN" "${TINY[@]}" "$@"; }
hash_of() { sed -n 's/.*params fnv1a \([0-9a-f]*\).*/\1/p' "$1" | head -n 1; }

# --- gradient buckets in place (the shared gradient segment) and through the staging slots
#     (DDP_STAGED_GRADS=1): the same arithmetic, so the same bits ---
name="gpt_in_place_and_staged_buckets_same_bits_${N}ranks"
train --steps 6 --grad-accum 2 >"$tmp/inplace.log" 2>&1
DDP_STAGED_GRADS=1 train --steps 6 --grad-accum 2 >"$tmp/staged.log" 2>&1
a=$(hash_of "$tmp/inplace.log"); c=$(hash_of "$tmp/staged.log")
if [ -n "$a" ] && [ "$a" = "$c" ]; then pass "$name"; echo "  (params fnv1a $a, both)"
else fail "$name" "in place $a, staged $c: $(tail -n 2 "$tmp/staged.log")"; fi

# --- resume: bitwise ---
for accum in 1 2; do
    name="gpt_resume_bitwise_${N}ranks_accum$accum"
    train --steps 8 --grad-accum $accum >"$tmp/straight.log" 2>&1 || { fail "$name" "straight run failed: $(tail -n 2 "$tmp/straight.log")"; continue; }
    train --steps 8 --grad-accum $accum --stop-at 4 --save "$tmp/ck$accum" >"$tmp/first.log" 2>&1 || { fail "$name" "first half failed: $(tail -n 2 "$tmp/first.log")"; continue; }
    train --steps 8 --grad-accum $accum --resume "$tmp/ck$accum" >"$tmp/second.log" 2>&1 || { fail "$name" "resumed run failed: $(tail -n 2 "$tmp/second.log")"; continue; }
    a=$(hash_of "$tmp/straight.log"); h=$(hash_of "$tmp/first.log"); c=$(hash_of "$tmp/second.log")
    if [ -n "$a" ] && [ "$a" = "$c" ] && [ "$a" != "$h" ] && grep -q "resumed from .* at step 4" "$tmp/second.log"; then
        pass "$name"; echo "  (8 steps straight and 4 + resume + 4: parameters fnv1a $a, both)"
    else
        fail "$name" "straight $a, after 4 steps $h, resumed $c"
    fi
    # the resumed run's step lines 5..8 must print the straight run's losses exactly
    if diff <(grep -oE "step +[5-8]/8 \| loss [0-9.]+" "$tmp/straight.log") <(grep -oE "step +[5-8]/8 \| loss [0-9.]+" "$tmp/second.log") >/dev/null; then
        pass "gpt_resume_same_losses_accum$accum"
    else
        fail "gpt_resume_same_losses_accum$accum" "the losses of steps 5-8 differ"
    fi
done

# --- checkpoints that must be refused ---
out=$(train --steps 8 --dim 64 --resume "$tmp/ck1" 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "holds a model with --layers 2 --heads 2 --dim 32" <<<"$out"; then pass gpt_resume_refuses_other_model
else fail gpt_resume_refuses_other_model "rc $rc: $(tail -n 2 <<<"$out")"; fi
cp "$tmp/ck1" "$tmp/bad"; printf '\x55' | dd of="$tmp/bad" bs=1 seek=200 conv=notrunc 2>/dev/null
out=$(train --steps 8 --resume "$tmp/bad" 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "corrupt (checksum mismatch)" <<<"$out"; then pass gpt_resume_refuses_corrupt_checkpoint
else fail gpt_resume_refuses_corrupt_checkpoint "rc $rc: $(tail -n 2 <<<"$out")"; fi
head -c 5000 "$tmp/ck1" >"$tmp/short"
out=$(train --steps 8 --resume "$tmp/short" 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "is truncated" <<<"$out"; then pass gpt_resume_refuses_truncated_checkpoint
else fail gpt_resume_refuses_truncated_checkpoint "rc $rc: $(tail -n 2 <<<"$out")"; fi
ls "$tmp"/ck1.tmp.* >/dev/null 2>&1 && fail gpt_checkpoint_no_temp_left "a temp file was left" || pass gpt_checkpoint_no_temp_left

# --- data errors: a clear message naming rank, file, size and need; a non-zero exit ---
: >"$tmp/empty.txt"
head -c 20 ddp.h >"$tmp/small.txt"
check_data() {   # name, path, expected words
    local name=$1 path=$2 want=$3 out rc
    out=$(timeout 60 "$B/ddprun" -n "$N" "${WRAP[@]}" "$BIN" --data "$path" --layers 2 --heads 2 --dim 32 --seq 16 --batch 2 --steps 2 2>&1); rc=$?
    if [ $rc -ne 0 ] && grep -q "rank [01]: .*'$path'.*$want.*at least $((N * 34 + 1)) bytes (world $N x batch 2 x (seq 16 + 1) + 1)" <<<"$out"; then
        pass "$name"; echo "  ($(grep -m1 -o "rank [01]: .*" <<<"$out"))"
    else
        fail "$name" "rc $rc: $(tail -n 3 <<<"$out" | tr '\n' ' ')"
    fi
}
check_data gpt_data_missing_is_a_clear_error "$tmp/nope.txt" "No such file"
check_data gpt_data_empty_is_a_clear_error "$tmp/empty.txt" "is empty (0 bytes)"
check_data gpt_data_too_small_is_a_clear_error "$tmp/small.txt" "is too small (20 bytes)"

# --- dump-init and sampling ---
if "$BIN" --dump-init "$tmp/init.bin" --layers 2 --heads 2 --dim 32 --seq 16 >/dev/null 2>&1 &&
   [ "$(stat -c %s "$tmp/init.bin")" -eq $((34176 * 4)) ]; then pass gpt_dump_init
else fail gpt_dump_init "no file of 34176 floats"; fi
out=$(timeout 60 "$BIN" "${TINY[@]}" --steps 3 --sample 200 --seed 5 --top-k 20 2>&1)
if grep -q -- "---- sample (200 bytes" <<<"$out" && grep -q -- "---- end of sample" <<<"$out" &&
   ! LC_ALL=C grep -q -P '[\x00-\x08\x0b-\x1f\x7f-\xff]' <<<"$out"; then pass gpt_sample_printable
else fail gpt_sample_printable "no sample, or raw non-printable bytes in it"; fi
again=$(timeout 60 "$BIN" "${TINY[@]}" --steps 3 --sample 200 --seed 5 --top-k 20 2>&1)
sample_of() { sed -n '/---- sample/,/---- end of sample/p' <<<"$1"; }
[ -n "$(sample_of "$out")" ] && [ "$(sample_of "$out")" = "$(sample_of "$again")" ] && pass gpt_sample_seeded || fail gpt_sample_seeded "two runs with --seed 5 differ"

# --- the nvcc build's CPU path is the C build, bit for bit (same source, same host math) ---
if [ -z "${TRAIN_GPT:-}" ] && [ -x "$B/gpu/train_gpt" ]; then
    name=gpt_nvcc_build_cpu_path_equals_c_build
    args=(--steps 6 --grad-accum 2 --eval-every 3 --sample 120 --seed 3)
    train "${args[@]}" >"$tmp/c.log" 2>&1; rc_c=$?
    timeout 120 "$B/ddprun" -n "$N" "$B/gpu/train_gpt" --cpu "${TINY[@]}" "${args[@]}" >"$tmp/nvcc.log" 2>&1; rc_n=$?
    digest() { { grep -oE "(val )?loss [0-9.]+|params fnv1a [0-9a-f]+" "$1"; sed -n '/---- sample/,/---- end of sample/p' "$1"; } | sed -E 's/^\[rank [0-9]+\] //'; }
    if [ $rc_c -eq 0 ] && [ $rc_n -eq 0 ] && [ -n "$(digest "$tmp/c.log")" ] && [ "$(digest "$tmp/c.log")" = "$(digest "$tmp/nvcc.log")" ]; then
        pass "$name"; echo "  ($N ranks, 6 steps of 2 micro-steps, evaluation, a sample: the same losses, parameters and text)"
    else
        fail "$name" "rc $rc_c / $rc_n; C: $(digest "$tmp/c.log" | tail -n 3 | tr '\n' ' ') nvcc: $(digest "$tmp/nvcc.log" | tail -n 3 | tr '\n' ' ')"
    fi
fi

echo "test_gpt.sh: $fails failure(s)" >&2
[ "$fails" -eq 0 ]
