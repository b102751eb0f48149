#!/usr/bin/env bash
# test_gpu_check.sh — the GPU machine's calls (bench/gpu/check_tests.sh, check_bench.sh,
# check_shakespeare.sh, and the one-call window bench/gpu/check_bf16.sh, also on a stand-in GPU)
# dry-run here, so that they are known to work up to the first CUDA call before a GPU machine's
# time is spent on them: with the binaries as built (--no-build, no nvcc run), every GPU step
# must say SKIP and the call exit 0; the files under $OUT must be what the device tool brings
# back (at most 8, plain names, no deeper than $OUT/a/b/file). Also: a target that does not build is
# named and the rest still runs; a budget that has run out starts nothing; a step that hangs is
# cut at its limit, with what was running named, and nothing of it left behind.
# Usage: tests/test_gpu_check.sh [BUILD_DIR]
set -u
B=${1:-build}
cd "$(dirname "$0")/.." || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; fails=$((fails + 1)); }
# The calls run make and nvcc of their own: not as a part of the make that runs this test.
unset MAKEFLAGS MFLAGS MAKELEVEL

out_ok() {   # OUT dir: what the device tool brings back, all of it
    local n bad
    n=$(find "$1" -type f | wc -l)
    bad=$(find "$1" -mindepth 1 | sed "s|^$1/||" | grep -vE '^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+){0,2}$')
    [ "$n" -ge 1 ] && [ "$n" -le 8 ] && [ -z "$bad" ] && [ -z "$(find "$1" -mindepth 3 -type d)" ]
}

gpus=0
[ -x "$B/gpu/gpu_count" ] && gpus=$(timeout 60 "$B/gpu/gpu_count" 2>/dev/null)
case "$gpus" in '' | *[!0-9]*) gpus=0 ;; esac
if [ "$gpus" -gt 0 ]; then
    echo "SKIP gpu_check_dry_run: a GPU is here; run bench/gpu/check_tests.sh itself"
else
    for call in tests bench; do
        name=gpu_check_${call}_dry_run_every_step_skips
        t0=$(date +%s)
        OUT=$tmp/out$call timeout 240 bench/gpu/check_$call.sh --no-build "$B" >"$tmp/log$call" 2>&1
        rc=$?
        sum=$tmp/out$call/$call-summary.txt
        steps=$(grep -cvE '^#' "$sum" 2>/dev/null)
        notok=$(grep -vE '^(#|ok |SKIP )' "$sum" 2>/dev/null)
        if [ $rc -eq 0 ] && [ "${steps:-0}" -ge 2 ] && [ -z "$notok" ] && grep -q "^# check_$call: .* 0 not ok" "$sum" &&
           ! grep -q "^FAIL" "$tmp/log$call" && out_ok "$tmp/out$call"; then
            pass "$name"
            echo "  ($steps steps in $(($(date +%s) - t0)) s: $(grep -cE '^SKIP ' "$sum") SKIP, $(grep -cE '^ok ' "$sum") ok; files: $(cd "$tmp/out$call" && ls | tr '\n' ' '))"
        else
            fail "$name" "exit $rc; not ok: $(tr '\n' ' ' <<<"$notok") $(tail -n 4 "$tmp/log$call" | tr '\n' ' ')"
        fi
    done
    # check_tests.sh writes the environment before anything can fail
    if grep -q "^-- nvcc" "$tmp/outtests/tests-env.txt" 2>/dev/null && grep -q "^-- nccl: " "$tmp/outtests/tests-env.txt" &&
       grep -q "^-- cublas: " "$tmp/outtests/tests-env.txt"; then pass gpu_check_tests_records_the_environment
    else fail gpu_check_tests_records_the_environment "tests-env.txt lacks nvcc, NCCL or cuBLAS lines"; fi
fi

# A target that does not build: named, the call goes on to its steps, and fails.
if [ -n "$(tools/gpu_paths.sh nvcc)" ]; then
    OUT=$tmp/nobuild CHECK_TARGETS="$B/gpu/no_such_target" timeout 240 bench/gpu/check_bench.sh "$B" >"$tmp/nobuild.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ] && grep -q "^FAIL build: did not build: $B/gpu/no_such_target" "$tmp/nobuild.log" &&
       grep -q "No rule to make target" "$tmp/nobuild/bench-build.log" && grep -qE "^(SKIP|PASS|FAIL|==) bench_gpu" "$tmp/nobuild.log"; then
        pass gpu_check_names_what_did_not_build_and_goes_on
    else
        fail gpu_check_names_what_did_not_build_and_goes_on "exit $rc: $(grep -m2 -E "build|FAIL" "$tmp/nobuild.log" | tr '\n' ' ')"
    fi
else
    echo "SKIP gpu_check_names_what_did_not_build_and_goes_on: no nvcc"
fi

# Each call's default build list reaches make as separate targets (check_bench.sh, then named
# check_2.sh, once passed its list as one quoted word: "No rule to make target 'a b c'", and
# nothing was built). A stand-in make on PATH records its arguments; the real nvcc probe runs
# first, so this needs nvcc.
if [ -n "$(tools/gpu_paths.sh nvcc 2>/dev/null)" ]; then
    mkdir -p "$tmp/fakemake"
    printf '#!/bin/sh\nfor a in "$@"; do echo "arg: $a"; done\nexit 0\n' >"$tmp/fakemake/make"
    chmod +x "$tmp/fakemake/make"
    why=""
    for c in tests bench shakespeare; do
        PATH="$tmp/fakemake:$PATH" OUT="$tmp/targets$c" CHECK_BUDGET_S=100 timeout 200 bench/gpu/check_$c.sh "$B" >"$tmp/targets$c.log" 2>&1
        n=$(grep -c "^arg: $B/" "$tmp/targets$c/$c-build.log" 2>/dev/null)
        if [ "${n:-0}" -lt 3 ] || grep -q "^arg: .* " "$tmp/targets$c/$c-build.log"; then
            why="$why check_$c: ${n:-0} target argument(s): $(grep "^arg:" "$tmp/targets$c/$c-build.log" 2>/dev/null | head -n 3 | tr '\n' ' ');"
        fi
    done
    if [ -z "$why" ]; then pass gpu_check_build_lists_reach_make_as_separate_targets
    else fail gpu_check_build_lists_reach_make_as_separate_targets "$why"; fi
else
    echo "SKIP gpu_check_build_lists_reach_make_as_separate_targets: no nvcc"
fi

# No budget left: no step starts, each says so, the call fails (its results are not complete).
OUT=$tmp/late CHECK_BUDGET_S=0 timeout 120 bench/gpu/check_bench.sh --no-build "$B" >"$tmp/late.log" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ "$(grep -c "out of time" "$tmp/late.log")" -eq 2 ] && grep -q "^OUT_OF_TIME bench_gpu" "$tmp/late/bench-summary.txt"; then
    pass gpu_check_budget_spent_starts_nothing
else
    fail gpu_check_budget_spent_starts_nothing "exit $rc: $(tail -n 3 "$tmp/late.log" | tr '\n' ' ')"
fi

# The optional third call (nanoGPT's shakespeare_char target): without a GPU each run says SKIP.
OUT=$tmp/c3 timeout 120 bench/gpu/check_shakespeare.sh --no-build "$B" >"$tmp/c3.log" 2>&1
rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c "^SKIP shakespeare_char_[12]rank 0" "$tmp/c3/shakespeare-summary.txt")" -eq 2 ]; then
    pass gpu_check_shakespeare_dry_run_skips_both_runs
else
    fail gpu_check_shakespeare_dry_run_skips_both_runs "exit $rc: $(tail -n 3 "$tmp/c3.log" | tr '\n' ' ')"
fi

# The one-call window (bench/gpu/check_bf16.sh) without a GPU: every GPU step SKIPs, the call
# passes, its files are what the device tool brings back.
OUT=$tmp/cb timeout 120 bench/gpu/check_bf16.sh --no-build "$B" >"$tmp/cb.log" 2>&1
rc=$?
n=$(grep -cE "^SKIP (smoke_bf16_gpt2|sanitizer_bf16|bench_bf16_tf32|gpt_model_bf16|gpu_kernels|gpt_model_rest|two_ranks_bf16_resume|two_ranks_bf16_exposed_comm|zero_2ranks|op_times_bf16_kernels1|op_times_bf16_kernels2|op_times_bf16_kernels2_fused_attention|op_times_tf32_kernels1|bench_bf16_kernels2|bench_fp32|bench_bf16_torch_compile) " "$tmp/cb/bf16-summary.txt" 2>/dev/null)
if [ $rc -eq 0 ] && [ "${n:-0}" -eq 16 ] && grep -q "^# check_bf16: 0 step(s) ok, 0 not ok" "$tmp/cb/bf16-summary.txt" && out_ok "$tmp/cb"; then
    pass gpu_check_bf16_dry_run_every_step_skips
else
    fail gpu_check_bf16_dry_run_every_step_skips "exit $rc, $n of 16 steps SKIP: $(tail -n 3 "$tmp/cb.log" | tr '\n' ' ')"
fi

# The same call on a stand-in GPU: gpu_count says 1, nvidia-smi names a GPU, the trainer is the
# CUDA model emulated on the host (build/train_gpt_emulated) at a tiny shape, PyTorch and
# compute-sanitizer are stand-ins. What runs is the call's own logic — the steps' verdicts, the
# benchmark's rows and RESULT lines, the 2-rank bf16 resume, the ZeRO levels, the op times — all but CUDA.
if [ -x "$B/train_gpt_emulated" ] && [ -x "$B/ddprun" ]; then
    fb=$tmp/fake_build
    mkdir -p "$fb/gpu" "$tmp/fakebin"
    ln -s "$PWD/$B/ddprun" "$fb/ddprun"
    ln -s "$PWD/$B/train_gpt_emulated" "$fb/gpu/train_gpt"
    printf '#!/bin/sh\necho 1\n' >"$fb/gpu/gpu_count"
    printf '#!/bin/sh\necho 22803\n' >"$fb/gpu/nccl_version"
    for t in test_gpt_gpu test_gpu_kernels; do printf '#!/bin/sh\necho "PASS stand_in_%s $*"\n' $t >"$fb/gpu/$t"; done
    # (the compute processes: one stand-in pid and its MiB, as zero_2ranks.sh samples them)
    printf '#!/bin/sh\ncase "$1" in --query-compute-apps=*) echo "4242, 1234" ;; --query-gpu=memory.used) echo 2500 ;;\n*) echo "Stand-in GPU, 580.00, 81559 MiB" ;; esac\n' >"$tmp/fakebin/nvidia-smi"
    printf '#!/bin/sh\n[ "$1" = -c ] && { echo 2.11.0-stand-in; exit 0; }\necho "torch tokens/s 100 (1 rank(s), median of 6 steps, 320.0 ms, loss 5.000, cuda:0)"\n' >"$tmp/fakebin/python"
    printf '#!/bin/sh\nshift 6\n"$@"; rc=$?\necho "========= ERROR SUMMARY: 0 errors"\nexit $rc\n' >"$tmp/fakebin/compute-sanitizer"
    chmod +x "$fb/gpu/"* "$tmp/fakebin/"*
    tiny="--layers 1 --heads 2 --dim 32 --seq 16 --batch 2"
    PATH="$tmp/fakebin:$PATH" PY="$tmp/fakebin/python" SANITIZER="$tmp/fakebin/compute-sanitizer" CHECK_GPT2="$tiny" \
        CHECK_2RANKS_SHAPE="$tiny" CHECK_2RANKS_GROUPS=bf16 LAYERS=1 HEADS=2 DIM=32 SEQ=16 BATCH=2 STEPS=8 SKIP=2 DATA=ddp.h \
        OUT=$tmp/cf timeout 300 bench/gpu/check_bf16.sh "$fb" >"$tmp/cf.log" 2>&1
    rc=$?
    sum=$tmp/cf/bf16-summary.txt
    why=""
    [ $rc -eq 0 ] || why="exit $rc"
    ok=$(grep -c "^ok " "$sum" 2>/dev/null)
    [ "${ok:-0}" -eq 16 ] || why="$why; $ok of 16 steps ok: $(grep -vE '^(#|ok )' "$sum" | tr '\n' ' ')"
    for want in "PASS smoke_bf16_gpt2_trains" "PASS sanitizer_memcheck_bf16_odd_shapes" "PASS gpt_gpu_bf16_resume_bitwise_2ranks" \
                "^op times \\(GPT_OP_TIMES=1" "PASS zero_2ranks_fp32_parameters_prefetch_off_equals_none" "PASS zero_2ranks_bf16_gradients_equals_none" "RESULT gpu=\"Stand-in GPU, 580.00, 81559 MiB\" gpt2small_bf16 ours_tokens_per_s=[0-9]+ torch_tokens_per_s=100 ratio="; do
        grep -qE -- "$want" "$tmp/cf"/bf16-*.log || why="$why; no '$want'"
    done
    for p in bf16 tf32 fp32 bf16_kernels2; do grep -q "^# RESULT .*gpt2small_$p " "$sum" || why="$why; no $p RESULT in the summary"; done
    grep -q "GPT_KERNELS=2" "$tmp/cf/bf16-6-more.log" || why="$why; the GPT_KERNELS=2 runs do not say so" 
    grep -q "GPT_ATTENTION=fused" "$tmp/cf/bf16-6-more.log" || why="$why; the GPT_ATTENTION=fused run does not say so"
    grep -q "compile_tokens_per_s=100 " "$sum" || why="$why; no torch.compile RESULT"
    # the ZeRO table in the summary: five fp32 levels, each with the stand-in pid's MiB
    [ "$(grep -cE "^# ZERO fp32 [a-z,-]+ +\| [0-9.]+ +\| [0-9a-f]{16} \| +[0-9.]+ \| +[0-9.]+x \| 1234 \(1 pid\(s\)\); GPU used 2500, \+0 over idle" "$sum")" -eq 5 ] ||
        why="$why; the summary lacks the five fp32 ZERO lines: $(grep -m2 "^# ZERO" "$sum" | tr '\n' ' ')"
    out_ok "$tmp/cf" || why="$why; files: $(cd "$tmp/cf" && ls | tr '\n' ' ')"
    if [ -z "$why" ]; then pass gpu_check_bf16_on_a_stand_in_gpu_runs_every_step
        echo "  ($ok steps ok in $(grep -o '[0-9]* s; logs' "$sum" | cut -d' ' -f1) s; $(grep -c '^# RESULT' "$sum") RESULT lines)"
    else fail gpu_check_bf16_on_a_stand_in_gpu_runs_every_step "${why#; }"; fi
else
    echo "SKIP gpu_check_bf16_on_a_stand_in_gpu_runs_every_step: $B/train_gpt_emulated not built"
fi

# A hang: cut at its limit, what was running named, its whole process group gone.
marker="gpu_check_hang_$$"
t0=$(date +%s)
hang=$(bash -c '. tests/gpu/steps.sh; gpu_step hang 2 "" bash -c "echo started; exec -a $1 sleep 60 & sleep 61; echo never"' _ "$marker" 2>&1)
secs=$(($(date +%s) - t0))
sleep 0.5
if grep -q "^FAIL hang: timed out after 2 s; was running: bash -c" <<<"$hang" && grep -q "running: .*$marker" <<<"$hang" &&
   grep -qx "started" <<<"$hang" && ! grep -qx never <<<"$hang" && [ $secs -lt 20 ] && ! pgrep -f "$marker" >/dev/null; then
    pass gpu_step_cuts_a_hang_and_names_what_ran
    echo "  (cut after $secs s; $(grep -c "running:" <<<"$hang") process(es) named)"
else
    fail gpu_step_cuts_a_hang_and_names_what_ran "$secs s: $(tr '\n' ' ' <<<"$hang")"
fi

[ "$fails" -eq 0 ]
