#!/usr/bin/env bash
# test_gpt.sh — build/train_gpt as a user runs it, on 2 real ranks under ddprun:
#   checkpoint resume is bit-identical (train 2k steps == train k, save, resume, train k more),
#   with and without gradient accumulation; --save PATH resumes from what PATH holds (--fresh:
#   not); a checkpoint of another model or seed, a damaged, overlong or out-of-range one, or a
#   FIFO is refused; the rename of a checkpoint is followed by an fsync of its directory; a
#   missing, empty, too small or FIFO data file is a clear error and a non-zero exit, and so is
#   running out of memory; NaN or Inf flag values are refused, by the trainer built -Ofast too;
#   --dump-init and --sample work; the outer sync's flags (--outer average|diloco|streaming) fill
#   ddp_desc.outer: one group averaging is DDP bit for bit, groups of one sync when the schedule
#   says, bad values are refused by name; and where nvcc built BUILD_DIR/gpu/train_gpt, its CPU path
#   (--cpu) trains bit for bit what build/train_gpt trains. Prints one PASS/FAIL line per check.
# Usage: tests/test_gpt.sh [BUILD_DIR]      (data: ddp.h itself, any file is bytes)
#   env: TRAIN_GPT (the trainer to test, default BUILD_DIR/train_gpt), GPT_TEST_RANKS (2),
#        TEST_PREFIX (what the check names start with instead of "gpt"), RANK_WRAPPER (a
#        command each rank of a multi-rank run starts through, e.g. tools/nccl_one_gpu.sh
#        for 2 ranks on one GPU), GPT_TEST_ONLY (groups to run, e.g. "bf16 resume": see want())
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
# GPT_TEST_ONLY="bf16 resume ...": only those groups (the names after each "if want"; a GPU
# window runs a few); "refused" reuses resume's checkpoint, so it brings resume along.
want() {
    [ -z "${GPT_TEST_ONLY:-}" ] && return 0
    case " $GPT_TEST_ONLY " in *" $1 "*) return 0 ;; esac
    [ "$1" = resume ] && case " $GPT_TEST_ONLY " in *" refused "*) return 0 ;; esac
    return 1
}
for g in ${GPT_TEST_ONLY:-}; do
    case $g in buckets | dropout | flags | tape | dump_full | shakespeare | resume | refused | fsync | data | oom | sample | straggler | optimes | kernels2 | bf16 | outer | nvcc_cpu | zero3) ;;
    *) echo "FAIL ${pfx}_test_only: GPT_TEST_ONLY names '$g', no group of tests/test_gpt.sh"; exit 1 ;;
    esac
done

if want buckets; then
# --- gradient buckets in place (the shared gradient segment) and through the staging slots
#     (DDP_STAGED_GRADS=1): the same arithmetic, so the same bits ---
name="gpt_in_place_and_staged_buckets_same_bits_${N}ranks"
train --steps 6 --grad-accum 2 >"$tmp/inplace.log" 2>&1
DDP_STAGED_GRADS=1 train --steps 6 --grad-accum 2 >"$tmp/staged.log" 2>&1
a=$(hash_of "$tmp/inplace.log"); c=$(hash_of "$tmp/staged.log")
if [ -n "$a" ] && [ "$a" = "$c" ]; then pass "$name"; echo "  (params fnv1a $a, both)"
else fail "$name" "in place $a, staged $c: $(tail -n 2 "$tmp/staged.log")"; fi
fi   # buckets

if want dropout; then
# --- dropout: the masks follow the step and the global batch position, so a resumed run draws
#     what a straight run draws; it changes the training; a probability out of range is refused ---
name="gpt_dropout_resume_bitwise_${N}ranks"
train --steps 6 --dropout 0.2 >"$tmp/drop.log" 2>&1
train --steps 6 --dropout 0.2 --stop-at 3 --save "$tmp/ckdrop" >"$tmp/drop1.log" 2>&1
train --steps 6 --dropout 0.2 --resume "$tmp/ckdrop" >"$tmp/drop2.log" 2>&1
train --steps 6 >"$tmp/nodrop.log" 2>&1
a=$(hash_of "$tmp/drop.log"); c=$(hash_of "$tmp/drop2.log"); z=$(hash_of "$tmp/nodrop.log")
if [ -n "$a" ] && [ "$a" = "$c" ] && [ -n "$z" ] && [ "$a" != "$z" ]; then pass "$name"; echo "  (6 steps with dropout 0.2, straight and 3 + resume + 3: params fnv1a $a; without dropout $z)"
else fail "$name" "straight $a, resumed $c, without dropout $z: $(tail -n 2 "$tmp/drop2.log")"; fi
out=$(train --steps 1 --dropout 1 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "dropout must be in \[0, 1)" <<<"$out"; then pass gpt_dropout_out_of_range_refused
else fail gpt_dropout_out_of_range_refused "rc $rc: $(tail -n 2 <<<"$out")"; fi
fi   # dropout

if want flags; then
# --- flags that would wrap a size or wait forever are refused at once, by name (exit 2) ---
flag_refused() {   # name, expected words, flags...
    local name=$1 words=$2 out rc
    shift 2
    out=$(timeout 60 "$BIN" "${TINY[@]}" --steps 1 "$@" 2>&1); rc=$?
    if [ $rc -eq 2 ] && grep -q -- "$words" <<<"$out"; then pass "$name"
    else fail "$name" "rc $rc: $(tail -n 2 <<<"$out" | tr '\n' ' ')"; fi
}
flag_refused gpt_model_too_large_refused "the model is too large for this program" --layers 103991 --heads 1 --dim 84606976
flag_refused gpt_batch_times_seq_too_large_refused "batch x seq" --layers 1 --heads 1 --dim 1 --seq 1000000000 --batch 8
flag_refused gpt_negative_seed_refused "'-1' is not a non-negative integer" --seed -1
flag_refused gpt_infinite_latency_refused "'inf' is not a finite number >= 0" --inject-latency-ms inf
flag_refused gpt_underflowing_lr_refused "'1e-999' is beyond a float's range (too small" --lr 1e-999
flag_refused gpt_save_every_without_save_refused "--save-every goes with --save PATH" --save-every 1
# the trainer built -Ofast (the Makefile's train_gpt_fastmath): NaN and Inf are still refused by
# name, where a check by comparison or isinf() folds away (--dropout nan trained with NaN masks)
FM=${TRAIN_GPT_FASTMATH:-$B/train_gpt_fastmath}
if [ -x "$FM" ]; then
    for fv in "--dropout nan" "--temperature inf" "--straggler-pct -nan" "--lr inf"; do
        n=${fv:2}; BIN=$FM flag_refused "gpt_fastmath_${n// /_}_refused" "'${fv#* }' is not a finite number >= 0" $fv
    done
else echo "SKIP gpt_fastmath_nan_inf_flags_refused: no $FM (make builds it)"; fi
fi   # flags

if want tape; then
# --- the model's tape lists each parameter on the op that finishes its gradient: a one-rank run
#     with DDP_CHECK_READY=1 (every gradient compared at ddp_finish with its copy when it was
#     marked ready) passes, with accumulation and dropout; with 2 ranks the option is refused ---
out=$(DDP_CHECK_READY=1 timeout 120 "$BIN" "${TINY[@]}" --steps 3 --grad-accum 2 --dropout 0.1 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "^done: step 3" <<<"$out"; then pass gpt_tape_ids_pass_check_ready
elif grep -q "check_ready (DDP_CHECK_READY=1) is a debugging run .*backend nccl" <<<"$out"; then
    echo "SKIP ${pfx}_tape_ids_pass_check_ready: this trainer runs on a GPU (check_ready needs host memory; the CPU builds check it)"
else fail gpt_tape_ids_pass_check_ready "rc $rc: $(tail -n 2 <<<"$out" | tr '\n' ' ')"; fi
out=$(DDP_CHECK_READY=1 train --steps 1 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "check_ready (DDP_CHECK_READY=1) is a debugging run on one rank" <<<"$out"; then pass gpt_check_ready_refused_on_2_ranks
else fail gpt_check_ready_refused_on_2_ranks "rc $rc: $(tail -n 2 <<<"$out" | tr '\n' ' ')"; fi
fi   # tape

if want dump_full; then
# --- --dump-init on a full disk leaves no partial file (written to a temporary, renamed) ---
if [ "$(id -u)" = 0 ] && mkdir -p "$tmp/small" && mount -t tmpfs -o size=64k tmpfs "$tmp/small" 2>/dev/null; then
    out=$(timeout 60 "$BIN" "${TINY[@]}" --dim 64 --dump-init "$tmp/small/init.bin" 2>&1); rc=$?
    left=$(ls -A "$tmp/small")
    umount "$tmp/small"
    if [ $rc -ne 0 ] && grep -q "cannot write '$tmp/small/init.bin': No space left on device" <<<"$out" && [ -z "$left" ]; then
        pass gpt_dump_init_full_disk_leaves_nothing
    else fail gpt_dump_init_full_disk_leaves_nothing "rc $rc, left '$left': $(tail -n 1 <<<"$out")"; fi
else
    echo "SKIP gpt_dump_init_full_disk_leaves_nothing: cannot mount a small tmpfs here (not root, or no mount namespace rights)"
fi
fi   # dump_full

if want shakespeare; then
# --- examples/gpt/shakespeare_char.sh (nanoGPT's shakespeare_char configuration) starts, here on the CPU
#     backend, with the model shrunk by flags that override its own ---
if [ -z "${TRAIN_GPT:-}" ] && [ -f ../shared/data/tinyshakespeare.txt ]; then
    out=$(timeout 120 examples/gpt/shakespeare_char.sh "$B" --ranks 2 --layers 1 --heads 2 --dim 32 --seq 32 --batch 2 --stop-at 2 2>&1); rc=$?
    if [ $rc = 0 ] && grep -q "step     2/5000" <<<"$out" && grep -q "done: step 2 | val loss" <<<"$out"; then pass gpt_shakespeare_char_script_runs
    else fail gpt_shakespeare_char_script_runs "rc $rc: $(tail -n 3 <<<"$out")"; fi
fi
fi   # shakespeare

if want resume; then
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
    # --save PATH where PATH holds a checkpoint continues from it (a restarted job runs the same
    # command again), saying so; --fresh starts over
    if [ "$accum" = 1 ]; then
        cp "$tmp/ck$accum" "$tmp/auto$accum"
        train --steps 8 --grad-accum $accum --save "$tmp/auto$accum" >"$tmp/auto.log" 2>&1
        c=$(hash_of "$tmp/auto.log")
        if [ -n "$a" ] && [ "$a" = "$c" ] && grep -q "resumed from $tmp/auto$accum at step 4 (the --save path held a checkpoint" "$tmp/auto.log"; then
            pass gpt_save_path_with_checkpoint_resumes
        else fail gpt_save_path_with_checkpoint_resumes "straight $a, via --save $c: $(grep -v '^\[rank 0\] step' "$tmp/auto.log" | tail -n 2)"; fi
        cp "$tmp/ck$accum" "$tmp/fresh$accum"
        train --steps 8 --grad-accum $accum --save "$tmp/fresh$accum" --fresh >"$tmp/fresh.log" 2>&1
        c=$(hash_of "$tmp/fresh.log")
        if [ -n "$a" ] && [ "$a" = "$c" ] && ! grep -q "resumed" "$tmp/fresh.log" && cmp -s "$tmp/fresh$accum" "$tmp/auto$accum"; then
            pass gpt_save_fresh_starts_over
        else fail gpt_save_fresh_starts_over "straight $a, --fresh $c: $(tail -n 2 "$tmp/fresh.log")"; fi
        # --stop-at 0 stops before the first step (it once meant "no stop": a full run, exit 0):
        # the checkpoint holds the initial state, and 8 steps from it are the straight run's
        train --steps 8 --stop-at 0 --save "$tmp/ck0" >"$tmp/stop0.log" 2>&1
        train --steps 8 --resume "$tmp/ck0" >"$tmp/from0.log" 2>&1
        c=$(hash_of "$tmp/from0.log")
        if grep -q "done: step 0 |" "$tmp/stop0.log" && [ -n "$a" ] && [ "$a" = "$c" ]; then pass gpt_stop_at_0_saves_the_initial_state
        else fail gpt_stop_at_0_saves_the_initial_state "$(grep -m1 "done:" "$tmp/stop0.log"); straight $a, 8 steps from it $c"; fi
    fi
    # the resumed run's step lines 5..8 must print the straight run's losses exactly
    if diff <(grep -oE "step +[5-8]/8 \| loss [0-9.]+" "$tmp/straight.log") <(grep -oE "step +[5-8]/8 \| loss [0-9.]+" "$tmp/second.log") >/dev/null; then
        pass "gpt_resume_same_losses_accum$accum"
    else
        fail "gpt_resume_same_losses_accum$accum" "the losses of steps 5-8 differ"
    fi
done
fi   # resume

if want refused; then
# --- checkpoints that must be refused ---
out=$(train --steps 8 --dim 64 --resume "$tmp/ck1" 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "holds a model with --layers 2 --heads 2 --dim 32" <<<"$out"; then pass gpt_resume_refuses_other_model
else fail gpt_resume_refuses_other_model "rc $rc: $(tail -n 2 <<<"$out")"; fi
# the middle byte flipped (a fixed value written there was no change when the byte held it already)
mid=$(( $(stat -c %s "$tmp/ck1") / 2 ))
byte=$(od -An -tu1 -j "$mid" -N1 "$tmp/ck1" | tr -d ' ')
cp "$tmp/ck1" "$tmp/bad"; printf "\\$(printf %03o $(( byte ^ 255 )))" | dd of="$tmp/bad" bs=1 seek="$mid" conv=notrunc 2>/dev/null
cmp -s "$tmp/ck1" "$tmp/bad" && fail gpt_resume_refuses_corrupt_checkpoint_setup "the corruption changed nothing"
out=$(train --steps 8 --resume "$tmp/bad" 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "corrupt (checksum mismatch)" <<<"$out"; then pass gpt_resume_refuses_corrupt_checkpoint
else fail gpt_resume_refuses_corrupt_checkpoint "rc $rc: $(tail -n 2 <<<"$out")"; fi
head -c 5000 "$tmp/ck1" >"$tmp/short"
out=$(train --steps 8 --resume "$tmp/short" 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "is truncated" <<<"$out"; then pass gpt_resume_refuses_truncated_checkpoint
else fail gpt_resume_refuses_truncated_checkpoint "rc $rc: $(tail -n 2 <<<"$out")"; fi
ls "$tmp"/ck1.tmp.* >/dev/null 2>&1 && fail gpt_checkpoint_no_temp_left "a temp file was left" || pass gpt_checkpoint_no_temp_left

# reseal SRC DST STEP [SEED]: a copy of a checkpoint with train_gpt's step and seed changed (its
# run_state, the 56-byte user blob before ddp.h's checksum: step an int64 at byte 32 of it, seed a
# uint64 at 40) and the checksum (the last 8 bytes) made valid again: what only the
# loader's own checks can refuse.
reseal() {
    python3 - "$@" <<'PY'
import struct, sys
b = bytearray(open(sys.argv[1], 'rb').read())
blob = len(b) - 8 - 56
assert b[blob:blob + 8] == b'GPTRUN01'
struct.pack_into('<q', b, blob + 32, int(sys.argv[3]))
if len(sys.argv) > 4: struct.pack_into('<Q', b, blob + 40, int(sys.argv[4]))
# ddp.h's checksum (>>checkpoint): FNV-1a's step on little-endian 64-bit words in four lanes
# (lane k: word k of each 32-byte block), then FNV-1a over the lanes, the partial block, the length
P, M, d = 1099511628211, (1 << 64) - 1, bytes(b[:-8])
lanes = [1469598103934665603 + k for k in range(4)]
words = struct.unpack_from('<%dQ' % (len(d) // 32 * 4), d)
for i in range(0, len(words), 4):
    for k in range(4): lanes[k] = ((lanes[k] ^ words[i + k]) * P) & M
h = 1469598103934665603
for x in struct.pack('<4Q', *lanes) + d[len(d) // 32 * 32:] + struct.pack('<Q', len(d)): h = ((h ^ x) * P) & M
struct.pack_into('<Q', b, len(b) - 8, h)
open(sys.argv[2], 'wb').write(b)
PY
}
refused() {   # name, checkpoint, expected words, [more train flags]
    local name=$1 ck=$2 want=$3 out rc; shift 3
    out=$(train --steps 8 --resume "$ck" "$@" 2>&1); rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "$want" <<<"$out" && ! grep -q "resumed from" <<<"$out"; then
        pass "$name"; echo "  ($(grep -m1 -o "\(rank 0: \|\[rank 0\] \)[a-z].*" <<<"$out" | cut -c1-150))"
    else fail "$name" "rc $rc: $(grep -v '^\[rank 0\] step' <<<"$out" | tail -n 2 | tr '\n' ' ')"; fi
}
cat "$tmp/ck1" >"$tmp/long"; printf 'x' >>"$tmp/long"
refused gpt_resume_refuses_bytes_after_checksum "$tmp/long" "goes on after its checksum"
reseal "$tmp/ck1" "$tmp/step_wraps" $(( (1 << 32) + 5 ))
refused gpt_resume_refuses_step_beyond_int32 "$tmp/step_wraps" "holds step 4294967301 and AdamW step 4"
reseal "$tmp/ck1" "$tmp/step_negative" -3
refused gpt_resume_refuses_negative_step "$tmp/step_negative" "holds step -3 and AdamW step 4"
refused gpt_resume_refuses_other_seed "$tmp/ck1" "trained with --seed 1337, this run has --seed 7.*pass --seed 1337" --seed 7
refused gpt_resume_refuses_other_dropout "$tmp/ck1" "trained with --dropout 0, this run has --dropout 0.1: pass --dropout 0" --dropout 0.1
[ -p "$tmp/fifo" ] || mkfifo "$tmp/fifo"
out=$(timeout 30 "$B/ddprun" -n "$N" "${WRAP[@]}" "$BIN" "${TINY[@]}" --steps 8 --resume "$tmp/fifo" 2>&1); rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "\(rank 0: \|\[rank 0\] \)the checkpoint '$tmp/fifo' is a FIFO (named pipe), not a regular file" <<<"$out"; then
    pass gpt_resume_refuses_fifo
else fail gpt_resume_refuses_fifo "rc $rc (124: it blocked in open): $(tail -n 2 <<<"$out" | tr '\n' ' ')"; fi
out=$(train --steps 8 --dim 64 --save "$tmp/ck1" 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "holds a model with --layers 2 --heads 2 --dim 32.*--save '$tmp/ck1' already holds that file: pass --fresh" <<<"$out"; then
    pass gpt_save_path_with_other_checkpoint_refused
else fail gpt_save_path_with_other_checkpoint_refused "rc $rc: $(tail -n 2 <<<"$out" | tr '\n' ' ')"; fi
fi   # refused

if want fsync; then
# --- the checkpoint's rename reaches the disk: the directory is fsync'ed after it (strace) ---
mkdir -p "$tmp/dur"
if ! command -v strace >/dev/null || ! strace -o /dev/null true 2>/dev/null; then
    echo "SKIP gpt_checkpoint_rename_is_synced: no strace, or ptrace not permitted here"
else
    strace -f -e trace=rename,renameat,renameat2,openat,fsync,fdatasync -o "$tmp/strace.txt" \
        timeout 60 "$BIN" "${TINY[@]}" --steps 2 --save "$tmp/dur/ck" >/dev/null 2>&1
    # after the rename onto dur/ck: an fsync of a descriptor opened on the directory dur
    if awk -v dir="\"$tmp/dur\"" '
        /rename/ && index($0, "/dur/ck\"") { renamed = 1; next }
        renamed && /openat\(/ && index($0, dir) && /O_DIRECTORY/ { fd = $NF }
        renamed && fd != "" && $0 ~ ("fsync\\(" fd "\\)") { ok = 1 }
        END { exit !ok }' "$tmp/strace.txt"; then
        pass gpt_checkpoint_rename_is_synced
    else fail gpt_checkpoint_rename_is_synced "no fsync of '$tmp/dur' after the rename: $(grep -A3 rename "$tmp/strace.txt" | tr '\n' ' ' | cut -c1-300)"; fi
fi
fi   # fsync

if want data; then
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
# an epoch must hold one optimizer step: every rank's share of the windows (the sampler's
# floor(n / world)) at least batch x grad-accum; a text of a fixed size (ddp.h grows: once it held
# a step of 200000 micro-steps, and the run trained instead of failing)
head -c 100000 ddp.h >"$tmp/text100k.txt"
out=$(timeout 60 "$B/ddprun" -n "$N" "${WRAP[@]}" "$BIN" "${TINY[@]}" --data "$tmp/text100k.txt" --steps 1 --grad-accum 200000 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "rank [01]: the training data '$tmp/text100k.txt' (100000 bytes) is too small for one optimizer step: .* windows of seq 16 + 1 bytes .*a step takes batch 2 x grad-accum 200000 = 400000 a rank (world $N)" <<<"$out"; then
    pass gpt_data_less_than_one_step_is_a_clear_error; echo "  ($(grep -m1 -o "rank [01]: .*" <<<"$out" | cut -c1-200))"
else fail gpt_data_less_than_one_step_is_a_clear_error "rc $rc: $(tail -n 2 <<<"$out" | tr '\n' ' ')"; fi
# a file that holds a step but whose 10% validation split is shorter than a window trains, and
# says why its val loss is nan (it looked like a diverged run)
head -c $((N * 34 + 11)) ddp.h >"$tmp/noval.txt"
out=$(timeout 60 "$B/ddprun" -n "$N" "${WRAP[@]}" "$BIN" "${TINY[@]}" --data "$tmp/noval.txt" --steps 1 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "val [0-9]*: less than a window, so no validation: val loss is nan" <<<"$out" && grep -q "done: step 1 | val loss nan" <<<"$out"; then
    pass gpt_data_without_validation_window_says_so
else fail gpt_data_without_validation_window_says_so "rc $rc: $(grep -m1 "data:" <<<"$out") $(tail -n 2 <<<"$out" | tr '\n' ' ')"; fi
# a FIFO would block in open forever, before any timeout applies
[ -p "$tmp/fifo" ] || mkfifo "$tmp/fifo"
out=$(timeout 30 "$B/ddprun" -n "$N" "${WRAP[@]}" "$BIN" --data "$tmp/fifo" --layers 2 --heads 2 --dim 32 --seq 16 --batch 2 --steps 2 2>&1); rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "rank [01]: the training data '$tmp/fifo' is a FIFO (named pipe), not a regular file" <<<"$out"; then
    pass gpt_data_fifo_is_a_clear_error
else fail gpt_data_fifo_is_a_clear_error "rc $rc (124: it blocked in open): $(tail -n 2 <<<"$out" | tr '\n' ' ')"; fi
fi   # data

if want oom; then
# --- out of memory: a message that says so and what to change, not "no error" ---
out=$(ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}allocator_may_return_null=1" \
      TSAN_OPTIONS="${TSAN_OPTIONS:+$TSAN_OPTIONS:}allocator_may_return_null=1" \
      timeout 60 "$BIN" --data ddp.h --dim 1000000 --heads 1 --steps 1 2>&1); rc=$?
if [ $rc -eq 1 ] && grep -q "rank 0: out of memory creating the model: --layers 4 --heads 1 --dim 1000000 .*make --dim" <<<"$out" &&
   ! grep -q "no error" <<<"$out"; then
    pass gpt_out_of_memory_is_named
else fail gpt_out_of_memory_is_named "rc $rc: $(tail -n 2 <<<"$out" | tr '\n' ' ')"; fi
fi   # oom

if want sample; then
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
fi   # sample

if want straggler; then
# --- --straggler-pct: rank N-1 sleeps 200 ms before each step (GPT_TEST_SLOW_RANK, a test hook):
#     rank 0's log names it with the wait; --straggler-pct 0 prints nothing; out of range refused.
#     The wait is the sleep less however much longer rank 0's own step took (under TSan that was
#     31 ms of a 100 ms sleep): the largest of the steps' waits, at least half the sleep. ---
out=$(GPT_TEST_SLOW_RANK=$((N - 1)):200 train --steps 3 --log-every 1 2>&1)
if grep -q "ddp.h: nccl backend" <<<"$out"; then echo "SKIP ${pfx}_straggler_line: the NCCL backend cannot tell who arrived last (ddp.h, STRAGGLERS)"
else
    waited=$(sed -n "s/.*straggler: step [0-9]* | rank $((N - 1)) arrived last: the ranks waited up to \([0-9.]*\) ms.*/\1/p" <<<"$out" | sort -g | tail -n 1)
    if [ -n "$waited" ] && awk -v w="$waited" 'BEGIN { exit !(w >= 100) }'; then pass gpt_straggler_line_names_the_slow_rank; echo "  (waited $waited ms of the 200 ms)"
    else fail gpt_straggler_line_names_the_slow_rank "no straggler line naming rank $((N - 1)) with >= 100 ms: $(grep -m1 -E 'straggler|rror' <<<"$out")"; fi
    out=$(GPT_TEST_SLOW_RANK=$((N - 1)):100 train --steps 2 --straggler-pct 0 2>&1)
    if grep -qE "step +2/2" <<<"$out" && ! grep -q "straggler:" <<<"$out"; then pass gpt_straggler_pct_0_is_off
    else fail gpt_straggler_pct_0_is_off "$(grep -m1 -E 'straggler:|rror' <<<"$out")"; fi
fi
if ! out=$("$BIN" "${TINY[@]}" --steps 1 --straggler-pct 150 2>&1) && grep -q -- "--straggler-pct is a share of the step, 0 to 100" <<<"$out"; then pass gpt_straggler_pct_out_of_range_refused
else fail gpt_straggler_pct_out_of_range_refused "$(tail -n 1 <<<"$out")"; fi
fi   # straggler

if want optimes; then
# --- GPT_OP_TIMES=1: the CUDA model's per-op times (CUDA events; host clock in emulation): a
#     table with every op of the model at its calls per step, the ops' and the rest's shares
#     adding to 100%, and the training's bits unchanged; a bad value refused ---
if [[ "$BIN" == *emulated* || "$BIN" == */gpu/train_gpt ]]; then
    name=gpt_op_times_table_and_same_bits
    GPT_OP_TIMES=1 timeout 120 "$BIN" "${TINY[@]}" --steps 8 --eval-every 4 --log-every 4 --dropout 0.1 >"$tmp/optimes.log" 2>&1; rc_a=$?
    timeout 120 "$BIN" "${TINY[@]}" --steps 8 --eval-every 4 --log-every 4 --dropout 0.1 >"$tmp/nooptimes.log" 2>&1; rc_b=$?
    why=""
    [ $rc_a -eq 0 ] && [ $rc_b -eq 0 ] || why="rc $rc_a / $rc_b"
    grep -q "^op times (GPT_OP_TIMES=1, .*): 5 step(s)" "$tmp/optimes.log" || why="$why; no header for 5 steps"
    for op in "fwd embedding:1.0" "fwd layernorm:5.0" "fwd matmul qkv:2.0" "fwd attention S = Q K^T:2.0" "fwd attention softmax:2.0" \
              "fwd attention O = P V:2.0" "fwd gelu:2.0" "fwd matmul mlp proj:2.0" "fwd matmul head:1.0" "fwd cross-entropy (+ dlogits):1.0" \
              "bwd attention softmax:2.0" "bwd matmul qkv dW:2.0" "bwd matmul qkv dx:2.0" "bwd layernorm dx:5.0" "bwd embedding (wte, wpe):1.0" \
              "bwd dropout:4.0" "fwd dropout:4.0" "ddp adamw step (+ norm, clip):1.0"; do
        awk -v op="${op%:*}" -v calls="${op##*:}" 'index($0, "  " op " ") == 1 { rest = substr($0, length(op) + 3); split(rest, f, " "); if (f[1] == calls) ok = 1 } END { exit !ok }' \
            "$tmp/optimes.log" || why="$why; no '${op%:*}' at ${op##*:} calls a step"
    done
    total=$(awk '/^  \(ops, summed\)|^  \(no op:/ { s += $NF + 0 } END { printf "%.1f", s }' "$tmp/optimes.log")
    awk -v t="$total" 'BEGIN { exit !(t >= 99.8 && t <= 100.2) }' || why="$why; shares add to $total%"
    [ -n "$(hash_of "$tmp/optimes.log")" ] && [ "$(hash_of "$tmp/optimes.log")" = "$(hash_of "$tmp/nooptimes.log")" ] || why="$why; other bits with the timer"
    grep -q "^op times" "$tmp/nooptimes.log" && why="$why; a table without GPT_OP_TIMES"
    if [ -z "$why" ]; then pass "$name"; echo "  ($(grep -c '^  [fb]wd\|^  ddp' "$tmp/optimes.log") ops; $(grep -m1 '^op times' "$tmp/optimes.log"))"
    else fail "$name" "${why#; }: $(tail -n 3 "$tmp/optimes.log" | tr '\n' ' ')"; fi
    out=$(GPT_OP_TIMES=yes timeout 60 "$BIN" "${TINY[@]}" --steps 1 2>&1); rc=$?
    if [ $rc -ne 0 ] && grep -q "GPT_OP_TIMES is 'yes': 1 (per-op times) or 0 (none)" <<<"$out"; then pass gpt_op_times_bad_value_refused
    else fail gpt_op_times_bad_value_refused "rc $rc: $(tail -n 2 <<<"$out" | tr '\n' ' ')"; fi
fi
fi   # optimes

if want kernels2; then
# --- GPT_KERNELS=2 (the CUDA model's new kernels): a run resumes bit for bit, other bits than
#     the old kernels' (another summation order), its op times name the fused LayerNorm backward
#     (the straight run times its ops: the timer changes no bits), a bad value refused;
#     GPT_ATTENTION=fused ---
if [[ "$BIN" == *emulated* || "$BIN" == */gpu/train_gpt ]]; then
    name="gpt_kernels2_resume_bitwise_${N}ranks"
    GPT_KERNELS=2 GPT_OP_TIMES=1 train --steps 8 --seq 64 --batch 8 >"$tmp/k2.log" 2>&1
    GPT_KERNELS=2 train --steps 8 --seq 64 --batch 8 --stop-at 4 --save "$tmp/k2.ck" >/dev/null 2>&1
    GPT_KERNELS=2 train --steps 8 --seq 64 --batch 8 --resume "$tmp/k2.ck" >"$tmp/k2r.log" 2>&1
    train --steps 8 --seq 64 --batch 8 >"$tmp/k1.log" 2>&1
    a=$(hash_of "$tmp/k2.log"); c=$(hash_of "$tmp/k2r.log"); o=$(hash_of "$tmp/k1.log")
    if [ -n "$a" ] && [ "$a" = "$c" ] && [ -n "$o" ] && [ "$a" != "$o" ] && grep -q "GPT_KERNELS=2" "$tmp/k2.log"; then
        pass "$name"; echo "  (params fnv1a $a, both; the old kernels: $o)"
    else fail "$name" "straight $a, resumed $c, old kernels $o: $(tail -n 2 "$tmp/k2r.log" | tr '\n' ' ')"; fi
    why=""
    sed 's/^\[rank 0\] //' "$tmp/k2.log" >"$tmp/k2t.log"   # the launcher's rank prefix off
    for op in "bwd layernorm dx, dw, db (fused):5.0" "fwd attention S = Q K^T:2.0" "bwd attention dQ, dK:2.0"; do
        awk -v op="${op%:*}" -v calls="${op##*:}" 'index($0, "  " op " ") == 1 { rest = substr($0, length(op) + 3); split(rest, f, " "); if (f[1] == calls) ok = 1 } END { exit !ok }' \
            "$tmp/k2t.log" || why="$why; no '${op%:*}' at ${op##*:} calls a step"
    done
    grep -q "^  bwd layernorm dx " "$tmp/k2t.log" && why="$why; the unfused 'bwd layernorm dx' timed too"
    if [ -z "$why" ]; then pass gpt_kernels2_op_times_name_the_fused_layernorm
    else fail gpt_kernels2_op_times_name_the_fused_layernorm "${why#; }: $(grep -A4 '^op times' "$tmp/k2t.log" | tr '\n' ' ')"; fi
    # GPT_ATTENTION=fused (no [T, T] matrices): a run with dropout resumes bit for bit, and its
    # losses follow the explicit attention's: the first step's within the CUDA model's loss
    # tolerance against the CPU model (2e-5 relative; the log prints 6 decimals), the later ones
    # within 1e-3 (AdamW turns gradients that are rounding noise into lr-sized steps, which the
    # two summation orders take differently); a bad value refused.
    name="gpt_fused_attention_resume_bitwise_follows_explicit_${N}ranks"
    GPT_ATTENTION=fused train --steps 8 --seq 64 --batch 8 --dropout 0.1 >"$tmp/fa.log" 2>&1
    GPT_ATTENTION=fused train --steps 8 --seq 64 --batch 8 --dropout 0.1 --stop-at 4 --save "$tmp/fa.ck" >/dev/null 2>&1
    GPT_ATTENTION=fused train --steps 8 --seq 64 --batch 8 --dropout 0.1 --resume "$tmp/fa.ck" >"$tmp/far.log" 2>&1
    train --steps 8 --seq 64 --batch 8 --dropout 0.1 >"$tmp/fe.log" 2>&1
    a=$(hash_of "$tmp/fa.log"); c=$(hash_of "$tmp/far.log")
    losses() { sed -n 's/.*step *\([0-9]*\)\/8 | loss \([0-9.]*\) .*/\1 \2/p' "$1"; }
    far=$(join <(losses "$tmp/fa.log") <(losses "$tmp/fe.log") |
          awk '{ d = $2 - $3; if (d < 0) d = -d; lim = $1 == 1 ? 2e-5 * $3 + 1e-6 : 1e-3; if (d > lim) printf "step %d: %s vs %s; ", $1, $2, $3; n++ }
               END { if (n != 8) printf "%d steps compared, 8 expected", n }')
    if [ -n "$a" ] && [ "$a" = "$c" ] && [ -z "$far" ] && grep -q "GPT_ATTENTION=fused" "$tmp/fa.log"; then
        pass "$name"; echo "  (params fnv1a $a, both; 8 steps' losses within the bounds of the explicit attention's)"
    else fail "$name" "straight $a, resumed $c; ${far:-losses close}: $(tail -n 2 "$tmp/far.log" | tr '\n' ' ')"; fi
    out=$(GPT_ATTENTION=flash timeout 60 "$BIN" "${TINY[@]}" --steps 1 2>&1); rc=$?
    if [ $rc -ne 0 ] && grep -q "GPT_ATTENTION is 'flash': explicit (the \[T, T\] matrices, the default) or fused" <<<"$out"; then
        pass gpt_attention_bad_value_refused
    else fail gpt_attention_bad_value_refused "rc $rc: $(tail -n 2 <<<"$out" | tr '\n' ' ')"; fi
    out=$(GPT_KERNELS=3 timeout 60 "$BIN" "${TINY[@]}" --steps 1 2>&1); rc=$?
    if [ $rc -ne 0 ] && grep -q "GPT_KERNELS is '3': 1 (the kernels as they were) or 2 (the new ones)" <<<"$out"; then pass gpt_kernels_bad_value_refused
    else fail gpt_kernels_bad_value_refused "rc $rc: $(tail -n 2 <<<"$out" | tr '\n' ' ')"; fi
fi
fi   # kernels2

if want zero3; then
# --- DDP_SHARD=parameters (ZeRO-3): the model's units gathered in the forward, by the tape in the
#     backward; the same bits as unsharded training with the same buckets (--units), with
#     accumulation and clipping; a checkpoint of a ZeRO-3 run resumed unsharded ends the same ---
    name="gpt_zero3_equals_unsharded_bitwise_${N}ranks"
    train --steps 8 --grad-accum 2 --clip 0.5 --units >"$tmp/z3_none.log" 2>&1
    DDP_SHARD=parameters train --steps 8 --grad-accum 2 --clip 0.5 >"$tmp/z3.log" 2>&1
    a=$(hash_of "$tmp/z3_none.log"); c=$(hash_of "$tmp/z3.log")
    if [ -n "$a" ] && [ "$a" = "$c" ] && grep -q "parameters sharded (ZeRO-3)" "$tmp/z3.log"; then pass "$name"; echo "  (params fnv1a $a, both)"
    else fail "$name" "unsharded $a, ZeRO-3 $c: $(tail -n 2 "$tmp/z3.log")"; fi
    name="gpt_zero3_checkpoint_resumed_unsharded_bitwise_${N}ranks"
    DDP_SHARD=parameters train --steps 8 --grad-accum 2 --clip 0.5 --stop-at 4 --save "$tmp/z3.ck" >/dev/null 2>&1
    train --steps 8 --grad-accum 2 --clip 0.5 --units --resume "$tmp/z3.ck" >"$tmp/z3_resumed.log" 2>&1
    c=$(hash_of "$tmp/z3_resumed.log")
    if [ -n "$a" ] && [ "$a" = "$c" ]; then pass "$name"
    else fail "$name" "straight $a, resumed $c: $(tail -n 2 "$tmp/z3_resumed.log")"; fi
    # --prefetch off (ddp_desc.shard_prefetch_off): each unit gathered when needed, the same bits;
    # a value other than on / off refused by the trainer
    name="gpt_zero3_prefetch_off_equals_unsharded_bitwise_${N}ranks"
    DDP_SHARD=parameters train --steps 8 --grad-accum 2 --clip 0.5 --prefetch off >"$tmp/z3_off.log" 2>&1
    c=$(hash_of "$tmp/z3_off.log")
    if [ -n "$a" ] && [ "$a" = "$c" ]; then pass "$name"
    else fail "$name" "unsharded $a, prefetch off $c: $(tail -n 2 "$tmp/z3_off.log")"; fi
    out=$("$BIN" "${TINY[@]}" --prefetch maybe 2>&1); rc=$?
    if [ $rc -eq 2 ] && grep -qF -- "--prefetch: 'maybe' is neither on nor off" <<<"$out"; then pass gpt_prefetch_bad_value_refused
    else fail gpt_prefetch_bad_value_refused "rc $rc: $(tail -n 2 <<<"$out" | tr '\n' ' ')"; fi
    # The CUDA model (the emulated build; the GPU trainer): its forward gathers the units as gpt.h's
    # does. bf16 too (the context's bf16 working copies sharded, the fp32 master in parts), and a
    # sample after a ZeRO-3 run (every rank runs its forwards there) is the unsharded run's text.
    if [[ "$BIN" == *emulated* || "$BIN" == */gpu/train_gpt ]]; then
        name="gpt_zero3_bf16_equals_unsharded_bitwise_${N}ranks"
        train --steps 8 --grad-accum 2 --clip 0.5 --bf16 --units >"$tmp/z3b_none.log" 2>&1
        DDP_SHARD=parameters train --steps 8 --grad-accum 2 --clip 0.5 --bf16 >"$tmp/z3b.log" 2>&1
        a=$(hash_of "$tmp/z3b_none.log"); c=$(hash_of "$tmp/z3b.log")
        if [ -n "$a" ] && [ "$a" = "$c" ] && grep -q ", bf16" "$tmp/z3b.log" && grep -q "parameters sharded (ZeRO-3)" "$tmp/z3b.log"
        then pass "$name"; echo "  (params fnv1a $a, both)"
        else fail "$name" "unsharded $a, ZeRO-3 $c: $(tail -n 2 "$tmp/z3b.log")"; fi
        name="gpt_zero3_sample_equals_unsharded_${N}ranks"
        train --steps 4 --units --sample 60 --seed 5 >"$tmp/z3s_none.log" 2>&1
        DDP_SHARD=parameters train --steps 4 --sample 60 --seed 5 >"$tmp/z3s.log" 2>&1; rc=$?
        sample_in() { sed -n '/---- sample/,/---- end of sample/p' "$1" | sed -E 's/^\[rank [0-9]+\] //'; }
        a=$(sample_in "$tmp/z3s_none.log"); c=$(sample_in "$tmp/z3s.log")
        if [ $rc -eq 0 ] && [ -n "$a" ] && [ "$a" = "$c" ] && [ "$(grep -c -- "---- sample (60 bytes" "$tmp/z3s.log")" = 1 ]; then pass "$name"
        else fail "$name" "rc $rc, unsharded '$a', ZeRO-3 '$c': $(tail -n 2 "$tmp/z3s.log")"; fi
    fi
    # The same model on ddp.h's NCCL backend (tests/fakegpu; 1 rank, the fake's ranks being threads):
    # its gathers map the unit's granules and all-gather on the comm stream. fp32 with accumulation
    # and clipping, bf16 with prefetch off, and the sample: ZeRO-3 ends as unsharded, no misuse.
    if [[ "$BIN" == *emulated* ]]; then
        name="gpt_zero3_cuda_model_on_fake_nccl_equals_unsharded_1rank"
        if [ ! -x "$B/train_gpt_fakegpu" ]; then echo "SKIP ${name/#gpt_/${pfx}_}: $B/train_gpt_fakegpu not built"
        else
            fk() { timeout 120 "$B/train_gpt_fakegpu" "${TINY[@]}" --steps 6 --grad-accum 2 --clip 0.5 --seed 5 --sample 40 "$@"; }
            bad=""
            for v in "" "--bf16 --prefetch off"; do
                # shellcheck disable=SC2086
                fk --units $v >"$tmp/fk_none.log" 2>&1
                # shellcheck disable=SC2086
                DDP_SHARD=parameters fk $v >"$tmp/fk_z3.log" 2>&1
                a=$(hash_of "$tmp/fk_none.log"); c=$(hash_of "$tmp/fk_z3.log")
                sa=$(sed -n '/---- sample/,/---- end of sample/p' "$tmp/fk_none.log"); sc=$(sed -n '/---- sample/,/---- end of sample/p' "$tmp/fk_z3.log")
                if [ -z "$a" ] || [ "$a" != "$c" ] || [ -z "$sa" ] || [ "$sa" != "$sc" ] || ! grep -q "nccl backend" "$tmp/fk_z3.log" ||
                   ! grep -q "parameters sharded (ZeRO-3" "$tmp/fk_z3.log" || grep -q "FAKEGPU MISUSE" "$tmp/fk_none.log" "$tmp/fk_z3.log"; then
                    bad="${v:-fp32}: unsharded $a, ZeRO-3 $c: $(grep -h "FAKEGPU MISUSE" "$tmp/fk_z3.log" | head -n 1) $(tail -n 2 "$tmp/fk_z3.log" | tr '\n' ' ')"
                    break
                fi
            done
            if [ -z "$bad" ]; then pass "$name"; echo "  (fp32, and bf16 with prefetch off: the parameters and the sample the same)"
            else fail "$name" "$bad"; fi
        fi
    fi
fi   # zero3

if want bf16; then
# --- --bf16: the CUDA model's bf16 mode (the emulated build; the GPU trainer in tests/gpu/run.sh),
#     refused where it cannot run ---
if [[ "$BIN" == *emulated* || "$BIN" == */gpu/train_gpt ]]; then
    # A tiny run, N ranks, 20 steps, fp32 and --bf16 from the same seed: each logged loss within
    # 2 n_f u = 0.09 nats of the fp32 run's — one forward's bound of test_gpt_gpu part 4 (L = 2:
    # n_f = 23 roundings to the logits, u = 2^-9) at a logit scale of 1, which the tiny model's
    # logits stay below in 20 steps at lr 3e-3 — and the bf16 run's parameters not the fp32's.
    name="gpt_bf16_loss_curve_within_0.09_of_fp32_${N}ranks"
    train --steps 20 --log-every 4 >"$tmp/fp32.log" 2>&1; rc_a=$?
    train --steps 20 --log-every 4 --bf16 >"$tmp/bf16.log" 2>&1; rc_b=$?
    losses_of() { grep -oE "step +[0-9]+/20 \| loss [0-9.]+" "$1" | sed -E 's/.*loss //'; }
    worst=$(paste <(losses_of "$tmp/fp32.log") <(losses_of "$tmp/bf16.log") | awk 'NF == 2 { d = $1 - $2; if (d < 0) d = -d; if (d > w) w = d; n++ } END { if (n == 6) printf "%.6f", w; else print "missing" }')
    if [ $rc_a -eq 0 ] && [ $rc_b -eq 0 ] && [ "$worst" != missing ] && awk -v w="$worst" 'BEGIN { exit !(w <= 0.09) }' &&
       grep -q ", bf16" "$tmp/bf16.log" && [ "$(hash_of "$tmp/fp32.log")" != "$(hash_of "$tmp/bf16.log")" ]; then
        pass "$name"; echo "  (6 logged steps: worst |loss bf16 - loss fp32| = $worst nats)"
    else
        fail "$name" "rc $rc_a / $rc_b, worst $worst: $(tail -n 2 "$tmp/bf16.log")"
    fi
    # Resume: the checkpoint holds the fp32 master weights and AdamW's state; the bf16 working
    # copies are rounded from the master when it is loaded, so stopping changes nothing.
    name="gpt_bf16_resume_bitwise_${N}ranks"
    train --steps 8 --bf16 >"$tmp/bf16_full.log" 2>&1
    train --steps 8 --bf16 --stop-at 4 --save "$tmp/bf16.ck" >/dev/null 2>&1
    train --steps 8 --bf16 --resume "$tmp/bf16.ck" >"$tmp/bf16_resumed.log" 2>&1
    a=$(hash_of "$tmp/bf16_full.log"); c=$(hash_of "$tmp/bf16_resumed.log")
    if [ -n "$a" ] && [ "$a" = "$c" ] && grep -q "resumed from" "$tmp/bf16_resumed.log"; then pass "$name"; echo "  (params fnv1a $a, both)"
    else fail "$name" "uninterrupted $a, resumed $c: $(tail -n 2 "$tmp/bf16_resumed.log")"; fi
    out=$("$BIN" --bf16 --cpu "${TINY[@]}" 2>&1); rc=$?
    if [ $rc -eq 2 ] && grep -q -- "--bf16 is the CUDA model's mode and --cpu runs gpt.h's fp32 CPU model" <<<"$out"; then pass gpt_bf16_with_cpu_refused
    else fail gpt_bf16_with_cpu_refused "rc $rc: $out"; fi
    out=$("$BIN" --bf16 --tf32 "${TINY[@]}" 2>&1); rc=$?
    if [ $rc -eq 2 ] && grep -q -- "--bf16 and --tf32 are two precisions" <<<"$out"; then pass gpt_bf16_with_tf32_refused
    else fail gpt_bf16_with_tf32_refused "rc $rc: $out"; fi
elif [ -z "${TRAIN_GPT:-}" ]; then
    out=$("$BIN" --bf16 "${TINY[@]}" 2>&1); rc=$?
    if [ $rc -eq 2 ] && grep -q -- "--bf16 needs the CUDA model: this build has none" <<<"$out"; then pass gpt_bf16_refused_without_cuda_model
    else fail gpt_bf16_refused_without_cuda_model "rc $rc: $out"; fi
fi
fi   # bf16

if want outer; then
# --- the outer sync's flags (--outer ...: ddp_desc.outer): one group averaging its parameters is
#     DDP bit for bit; two groups of one rank sync at the steps the schedule names and train
#     something else than DDP; streaming's fragments are sent and merged at their staggered steps;
#     bad values are refused by name (every backend: NCCL has replica groups too). ---
train --steps 6 >"$tmp/outer_ddp.log" 2>&1
train --steps 6 --outer average --inner-steps 2 >"$tmp/outer_avg.log" 2>&1; rc=$?
if true; then
    name="gpt_outer_average_one_group_is_ddp_${N}ranks"
    a=$(hash_of "$tmp/outer_ddp.log"); c=$(hash_of "$tmp/outer_avg.log")
    syncs=$(grep -c "outer step .*merged fragment 0/1" "$tmp/outer_avg.log")
    if [ $rc -eq 0 ] && [ -n "$a" ] && [ "$a" = "$c" ] && [ "$syncs" -eq 3 ] && grep -q "outer: average | 1 group(s) of $N rank(s)" "$tmp/outer_avg.log"; then
        pass "$name"; echo "  (6 steps, a sync every 2: 3 sync lines; params fnv1a $a, both)"
    else fail "$name" "rc $rc, DDP $a, --outer average $c, $syncs sync lines: $(tail -n 2 "$tmp/outer_avg.log")"; fi
    if [ "$N" -ge 2 ]; then
        name="gpt_outer_diloco_groups_of_one_sync_every_h_${N}ranks"
        train --steps 6 --outer diloco --inner-steps 3 --group-size 1 --outer-wire int8 >"$tmp/outer_dl.log" 2>&1; rc=$?
        d=$(hash_of "$tmp/outer_dl.log")
        steps=$(sed -n 's/.*outer step *\([0-9]*\) | sent fragment 0\/1 | merged fragment 0\/1 | exchange [0-9.]* ms | .*syncs \([0-9]*\) | .*/\1:\2/p' "$tmp/outer_dl.log" | tr '\n' ' ')
        if [ $rc -eq 0 ] && [ "$steps" = "3:1 6:2 " ] && [ -n "$d" ] && [ "$d" != "$a" ] &&
            grep -q "outer: diloco | $N group(s) of 1 rank(s) | every 3 inner steps | outer lr 0.7 momentum 0.9 .* | wire int8 (blocks of 64)" "$tmp/outer_dl.log"; then
            pass "$name"; echo "  (syncs at steps $steps(step:syncs); params fnv1a $d, DDP's $a)"
        else fail "$name" "rc $rc, sync lines '$steps' (want '3:1 6:2 '), params $d (DDP $a): $(tail -n 2 "$tmp/outer_dl.log")"; fi
        name="gpt_outer_streaming_fragments_staggered_${N}ranks"
        train --steps 8 --outer streaming --inner-steps 4 --fragments 2 --outer-delay 1 --outer-mix 0.25 --group-size 1 \
            --outer-lr 1 --outer-momentum 0 >"$tmp/outer_st.log" 2>&1; rc=$?
        got=$(sed -n 's/.*outer step *\([0-9]*\) | \(sent\|merged\) fragment \([0-9]\)\/2 .*/\1\2\3/p' "$tmp/outer_st.log" | tr '\n' ' ')
        if [ $rc -eq 0 ] && [ "$got" = "2sent1 3merged1 4sent0 5merged0 6sent1 7merged1 8sent0 " ] &&
            grep -q "outer lr 1 momentum 0 .*| 2 fragment(s), one every 2 steps, delay 1, mix 0.25" "$tmp/outer_st.log"; then
            pass "$name"; echo "  (H 4, F 2, delay 1: $got)"
        else fail "$name" "rc $rc, lines '$got': $(tail -n 2 "$tmp/outer_st.log")"; fi
    fi
    if [ "$N" -ge 2 ]; then
        # resume: ddp_save holds the outer state (the outer copy, momentum, the schedule, a fragment
        # in flight), so stopping between syncs, or with a fragment in flight, changes nothing
        name="gpt_outer_resume_bitwise_${N}ranks"
        why=""
        for mode in "diloco --inner-steps 3" "streaming --inner-steps 4 --fragments 2 --outer-delay 1 --outer-wire int8"; do
            # shellcheck disable=SC2086
            train --steps 8 --outer $mode --group-size 1 >"$tmp/outer_straight.log" 2>&1
            rm -f "$tmp/outer.ckpt"
            # shellcheck disable=SC2086
            train --steps 8 --stop-at 4 --save "$tmp/outer.ckpt" --outer $mode --group-size 1 >"$tmp/outer_first.log" 2>&1; rc1=$?
            # shellcheck disable=SC2086
            train --steps 8 --save "$tmp/outer.ckpt" --outer $mode --group-size 1 >"$tmp/outer_rest.log" 2>&1; rc2=$?
            a=$(hash_of "$tmp/outer_straight.log"); c=$(hash_of "$tmp/outer_rest.log")
            if [ $rc1 -ne 0 ] || [ $rc2 -ne 0 ] || [ -z "$a" ] || [ "$a" != "$c" ] || ! grep -q "resumed from .* at step 4" "$tmp/outer_rest.log"; then
                why="$why [--outer $mode: rc $rc1/$rc2, straight $a, 4 + resume + 4 $c: $(tail -n 2 "$tmp/outer_rest.log" | tr '\n' ' ')]"
            fi
        done
        if [ -z "$why" ]; then pass "$name"; echo "  (diloco H 3 stopped between syncs, streaming with fragment 0 in flight at step 4: the same bits)"
        else fail "$name" "$why"; fi
    fi
    name=gpt_outer_bad_flags_refused
    bad=""
    while IFS='|' read -r flags words; do
        # shellcheck disable=SC2086
        out=$("$BIN" "${TINY[@]}" $flags 2>&1); rc=$?
        [ $rc -eq 2 ] && grep -qF -- "$words" <<<"$out" || bad="$bad [$flags: rc $rc, '$out']"
    done <<'EOF_BAD'
--outer diloco|--outer diloco needs --inner-steps H >= 1
--outer diloco --inner-steps 0|not 0
--outer sometimes --inner-steps 4|--outer: 'sometimes' is not one of off, average, diloco, streaming
--inner-steps 4|--inner-steps is a setting of the outer sync
--outer average --inner-steps 4 --outer-lr 0.5|--outer average is outer lr 1 and momentum 0
--outer diloco --inner-steps 4 --fragments 2|--fragments is streaming DiLoCo's
--outer streaming --inner-steps 4 --fragments 8|--fragments 8 is more than --inner-steps 4
--outer streaming --inner-steps 8 --fragments 2 --outer-delay 4|--outer-delay 4 must be less than --inner-steps / --fragments = 4
--outer diloco --inner-steps 4 --outer-wire fp8|--outer-wire: 'fp8' is not one of fp32, bf16, int8
--outer diloco --inner-steps 4 --outer-momentum 1|--outer-momentum must be in [0, 1)
--outer streaming --inner-steps 4 --outer-mix 1|--outer-mix must be in [0, 1)
--outer diloco --inner-steps 4 --quant-block 16|--quant-block goes with --outer-wire int8
EOF_BAD
    # a group size that does not divide the ranks: ddp.h's own refusal, by name, on every rank
    out=$(train --steps 2 --outer diloco --inner-steps 2 --group-size 3 2>&1); rc=$?
    [ "$N" -eq 3 ] || { [ $rc -ne 0 ] && grep -q "group_size 3 does not divide the $N ranks" <<<"$out"; } || bad="$bad [--group-size 3: rc $rc, '$(tail -n 2 <<<"$out")']"
    if [ -z "$bad" ]; then pass "$name"; else fail "$name" "$bad"; fi
fi
fi   # outer

if want nvcc_cpu; then
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
fi   # nvcc_cpu

echo "test_gpt.sh: $fails failure(s)" >&2
[ "$fails" -eq 0 ]
