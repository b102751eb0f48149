#!/usr/bin/env bash
# compare_builds.sh — two builds of ddp.h side by side in one run, interleaved: the tiny GPT's
# training step on 1 and 2 ranks (the same trainer source compiled against each header) and
# the 2-rank allreduce of user buffers. For a change to the library that must not slow a step
# (the backend table of issue 11 against the header before it, say).
#
#   bench/compare_builds.sh OLD_REF [BUILD_DIR]
#
# OLD_REF is a git revision: its ddp.h, trainer (examples/gpt/train_gpt.c, gpt.h) and
# bench_allreduce.c are built into $tmp with the same compiler flags as BUILD_DIR's (default
# build). The trainer's step loop is the same code on both sides unless the revisions changed
# it (read `git diff OLD_REF -- examples/gpt` before reading the GPT rows as the library's).
# Both sides run under this checkout's ddprun. Each round runs old and new back to back, in
# alternating order; the table shows the medians and new/old. env: REPS (5), STEPS (110, first
# 10 untimed), DATA.
set -u
OLD=${1:?usage: bench/compare_builds.sh OLD_REF [BUILD_DIR]}
B=${2:-build}
cd "$(dirname "$0")/.." || exit 1
DATA=${DATA:-../shared/data/tinyshakespeare.txt}
[ -f "$DATA" ] || DATA=$B/fortunes.txt
[ -f "$DATA" ] || { echo "compare_builds: no data (set DATA=FILE)"; exit 1; }
REPS=${REPS:-5}
STEPS=${STEPS:-110}
SKIP=10
CFG=(--layers 4 --heads 4 --dim 128 --seq 64 --batch 4)
# The revision before 2026-11-23 forced one OpenBLAS thread; both sides get one.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The old revision's files, laid out as in the repository (they include "../ddp.h").
mkdir -p "$tmp/src/examples/gpt" "$tmp/src/bench" "$tmp/src/build"
for f in ddp.h examples/gpt/train_gpt.c examples/gpt/gpt.h bench/bench_allreduce.c; do
    git show "$OLD:$f" >"$tmp/src/$f" || { echo "compare_builds: no $f at $OLD"; exit 1; }
done
# bench_allreduce.c's size parser, where the revision has it (since bb5fd5c)
git show "$OLD:bench/bench_sizes.h" >"$tmp/src/bench/bench_sizes.h" 2>/dev/null || rm -f "$tmp/src/bench/bench_sizes.h"
OPT="-O3 -march=native -fno-math-errno -g"
# OpenBLAS as the Makefile finds it (the trainer's matmuls), else the portable ones, on both sides
if printf '#include <cblas.h>\nint main(void) { return 0; }\n' | cc -x c - -o /dev/null -lopenblas >/dev/null 2>&1; then
    defs=""; libs="-lopenblas"; else defs="-DGPT_NO_BLAS"; libs=""; fi
make -s NVCC= "$B/ddprun" "$B/train_gpt" "$B/bench_allreduce" || exit 1
( cd "$tmp/src" &&
  cc -std=c99 $OPT -Wall -Wextra $defs -o build/train_gpt examples/gpt/train_gpt.c $libs -lpthread -lm &&
  cc -std=c99 $OPT -Wall -Wextra -o build/bench_allreduce bench/bench_allreduce.c -lpthread -lm ) 2>"$tmp/build.log" ||
  { echo "compare_builds: $OLD does not build:"; tail -n 20 "$tmp/build.log"; exit 1; }

median() { sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

gpt() {   # BIN N -> tokens/s (median of the progress lines after step SKIP)
    "$B/ddprun" -n "$2" "$1" --data "$DATA" "${CFG[@]}" --steps "$STEPS" --warmup 10 --eval-every 0 --eval-batches 1 \
        --sample 0 --log-every 10 >"$tmp/gpt.log" 2>&1 || { echo 0; return; }
    sed -E 's/^\[rank [0-9]+\] //' "$tmp/gpt.log" | awk -F'|' -v skip=$SKIP '
        /^step +[0-9]+\/[0-9]+ \| loss/ { split($1, s, /[ \/]+/); if (s[2] > skip) print $5 + 0 }' |
        median | awk -v tok=$(($2 * 4 * 64)) '{ printf "%.0f\n", ($1 > 0) ? tok / ($1 / 1000) : 0 }'
}

allreduce() {   # BIN SIZE -> microseconds per 2-rank allreduce
    "$B/ddprun" -n 2 "$1" --sizes "$2" --target-s 0.3 2>/dev/null | sed -n 's/.*time_us=\([0-9.]*\).*/\1/p' | head -n 1
}

echo "compare_builds: old = ddp.h at $OLD, new = $B; $REPS interleaved rounds; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(getconf _NPROCESSORS_ONLN) CPUs"
for r in $(seq 1 "$REPS"); do
    for which in $([ $((r % 2)) -eq 1 ] && echo "old new" || echo "new old"); do
        if [ "$which" = old ]; then bin=$tmp/src/build; else bin=$B; fi
        echo "$(gpt "$bin/train_gpt" 1)" >>"$tmp/$which.g1"
        echo "$(gpt "$bin/train_gpt" 2)" >>"$tmp/$which.g2"
        echo "$(allreduce "$bin/bench_allreduce" 1M)" >>"$tmp/$which.a1"
        echo "$(allreduce "$bin/bench_allreduce" 25M)" >>"$tmp/$which.a25"
    done
    echo "  round $r: GPT 2 ranks old $(tail -n 1 "$tmp/old.g2") new $(tail -n 1 "$tmp/new.g2") tokens/s"
done
row() {   # label unit file-suffix higher-is-better
    local o n
    o=$(median <"$tmp/old.$3") n=$(median <"$tmp/new.$3")
    awk -v l="$1" -v u="$2" -v o="$o" -v n="$n" -v hib="$4" 'BEGIN {
        r = (o > 0) ? n / o : 0
        printf "| %s | %s %s | %s %s | %.3f (%s) |\n", l, o, u, n, u, r, hib ? "higher is faster" : "lower is faster" }'
}
echo
echo "| measure | old | new | new / old |"
echo "|---|---:|---:|---:|"
row "tiny GPT, 1 rank" "tokens/s" g1 1
row "tiny GPT, 2 ranks" "tokens/s" g2 1
row "allreduce 1 MiB, 2 ranks" "us" a1 0
row "allreduce 25 MiB, 2 ranks" "us" a25 0
