# ddp.h — build, test, benchmark. `make` needs only a C compiler.
CC       ?= cc
CXX      ?= c++
# HOST_ARCH: the host code's -march (x86-64-v3 for binaries that run on another machine: make gpu-window)
HOST_ARCH ?= native
OPT      ?= -O3 -march=$(HOST_ARCH) -fno-math-errno -g   # no errno: sqrtf in AdamW vectorizes
CFLAGS   ?= $(OPT)
WARN     := -Wall -Wextra
LDLIBS   := -lpthread -lm
B        := build

PROGRAMS := $(B)/ddprun $(B)/minimal $(B)/own_autograd $(B)/engine $(B)/texture $(B)/texture_cxx $(B)/bench_allreduce $(B)/bench_overlap $(B)/copy_bw \
            $(B)/test_unit $(B)/test_collectives $(B)/test_equivalence $(B)/test_fault \
            $(B)/test_overlap $(B)/test_straggler $(B)/test_bf16 $(B)/test_shard $(B)/test_structs $(B)/test_own_path $(B)/test_outer $(B)/test_embed $(B)/test_host $(B)/test_sampler $(B)/test_checkpoint $(B)/test_outer_checkpoint $(B)/train_gpt $(B)/test_gpt \
            $(B)/train_gpt_emulated $(B)/test_gpt_gpu_emulated $(B)/test_fake_nccl $(B)/hosts_nccl_fake $(B)/test_bf16_params \
            $(B)/test_shard_join
PROGRAMS += $(B)/train_gpt_fakegpu    # the CUDA model emulated, on the NCCL backend on tests/fakegpu (ZeRO-3's device path)
PROGRAMS += $(B)/test_groups          # replica groups of several ranks (desc.outer): averages within each group
PROGRAMS += $(B)/test_groups_shard    # shard_optimizer within replica groups = unsharded, bit for bit
PROGRAMS += $(B)/test_zero2          # ZeRO-2 (shard GRADIENTS) = unsharded, bit for bit; released gradient pages
PROGRAMS += $(B)/test_hybrid          # hybrid sharding (shard_group) = unsharded, bit for bit
CHECKS   := $(B)/cxx_check.o
PROGRAMS += $(B)/mpi_parity          # the CPU side of tests/test_mpi_parity.sh
PROGRAMS += $(B)/bench_shard_memory   # sharded optimizer: bytes per parameter (bench/RESULTS.md)
PROGRAMS += $(B)/bench_zero2_memory   # ZeRO-2: a rank's Pss/Rss per level, step time against NONE (bench/RESULTS.md)
PROGRAMS += $(B)/test_zero3           # sharded parameters (ZeRO-3 / FSDP) = unsharded, bit for bit
PROGRAMS += $(B)/bench_zero3_memory   # sharded parameters: a rank's resident bytes per parameter at every level (bench/RESULTS.md)
PROGRAMS += $(B)/bench_bf16_step      # bf16 parameters: the library's part of a step (bench/RESULTS.md)
PROGRAMS += $(B)/bench_adamw_guard    # bf16 parameters: the misuse guard's share of the AdamW pass
# -Ofast (-ffast-math) programs keep the NaN guard: ddp.h's implementation built with gcc -Ofast
# and clang -Ofast (tests/test_fastmath.c; run by tests/run.sh under ddprun -n 2). CLANG= (empty)
# or no clang: the gcc build only.
CLANG ?= $(shell command -v clang 2>/dev/null)
FASTMATH := $(B)/test_fastmath_gcc $(if $(strip $(CLANG)),$(B)/test_fastmath_clang) $(B)/own_autograd_fastmath $(B)/train_gpt_fastmath
PROGRAMS += $(FASTMATH)

.PHONY: all mpi windows help run train-2-ranks deps bench-deps test test-asan test-tsan fuzz bench bench-gpt bench-zero bench-gpu bench-outer gpu-window clean
all: $(PROGRAMS) $(CHECKS) gpu mpi windows

# ---- The GPU path: built whenever nvcc is found (CI compiles and links it on every run);
# the tests run where a GPU is (tests/gpu/run.sh: one SKIP line a test elsewhere). nvcc, NCCL
# and cuBLAS are looked up in CUDA_HOME, NCCL_HOME, /usr/local/cuda, /usr and the Python wheels
# (nvidia/nccl, nvidia/cu13, nvidia/cublas; tools/gpu_paths.sh); the binaries carry an rpath to them.
CUDA_ARCH  ?= sm_90
NVCC       ?= $(shell tools/gpu_paths.sh nvcc)
NCCL_INC   ?= $(shell tools/gpu_paths.sh nccl-inc)
NCCL_LIB   ?= $(shell tools/gpu_paths.sh nccl-lib)
NCCL_LINK  ?= $(shell tools/gpu_paths.sh nccl-link)
CUBLAS_INC ?= $(shell tools/gpu_paths.sh cublas-inc)
CUBLAS_LIB ?= $(shell tools/gpu_paths.sh cublas-lib)
CUBLAS_LINK?= $(shell tools/gpu_paths.sh cublas-link)
G          := $(B)/gpu
CUDA_RT_LIB = $(dir $(NVCC))../lib64
GPU_INCS    = $(addprefix -I,$(sort $(NCCL_INC) $(CUBLAS_INC)))
# The rpath as DT_RPATH, not DT_RUNPATH: it then also finds what the libraries load themselves
# (a wheel's libcublas.so.13 loads libcublasLt.so.13 from the same folder).
GPU_RPATH   = $(foreach d,$(sort $(NCCL_LIB) $(CUBLAS_LIB)),-L$(d) -Xlinker -rpath -Xlinker $(d)) -Xlinker --disable-new-dtags
# Warnings are errors here and in CI; bench/gpu/check_tests.sh builds with WERROR= so that a
# newer host compiler's new warning on the GPU machine is shown, not fatal. NVCC_EXTRA: more nvcc
# flags (the check adds -allow-unsupported-compiler where nvcc refuses the host compiler).
WERROR     ?= -Werror all-warnings
NVCC_EXTRA ?=
NVFLAGS    ?= -O3 -g -std=c++17 -arch=$(CUDA_ARCH) -Xcompiler -Wall,-Wextra $(WERROR) $(NVCC_EXTRA)
GPU_TESTS  := $(G)/test_gpu_kernels $(G)/test_gpu_train $(G)/test_gpu_overlap $(G)/nccl_version $(G)/c_link_check \
              $(G)/test_kernel_math_host $(G)/test_kernel_math_host_fastmath $(G)/test_gpt_gpu $(G)/hosts_nccl
GPU_BENCH  := $(G)/bench_gpu
GPU_TOOLS  := $(G)/train_gpt $(G)/gpu_count

ifeq ($(strip $(NVCC)),)
gpu:
	@echo "no nvcc (CUDA_HOME=$(CUDA_HOME), or NVCC= given): building the CPU parts only"
else
gpu: $(GPU_TESTS) $(GPU_BENCH) $(GPU_TOOLS)
endif

$(G):
	@mkdir -p $(G)
GPU_DEPS := ddp.h ddp_kernels.cuh tests/testlib.h tests/gpu/gpu_common.h
$(G)/%: tests/gpu/%.cu $(GPU_DEPS) | $(G)
	$(NVCC) $(NVFLAGS) $(GPU_INCS) -o $@ $< $(GPU_RPATH) $(NCCL_LINK) -lpthread
# The model's ops without fused multiply-add: the same arithmetic as the CPU reference.
$(G)/test_gpu_train: tests/gpu/test_gpu_train.cu tests/support/equivalence_model.h $(GPU_DEPS) | $(G)
	$(NVCC) $(NVFLAGS) --fmad=false $(GPU_INCS) -o $@ $< $(GPU_RPATH) $(NCCL_LINK) -lpthread
# The kernels' arithmetic run on the host (no GPU needed; tests/run.sh runs it wherever it was
# built): host float operations must not be fused into multiply-adds, as on the device.
$(G)/test_kernel_math_host: tests/gpu/test_kernel_math_host.cu $(GPU_DEPS) | $(G)
	$(NVCC) $(NVFLAGS) --fmad=false -Xcompiler -ffp-contract=off $(GPU_INCS) -o $@ $< $(GPU_RPATH) $(NCCL_LINK) -lpthread
# The same, with fast math: the device code compiled with --use_fast_math, the host reference with
# -ffinite-math-only (isfinite folds to 1 there): the skipped NaN/Inf steps must still be skipped,
# found by their bits; rounding unchanged (the kernels use _rn intrinsics; no contraction on the host).
$(G)/test_kernel_math_host_fastmath: tests/gpu/test_kernel_math_host.cu $(GPU_DEPS) | $(G)
	$(NVCC) $(NVFLAGS) --use_fast_math -Xcompiler -ffinite-math-only,-ffp-contract=off $(GPU_INCS) -o $@ $< $(GPU_RPATH) $(NCCL_LINK) -lpthread
# One rank of the NCCL backend for tests/test_hosts.sh (the same source as the fake build below).
$(G)/hosts_nccl: tests/hosts_nccl.c ddp.h ddp_kernels.cuh | $(G)
	$(NVCC) $(NVFLAGS) $(GPU_INCS) -x cu -o $@ $< $(GPU_RPATH) $(NCCL_LINK) -lpthread
$(G)/bench_gpu: bench/gpu/bench_gpu.cu $(GPU_DEPS) | $(G)
	$(NVCC) $(NVFLAGS) $(GPU_INCS) -o $@ $< $(GPU_RPATH) $(NCCL_LINK) $(CUBLAS_LINK) -lpthread
# The implementation compiled by the C compiler with -DDDP_CUDA, the kernels by nvcc.
$(G)/kernels_impl.o: tests/gpu/kernels_impl.cu ddp_kernels.cuh | $(G)
	$(NVCC) $(NVFLAGS) -c -o $@ $<
$(G)/c_link_check: tests/gpu/c_link_check.c $(G)/kernels_impl.o ddp.h ddp_kernels.cuh | $(G)
	$(CC) -std=c99 -O2 -g $(WARN) -DDDP_CUDA $(GPU_INCS) -I$(dir $(NVCC))../include -c -o $(G)/c_link_check.o $<
	$(NVCC) -arch=$(CUDA_ARCH) -o $@ $(G)/c_link_check.o $(G)/kernels_impl.o $(GPU_RPATH) $(NCCL_LINK) -lpthread -lm
$(G)/gpu_count: tools/gpu_count.cu | $(G)
	$(NVCC) $(NVFLAGS) -o $@ $<
# The tiny GPT, nvcc-built: the CUDA model (examples/gpt/gpt_cuda.cuh) on the NCCL backend, gpt.h's
# CPU model elsewhere. Its host code gets the C build's math flags, and -ffp-contract=off because
# g++ fuses a*b+c in C++ mode where gcc -std=c99 does not: so its CPU path (--cpu, or no GPU)
# trains the same bits as build/train_gpt (tests/test_gpt.sh checks).
GPT_CUDA_DEPS := examples/gpt/gpt_cuda.cuh examples/gpt/gpt.h ddp.h
GPT_HOST_MATH := -Xcompiler -march=$(HOST_ARCH),-fno-math-errno,-ffp-contract=off
$(G)/train_gpt: examples/gpt/train_gpt.c examples/gpt/gpt_data.h $(GPT_CUDA_DEPS) ddp_kernels.cuh | $(G)
	$(NVCC) $(NVFLAGS) $(GPT_HOST_MATH) $(GPT_DEFS) $(GPU_INCS) -x cu -o $@ $< $(GPU_RPATH) $(NCCL_LINK) $(CUBLAS_LINK) $(GPT_LIBS) -lpthread
$(G)/test_gpt_gpu: tests/gpu/test_gpt_gpu.cu tests/support/gpt_reference.h $(GPT_CUDA_DEPS) $(GPU_DEPS) | $(G)
	$(NVCC) $(NVFLAGS) $(GPT_HOST_MATH) $(GPT_DEFS) $(GPU_INCS) -o $@ $< $(GPU_RPATH) $(NCCL_LINK) $(CUBLAS_LINK) $(GPT_LIBS) -lpthread

# ---- The MPI backend (ddp.h's >>mpi, -DDDP_MPI): CPU ranks on several hosts. Built with mpicc
# where it is (.ci/run installs openmpi-bin and libopenmpi-dev); tests/test_mpi_hosts.sh runs them
# on namespace hosts and prints a SKIP line where mpicc/mpirun or the namespaces are missing.
MPICC ?= $(shell command -v mpicc 2>/dev/null)
M     := $(B)/mpi
MPI_PROGRAMS := $(M)/mpi_steps $(M)/test_equivalence $(M)/test_collectives $(M)/minimal $(M)/train_gpt $(M)/test_gpt $(M)/bench_allreduce
# the MPI backend against the CPU backend, bit for bit (tests/test_mpi_parity.sh: the CPU build of
# the same source is build/mpi_parity)
MPI_PROGRAMS += $(M)/mpi_parity
MPI_PROGRAMS += $(M)/test_groups      # the same replica groups on the MPI backend (tests/test_groups.sh)
MPI_PROGRAMS += $(M)/test_groups_shard   # shard_optimizer within the groups on the MPI backend
MPI_PROGRAMS += $(M)/test_zero2      # ZeRO-2 on the MPI backend (tests/test_zero2_mpi.sh)
MPI_PROGRAMS += $(M)/test_zero3      # ZeRO-3 on the MPI backend, flat and hybrid (tests/test_zero3_mpi.sh)
MPI_PROGRAMS += $(M)/test_hybrid         # hybrid sharding across hosts (tests/test_hybrid.sh)
ifeq ($(strip $(MPICC)),)
mpi:
	@echo "no mpicc: the MPI backend's programs are not built (apt-get install openmpi-bin libopenmpi-dev)"
else
mpi: $(MPI_PROGRAMS)
endif
$(M):
	@mkdir -p $(M)
$(M)/%: tests/%.c tests/testlib.h ddp.h | $(M)
	$(MPICC) -std=c99 $(CFLAGS) $(WARN) -DDDP_MPI -o $@ $< $(LDLIBS)
$(M)/test_zero2: tests/test_shard.c   # its harness, included
$(M)/%: examples/%.c ddp.h | $(M)
	$(MPICC) -std=c99 $(CFLAGS) $(WARN) -DDDP_MPI -o $@ $< $(LDLIBS)
$(M)/%: bench/%.c ddp.h | $(M)
	$(MPICC) -std=c99 $(CFLAGS) $(WARN) -DDDP_MPI -o $@ $< $(LDLIBS)
$(M)/train_gpt: examples/gpt/train_gpt.c examples/gpt/gpt_data.h examples/gpt/gpt.h ddp.h | $(M)
	$(MPICC) -std=c99 $(CFLAGS) $(WARN) -fno-math-errno -DDDP_MPI $(GPT_DEFS) -o $@ $< $(GPT_LIBS) $(LDLIBS)
$(M)/test_gpt: tests/test_gpt.c tests/support/gpt_reference.h tests/testlib.h examples/gpt/gpt.h examples/gpt/gpt_data.h ddp.h | $(M)
	$(MPICC) -std=c99 $(CFLAGS) $(WARN) -fno-math-errno -DDDP_MPI $(GPT_DEFS) -o $@ $< $(GPT_LIBS) $(LDLIBS)

# ---- Windows (tests/test_windows.sh runs these under Wine): the MinGW-w64 cross compiler, where it
# is (.ci/run installs gcc-mingw-w64-x86-64 and wine64). Fixed flags, not OPT: they are never
# sanitized, so the sanitizer passes reuse them (build/win whatever B is), and -ffp-contract=off
# (with TEST_PORTABLE_MATH for test_equivalence) because their bits are compared with the Linux
# build's. Static: Wine needs no MinGW DLLs. The tests' own threads are winpthreads'; ddp.h uses
# Win32 alone (the examples too).
WIN_CC    ?= $(shell command -v x86_64-w64-mingw32-gcc 2>/dev/null)
WB        := build/win
WIN_FLAGS := -std=gnu99 -O2 -ffp-contract=off $(WARN) -Wno-pointer-sign -static
WIN_LIBS  := -lws2_32 -lbcrypt
WIN_PROGRAMS := $(WB)/test_unit.exe $(WB)/test_embed.exe $(WB)/test_host.exe $(WB)/test_equivalence.exe $(WB)/test_checkpoint.exe $(WB)/engine.exe $(WB)/texture.exe \
                $(WB)/minimal.exe $(WB)/ddprun.exe $(WB)/test_equivalence_il.exe $(WB)/engine_il.exe
ifeq ($(strip $(WIN_CC)),)
windows:
	@echo "no x86_64-w64-mingw32-gcc: the Windows programs are not built (apt-get install gcc-mingw-w64-x86-64)"
else
windows: $(WIN_PROGRAMS) $(B)/test_equivalence_portable
endif
$(WB):
	@mkdir -p $(WB)
$(WB)/test_equivalence.exe: tests/test_equivalence.c tests/support/equivalence_model.h tests/testlib.h ddp.h | $(WB)
	$(WIN_CC) $(WIN_FLAGS) -DTEST_PORTABLE_MATH -o $@ $< $(WIN_LIBS) -lpthread
# The mapping of the __atomic builtins onto Interlocked calls that a cl.exe build uses (>>platform),
# checked here by forcing it on MinGW: no MSVC to build with.
$(WB)/test_equivalence_il.exe: tests/test_equivalence.c tests/support/equivalence_model.h tests/testlib.h ddp.h | $(WB)
	$(WIN_CC) $(WIN_FLAGS) -DDDP__ATOMICS_INTERLOCKED -DTEST_PORTABLE_MATH -o $@ $< $(WIN_LIBS) -lpthread
$(WB)/engine_il.exe: examples/engine.c ddp.h | $(WB)
	$(WIN_CC) $(WIN_FLAGS) -DDDP__ATOMICS_INTERLOCKED -o $@ $< $(WIN_LIBS)
$(WB)/%.exe: tests/%.c tests/testlib.h ddp.h | $(WB)
	$(WIN_CC) $(WIN_FLAGS) -o $@ $< $(WIN_LIBS) -lpthread
$(WB)/%.exe: examples/%.c ddp.h | $(WB)
	$(WIN_CC) $(WIN_FLAGS) -o $@ $< $(WIN_LIBS)
$(WB)/texture.exe: examples/engine/texture.c ddp.h | $(WB)
	$(WIN_CC) $(WIN_FLAGS) -o $@ $< $(WIN_LIBS)
$(WB)/ddprun.exe: tools/ddprun.c tools/ddprun_windows.c | $(WB)
	$(WIN_CC) $(WIN_FLAGS) -o $@ $< $(WIN_LIBS)
# The Linux side of the comparison: the same source and arithmetic flags.
$(B)/test_equivalence_portable: tests/test_equivalence.c tests/support/equivalence_model.h tests/testlib.h ddp.h | $(B)
	$(CC) -std=c99 $(CFLAGS) $(WARN) -ffp-contract=off -DTEST_PORTABLE_MATH -o $@ $< $(LDLIBS)

$(B):
	@mkdir -p $(B)

$(B)/ddprun: tools/ddprun.c | $(B)
	$(CC) -std=c99 -D_GNU_SOURCE -pthread $(CFLAGS) $(WARN) -o $@ $<

# Everything that includes the header rebuilds when it changes.
$(B)/%: examples/%.c ddp.h | $(B)
	$(CC) -std=c99 $(CFLAGS) $(WARN) -o $@ $< $(LDLIBS)
$(B)/%: tests/%.c tests/testlib.h ddp.h | $(B)
	$(CC) -std=c99 $(CFLAGS) $(WARN) -o $@ $< $(LDLIBS)
$(B)/%: bench/%.c bench/bench_sizes.h ddp.h | $(B)
	$(CC) -std=c99 $(CFLAGS) $(WARN) -o $@ $< $(LDLIBS)
# test_equivalence's model (shared with test_fake_nccl and the GPU tests): one more prerequisite
$(B)/test_equivalence $(M)/test_equivalence: tests/support/equivalence_model.h
$(B)/test_zero2: tests/test_shard.c   # its harness, included

# The neural-texture host program (examples/engine/), built as C and as C++.
$(B)/texture: examples/engine/texture.c ddp.h | $(B)
	$(CC) -std=c99 $(CFLAGS) $(WARN) -o $@ $< $(LDLIBS)
$(B)/texture_cxx: examples/engine/texture.c ddp.h | $(B)
	$(CXX) -std=c++11 $(CFLAGS) $(WARN) -x c++ -o $@ $< -x none $(LDLIBS)

# (make test-asan / test-tsan: -Ofast with the sanitizer flags of OPT)
FASTMATH_SAN := $(filter -fsanitize=% -fno-sanitize-recover=% -fno-omit-frame-pointer,$(CFLAGS))
$(B)/test_fastmath_gcc: tests/test_fastmath.c tests/testlib.h ddp.h | $(B)
	$(CC) -std=c99 -Ofast -g $(FASTMATH_SAN) $(WARN) -o $@ $< $(LDLIBS)
$(B)/test_fastmath_clang: tests/test_fastmath.c tests/testlib.h ddp.h | $(B)
	$(CLANG) -std=c99 -Ofast -g $(FASTMATH_SAN) $(WARN) -o $@ $< $(LDLIBS)
# the trainer built -Ofast: its flags' NaN/Inf checks hold (tests/test_gpt.sh, flags)
$(B)/train_gpt_fastmath: examples/gpt/train_gpt.c examples/gpt/gpt_data.h examples/gpt/gpt.h ddp.h | $(B)
	$(CC) -std=c99 -Ofast -g $(FASTMATH_SAN) $(WARN) $(GPT_DEFS) -o $@ $< $(GPT_LIBS) $(LDLIBS)
# the own-autograd example built -Ofast: 2 ranks = 1 rank at 2x batch and identical replicas still
$(B)/own_autograd_fastmath: examples/own_autograd.c ddp.h | $(B)
	$(CC) -std=c99 -Ofast -g $(FASTMATH_SAN) $(WARN) -o $@ $< $(LDLIBS)

# The header, implementation included, must also compile as C++.
$(B)/cxx_check.o: tests/cxx_check.cpp ddp.h | $(B)
	$(CXX) -std=c++11 $(CFLAGS) $(WARN) -c -o $@ $<

# The tiny GPT (examples/gpt): matmuls through OpenBLAS when <cblas.h> and -lopenblas are
# there (Debian: libopenblas-dev), else the portable fallback. `make GPT_BLAS=0` forces it.
GPT_HASH := \#
ifndef GPT_BLAS
GPT_BLAS := $(shell printf '$(GPT_HASH)include <cblas.h>\nvoid openblas_set_num_threads(int);\nint main(void) { openblas_set_num_threads(1); return 0; }\n' \
              | $(CC) -x c - -o /dev/null -lopenblas >/dev/null 2>&1 && echo 1 || echo 0)
endif
ifeq ($(GPT_BLAS),1)
GPT_DEFS :=
GPT_LIBS := -lopenblas
else
GPT_DEFS := -DGPT_NO_BLAS
GPT_LIBS :=
endif

# -fno-math-errno: sqrtf (AdamW) and friends vectorize; results are unchanged (errno is never read).
$(B)/train_gpt: examples/gpt/train_gpt.c examples/gpt/gpt_data.h examples/gpt/gpt.h ddp.h | $(B)
	$(CC) -std=c99 $(CFLAGS) $(WARN) -fno-math-errno $(GPT_DEFS) -o $@ $< $(GPT_LIBS) $(LDLIBS)
$(B)/test_gpt: tests/test_gpt.c tests/support/gpt_reference.h tests/testlib.h examples/gpt/gpt.h examples/gpt/gpt_data.h ddp.h | $(B)
	$(CC) -std=c99 $(CFLAGS) $(WARN) -fno-math-errno $(GPT_DEFS) -o $@ $< $(GPT_LIBS) $(LDLIBS)
# The GPT's CUDA model run on the host (-DGPT_CUDA_EMULATE, C++17, no CUDA needed): the same
# kernel code and matmul calls as the GPU build, in host loops; the trainer and the GPU test
# built that way run in every `make test`, so the model's logic is checked without a GPU.
$(B)/train_gpt_emulated: examples/gpt/train_gpt.c examples/gpt/gpt_data.h examples/gpt/gpt_cuda.cuh examples/gpt/gpt.h ddp.h | $(B)
	$(CXX) -std=c++17 $(CFLAGS) $(WARN) -fno-math-errno -DGPT_CUDA_EMULATE $(GPT_DEFS) -x c++ -o $@ $< -x none $(GPT_LIBS) $(LDLIBS)
$(B)/test_gpt_gpu_emulated: tests/gpu/test_gpt_gpu.cu tests/support/gpt_reference.h tests/testlib.h examples/gpt/gpt_cuda.cuh examples/gpt/gpt.h ddp.h | $(B)
	$(CXX) -std=c++17 $(CFLAGS) $(WARN) -fno-math-errno -DGPT_CUDA_EMULATE $(GPT_DEFS) -x c++ -o $@ $< -x none $(GPT_LIBS) $(LDLIBS)

# ddp.h's NCCL backend run without a GPU: the implementation compiled by the C compiler with
# -DDDP_CUDA against tests/fakegpu's CUDA runtime and NCCL (host memory, ranks as threads), the
# kernels' launchers on the host with ddp_kernels.cuh's own element arithmetic (extracted by
# host_kernels.awk; C++, no fused multiply-adds). No nvcc needed: built and run by every `make
# test`, sanitizer runs included.
FAKE_DIR   := tests/fakegpu
FAKE_HDRS  := $(FAKE_DIR)/cuda_runtime_api.h $(FAKE_DIR)/cuda.h $(FAKE_DIR)/nccl.h $(FAKE_DIR)/fakegpu.h $(FAKE_DIR)/fake_internal.h
FAKE_OBJS  := $(B)/fakegpu/fake_cuda.o $(B)/fakegpu/fake_vm.o $(B)/fakegpu/fake_nccl.o $(B)/fakegpu/fake_kernels.o
$(B)/fakegpu:
	@mkdir -p $(B)/fakegpu
$(B)/fakegpu/ddp_kernels_host.inc: ddp_kernels.cuh $(FAKE_DIR)/host_kernels.awk | $(B)/fakegpu
	awk -f $(FAKE_DIR)/host_kernels.awk ddp_kernels.cuh > $@.tmp && mv $@.tmp $@
$(B)/fakegpu/%.o: $(FAKE_DIR)/%.c $(FAKE_HDRS) | $(B)/fakegpu
	$(CC) -std=c99 $(CFLAGS) $(WARN) -ffp-contract=off -pthread -I$(FAKE_DIR) -c -o $@ $<
$(B)/fakegpu/fake_kernels.o: $(FAKE_DIR)/fake_kernels.cpp $(B)/fakegpu/ddp_kernels_host.inc ddp_kernels.cuh $(FAKE_HDRS) | $(B)/fakegpu
	$(CXX) -std=c++11 $(CFLAGS) $(WARN) -ffp-contract=off -pthread -I$(FAKE_DIR) -I$(B)/fakegpu -c -o $@ $<
$(B)/test_fake_nccl: tests/test_fake_nccl.c tests/support/equivalence_model.h tests/testlib.h ddp.h ddp_kernels.cuh $(FAKE_OBJS) $(FAKE_HDRS) | $(B)
	$(CC) -std=c99 $(CFLAGS) $(WARN) -DDDP_CUDA -I$(FAKE_DIR) -c -o $(B)/fakegpu/test_fake_nccl.o $<
	$(CXX) $(CFLAGS) -o $@ $(B)/fakegpu/test_fake_nccl.o $(FAKE_OBJS) $(LDLIBS)

# The trainer with the CUDA model emulated on the host (as train_gpt_emulated) on ddp.h's NCCL
# backend on the fake GPU: one rank (the fake's ranks are threads of one process), so the model's
# ZeRO-3 gathers run ddp.h's device path (mapped granules, gathers as collectives) without a GPU.
$(B)/train_gpt_fakegpu: examples/gpt/train_gpt.c examples/gpt/gpt_data.h examples/gpt/gpt_cuda.cuh examples/gpt/gpt.h ddp.h ddp_kernels.cuh $(FAKE_OBJS) $(FAKE_HDRS) | $(B)
	$(CXX) -std=c++17 $(CFLAGS) $(WARN) -fno-math-errno -DGPT_CUDA_EMULATE -DDDP_CUDA -I$(FAKE_DIR) $(GPT_DEFS) -x c++ -c -o $(B)/fakegpu/train_gpt_fakegpu.o $<
	$(CXX) $(CFLAGS) -o $@ $(B)/fakegpu/train_gpt_fakegpu.o $(FAKE_OBJS) $(GPT_LIBS) $(LDLIBS)

# bf16 parameters (fp32 master) on the CPU backend and on the NCCL backend on the fake GPU, one binary.
$(B)/test_bf16_params: tests/test_bf16_params.c tests/testlib.h ddp.h ddp_kernels.cuh $(FAKE_OBJS) $(FAKE_HDRS) | $(B)
	$(CC) -std=c99 $(CFLAGS) $(WARN) -DDDP_CUDA -I$(FAKE_DIR) -c -o $(B)/fakegpu/test_bf16_params.o $<
	$(CXX) $(CFLAGS) -o $@ $(B)/fakegpu/test_bf16_params.o $(FAKE_OBJS) $(LDLIBS)
# uneven inputs (ddp_join) at every sharded level, CPU and NCCL on the fake GPU, one binary.
$(B)/test_shard_join: tests/test_shard_join.c tests/testlib.h ddp.h ddp_kernels.cuh $(FAKE_OBJS) $(FAKE_HDRS) | $(B)
	$(CC) -std=c99 $(CFLAGS) $(WARN) -DDDP_CUDA -I$(FAKE_DIR) -c -o $(B)/fakegpu/test_shard_join.o $<
	$(CXX) $(CFLAGS) -o $@ $(B)/fakegpu/test_shard_join.o $(FAKE_OBJS) $(LDLIBS)
# tests/test_hosts.sh's NCCL rank on the fake GPU: one process per rank, on namespace hosts.
$(B)/hosts_nccl_fake: tests/hosts_nccl.c ddp.h ddp_kernels.cuh $(FAKE_OBJS) $(FAKE_HDRS) | $(B)
	$(CC) -std=c99 $(CFLAGS) $(WARN) -DDDP_CUDA -DHOSTS_FAKEGPU -I$(FAKE_DIR) -c -o $(B)/fakegpu/hosts_nccl_fake.o $<
	$(CXX) $(CFLAGS) -o $@ $(B)/fakegpu/hosts_nccl_fake.o $(FAKE_OBJS) $(LDLIBS)

# The default corpus: Debian's fortunes text (installed when missing), never committed.
$(B)/fortunes.txt: | $(B)
	@if [ ! -f /usr/share/games/fortunes/fortunes ]; then \
	    echo "installing Debian's 'fortunes' package for the default corpus"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -qq fortunes >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq fortunes; } \
	    || { echo "cannot install 'fortunes'; pass --data PATH to build/train_gpt instead"; exit 1; }; fi
	find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | LC_ALL=C sort | xargs cat > $@.tmp
	mv $@.tmp $@

# The main job: train the tiny GPT on 2 local ranks (about two minutes on 2 cores). OpenBLAS
# is installed first when missing (Debian), then make starts again so the build finds it.
# It builds what the run needs and no more: ddprun and the CPU trainer, and the GPU trainer
# (with gpu_count and nccl_version, which pick it) only where nvcc is and a GPU is visible —
# nvcc without a GPU would otherwise spend minutes on GPU targets the run never starts. (A
# warning of a newer host compiler than CI's does not stop a run: WERROR=.)
# examples/gpt/train_gpt_run.sh picks the binary: build/gpu/train_gpt where a GPU is (2 ranks on
# 2 GPUs, or both on one through tools/nccl_one_gpu.sh), build/train_gpt (CPU) otherwise.
run:
	@$(MAKE) --no-print-directory deps
	@$(MAKE) --no-print-directory train-2-ranks
train-2-ranks: $(B)/ddprun $(B)/train_gpt $(B)/fortunes.txt
	@if [ -n "$(strip $(NVCC))" ] && { nvidia-smi -L 2>/dev/null | grep -q '^GPU' || ls /dev/nvidia[0-9]* >/dev/null 2>&1; }; then \
	    $(MAKE) --no-print-directory WERROR= $(G)/train_gpt $(G)/gpu_count $(G)/nccl_version; fi
	examples/gpt/train_gpt_run.sh $(B) --data $(B)/fortunes.txt --steps 1200 --batch 8 --eval-every 200 --log-every 25 --sample 600
deps:
	@[ "$(GPT_BLAS)" = 1 ] || ! command -v apt-get >/dev/null || { echo "installing libopenblas-dev for the GPT's matmuls"; \
	    { apt-get install -y -qq libopenblas-dev >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq libopenblas-dev; }; } \
	    || echo "no OpenBLAS: the GPT uses its portable matmuls (slower)"; }

test: all
	@tests/run.sh $(B)

# The build a GPU window runs (bench/gpu/check_bf16.sh), made here and carried there: build-gpu/
# (ignored by git: name it in the device call's carry). Portable host code (-march=x86-64-v3:
# -march=native here may emit instructions the GPU machine's CPU lacks), sm_90 device code, no
# OpenBLAS (the GPU machine may not have it; the CPU model in the tests is small), warnings shown.
GPU_WINDOW_B := build-gpu
GPU_WINDOW_TARGETS := ddprun gpu/gpu_count gpu/nccl_version gpu/train_gpt gpu/test_gpt_gpu gpu/test_gpu_kernels
ifeq ($(strip $(NVCC)),)
gpu-window:
	@echo "gpu-window: no nvcc here: nothing to build" && false
else
gpu-window:
	@$(MAKE) --no-print-directory B=$(GPU_WINDOW_B) HOST_ARCH=x86-64-v3 GPT_BLAS=0 WERROR= $(addprefix $(GPU_WINDOW_B)/,$(GPU_WINDOW_TARGETS))
	@echo "commit $$(git rev-parse --short HEAD 2>/dev/null)$$(git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo +changes), made $$(date -u +%Y-%m-%dT%H:%M:%SZ) on $$(uname -n): HOST_ARCH=x86-64-v3 CUDA_ARCH=$(CUDA_ARCH) GPT_BLAS=0" >$(GPU_WINDOW_B)/.gpu-window
	@echo "gpu-window: $(GPU_WINDOW_B)/ built ($$(du -sh $(GPU_WINDOW_B) | cut -f1)); carry it: run(carry=[\"$(GPU_WINDOW_B)\"], command=\"OUT=\$$OUT bash bench/gpu/check_bf16.sh\")"
endif

bench: bench-deps $(B)/ddprun $(B)/bench_allreduce $(B)/copy_bw $(B)/bench_overlap $(B)/train_gpt bench-gpu
	@bench/compare_allreduce.sh
	@bench/overlap.sh
	@bench/bench_gpt.sh $(B)
	@bench/mpi_hosts.sh $(B)
	@bench/scaling_hosts.sh $(B)
	@bench/outer_hosts.sh $(B)

# Across slow links (issue 26): DDP vs DiLoCo vs streaming DiLoCo on 2 namespace hosts at 1 Gbit/s
# and 100 Mbit/s, the scaling model beside each run (bench/RESULTS.md, bench/outer_hosts.svg);
# then 3 hosts, 2 ranks a host (groups of 2) and a 25.6 MB shape (RESULTS' further tables).
bench-outer:
	@bench/outer_hosts.sh $(B)
	@bench/outer_hosts.sh $(B) --hosts 3 --rates 100mbit --runs "ddp diloco50_lr1_m0.5 stream25f5t2_lr1_m0.5_int8" --int8-at "" --tag hosts3
	@bench/outer_hosts.sh $(B) --ranks-per-host 2 --steps 200 --base-steps 30 --rates 100mbit --runs "ddp diloco50_lr1_m0.5 stream25f5t2_lr1_m0.5_int8" --int8-at "" --tag rph2
	@bench/outer_hosts.sh $(B) --model "--layers 8 --dim 256" --steps 20 --base-steps 6 --eval-every 10 --rates "1gbit 100mbit" --runs "ddp diloco10_lr1_m0.5 stream10f5t1_lr1_m0.5_int8" --int8-at "" --tag large

# What the side-by-side comparisons run against: Open MPI and PyTorch's gloo (Debian's packages;
# without apt-get, or when it fails, the comparison skips them with a note).
bench-deps:
	@command -v mpicc >/dev/null && command -v mpirun >/dev/null && /usr/bin/python3 -c 'import torch' 2>/dev/null || \
	    ! command -v apt-get >/dev/null || { echo "installing openmpi-bin libopenmpi-dev python3-torch for the comparisons"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev python3-torch >/dev/null; } \
	    || echo "could not install them: the comparisons skip Open MPI and gloo"; }

# Issue 27: the tiny GPT's step time at every sharding level against DDP at N = 2 and 4, ZeRO-3's
# prefetch on and off, interleaved rounds, the same bits checked (bench/RESULTS.md, zero-steps).
bench-zero: $(B)/ddprun $(B)/train_gpt
	@bench/zero_steps.sh $(B)

# The tiny GPT's throughput: ours on 1 and 2 ranks next to PyTorch (needs python3-torch for that half).
bench-gpt: $(B)/ddprun $(B)/train_gpt
	@bench/bench_gpt.sh $(B)

# GPU benchmarks: skipped with a line where there is no nvcc or no GPU.
ifeq ($(strip $(NVCC)),)
bench-gpu:
	@echo "SKIP gpu benchmarks: no nvcc"
else
bench-gpu: $(GPU_BENCH) $(G)/train_gpt
	@$(GPU_BENCH)
	@bench/gpu/bench_gpt_gpu.sh $(B)
endif

# The same tests under sanitizers, each in a build directory of its own (CPU parts only: the
# GPU binaries are not sanitizer builds, and their tests need a GPU).
ASAN_OPT := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
TSAN_OPT := -O1 -g -fsanitize=thread
test-asan:
	@$(MAKE) --no-print-directory B=build-asan OPT="$(ASAN_OPT)" NVCC= test
test-tsan:
	@$(MAKE) --no-print-directory B=build-tsan OPT="$(TSAN_OPT)" NVCC= test

# libFuzzer targets (clang): the rendezvous store's message handling, ddp.h's checkpoint
# loader (ddp_load), the GPT's data loader, Slurm's hostlist syntax; FUZZ_SECONDS each.
FUZZ_SECONDS ?= 60
FUZZ_CC      ?= clang
FUZZERS      := $(B)/fuzz_store $(B)/fuzz_checkpoint $(B)/fuzz_data $(B)/fuzz_hostlist
FUZZ_FLAGS   := -std=c99 -g -O1 -fno-math-errno -fsanitize=fuzzer,address,undefined $(WARN)
$(B)/fuzz_store: fuzz/fuzz_store.c ddp.h | $(B)
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $< $(LDLIBS)
$(B)/fuzz_checkpoint: fuzz/fuzz_checkpoint.c ddp.h | $(B)
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $< $(LDLIBS)
$(B)/fuzz_hostlist: fuzz/fuzz_hostlist.c ddp.h | $(B)
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $< $(LDLIBS)
$(B)/fuzz_data: fuzz/fuzz_data.c examples/gpt/gpt_data.h ddp.h | $(B)
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $< $(LDLIBS)
fuzz: $(FUZZERS)
	@fuzz/run.sh $(B) $(FUZZ_SECONDS)

clean:
	rm -rf $(B) build-asan build-tsan

help:
	@echo "make              build everything: the library's tests and tools, the GPT, and every GPU target where nvcc is"
	@echo "make run          train the tiny GPT on 2 local ranks and print a sample (builds only what it runs)"
	@echo "make test         build everything, then every test (GPU tests SKIP without a GPU): 'N passed, N failed'"
	@echo "make test-asan    the same tests under AddressSanitizer + UBSan (CPU parts, build-asan/)"
	@echo "make test-tsan    the same tests under ThreadSanitizer (CPU parts, build-tsan/)"
	@echo "make fuzz         the libFuzzer targets, FUZZ_SECONDS (60) each (clang)"
	@echo "make windows      the Windows programs (build/win/*.exe, MinGW-w64) that tests/test_windows.sh runs under Wine"
	@echo "make mpi          the MPI backend's programs (build/mpi/: mpi_steps, train_gpt, tests), with mpicc"
	@echo "make bench        allreduce vs Open MPI and gloo, overlap and bucket sweep, the GPT's throughput, GPU benchmarks"
	@echo "make bench-gpt    the tiny GPT's tokens/s on 1 and 2 ranks, next to PyTorch"
	@echo "make bench-zero   step time at every sharding level vs DDP, N = 2 and 4, ZeRO-3 prefetch on/off"
	@echo "make bench-outer  DDP vs DiLoCo vs streaming DiLoCo across 2 namespace hosts at 1 Gbit/s and 100 Mbit/s"
	@echo "make bench-deps   install Open MPI and PyTorch (Debian packages) for the comparisons; make bench does it first"
	@echo "make bench-gpu    GPU benchmarks: AdamW bandwidth, ddp.h's cost at 1 rank, GPT-2-small-sized training (SKIP without a GPU)"
	@echo "make deps         install OpenBLAS for the GPT's matmuls (Debian, when missing)"
	@echo "make clean        remove build/, build-asan/, build-tsan/"
	@echo "variables: CUDA_ARCH (sm_90), NVCC, CUDA_HOME, NCCL_HOME, WERROR (nvcc's -Werror; WERROR= shows warnings only),"
	@echo "           GPT_BLAS (0: portable matmuls), OPT, B (build directory)"
	@echo "make gpu-window   build-gpu/: the GPU window's binaries, made here (portable -march=x86-64-v3) for bench/gpu/check_bf16.sh"
	@echo "on a GPU machine: bench/gpu/check_tests.sh (environment, build, GPU tests), bench/gpu/check_bench.sh (GPU benchmarks), check_shakespeare.sh (shakespeare_char target)"
