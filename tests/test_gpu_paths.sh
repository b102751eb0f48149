#!/usr/bin/env bash
# test_gpu_paths.sh — tools/gpu_paths.sh (how the Makefile finds NCCL and cuBLAS) on made-up
# directory trees, one per layout a GPU machine may have: the CUDA 13 wheels (cuBLAS in
# nvidia/cu13, libcublas.so.13; NCCL in nvidia/nccl, libnccl.so.2 only) in PyTorch's venv
# under /opt/torch/.venv while the first python3 on PATH is another one; the CUDA 12 wheels
# (nvidia/cublas, nvidia/nccl) in a system dist-packages; a venv only its own python3 knows; a
# toolkit prefix (/usr/local/cuda) that wins over the wheels; a header without its library.
# Usage: tests/test_gpu_paths.sh
set -u
cd "$(dirname "$0")/.." || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

mk() {   # mk FILE...: empty files (and their folders)
    local f
    for f; do mkdir -p "$(dirname "$f")" && : >"$f"; done
}
# q ROOT WHAT [PYTHONS]: gpu_paths.sh with every fixed path under ROOT, no real Python asked
q() { GPU_PATHS_ROOT=$1 GPU_PATHS_PYTHONS=${3:-} CUDA_HOME= NCCL_HOME= tools/gpu_paths.sh "$2"; }
expect() {   # name root what want [pythons]
    local got
    got=$(q "$2" "$3" "${5:-}")
    if [ "$got" = "$4" ]; then echo "PASS gpu_paths_$1_$3"
    else echo "FAIL gpu_paths_$1_$3: got '$got', want '$4'"; fails=$((fails + 1)); fi
}

# 1. CUDA 13 wheels in /opt/torch/.venv (python3 on PATH is another Python: not asked here)
r=$tmp/cu13
s=$r/opt/torch/.venv/lib/python3.12/site-packages/nvidia
mk "$s/cu13/include/cublas_v2.h" "$s/cu13/include/cublas_api.h" "$s/cu13/lib/libcublas.so.13" "$s/cu13/lib/libcublasLt.so.13" \
   "$s/cu13/lib/libcudart.so.13" "$s/nccl/include/nccl.h" "$s/nccl/lib/libnccl.so.2"
expect cu13_wheels "$r" nccl-inc "$s/nccl/include"
expect cu13_wheels "$r" nccl-lib "$s/nccl/lib"
expect cu13_wheels "$r" nccl-link "-l:libnccl.so.2"
expect cu13_wheels "$r" cublas-inc "$s/cu13/include"
expect cu13_wheels "$r" cublas-lib "$s/cu13/lib"
expect cu13_wheels "$r" cublas-link "-l:libcublas.so.13"

# 2. CUDA 12 wheels in a system dist-packages
r=$tmp/cu12
s=$r/usr/local/lib/python3.11/dist-packages/nvidia
mk "$s/cublas/include/cublas_v2.h" "$s/cublas/lib/libcublas.so.12" "$s/cublas/lib/libcublasLt.so.12" \
   "$s/nccl/include/nccl.h" "$s/nccl/lib/libnccl.so.2"
expect cu12_wheels "$r" nccl-lib "$s/nccl/lib"
expect cu12_wheels "$r" cublas-inc "$s/cublas/include"
expect cu12_wheels "$r" cublas-link "-l:libcublas.so.12"

# 3. A venv nowhere standard: found by asking its python3 for its site-packages
r=$tmp/venv
s=$r/somewhere/venv/lib/python3.12/site-packages
mk "$s/nvidia/nccl/include/nccl.h" "$s/nvidia/nccl/lib/libnccl.so.2"
mkdir -p "$r/bin"
printf '#!/bin/sh\necho %s\n' "$s" >"$r/bin/python3"   # answers what site.getsitepackages() would
chmod +x "$r/bin/python3"
expect venv_python "$r" nccl-lib "$s/nvidia/nccl/lib" "$r/bin/python3"
expect venv_python "$r" nccl-link "-l:libnccl.so.2" "$r/bin/python3"

# 4. A toolkit prefix with both: it wins over the wheels, and -lnccl where libnccl.so exists
r=$tmp/toolkit
s=$r/opt/torch/.venv/lib/python3.12/site-packages/nvidia
mk "$r/usr/local/cuda/include/nccl.h" "$r/usr/local/cuda/lib64/libnccl.so" "$r/usr/local/cuda/lib64/libnccl.so.2" \
   "$r/usr/local/cuda/targets/x86_64-linux/include/cublas_v2.h" "$r/usr/local/cuda/targets/x86_64-linux/lib/libcublas.so.13" \
   "$s/nccl/include/nccl.h" "$s/nccl/lib/libnccl.so.2"
expect toolkit_first "$r" nccl-inc "$r/usr/local/cuda/include"
expect toolkit_first "$r" nccl-link "-lnccl"
expect toolkit_targets_dir "$r" cublas-inc "$r/usr/local/cuda/targets/x86_64-linux/include"
expect toolkit_targets_dir "$r" cublas-link "-l:libcublas.so.13"

# 5. The toolkit has cuBLAS's header but not its library (a trimmed image), the wheel has both:
#    both from the wheel, so the header is the library's own
r=$tmp/split
s=$r/opt/torch/.venv/lib/python3.12/site-packages/nvidia
mk "$r/usr/local/cuda/include/cublas_v2.h" "$s/cu13/include/cublas_v2.h" "$s/cu13/lib/libcublas.so.13"
expect same_place "$r" cublas-inc "$s/cu13/include"
expect same_place "$r" cublas-lib "$s/cu13/lib"
# ... and where no place has both, each from where it is
rm -rf "$s/cu13/include"
expect header_elsewhere "$r" cublas-inc "$r/usr/local/cuda/include"
expect header_elsewhere "$r" cublas-lib "$s/cu13/lib"

# 6. Nothing anywhere: nothing printed, exit 0 (the Makefile then builds the CPU parts)
mkdir -p "$tmp/none"
out=$(q "$tmp/none" nccl-lib; q "$tmp/none" cublas-link); rc=$?
if [ -z "$out" ] && [ $rc -eq 0 ]; then echo "PASS gpu_paths_nothing_found_prints_nothing"
else echo "FAIL gpu_paths_nothing_found_prints_nothing: '$out' rc $rc"; fails=$((fails + 1)); fi

[ "$fails" -eq 0 ]
