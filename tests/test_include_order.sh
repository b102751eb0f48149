#!/usr/bin/env bash
# test_include_order.sh — an engine file has its own #includes first. Under a strict -std=c99
# that hides the POSIX declarations the implementation needs, and ddp.h must then stop with an
# #error that says what to do (not a wall of undeclared names); with -std=gnu99, -D_GNU_SOURCE
# or ddp.h first, the same file compiles. Usage: tests/test_include_order.sh
set -u
cd "$(dirname "$0")/.." || exit 1
CC=${CC:-cc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '#include <stdio.h>\n#include <string.h>\n#define DDP_IMPLEMENTATION\n#include "ddp.h"\nint main(void) { return ddp_world_size(NULL); }\n' >"$tmp/late.c"
printf '#define DDP_IMPLEMENTATION\n#include "ddp.h"\n#include <stdio.h>\nint main(void) { return ddp_world_size(NULL); }\n' >"$tmp/first.c"
check() {   # name, expect (ok|error), flags...
    local name=$1 expect=$2; shift 2
    if "$CC" "$@" -I. -c -o "$tmp/o.o" >"$tmp/log" 2>&1; then got=ok; else got=error; fi
    if [ "$got" != "$expect" ]; then echo "FAIL $name: expected $expect, got $got"; head -n 5 "$tmp/log"; return; fi
    if [ "$expect" = error ]; then
        n=$(grep -c "error" "$tmp/log")
        if ! grep -q 'before every other #include' "$tmp/log" || [ "$n" -gt 2 ]; then
            echo "FAIL $name: the #error is not the one message ($n error lines)"; head -n 5 "$tmp/log"; return
        fi
    fi
    echo "PASS $name"
}
check include_order_strict_c99_stops_with_advice error -std=c99 "$tmp/late.c"
check include_order_gnu99_compiles ok -std=gnu99 -Wall -Wextra -Werror "$tmp/late.c"
check include_order_gnu_source_compiles ok -std=c99 -D_GNU_SOURCE -Wall -Wextra -Werror "$tmp/late.c"
check include_order_ddp_first_compiles ok -std=c99 -Wall -Wextra -Werror "$tmp/first.c"
# An engine's own strict warning set must stay quiet on ddp.h (the implementation included).
strict="-Wall -Wextra -Wshadow -Wconversion -Werror"
check header_strict_warnings_c99_pedantic ok -std=c99 -pedantic $strict "$tmp/first.c"
if command -v clang >/dev/null 2>&1; then
    CC=clang check header_strict_warnings_clang ok -std=c99 -pedantic $strict "$tmp/first.c"
fi
if command -v g++ >/dev/null 2>&1; then
    CC=g++ check header_strict_warnings_as_cxx ok -x c++ $strict "$tmp/first.c"
fi
