#!/bin/sh
# gpu_paths.sh WHAT — where the GPU toolchain is, for the Makefile; prints nothing when absent.
#   nvcc                  the nvcc to use
#   nccl-inc / nccl-lib   directory of nccl.h / of libnccl.so*
#   nccl-link             -lnccl, or -l:libnccl.so.2 where only the versioned file exists (pip wheels)
#   cublas-inc / cublas-lib / cublas-link   the same for cuBLAS
# Looks in $CUDA_HOME, $NCCL_HOME, /usr/local/cuda, /usr, and the nvidia/nccl, nvidia/cublas
# Python wheels (GPU images often carry NCCL only there).
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
wheel() {   # the directory of the nvidia.$1 wheel, or nothing
    python3 -c "import nvidia.$1 as m; print(list(m.__path__)[0])" 2>/dev/null && return
    for d in /usr/lib/python3*/site-packages /usr/local/lib/python3*/site-packages \
             /usr/lib/python3*/dist-packages /usr/local/lib/python3*/dist-packages /usr/lib/python3/dist-packages; do
        [ -d "$d/nvidia/$1" ] && { echo "$d/nvidia/$1"; return; }
    done
}
roots() { # $1: nccl or cublas
    if [ "$1" = nccl ]; then printf '%s\n' "${NCCL_HOME:-}"; fi
    printf '%s\n' "$CUDA_HOME" /usr/local/cuda /usr "$(wheel "$1")"
}
find_inc() { # $1 lib, $2 header
    roots "$1" | while read -r r; do
        [ -n "$r" ] || continue
        for d in "$r/include" "$r/targets/x86_64-linux/include" "$r/targets/sbsa-linux/include"; do
            [ -f "$d/$2" ] && { echo "$d"; return; }
        done
    done | head -n 1
}
find_lib() { # $1 lib, $2 library stem
    roots "$1" | while read -r r; do
        [ -n "$r" ] || continue
        for d in "$r/lib64" "$r/lib" "$r/lib/x86_64-linux-gnu" "$r/lib/aarch64-linux-gnu"; do
            ls "$d/$2".so* >/dev/null 2>&1 && { echo "$d"; return; }
        done
    done | head -n 1
}
link_flag() { # $1 dir, $2 stem
    if [ -e "$1/$2.so" ]; then echo "-l${2#lib}"; else
        f=$(ls "$1/$2".so.* 2>/dev/null | head -n 1); [ -n "$f" ] && echo "-l:$(basename "$f")"; fi
}
case "$1" in
nvcc) command -v nvcc 2>/dev/null || { [ -x "$CUDA_HOME/bin/nvcc" ] && echo "$CUDA_HOME/bin/nvcc"; } ;;
nccl-inc) find_inc nccl nccl.h ;;
nccl-lib) find_lib nccl libnccl ;;
nccl-link) d=$(find_lib nccl libnccl); [ -n "$d" ] && link_flag "$d" libnccl ;;
cublas-inc) find_inc cublas cublas_v2.h ;;
cublas-lib) find_lib cublas libcublas ;;
cublas-link) d=$(find_lib cublas libcublas); [ -n "$d" ] && link_flag "$d" libcublas ;;
esac
exit 0
