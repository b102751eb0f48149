#!/bin/sh
# gpu_paths.sh WHAT — where the GPU toolchain is, for the Makefile; prints nothing when absent.
#   nvcc                  the nvcc to use
#   nccl-inc / nccl-lib   directory of nccl.h / of libnccl.so*
#   nccl-link             -lnccl, or -l:libnccl.so.2 where only the versioned file exists (pip wheels)
#   cublas-inc / cublas-lib / cublas-link   the same for cuBLAS
# Looks in $CUDA_HOME, $NCCL_HOME (NCCL), /usr/local/cuda, /usr, then the Python wheels: GPU
# images often carry NCCL and cuBLAS only there, for a Python that need not be the first
# python3 on PATH (PyTorch's own venv, /opt/torch/.venv). Wheel layouts:
#   nvidia/nccl/{include,lib}   NCCL (nvidia-nccl-cu12, -cu13: libnccl.so.2 only)
#   nvidia/cu13/{include,lib}   CUDA 13's libraries, cuBLAS among them (nvidia-cublas 13: libcublas.so.13)
#   nvidia/cublas/{include,lib} cuBLAS up to CUDA 12 (nvidia-cublas-cu12: libcublas.so.12)
# A library's header and its .so are taken from the same place where one place has both, so
# the header matches the library the binaries load.
# Testing (tests/test_gpu_paths.sh): GPU_PATHS_ROOT=DIR puts DIR in front of every fixed path
# (/usr/local/cuda, /usr, /opt/torch/.venv, the site-packages folders); GPU_PATHS_PYTHONS lists
# the Python interpreters asked for their site-packages (default: python3 on PATH and
# /opt/torch/.venv/bin/python3).
R=${GPU_PATHS_ROOT:-}
CUDA_HOME=${CUDA_HOME:-$R/usr/local/cuda}
PYTHONS=${GPU_PATHS_PYTHONS-python3 $R/opt/torch/.venv/bin/python3}

site_dirs() {   # every site-packages folder that may hold nvidia/* wheels, first found first
    for py in $PYTHONS; do
        command -v "$py" >/dev/null 2>&1 || continue
        "$py" -c 'import site, sys
for d in site.getsitepackages() + [site.getusersitepackages()]: print(d)' 2>/dev/null
    done
    for d in "$R"/opt/torch/.venv/lib/python3*/site-packages "$R"/usr/local/lib/python3*/site-packages \
             "$R"/usr/local/lib/python3*/dist-packages "$R"/usr/lib/python3*/site-packages \
             "$R"/usr/lib/python3*/dist-packages "$R"/usr/lib/python3/dist-packages; do
        echo "$d"
    done
}
fixed_roots() {   # $1: nccl or cublas — the toolkit-style prefixes, in order
    if [ "$1" = nccl ] && [ -n "${NCCL_HOME:-}" ]; then echo "$NCCL_HOME"; fi
    printf '%s\n' "$CUDA_HOME" "$R/usr/local/cuda" "$R/usr"
}
wheel_roots() {   # $1: nccl or cublas — the wheels' prefixes (asks Python: only when needed)
    if [ "$1" = nccl ]; then wheels="nccl cu13"; else wheels="cu13 cublas cu12"; fi
    site_dirs | while read -r d; do
        for w in $wheels; do [ -d "$d/nvidia/$w" ] && echo "$d/nvidia/$w"; done
    done
}
inc_in() {   # $1 root, $2 header: the include folder of that root holding it
    for d in "$1/include" "$1/targets/x86_64-linux/include" "$1/targets/sbsa-linux/include"; do
        [ -f "$d/$2" ] && { echo "$d"; return 0; }
    done
    return 1
}
lib_in() {   # $1 root, $2 library stem: the lib folder of that root holding it
    for d in "$1/lib64" "$1/lib" "$1/lib/x86_64-linux-gnu" "$1/lib/aarch64-linux-gnu" \
             "$1/targets/x86_64-linux/lib" "$1/targets/sbsa-linux/lib"; do
        ls "$d/$2".so* >/dev/null 2>&1 && { echo "$d"; return 0; }
    done
    return 1
}
both_in() {   # stdin: roots; $1 header, $2 stem, $3 inc|lib: from the first root holding both
    while read -r r; do
        [ -n "$r" ] || continue
        i=$(inc_in "$r" "$1") && l=$(lib_in "$r" "$2") && { if [ "$3" = inc ]; then echo "$i"; else echo "$l"; fi; return 0; }
    done
    return 1
}
one_in() {   # stdin: roots; $1 header, $2 stem, $3 inc|lib: the first root holding that one
    while read -r r; do
        [ -n "$r" ] || continue
        if [ "$3" = inc ]; then inc_in "$r" "$1" && return 0; else lib_in "$r" "$2" && return 0; fi
    done
    return 1
}
# $1 nccl|cublas, $2 header, $3 library stem, $4 inc|lib: the first root with both the header
# and the library (toolkit prefixes before wheels); failing that, the first with the one asked for.
find_dir() {
    fixed_roots "$1" | both_in "$2" "$3" "$4" && return
    wheels=$(wheel_roots "$1")
    printf '%s\n' "$wheels" | both_in "$2" "$3" "$4" && return
    { fixed_roots "$1"; printf '%s\n' "$wheels"; } | one_in "$2" "$3" "$4"
}
link_flag() {   # $1 dir, $2 stem
    if [ -e "$1/$2.so" ]; then echo "-l${2#lib}"; else
        f=$(ls "$1/$2".so.* 2>/dev/null | head -n 1); [ -n "$f" ] && echo "-l:$(basename "$f")"; fi
}
case "${1:-}" in
nvcc) command -v nvcc 2>/dev/null || { [ -x "$CUDA_HOME/bin/nvcc" ] && echo "$CUDA_HOME/bin/nvcc"; } ;;
nccl-inc) find_dir nccl nccl.h libnccl inc ;;
nccl-lib) find_dir nccl nccl.h libnccl lib ;;
nccl-link) d=$(find_dir nccl nccl.h libnccl lib); [ -n "$d" ] && link_flag "$d" libnccl ;;
cublas-inc) find_dir cublas cublas_v2.h libcublas inc ;;
cublas-lib) find_dir cublas cublas_v2.h libcublas lib ;;
cublas-link) d=$(find_dir cublas cublas_v2.h libcublas lib); [ -n "$d" ] && link_flag "$d" libcublas ;;
*) echo "usage: gpu_paths.sh nvcc|nccl-inc|nccl-lib|nccl-link|cublas-inc|cublas-lib|cublas-link" >&2; exit 2 ;;
esac
exit 0
