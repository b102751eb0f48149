#!/usr/bin/env bash
# run.sh — run every libFuzzer target for a set time. Usage: fuzz/run.sh BUILD_DIR SECONDS
# Seeds come from fuzz/corpus/<target> (read only); what the fuzzer learns goes to
# BUILD_DIR/corpus/<target>; a crash leaves its input in BUILD_DIR/crash-* and fails the run.
set -u
B=${1:-build}
SECONDS_EACH=${2:-60}
cd "$(dirname "$0")/.." || exit 1
status=0
for bin in "$B"/fuzz_*; do
    [ -x "$bin" ] || continue
    name=${bin##*/fuzz_}
    mkdir -p "$B/corpus/$name"
    log="$B/fuzz_$name.log"
    # no -max_len: libFuzzer takes the largest seed (at least 4096 bytes) as the limit
    "$bin" -max_total_time="$SECONDS_EACH" -timeout=10 -print_final_stats=1 \
        -artifact_prefix="$B/" "$B/corpus/$name" "fuzz/corpus/$name" >"$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    if [ "$rc" -eq 0 ]; then
        echo "fuzz_$name: ${runs:-?} runs in ${SECONDS_EACH} s, no crash"
    else
        echo "fuzz_$name: CRASH (exit $rc) after ${runs:-?} runs; see $log and $B/crash-*"
        grep -m 5 -E "ERROR|SUMMARY" "$log"
        status=1
    fi
done
exit $status
