#!/usr/bin/env bash
# compare_allreduce.sh — ddp.h's allreduce against Open MPI and PyTorch/gloo, side by side.
#
#   bench/compare_allreduce.sh [--ranks "2 4"] [--sizes 64K,...,256M] [--repeat 2]
#                              [--malloc both|default|nommap] [--target-s 0.5] [--no-write]
#
# Every pass first measures the single-core copy bandwidth at each size (build/copy_bw), then, for
# each malloc setting, runs the three implementations under the same environment:
#   default  glibc's malloc as it comes (a buffer above its mmap threshold, which grows to at
#            most 32 MiB, is mmapped and page-faulted afresh after every free)
#   nommap   GLIBC_TUNABLES=glibc.malloc.mmap_threshold=2147483647:glibc.malloc.trim_threshold=
#            4294967295 for all three: freed memory is kept and reused
# For every rank count it runs, interleaved --repeat times:
#   ddp   build/ddprun -n N build/bench_allreduce          (both made first if missing or older
#                                                          than ddp.h; without ddprun the ranks
#                                                          are started by hand)
#   mpi   mpirun -n N build/mpi_allreduce                  (built here with mpicc; default
#                                                          Open MPI settings)
#   grads build/ddprun -n N build/bench_allreduce --grads  (gradient buckets in place)
#   gloo  /usr/bin/python3 bench/gloo_allreduce.py -n N    (torch.distributed, gloo, 1 thread)
# keeps, per implementation, setting and size, the fastest of the repeats (the same rule for all),
# and prints a table per rank count and setting: each busbw beside the shared-memory bound (the
# copy bandwidth over the bytes a rank must move; RESULTS.md says how), and replaces the section between <!-- allreduce:begin --> and
# <!-- allreduce:end --> of bench/RESULTS.md (unless --no-write).
# An implementation whose toolchain is missing is skipped with a line saying so.
# Rank counts above the number of CPUs oversubscribe the cores; their tables say so.
set -u

cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
RANKS="2 4"
SIZES="64K,256K,1M,4M,16M,25M,64M,256M"
REPEAT=2
MALLOC=both
TARGET_S=0.5
WRITE=1
RUN_LIMIT_S=${RUN_LIMIT_S:-240}     # one benchmark run longer than this is killed
CMDLINE="bench/compare_allreduce.sh${*:+ $*}"

while [ $# -gt 0 ]; do
    case $1 in
    --ranks) RANKS=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --target-s) TARGET_S=$2; shift 2 ;;
    --no-write) WRITE=0; shift ;;
    --malloc) MALLOC=$2; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "compare_allreduce.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done
case $REPEAT in ''|*[!0-9]*|0) echo "compare_allreduce.sh: --repeat must be a positive integer" >&2; exit 2 ;; esac
case $MALLOC in
both) SETTINGS="default nommap" ;;
default|nommap) SETTINGS=$MALLOC ;;
*) echo "compare_allreduce.sh: --malloc must be both, default or nommap (got '$MALLOC')" >&2; exit 2 ;;
esac
NOMMAP_TUNABLES="glibc.malloc.mmap_threshold=2147483647:glibc.malloc.trim_threshold=4294967295"

NCPU=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)   # (nproc obeys OMP_NUM_THREADS)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/compare_allreduce.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$BUILD"
NOTES="$TMP/notes"
: >"$NOTES"
note() { echo "$*"; echo "$*" >>"$NOTES"; }

# stale TARGET SOURCES...: true if TARGET is missing or older than any source.
stale() {
    local t=$1 s
    shift
    [ -e "$t" ] || return 0
    for s in "$@"; do [ "$s" -nt "$t" ] && return 0; done
    return 1
}

# ---------------------------------------------------------------- what can run
HAVE_DDP=0 HAVE_MPI=0 HAVE_GLOO=0 DDPRUN=""
if [ -f Makefile ] && command -v make >/dev/null 2>&1; then
    # The owner's rules (and flags) first; make rebuilds whatever is older than ddp.h.
    make -k --no-print-directory B="$BUILD" "$BUILD/bench_allreduce" "$BUILD/ddprun" "$BUILD/copy_bw" >"$TMP/make.log" 2>&1 ||
        { cat "$TMP/make.log"; note "warning: make $BUILD/bench_allreduce $BUILD/ddprun $BUILD/copy_bw failed"; }
fi
if stale "$BUILD/copy_bw" bench/copy_bw.c bench/bench_sizes.h && command -v cc >/dev/null 2>&1; then
    cc -std=c99 -O3 -march=native -Wall -Wextra -o "$BUILD/copy_bw" bench/copy_bw.c || rm -f "$BUILD/copy_bw"
fi
[ -x "$BUILD/copy_bw" ] || note "warning: $BUILD/copy_bw could not be built: no copy bandwidth, no bound columns"
if stale "$BUILD/bench_allreduce" ddp.h bench/bench_allreduce.c bench/bench_sizes.h && command -v cc >/dev/null 2>&1; then
    echo "building $BUILD/bench_allreduce"
    if ! cc -std=c99 -O3 -march=native -Wall -Wextra -o "$BUILD/bench_allreduce" bench/bench_allreduce.c -lpthread -lm; then
        rm -f "$BUILD/bench_allreduce"    # never measure a binary older than ddp.h
        note "skip ddp: building bench/bench_allreduce.c failed"
    fi
fi
if [ -x "$BUILD/bench_allreduce" ]; then
    HAVE_DDP=1
    if [ -x "$BUILD/ddprun" ]; then
        DDPRUN="$BUILD/ddprun"
    else
        note "note: $BUILD/ddprun not found; ddp ranks are started by this script (RANK/WORLD_SIZE/MASTER_PORT)"
    fi
elif ! grep -q '^skip ddp' "$NOTES"; then
    note "skip ddp: $BUILD/bench_allreduce is missing and cc is not available to build it"
fi

MPI_VERSION="not installed"
if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then
    MPI_VERSION=$(mpirun --version 2>/dev/null | head -n 1)
    if stale "$BUILD/mpi_allreduce" bench/mpi_allreduce.c bench/bench_sizes.h; then
        echo "building $BUILD/mpi_allreduce"
        mpicc -std=c99 -O3 -march=native -Wall -Wextra -o "$BUILD/mpi_allreduce" bench/mpi_allreduce.c || rm -f "$BUILD/mpi_allreduce"
    fi
    if [ -x "$BUILD/mpi_allreduce" ]; then HAVE_MPI=1; else note "skip mpi: building bench/mpi_allreduce.c failed"; fi
else
    note "skip mpi: mpicc/mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
fi

TORCH_VERSION="not installed"
if [ -x "$PYTHON" ] && v=$("$PYTHON" -c 'import torch, torch.distributed as d; assert d.is_available() and d.is_gloo_available(); print(torch.__version__)' 2>/dev/null); then
    TORCH_VERSION=$v
    HAVE_GLOO=1
else
    note "skip gloo: $PYTHON cannot import torch.distributed with gloo (apt-get install python3-torch)"
fi

# ---------------------------------------------------------------- launchers
# Each run_* writes the "allreduce impl=..." lines of one run to stdout.
MPI_FLAGS=""
[ "$(id -u)" = 0 ] && MPI_FLAGS="--allow-run-as-root"

free_port() { "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo $((20000 + RANDOM % 20000)); }

run_ddp() { # N [--grads]
    local n=$1 r pids="" rc=0 port
    shift
    if [ -n "$DDPRUN" ]; then
        timeout -k 5 "$RUN_LIMIT_S" "$DDPRUN" -n "$n" "$BUILD/bench_allreduce" --sizes "$SIZES" --target-s "$TARGET_S" "$@"
        return
    fi
    port=$(free_port)
    for ((r = 0; r < n; r++)); do
        RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            DDP_JOB_TOKEN="compare-$$-$port" timeout -k 5 "$RUN_LIMIT_S" \
            "$BUILD/bench_allreduce" --sizes "$SIZES" --target-s "$TARGET_S" "$@" &
        pids="$pids $!"
    done
    for r in $pids; do wait "$r" || rc=$?; done
    return $rc
}

run_grads() { run_ddp "$1" --grads; }   # gradient buckets, in place (impl=ddp-grads)

run_mpi() { # N
    local n=$1 extra=""
    [ "$n" -gt "$NCPU" ] && extra="--oversubscribe"
    # shellcheck disable=SC2086
    [ -n "${GLIBC_TUNABLES:-}" ] && extra="$extra -x GLIBC_TUNABLES"
    timeout -k 5 "$RUN_LIMIT_S" mpirun $MPI_FLAGS $extra -n "$n" "$BUILD/mpi_allreduce" --sizes "$SIZES" --target-s "$TARGET_S"
}

run_gloo() { # N
    timeout -k 5 "$RUN_LIMIT_S" "$PYTHON" bench/gloo_allreduce.py -n "$1" --sizes "$SIZES" --target-s "$TARGET_S"
}

# ---------------------------------------------------------------- measure
RAW="$TMP/raw"
: >"$RAW"
START=$(date +%s)
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)
COPY_PASSES=""
for ((rep = 1; rep <= REPEAT; rep++)); do
    if [ -x "$BUILD/copy_bw" ]; then
        echo "measuring the copy bandwidth, pass $rep/$REPEAT ..."
        timeout -k 5 "$RUN_LIMIT_S" "$BUILD/copy_bw" --sizes "$SIZES,100M" | tee -a "$RAW" >"$TMP/copy" && sed 's/^/  /' "$TMP/copy"
        COPY_PASSES="$COPY_PASSES $(awk 'END { for (i = 1; i <= NF; i++) if ($i ~ /^gbps=/) print substr($i, 6) }' "$TMP/copy")"   # the 100 MiB copy
    fi
    for n in $RANKS; do
        for setting in $SETTINGS; do
            for impl in ddp grads mpi gloo; do
                case $impl in
                ddp|grads) [ $HAVE_DDP = 1 ] || continue ;;
                mpi) [ $HAVE_MPI = 1 ] || continue ;;
                gloo) [ $HAVE_GLOO = 1 ] || continue ;;
                esac
                echo "running $impl, $n ranks, malloc $setting, pass $rep/$REPEAT ..."
                if [ "$setting" = nommap ]; then
                    GLIBC_TUNABLES=$NOMMAP_TUNABLES "run_$impl" "$n" >"$TMP/out" 2>"$TMP/err"
                else
                    "run_$impl" "$n" >"$TMP/out" 2>"$TMP/err"
                fi
                rc=$?
                sed -n "s/^.*\\(allreduce impl=\\)/\\1/p" "$TMP/out" | sed "s/\$/ malloc=$setting/" | tee -a "$RAW" | sed 's/^/  /'
                if [ $rc != 0 ]; then
                    note "warning: $impl with $n ranks, malloc $setting (pass $rep) exited with status $rc: $(tail -n 3 "$TMP/err" | tr '\n' ' ')"
                fi
            done
        done
    done
done
ELAPSED=$(($(date +%s) - START))

# ---------------------------------------------------------------- tables
# One markdown table for N ranks and one malloc setting from the raw lines: the fastest repeat
# per impl and size, the best copy bandwidth at that size, the bound it gives, the fractions.
# The bound (RESULTS.md derives it): each rank moves (5 - 2/N)/2 copies' worth of its buffer
# (stage in, reduce its part, copy the others' parts out); ranks beyond the CPUs share them.
table() { # N SETTING
    awk -v want="$1" -v setting="$2" -v ncpu="$NCPU" '
    function field(name,   i, kv) {
        for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == name) return kv[2] }
        return ""
    }
    function label(b) {
        if (b % 1048576 == 0) return (b / 1048576) " MiB"
        if (b % 1024 == 0) return (b / 1024) " KiB"
        return b " B"
    }
    function cell(x) { return x == "" ? "—" : x }
    function ratio(a, b) { return (a == "" || b == "" || b + 0 == 0) ? "—" : sprintf("%.2f", a / b) }
    $1 == "copy" { b = field("bytes") + 0; g = field("gbps") + 0; if (!(b in copy) || g > copy[b]) copy[b] = g }
    $1 == "allreduce" && field("ranks") == want && field("malloc") == setting {
        impl = field("impl"); b = field("bytes") + 0; t = field("time_us") + 0
        if (!(b in seen)) { seen[b] = 1; order[++nb] = b }
        k = impl SUBSEP b
        if (!(k in best) || t < best[k]) { best[k] = t; bw[k] = field("busbw") }
    }
    END {
        if (nb == 0) { print "(no results)"; exit }

        n = want + 0; c = n < ncpu ? n : ncpu; copies = (5 - 2 / n) / 2; gcopies = (3 - 1 / n) / 2
        print "| size | copy GB/s | bound busbw | ddp busbw | mpi busbw | gloo busbw | ddp/bound | mpi/bound | gloo/bound | ddp/mpi | grads bound | grads busbw | grads/bound | targets |"
        print "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---|"
        for (i = 1; i <= nb; i++) {
            b = order[i]
            d = ("ddp" SUBSEP b) in best ? bw["ddp" SUBSEP b] : ""
            m = ("mpi" SUBSEP b) in best ? bw["mpi" SUBSEP b] : ""
            g = ("gloo" SUBSEP b) in best ? bw["gloo" SUBSEP b] : ""
            cp = (b in copy) ? sprintf("%.1f", copy[b]) : ""
            # t_bound = copies * b * n / (c * copy bytes/s); busbw = b / t * 2(n-1)/n
            bd = (!(104857600 in copy) || n < 2) ? "" : sprintf("%.2f", copy[104857600] * c / (copies * n) * 2 * (n - 1) / n)
            gr = ("ddp-grads" SUBSEP b) in best ? bw["ddp-grads" SUBSEP b] : ""
            gbd = bd == "" ? "" : sprintf("%.2f", bd * copies / gcopies)
            rm = ratio(d, m); tgt = ""
            if (b >= 262144 && b <= 268435456 && bd != "")
                tgt = ((d != "" && d / bd >= 0.7) ? "bound met (≥0.7)" : "bound MISSED (≥0.7)") \
                      ((gr != "" && gr / gbd >= 0.7) ? ", grads met" : ", grads MISSED")
            if (b >= 1048576 && rm != "—")
                tgt = tgt (tgt == "" ? "" : ", ") ((rm >= 1.5) ? "mpi met (≥1.5×)" : "mpi MISSED (≥1.5×)")
            printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", label(b), cell(cp), cell(bd), cell(d), cell(m), cell(g),
                ratio(d, bd), ratio(m, bd), ratio(g, bd), rm, cell(gbd), cell(gr), ratio(gr, gbd), tgt
        }
    }' "$RAW"
}

MPI_SETTINGS="not run"
if [ $HAVE_MPI = 1 ]; then
    MPI_ENV=$(env | grep '^OMPI_MCA_' | tr '\n' ' ')
    COPY=$(ompi_info --param btl vader --level 9 2>/dev/null | sed -n 's/.*"btl_vader_single_copy_mechanism" (current value: "\([^"]*\)".*/\1/p' | head -n 1)
    if [ -n "$MPI_ENV" ]; then MPI_SETTINGS="MCA from the environment: $MPI_ENV; the rest default"; else MPI_SETTINGS="default MCA settings"; fi
    MPI_SETTINGS="$MPI_SETTINGS (btl_vader_single_copy_mechanism=${COPY:-?})"
fi
CPU_MODEL=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)
CORES_PER_SOCKET=$(lscpu 2>/dev/null | sed -n 's/^Core(s) per socket: *//p' | head -n 1)
SOCKETS=$(lscpu 2>/dev/null | sed -n 's/^Socket(s): *//p' | head -n 1)
CORES=$(( ${CORES_PER_SOCKET:-0} * ${SOCKETS:-0} ))
[ "$CORES" -gt 0 ] || CORES=$NCPU

SECTION="$TMP/section"
{
    echo "## Allreduce: ddp.h vs Open MPI vs gloo"
    echo
    echo "- Command: \`$CMDLINE\` (ranks: $RANKS; sizes: $SIZES; best of $REPEAT interleaved passes; ${ELAPSED} s)"
    echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- Machine: ${CPU_MODEL:-unknown CPU}, $CORES cores, $NCPU CPUs online; $(uname -sr); load average before the run: ${LOAD_START:-?} (other work on the machine skews every column)"
    [ $HAVE_MPI = 1 ] || MPI_VERSION="$MPI_VERSION (mpi skipped)"
    echo "- Open MPI: $MPI_VERSION — $MPI_SETTINGS; mpirun flags: \`${MPI_FLAGS:-none}\` (+ \`--oversubscribe\` above $NCPU ranks)"
    if [ $HAVE_GLOO = 1 ]; then
        echo "- torch: $TORCH_VERSION — \`torch.distributed\` gloo backend over loopback TCP, \`torch.set_num_threads(1)\`"
    else
        echo "- torch: not available (gloo skipped)"
    fi
    echo "- Method (identical for all three): float32 SUM allreduce in place on a user buffer; per size one exact correctness check, a calibration/warm-up, then iterations for ~${TARGET_S} s after a barrier; time_us = slowest rank's elapsed time / iterations; busbw = bytes / time × 2(n−1)/n in GB/s (1e9). copy GB/s = the best single-core memcpy of that size (build/copy_bw; small sizes copy within the cache); bound busbw = the busbw of a shared-memory allreduce that moves (5 − 2/N)/2 copies of the buffer per rank at the memory copy bandwidth (memcpy of 100 MiB) (ranks beyond the CPUs share them); x/bound = busbw / bound. grads = gradient buckets averaged in place through the shared gradient segment (bench_allreduce --grads: one parameter, one bucket, ddp_grad_ready + ddp_finish per iteration), whose bound is (3 − 1/N)/2 copies (no staging in). Targets: ddp ≥ 0.7 of the bound from 256 KiB to 256 MiB; ddp ≥ 1.5× mpi from 1 MiB, with the same malloc setting."
    if [ -s "$NOTES" ]; then sed 's/^/- /' "$NOTES"; fi
    echo "- Memory copy bandwidth (100 MiB), pass by pass (the host's state: it switches between a slow and a fast phase every few minutes, so only columns of one run compare):${COPY_PASSES:- not measured} GB/s; load average after the run: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
    for n in $RANKS; do
        for setting in $SETTINGS; do
            echo
            if [ "$n" -gt "$NCPU" ]; then
                echo "### $n ranks, malloc $setting (OVERSUBSCRIBED: $n ranks on $NCPU CPUs)"
            else
                echo "### $n ranks, malloc $setting"
            fi
            echo
            table "$n" "$setting"
        done
    done
} >"$SECTION"

echo
cat "$SECTION"

if [ "$WRITE" = 1 ]; then
    RESULTS=bench/RESULTS.md
    [ -e "$RESULTS" ] || printf '# Measured results\n' >"$RESULTS"
    if grep -q '^<!-- allreduce:begin -->' "$RESULTS" && grep -q '^<!-- allreduce:end -->' "$RESULTS"; then
        awk -v sec="$SECTION" '
            /^<!-- allreduce:begin -->/ { print; while ((getline line < sec) > 0) print line; skip = 1; next }
            /^<!-- allreduce:end -->/ { skip = 0 }
            !skip { print }' "$RESULTS" >"$TMP/results" && cat "$TMP/results" >"$RESULTS"
    else
        { echo; echo '<!-- allreduce:begin -->'; cat "$SECTION"; echo '<!-- allreduce:end -->'; } >>"$RESULTS"
    fi
    echo
    echo "wrote the allreduce section of $ROOT/$RESULTS"
fi
