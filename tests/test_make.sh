#!/usr/bin/env bash
# test_make.sh — what the two commands build. `make run` on a machine with nvcc but no GPU builds
# only what it runs (ddprun and the CPU trainer), not the GPU targets; `make help` lists the
# targets a new user types; `make gpu-window` (the GPU window's carried build) is portable. Dry
# runs (make -n): nothing is built.
# Usage: tests/test_make.sh
set -u
cd "$(dirname "$0")/.." || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin"
printf '#!/bin/sh\nexit 1\n' >"$tmp/bin/nvidia-smi"   # "no GPU", whatever this machine has
chmod +x "$tmp/bin/nvidia-smi"
# train-2-ranks is what `make run` runs after installing its dependencies
PATH="$tmp/bin:$PATH" make -n B="$tmp/b" NVCC=/usr/local/cuda/bin/nvcc train-2-ranks >"$tmp/plan" 2>&1
if ! grep -q "$tmp/b/train_gpt" "$tmp/plan" || ! grep -q "$tmp/b/ddprun" "$tmp/plan"; then
    echo "FAIL make_run_builds_no_gpu_target_without_a_gpu: the plan does not build ddprun and the CPU trainer"
elif grep -qE -- "-o $tmp/b/gpu/[a-z_]+ " "$tmp/plan"; then
    echo "FAIL make_run_builds_no_gpu_target_without_a_gpu: $(grep -oE -- "-o $tmp/b/gpu/[a-z_]+" "$tmp/plan" | head -n 3 | tr '\n' ' ')"
else
    echo "PASS make_run_builds_no_gpu_target_without_a_gpu"
fi
make -s help >"$tmp/help" 2>&1
missing=""
for t in run test test-asan test-tsan bench fuzz mpi clean; do grep -qE "^make $t( |$)" "$tmp/help" || missing="$missing $t"; done
[ -z "$missing" ] && echo "PASS make_help_lists_the_targets" || echo "FAIL make_help_lists_the_targets: missing$missing"
# make gpu-window: the build a GPU window carries is portable (-march=x86-64-v3 for every host
# compile, never native), needs no OpenBLAS there, and builds the GPU trainer and tests
if [ -n "$(tools/gpu_paths.sh nvcc)" ]; then
    # (under make test-asan/-tsan the environment carries NVCC=, B= and OPT= from the command line
    #  of the sanitizer build, which a GPU window's build never has)
    env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u NVCC -u B -u OPT make -n -B gpu-window >"$tmp/window" 2>&1
    why=""
    grep -q -- "-o build-gpu/gpu/train_gpt " "$tmp/window" || why="no build-gpu/gpu/train_gpt"
    grep -q -- "-o build-gpu/gpu/test_gpt_gpu " "$tmp/window" || why="$why; no test_gpt_gpu"
    grep -q -- "-march=native" "$tmp/window" && why="$why; -march=native in: $(grep -m1 -o -- '-o [^ ]*' <<<"$(grep -- '-march=native' "$tmp/window")")"
    grep -q -- "-lopenblas" "$tmp/window" && why="$why; links OpenBLAS"
    [ "$(grep -c -- "-march=x86-64-v3" "$tmp/window")" -ge 3 ] || why="$why; fewer than 3 compiles with -march=x86-64-v3"
    [ -z "$why" ] && echo "PASS make_gpu_window_is_portable" || echo "FAIL make_gpu_window_is_portable: ${why#; }"
else
    echo "SKIP make_gpu_window_is_portable: no nvcc"
fi

# the fuzz targets include the header's internals (make fuzz builds them only after every test run
# of CI): each still compiles against today's ddp.h
bad=""
for f in fuzz/fuzz_*.c; do
    ${CC:-cc} -std=c99 -fsyntax-only -Wall -Wextra -Werror "$f" 2>"$tmp/fz.err" || bad="$bad $(basename "$f"): $(grep -m1 -o 'error: .*' "$tmp/fz.err")"
done
[ -z "$bad" ] && echo "PASS fuzz_targets_compile" || echo "FAIL fuzz_targets_compile:$bad"
