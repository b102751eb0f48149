#!/bin/sh
# Sharded parameters' checkpoints across world sizes and levels: saved at PARAMETERS on 2 ranks,
# loaded at NONE on 1; saved at NONE on 1, loaded at PARAMETERS on 3. The loaded parameters are
# the saved ones, bit for bit (their hash). Usage: tests/test_zero3_ckpt.sh BUILD_DIR
B=${1:-build}
dir=$(mktemp -d /tmp/test_zero3_ckpt.XXXXXX) || exit 1
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/a" "$dir/b"
"$B/ddprun" -n 2 "$B/test_zero3" save "$dir/a" parameters || exit 1
"$B/ddprun" -n 1 "$B/test_zero3" load "$dir/a" none || exit 1
"$B/ddprun" -n 1 "$B/test_zero3" save "$dir/b" none || exit 1
"$B/ddprun" -n 3 "$B/test_zero3" load "$dir/b" parameters || exit 1
