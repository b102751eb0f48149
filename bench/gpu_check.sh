#!/usr/bin/env bash
# bench/gpu_check.sh — both GPU checks in a row, for a GPU machine of your own:
# bench/gpu/check_tests.sh (environment, build, GPU tests), then bench/gpu/check_bench.sh (benchmarks),
# logs in $OUT (default build/gpu-check). On the device tool run them as two calls instead
# (each well inside its 10 minutes); the commands are in bench/gpu/check_tests.sh's header.
# Usage: bench/gpu_check.sh [--no-build] [BUILD_DIR]
set -u
cd "$(dirname "$0")/.." || exit 1
bench/gpu/check_tests.sh "$@"
first=$?
bench/gpu/check_bench.sh "$@"
second=$?
[ $first -eq 0 ] && [ $second -eq 0 ]
