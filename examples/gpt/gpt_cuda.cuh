/* gpt_cuda.cuh — the GPT of gpt.h on a GPU: the same parameters (registered and initialised by
   gpt.h's own gpt_register_params, so a seed gives the same bits), the same ops in the same
   order, the same tape; activations in device memory, cuBLAS for every matmul (attention's
   Q K^T and P V included, strided-batched over the heads, or with GPT_KERNELS=2 one batched
   call over sequences and heads), kernels of ours for the rest.

   Include after ddp.h and gpt.h in a file nvcc compiles (CUDA C++17); link cuBLAS.

   Streams. Every kernel and cuBLAS call goes to ddp.h's compute stream (desc.cuda_stream, read
   back with ddp_config). Each op records its backward on the ddp tape with the parameters it
   finishes, exactly as gpt.h does, so when ddp_backward replays the tape ddp.h records an event
   per finished bucket and its comm stream averages that bucket while the compute stream goes
   on with earlier layers' backward.
   The host never waits inside forward or backward: a batch goes up through a ring of pinned
   slots (the host waits for a slot only when it runs GC_UPLOAD_SLOTS forwards ahead of the
   GPU), and each forward's loss stays on the device until gpt_cuda_losses() reads them all at
   once (the trainer does that for its progress lines, after ddp_adamw_step).
   Sharded parameters (ZeRO-3, DDP_SHARD_PARAMETERS): gpt.h's units (gpt_register_params declares
   them), gathered, prefetched and released by the forward exactly as gpt_forward does; the
   tape's backward gathers them again (ddp.h). On NCCL a gather is an all-gather on ddp.h's comm
   stream that the compute stream waits on, so every rank must run the same forwards (the
   trainer's sampling runs on every rank then). bf16 needs the context's bf16 parameters there.

   Determinism. No atomics anywhere. Every reduction has a fixed order: a row's sums go through
   a fixed butterfly of the warp; parameter gradients of LayerNorm and biases are column sums
   over GC_CHUNKS fixed chunks of rows, then the chunks in order; the embedding's backward gives
   each (token, column) one thread that adds the positions holding that token in increasing
   order (the host sorts the positions when it uploads the batch) — the CPU's order too. cuBLAS
   with one stream, atomics off, is deterministic on one GPU model and library version. So two
   runs give the same bits.

   Kernels (GPT_KERNELS, read by gpt_cuda_create; gpt_cuda_set_kernels). 1, the default: as
   above. 2: the token embedding's backward in segments of at most GC_WTE_SEGMENT positions
   (partial sums, then each token's segments in order: a blocked sum, deterministic, not the
   CPU's order), the causal softmax in one pass plus the write (online max and sum) and its
   backward reading the lower triangle only, GELU and the bias init as 16-byte maps (the
   same bits as the one-element kernels), each attention matmul as one pointer-array batched
   call over B x heads (gc_attn_gemm) and LayerNorm's backward as one launch plus the partials'
   sum (gc_layernorm_bwd_fused), both with GPT_KERNELS=1's bits. Both are kept so that one GPU call can time old and
   new (bench/gpu/check_bf16.sh).

   Attention (GPT_ATTENTION, read by gpt_cuda_create; gpt_cuda_set_attention). explicit, the
   default: as above, the [B, NH, T, T] scores and probabilities in memory, cuBLAS for Q K^T,
   P V and their backward. fused: no T x T matrix anywhere (gc_att_fused_fwd and the two backward
   row functions): a warp per query row walks its keys with an online softmax, keeps the head's
   output accumulator in registers (head size <= GC_ATT_MAX_HS, refused otherwise) and saves the
   row's logsumexp ([B, NH, T] floats per layer); the backward recomputes P from it, a warp per
   query row for dQ (and D = dO . O), a warp per key row for dK and dV, in fixed order, no
   atomics. Dropout on P draws the explicit path's mask (the same element index), so both train
   the same model. A model created fused makes no [T, T] buffers (so it cannot switch back);
   created explicit it can switch either way. Not the same bits as explicit (other summation
   orders, and in bf16 no rounding of S and P): test_gpt_gpu's fused part bounds the difference.

   Op times (GPT_OP_TIMES=1): per-op CUDA-event times, printed by the trainer (gc_op_timer).

   Precision (gpt_cuda_create's precision). GPT_CUDA_FP32: fp32 throughout, TF32 off
   (CUBLAS_DEFAULT_MATH never uses TF32 for SGEMM). GPT_CUDA_TF32: TF32 tensor cores (faster,
   ~1e-3 relative error in matmuls). GPT_CUDA_BF16: activations, parameters and gradients
   stored in bf16 (ddp.h's param_dtype DDP_DTYPE_BF16 working copies; fp32 master weights and
   AdamW there); matmuls cublasGemmEx with fp32 compute; every kernel computes in fp32 and
   rounds once on store; LayerNorm's mean/rstd, the bias/LayerNorm column sums and the loss are
   fp32. One templated body (S = float or gc_bf16) serves all three.

   Errors. Every CUDA and cuBLAS call and every kernel launch (cudaGetLastError) is checked; a
   failure prints "gpt_cuda: FILE:LINE: what failed: why" and exits, as gpt.h does on its errors.

   Host emulation (-DGPT_CUDA_EMULATE, any C++17 compiler, no CUDA at all). Each kernel is a
   row or element function, written once: on the GPU a warp shares a row (lane l takes elements
   l, l+32, ...) or a thread takes an element; in emulation a host loop calls the same function
   with a "warp" of one lane (a block function, gc_for_blocks: its 8 warps, then its 256
   threads, one at a time). cuBLAS calls go to a naive column-major sgemm that enforces
   cuBLAS's argument rules (leading dimensions; for the batched calls also the count, the
   pointer arrays and distinct outputs) and does not read C when beta is 0; device
   memory is malloc, one block per buffer (so AddressSanitizer sees every overrun), filled with
   NaN like the GPU's buffers (a read of something never written shows up). The CPU tests run
   the model that way on every machine: its buffers, strides, the row-major to column-major
   mapping, the tape, the ids — everything but the CUDA calls themselves. */
#ifndef GPT_CUDA_CUH
#define GPT_CUDA_CUH

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef GPT_CUDA_EMULATE
#define DDP_KERNELS_BF16_ONLY   /* the bf16 rounding only: no CUDA headers here */
#include "../../ddp_kernels.cuh"
#define GC_HD
typedef void *gc_stream;
typedef void *gc_blas;
typedef int gc_event;
#else
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include "../../ddp_kernels.cuh"   /* ddp.h compiled by nvcc has it already: its bf16 rounding */
#define GC_HD __host__ __device__
typedef cudaStream_t gc_stream;
typedef cublasHandle_t gc_blas;
typedef cudaEvent_t gc_event;
#endif

enum {
    GC_WARP = 32,
    GC_THREADS = 256,          /* threads per block: 8 rows (warps) or 256 elements */
    GC_CHUNKS = 64,            /* column sums: rows are cut into this many chunks, summed in order */
    GC_UPLOAD_SLOTS = 8,       /* pinned batch slots: how far the host may run ahead */
    GC_LOSS_SLOTS = 1024,      /* per-forward losses kept on the device until read */
    GC_WTE_SEGMENT = 32,       /* GPT_KERNELS=2: positions per partial sum of the token embedding's backward */
    GC_ATT_MAX_HS = 128,       /* GPT_ATTENTION=fused: the largest head size (a row's vectors live in registers) */
    GC_ATT_KEYS = 4            /* GPT_ATTENTION=fused: keys (queries) whose dot products a row reduces together */
};

/* ---------------------------------------------------------------------------------------------
   Errors: print where and why, exit (the trainer is a program, not a library).
   --------------------------------------------------------------------------------------------- */
static void gc_die(const char *file, int line, const char *what, const char *why) {
    fprintf(stderr, "gpt_cuda: %s:%d: %s failed: %s\n", file, line, what, why);
    exit(1);
}

#ifndef GPT_CUDA_EMULATE
static void gc_check_cuda(cudaError_t e, const char *what, const char *file, int line) {
    char why[256];
    if (e == cudaSuccess) return;
    snprintf(why, sizeof why, "%s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
    gc_die(file, line, what, why);
}
static void gc_check_cublas(cublasStatus_t s, const char *what, const char *file, int line) {
    char why[256];
    if (s == CUBLAS_STATUS_SUCCESS) return;
    snprintf(why, sizeof why, "%s (%s)", cublasGetStatusName(s), cublasGetStatusString(s));
    gc_die(file, line, what, why);
}
#define GC_CUDA(call) gc_check_cuda((call), #call, __FILE__, __LINE__)
#define GC_CUBLAS(call) gc_check_cublas((call), #call, __FILE__, __LINE__)
#endif

/* ---------------------------------------------------------------------------------------------
   Lane groups and launches. A row function takes the lanes that share its row: a warp on the
   GPU, one lane in emulation. sum/max leave the same bits in every lane: the butterfly adds
   the same two values in each lane of a pair (a + b == b + a exactly), stage after stage.
   --------------------------------------------------------------------------------------------- */
struct gc_one_lane {
    enum { WIDTH = 1 };   /* lanes per row, known at compile time (register arrays per lane) */
    GC_HD int lane() const { return 0; }
    GC_HD int size() const { return 1; }
    GC_HD float sum(float v) const { return v; }
    GC_HD double sum(double v) const { return v; }
    GC_HD float max(float v) const { return v; }
};

#ifndef GPT_CUDA_EMULATE
struct gc_warp_lanes {
    enum { WIDTH = GC_WARP };
#ifdef __CUDA_ARCH__
    __device__ int lane() const { return (int)(threadIdx.x % GC_WARP); }
    __device__ int size() const { return GC_WARP; }
    __device__ float sum(float v) const {
        for (int o = GC_WARP / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
        return v;
    }
    __device__ double sum(double v) const {
        for (int o = GC_WARP / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
        return v;
    }
    __device__ float max(float v) const {
        for (int o = GC_WARP / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
        return v;
    }
#else   /* the host pass of nvcc sees the declarations only */
    int lane() const { return 0; }
    int size() const { return 1; }
    float sum(float v) const { return v; }
    double sum(double v) const { return v; }
    float max(float v) const { return v; }
#endif
};

/* One warp per row. blockDim is a multiple of 32, so a row never straddles two warps and the
   `row < rows` branch is the same for every lane of a warp (the shuffles need the full warp). */
template <class Op> __global__ void gc_rows_kernel(Op op, int rows) {
    int row = (int)(((size_t)blockIdx.x * blockDim.x + threadIdx.x) / GC_WARP);
    if (row < rows) op(gc_warp_lanes(), row);
}

template <class Op> __global__ void gc_each_kernel(Op op, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) op(i);
}

/* A block op: op.rows(lanes, block, warp, warps) with each warp whole (its loop bounds depend on
   the warp only, so the shuffles have every lane), then op.columns(block, thread, threads). The
   two phases touch disjoint outputs, so no barrier between them. */
template <class Op> __global__ void gc_blocks_kernel(Op op) {
    op.rows(gc_warp_lanes(), (int)blockIdx.x, (int)(threadIdx.x / GC_WARP), (int)(blockDim.x / GC_WARP));
    op.columns((int)blockIdx.x, (int)threadIdx.x, (int)blockDim.x);
}
#endif

template <class Op> static void gc_for_rows(gc_stream s, const Op &op, int rows, const char *what, const char *file, int line) {
    if (rows <= 0) return;
#ifdef GPT_CUDA_EMULATE
    (void)s; (void)what; (void)file; (void)line;
    for (int r = 0; r < rows; r++) op(gc_one_lane(), r);
#else
    unsigned blocks = (unsigned)(((size_t)rows * GC_WARP + GC_THREADS - 1) / GC_THREADS);
    gc_rows_kernel<<<blocks, GC_THREADS, 0, s>>>(op, rows);
    gc_check_cuda(cudaGetLastError(), what, file, line);
#endif
}

template <class Op> static void gc_for_each(gc_stream s, const Op &op, size_t n, const char *what, const char *file, int line) {
    if (n == 0) return;
#ifdef GPT_CUDA_EMULATE
    (void)s; (void)what; (void)file; (void)line;
    for (size_t i = 0; i < n; i++) op(i);
#else
    unsigned blocks = (unsigned)((n + GC_THREADS - 1) / GC_THREADS);
    gc_each_kernel<<<blocks, GC_THREADS, 0, s>>>(op, n);
    gc_check_cuda(cudaGetLastError(), what, file, line);
#endif
}

template <class Op> static void gc_for_blocks(gc_stream s, const Op &op, int blocks, const char *what, const char *file, int line) {
    if (blocks <= 0) return;
#ifdef GPT_CUDA_EMULATE
    (void)s; (void)what; (void)file; (void)line;
    for (int b = 0; b < blocks; b++) {   /* the GPU's warps and threads, one at a time */
        for (int w = 0; w < GC_THREADS / GC_WARP; w++) op.rows(gc_one_lane(), b, w, GC_THREADS / GC_WARP);
        for (int t = 0; t < GC_THREADS; t++) op.columns(b, t, GC_THREADS);
    }
#else
    gc_blocks_kernel<<<(unsigned)blocks, GC_THREADS, 0, s>>>(op);
    gc_check_cuda(cudaGetLastError(), what, file, line);
#endif
}

#define GC_FOR_ROWS(m, op, rows) gc_for_rows((m)->stream, (op), (rows), "the kernel launch of '" #op "'", __FILE__, __LINE__)
#define GC_FOR_EACH(m, op, n) gc_for_each((m)->stream, (op), (n), "the kernel launch of '" #op "'", __FILE__, __LINE__)

/* ---------------------------------------------------------------------------------------------
   bf16 (--bf16): the upper 16 bits of a float, rounded to nearest even (NaN stays a quiet NaN):
   ddp_kernels.cuh's own rounding (ddp_k__to_bf16, ddp_k__from_bf16, __host__ __device__), so
   the GPU, the emulation and ddp.h give the same bits. gc_ld widens a stored value to float,
   gc_put rounds a float into storage: the kernels' bodies use them for every activation,
   parameter and gradient, so one body serves fp32 (identity) and bf16.
   --------------------------------------------------------------------------------------------- */
typedef uint16_t gc_bf16;

static GC_HD inline float gc_ld(float v) { return v; }
static GC_HD inline float gc_ld(gc_bf16 h) { return ddp_k__from_bf16(h); }
static GC_HD inline void gc_put(float *p, float v) { *p = v; }
static GC_HD inline void gc_put(gc_bf16 *p, float v) { *p = ddp_k__to_bf16(v); }
/* ---------------------------------------------------------------------------------------------
   Per-op times (GPT_OP_TIMES=1): where a step's device time goes, without a profiler. Each op's
   launches sit between two events recorded on the compute stream (host clock readings in
   emulation, where every launch runs at once); the pairs are read when the trainer ends a step
   (gpt_cuda_op_times_step, after the step's own host wait) and summed per name. The step's span
   (from the previous step's end) minus the ops' sum is what no op covers: launch gaps, the
   compute stream waiting for the last gradient bucket (exposed communication), the host. Events
   cost a little: the numbers are for where time goes, the tokens/s of a run without it for speed.
   --------------------------------------------------------------------------------------------- */
enum { GC_TIMER_PAIRS = 4096, GC_TIMER_NAMES = 64 };
#ifdef GPT_CUDA_EMULATE
#include <time.h>
typedef double gc_tick;
static void gc_tick_record(gc_tick *t, gc_stream s) {
    struct timespec ts;
    (void)s;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    *t = ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}
static float gc_tick_ms(const gc_tick *a, const gc_tick *b) { return (float)(*b - *a); }
static void gc_tick_wait(const gc_tick *t) { (void)t; }
#else
typedef cudaEvent_t gc_tick;
static void gc_tick_record(gc_tick *t, gc_stream s) { gc_check_cuda(cudaEventRecord(*t, s), "cudaEventRecord (GPT_OP_TIMES)", __FILE__, __LINE__); }
static float gc_tick_ms(const gc_tick *a, const gc_tick *b) {
    float ms = 0;
    gc_check_cuda(cudaEventElapsedTime(&ms, *a, *b), "cudaEventElapsedTime (GPT_OP_TIMES)", __FILE__, __LINE__);
    return ms;
}
static void gc_tick_wait(const gc_tick *t) { gc_check_cuda(cudaEventSynchronize(*t), "cudaEventSynchronize (GPT_OP_TIMES)", __FILE__, __LINE__); }
#endif
typedef struct gc_op_timer {
    gc_tick ticks[2 * GC_TIMER_PAIRS], step_ticks[2];
    const char *pending[GC_TIMER_PAIRS];   /* the open pairs' names; pair i: ticks 2i, 2i+1 */
    int npending, open, step_started, cur;
    struct { const char *name; double ms; long calls; } sum[GC_TIMER_NAMES];
    int nsum;
    double step_ms;                        /* the steps' spans, summed */
    long steps, overflows;
} gc_op_timer;

static void gc_timer_flush(gc_op_timer *t) {
    int i, k;
    if (!t->npending) return;
    gc_tick_wait(&t->ticks[2 * t->npending - 1]);
    for (i = 0; i < t->npending; i++) {
        for (k = 0; k < t->nsum && strcmp(t->sum[k].name, t->pending[i]) != 0; k++) {}
        if (k == t->nsum) {
            if (t->nsum == GC_TIMER_NAMES) continue;   /* more names than the table: not the model's ops */
            t->sum[k].name = t->pending[i]; t->sum[k].ms = 0; t->sum[k].calls = 0;
            t->nsum++;
        }
        t->sum[k].ms += gc_tick_ms(&t->ticks[2 * i], &t->ticks[2 * i + 1]);
        t->sum[k].calls++;
    }
    t->npending = 0;
}

/* ---------------------------------------------------------------------------------------------
   The model's state.
   --------------------------------------------------------------------------------------------- */
/* Activations are void *: float, or gc_bf16 with --bf16 (the ops cast them to their S);
   LayerNorm's mean and rstd and the losses are float in both modes. */
typedef struct gpt_cuda_layer {    /* one block's saved activations (device), as gpt_layer_acts */
    void *res_in;                  /* [BT, C] the block's input: the previous block's res_out */
    void *ln1;
    float *ln1_mean, *ln1_rstd;
    void *qkv;                     /* [BT, 3C] */
    void *att;                     /* [B, NH, T, T] softmax probabilities, 0 above the diagonal (NULL:
                                      created with GPT_ATTENTION=fused) */
    float *lse;                    /* [B, NH, T] GPT_ATTENTION=fused: each query row's logsumexp */
    void *att_out;                 /* [BT, C] */
    void *res_mid;
    void *ln2;
    float *ln2_mean, *ln2_rstd;
    void *fc, *gelu;               /* [BT, 4C] (GELU's backward recomputes its sigmoid) */
    void *res_out;
} gpt_cuda_layer;

typedef struct gpt_cuda {
    gpt_config cfg;
    ddp_context *ddp;
    int wte, wpe, lnfw, lnfb;
    gpt_layer_ids *layer;
    gpt_cuda_layer *acts;
    void *res0, *lnf, *logits;
    float *lnf_mean, *lnf_rstd;
    /* gradient scratch shared by every layer, as in gpt.h; datt: [B, NH, T, T] */
    void *dres, *dln, *dqkv, *datt_out, *dfc, *dgelu, *dlogits, *datt;
    float *row_loss;               /* [BT] the last forward's loss per position */
    float *losses;                 /* [GC_LOSS_SLOTS] one mean loss per forward, not yet read */
    float *partial_a, *partial_b;  /* [GC_CHUNKS, 4C] column sums per chunk of rows */
    /* the batch on the device: tokens [BT], targets [BT], token_start [V+1], positions [BT]
       (the positions sorted by token, increasing within a token: the embedding's backward) */
    int *tokens, *targets, *token_start, *positions;
    /* GPT_KERNELS=2: the sorted positions cut into segments of at most GC_WTE_SEGMENT, never
       across tokens: token v's are seg_first[v] .. seg_first[v + 1] - 1 [V+1]; segment s covers
       positions[seg_begin[s] .. seg_begin[s + 1]) [max_segments + 1] */
    int *seg_first, *seg_begin, segments, max_segments;
    float *wte_partial;            /* [max_segments, C] */
    size_t batch_ints;
    int kernels;                   /* 1: the kernels as they were; 2 (GPT_KERNELS=2): the new ones */
    void **attn_ptrs;              /* GPT_KERNELS=2: [3, batch * heads] operand pointers of one batched attention matmul */
    int attention_fused;           /* GPT_ATTENTION=fused: gc_attention_fused instead of gc_attention */
    float *att_D;                  /* [B, NH, T] the fused backward's dO . O per query row */
    int *upload[GC_UPLOAD_SLOTS];  /* pinned host slots, same layout */
    gc_event upload_done[GC_UPLOAD_SLOTS];
    int upload_used[GC_UPLOAD_SLOTS], upload_next;
    int losses_pending;            /* forwards whose loss is in `losses` */
    float *losses_host;            /* pinned, GC_LOSS_SLOTS */
    float *loss_list;              /* read losses, in forward order */
    int loss_count, loss_cap;
    gc_stream stream;
    gc_blas blas;
    int tf32;
    /* --bf16 (precision GPT_CUDA_BF16): activations, parameters and gradients in bf16. The
       working copies and gradients: ddp.h's (param_dtype DDP_DTYPE_BF16), or, on an fp32
       context (own16), the model's own params16 / grads16, laid out as ddp.h's fp32 flat
       buffers (flat_params) and synchronised with them by gpt_cuda_bf16_*. */
    int bf16, own16;
    size_t act_bytes;              /* sizeof(float) or sizeof(gc_bf16) */
    float *flat_params, *flat_grads;
    gc_bf16 *params16, *grads16;
    size_t flat_floats;            /* own16: their length, ddp.h's flat buffer's (its offsets, padding included) */
    int B, T;                      /* this forward's shape */
    /* dropout, as gpt.h (gpt_cuda_set_dropout, gpt_cuda_set_rows); ddrop: [BT, C] the masked
       branch gradient */
    float drop_p, drop_scale;
    uint32_t drop_threshold;
    uint64_t drop_seed, drop_step, drop_row0, drop_stride;
    int dropping;
    void *ddrop;
    size_t num_floats;
    int units;                     /* units declared (sharded parameters), as gpt.h: 0 the embeddings, 1..L the
                                      blocks, L + 1 the final LayerNorm; the forward gathers and releases them */
    struct gc_op_timer *timer;     /* GPT_OP_TIMES=1: per-op device times (NULL: off) */
    void **allocs;                 /* every device buffer, freed by gpt_cuda_destroy */
    int num_allocs, cap_allocs;
} gpt_cuda;

/* gc_time(m, "name") ... gc_time_end(m) around an op's launches (not nested). */
static void gc_time(gpt_cuda *m, const char *name) {
    gc_op_timer *t = m->timer;
    if (!t) return;
    if (t->npending == GC_TIMER_PAIRS) { gc_timer_flush(t); t->overflows++; }   /* a wait inside the step: rare */
    t->pending[t->npending] = name;
    gc_tick_record(&t->ticks[2 * t->npending], m->stream);
    t->open = 1;
}
static void gc_time_end(gpt_cuda *m) {
    gc_op_timer *t = m->timer;
    if (!t || !t->open) return;
    gc_tick_record(&t->ticks[2 * t->npending + 1], m->stream);
    t->npending++;
    t->open = 0;
}

/* ---------------------------------------------------------------------------------------------
   Memory and copies.
   --------------------------------------------------------------------------------------------- */
static void *gc_device_alloc(gpt_cuda *m, size_t bytes) {
    void *p = NULL;
    if (m->num_allocs == m->cap_allocs) {
        int cap = m->cap_allocs ? 2 * m->cap_allocs : 64;
        void **grown = (void **)realloc(m->allocs, sizeof(void *) * (size_t)cap);
        if (!grown) gc_die(__FILE__, __LINE__, "realloc", "out of host memory");
        m->allocs = grown;
        m->cap_allocs = cap;
    }
#ifdef GPT_CUDA_EMULATE
    if (!(p = malloc(bytes ? bytes : 1))) gc_die(__FILE__, __LINE__, "malloc (emulated device memory)", "out of memory");
    memset(p, 0xff, bytes);   /* NaN as floats, -1 as ints: what was never written shows */
#else
    GC_CUDA(cudaMalloc(&p, bytes ? bytes : 1));
    GC_CUDA(cudaMemset(p, 0xff, bytes));
#endif
    m->allocs[m->num_allocs++] = p;
    return p;
}
static float *gc_floats(gpt_cuda *m, size_t n) { return (float *)gc_device_alloc(m, n * sizeof(float)); }
static void *gc_acts(gpt_cuda *m, size_t n) { return gc_device_alloc(m, n * m->act_bytes); }   /* n activations */

static void *gc_pinned_alloc(size_t bytes) {
    void *p = NULL;
#ifdef GPT_CUDA_EMULATE
    if (!(p = malloc(bytes))) gc_die(__FILE__, __LINE__, "malloc", "out of host memory");
#else
    GC_CUDA(cudaMallocHost(&p, bytes));
#endif
    return p;
}
static void gc_pinned_free(void *p) {
#ifdef GPT_CUDA_EMULATE
    free(p);
#else
    if (p) cudaFreeHost(p);
#endif
}

/* Blocking copies between host memory and device buffers, ordered after everything enqueued
   on `stream` (ddp.h's cuda_stream): for checkpoints, sampling and tests, never inside a step. */
static inline void gpt_cuda_download(void *stream, void *host, const void *device, size_t bytes) {
#ifdef GPT_CUDA_EMULATE
    (void)stream;
    memcpy(host, device, bytes);
#else
    GC_CUDA(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream));
    GC_CUDA(cudaStreamSynchronize((cudaStream_t)stream));
#endif
}
static inline void gpt_cuda_upload(void *stream, void *device, const void *host, size_t bytes) {
#ifdef GPT_CUDA_EMULATE
    (void)stream;
    memcpy(device, host, bytes);
#else
    GC_CUDA(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream));
    GC_CUDA(cudaStreamSynchronize((cudaStream_t)stream));   /* the caller may free `host` at once */
#endif
}

/* ---------------------------------------------------------------------------------------------
   Matmul. gc_gemm is gpt.h's gpt_gemm — row-major C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C,
   op = transpose when ta/tb — for `count` problems spaced by the strides (attention: the heads).
   cuBLAS is column-major, and a row-major matrix read column-major is its transpose, so this
   asks cuBLAS for C^T[N,M] = op(B)^T op(A)^T: the operands swap places, M and N swap roles, each
   operand keeps its own transpose flag and leading dimension.
   In fp32, cublasSgemm; in bf16 (--bf16), cublasGemmEx / cublasGemmStridedBatchedEx with bf16
   A, B and C and CUBLAS_COMPUTE_32F: products summed in fp32, alpha * sum + beta * C in fp32,
   then C rounded to bf16 once, to nearest even. cuBLAS keeps that promise for a split-K GEMM
   only with CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION, which gpt_cuda_create sets in bf16
   (else it may add the K-slices' partials in bf16); tests/gpu/test_gpt_gpu.cu's gemm part checks
   a K = 8192 product against that bound.
   --------------------------------------------------------------------------------------------- */
#ifdef GPT_CUDA_EMULATE
static int gc_imax(int a, int b) { return a > b ? a : b; }

/* cublasSgemm's (S = float) and cublasGemmEx's (S = gc_bf16, fp32 compute) contract on the
   host: column-major, its argument checks, C not read when beta is 0, each element's sum in
   float and one rounding into S. Naive, and exact about which element is which. */
template <class S>
static void gc_gemm_host(int transa, int transb, int M, int N, int K, float alpha, const S *A, int lda,
                         const S *B, int ldb, float beta, S *C, int ldc, const char *file, int line) {
    int i, j, k;
    if (M < 0 || N < 0 || K < 0 || lda < gc_imax(1, transa ? K : M) || ldb < gc_imax(1, transb ? N : K) || ldc < gc_imax(1, M)) {
        char why[256];
        snprintf(why, sizeof why, "cuBLAS would refuse m=%d n=%d k=%d lda=%d ldb=%d ldc=%d (trans %d %d)",
                 M, N, K, lda, ldb, ldc, transa, transb);
        gc_die(file, line, sizeof(S) == sizeof(float) ? "cublasSgemm (emulated)" : "cublasGemmEx (emulated)", why);
    }
    for (j = 0; j < N; j++)
        for (i = 0; i < M; i++) {
            float s = 0;
            for (k = 0; k < K; k++)
                s += gc_ld(transa ? A[k + (size_t)i * lda] : A[i + (size_t)k * lda]) *
                     gc_ld(transb ? B[j + (size_t)k * ldb] : B[k + (size_t)j * ldb]);
            gc_put(&C[i + (size_t)j * ldc], beta == 0.0f ? alpha * s : alpha * s + beta * gc_ld(C[i + (size_t)j * ldc]));
        }
}

/* cublasSgemmBatched's / cublasGemmBatchedEx's contract (GPT_KERNELS=2's attention): the same
   argument checks once for the whole call, a count of at least 0, the three pointer arrays
   given, every problem's pointers set and no two problems writing the same C; each problem is
   then gc_gemm_host's, so its bits are those of the strided-batched call's problem. */
template <class S>
static void gc_gemm_batched_host(int transa, int transb, int M, int N, int K, float alpha, const S *const *A, int lda,
                                 const S *const *B, int ldb, float beta, S *const *C, int ldc, int count,
                                 const char *file, int line) {
    const char *what = sizeof(S) == sizeof(float) ? "cublasSgemmBatched (emulated)" : "cublasGemmBatchedEx (emulated)";
    char why[256];
    int i, j;
    if (M < 0 || N < 0 || K < 0 || count < 0 || lda < gc_imax(1, transa ? K : M) || ldb < gc_imax(1, transb ? N : K) ||
        ldc < gc_imax(1, M) || (count > 0 && (!A || !B || !C))) {
        snprintf(why, sizeof why, "cuBLAS would refuse m=%d n=%d k=%d lda=%d ldb=%d ldc=%d (trans %d %d) batchCount=%d arrays %s",
                 M, N, K, lda, ldb, ldc, transa, transb, count, A && B && C ? "given" : "missing");
        gc_die(file, line, what, why);
    }
    for (i = 0; i < count; i++) {
        if (!A[i] || !B[i] || !C[i]) {
            snprintf(why, sizeof why, "problem %d of %d has a NULL operand", i, count);
            gc_die(file, line, what, why);
        }
        for (j = 0; j < i; j++)
            if (C[j] == C[i]) {
                snprintf(why, sizeof why, "problems %d and %d write the same C", j, i);
                gc_die(file, line, what, why);
            }
    }
    for (i = 0; i < count; i++) gc_gemm_host(transa, transb, M, N, K, alpha, A[i], lda, B[i], ldb, beta, C[i], ldc, file, line);
}
#else
static void gc_blas_gemm_batched(gpt_cuda *m, cublasOperation_t op_b, cublasOperation_t op_a, int N, int M, int K, float alpha,
                                 const float *const *B, int ldb, const float *const *A, int lda, float beta, float *const *C,
                                 int ldc, int count, const char *file, int line) {
    gc_check_cublas(cublasSgemmBatched(m->blas, op_b, op_a, N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc, count),
                    "cublasSgemmBatched", file, line);
}
static void gc_blas_gemm_batched(gpt_cuda *m, cublasOperation_t op_b, cublasOperation_t op_a, int N, int M, int K, float alpha,
                                 const gc_bf16 *const *B, int ldb, const gc_bf16 *const *A, int lda, float beta,
                                 gc_bf16 *const *C, int ldc, int count, const char *file, int line) {
    gc_check_cublas(cublasGemmBatchedEx(m->blas, op_b, op_a, N, M, K, &alpha, (const void *const *)B, CUDA_R_16BF, ldb,
                                        (const void *const *)A, CUDA_R_16BF, lda, &beta, (void *const *)C, CUDA_R_16BF, ldc,
                                        count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                    "cublasGemmBatchedEx (bf16, fp32 compute)", file, line);
}
static void gc_blas_gemm(gpt_cuda *m, cublasOperation_t op_b, cublasOperation_t op_a, int N, int M, int K, float alpha,
                    const float *B, int ldb, long long sb, const float *A, int lda, long long sa, float beta,
                    float *C, int ldc, long long sc, int count, const char *file, int line) {
    if (count == 1)
        gc_check_cublas(cublasSgemm(m->blas, op_b, op_a, N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc),
                        "cublasSgemm", file, line);
    else
        gc_check_cublas(cublasSgemmStridedBatched(m->blas, op_b, op_a, N, M, K, &alpha, B, ldb, sb, A, lda, sa,
                                                  &beta, C, ldc, sc, count),
                        "cublasSgemmStridedBatched", file, line);
}
static void gc_blas_gemm(gpt_cuda *m, cublasOperation_t op_b, cublasOperation_t op_a, int N, int M, int K, float alpha,
                    const gc_bf16 *B, int ldb, long long sb, const gc_bf16 *A, int lda, long long sa, float beta,
                    gc_bf16 *C, int ldc, long long sc, int count, const char *file, int line) {
    if (count == 1)
        gc_check_cublas(cublasGemmEx(m->blas, op_b, op_a, N, M, K, &alpha, B, CUDA_R_16BF, ldb, A, CUDA_R_16BF, lda,
                                     &beta, C, CUDA_R_16BF, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                        "cublasGemmEx (bf16, fp32 compute)", file, line);
    else
        gc_check_cublas(cublasGemmStridedBatchedEx(m->blas, op_b, op_a, N, M, K, &alpha, B, CUDA_R_16BF, ldb, sb,
                                                   A, CUDA_R_16BF, lda, sa, &beta, C, CUDA_R_16BF, ldc, sc, count,
                                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                        "cublasGemmStridedBatchedEx (bf16, fp32 compute)", file, line);
}
#endif

template <class S>
static void gc_gemm(gpt_cuda *m, int ta, int tb, int M, int N, int K, float alpha,
                    const S *A, int lda, long long stride_a, const S *B, int ldb, long long stride_b,
                    float beta, S *C, int ldc, long long stride_c, int count, const char *file, int line) {
#ifdef GPT_CUDA_EMULATE
    int i;
    (void)m;
    for (i = 0; i < count; i++)
        gc_gemm_host(tb, ta, N, M, K, alpha, B + i * stride_b, ldb, A + i * stride_a, lda, beta, C + i * stride_c, ldc, file, line);
#else
    gc_blas_gemm(m, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, alpha, B, ldb, stride_b, A, lda,
            stride_a, beta, C, ldc, stride_c, count, file, line);
#endif
}
#define GC_MATMUL(m, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) \
    gc_gemm(m, ta, tb, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, __FILE__, __LINE__)
#define GC_MATMUL_HEADS(m, ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, count) \
    gc_gemm(m, ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, count, __FILE__, __LINE__)

/* One of attention's matmuls over the B sequences x NH heads of this forward: problem (b, h)'s
   operand X starts at X + b*Xb + h*Xh. GPT_KERNELS=1: a strided-batched call over the heads per
   sequence (B calls). GPT_KERNELS=2: one call for all B*NH problems. q, k and v inside qkv
   [BT, 3C] and the heads' outputs inside [BT, C] step h*hs within a sequence but b*T*3C (b*T*C)
   across sequences, which no single stride covers, so it is the pointer-array form
   (cublasSgemmBatched in fp32/TF32, cublasGemmBatchedEx with bf16 operands and
   CUBLAS_COMPUTE_32F in bf16: the per-sequence calls' types, compute type and the handle's math
   mode, so each problem is the same GEMM). The arrays are written on the device by one small
   kernel per call into m->attn_ptrs (stream order keeps them until the matmul has read them):
   B, T and the layer's buffers change from call to call, so arrays built once would need one
   set per layer, operand and shape. One sequence (B = 1) stays one strided-batched call, and so
   does a shape where some problem's operand would not be 16-byte aligned (odd head sizes or T):
   cuBLAS cannot see the alignment of pointers that sit in device memory, so the batched call is
   only made where every one is aligned as at GPT-2's shapes (hs, 3C, T*T multiples of 8 values).
   Returns 1 where the one batched call was made. */
template <class S> struct gc_attn_pointers {
    const S *A, *B;
    S *C;
    long long Ab, Ah, Bb, Bh, Cb, Ch;
    int NH;
    const S **pa, **pb;
    S **pc;
    GC_HD void operator()(size_t i) const {
        long long b = (long long)(i / (size_t)NH), h = (long long)(i % (size_t)NH);
        pa[i] = A + b * Ab + h * Ah;
        pb[i] = B + b * Bb + h * Bh;
        pc[i] = C + b * Cb + h * Ch;
    }
};
static int gc_steps_aligned16(const void *base, long long step1, long long step2, size_t elem) {
    return (uintptr_t)base % 16 == 0 && (step1 * (long long)elem) % 16 == 0 && (step2 * (long long)elem) % 16 == 0;
}
template <class S>
static int gc_attn_gemm(gpt_cuda *m, int ta, int tb, int M, int N, int K, float alpha, const S *A, int lda, long long Ab,
                        long long Ah, const S *B, int ldb, long long Bb, long long Bh, S *C, int ldc, long long Cb, long long Ch,
                        const char *file, int line) {
    int nb = m->B, NH = m->cfg.heads, b, count = nb * NH;
    if (m->kernels != 2 || nb == 1 || !gc_steps_aligned16(A, Ab, Ah, sizeof(S)) || !gc_steps_aligned16(B, Bb, Bh, sizeof(S)) ||
        !gc_steps_aligned16(C, Cb, Ch, sizeof(S))) {
        for (b = 0; b < nb; b++)
            gc_gemm(m, ta, tb, M, N, K, alpha, A + b * Ab, lda, Ah, B + b * Bb, ldb, Bh, 0.0f, C + b * Cb, ldc, Ch, NH, file, line);
        return 0;
    }
    {
        const S **pa = (const S **)m->attn_ptrs, **pb = pa + count;
        S **pc = (S **)(m->attn_ptrs + 2 * (size_t)count);
        gc_attn_pointers<S> ptrs = { A, B, C, Ab, Ah, Bb, Bh, Cb, Ch, NH, pa, pb, pc };
        gc_for_each(m->stream, ptrs, (size_t)count, "the kernel launch of the attention's pointer arrays", file, line);
#ifdef GPT_CUDA_EMULATE
        gc_gemm_batched_host(tb, ta, N, M, K, alpha, pb, ldb, pa, lda, 0.0f, pc, ldc, count, file, line);
#else
        gc_blas_gemm_batched(m, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, alpha, pb, ldb, pa, lda,
                             0.0f, pc, ldc, count, file, line);
#endif
    }
    return 1;
}
#define GC_ATTN_MATMUL(m, ta, tb, M, N, K, alpha, A, lda, Ab, Ah, B, ldb, Bb, Bh, C, ldc, Cb, Ch) \
    gc_attn_gemm(m, ta, tb, M, N, K, alpha, A, lda, Ab, Ah, B, ldb, Bb, Bh, C, ldc, Cb, Ch, __FILE__, __LINE__)

/* ---------------------------------------------------------------------------------------------
   The kernels' bodies. Element functions take a flat index; row functions a lane group and a
   row. Each states the CPU loop of gpt.h it follows; the arithmetic is written the same way.
   S is what activations, parameters and gradients are stored as (float, or gc_bf16 with
   --bf16); every body loads S into float (gc_ld), computes in float and stores once (gc_put),
   so with S = float the arithmetic is exactly the fp32 model's. LayerNorm's mean and rstd,
   the column sums' partials, and the losses are float in both modes.
   --------------------------------------------------------------------------------------------- */

/* Embedding: out[i, c] = wte[token i, c] + wpe[i mod T, c]. */
template <class S> struct gc_embed_fwd {
    const S *wte, *wpe;
    const int *tokens;
    S *out;
    int C, T;
    GC_HD void operator()(size_t i) const {
        size_t row = i / (size_t)C, c = i % (size_t)C;
        gc_put(&out[i], gc_ld(wte[(size_t)tokens[row] * C + c]) + gc_ld(wpe[(row % (size_t)T) * C + c]));
    }
};

/* grad wpe[t, c] += dres[b, t, c] for b = 0, 1, ... in order (the CPU's order). i = t*C + c. */
template <class S> struct gc_wpe_bwd {
    const S *dres;
    S *gwpe;
    int B, T, C;
    GC_HD void operator()(size_t i) const {
        size_t t = i / (size_t)C, c = i % (size_t)C;
        float acc = gc_ld(gwpe[i]);
        for (int b = 0; b < B; b++) acc += gc_ld(dres[((size_t)b * T + t) * C + c]);
        gc_put(&gwpe[i], acc);
    }
};

/* grad wte[v, c] += dres[p, c] over the positions p that hold token v, in increasing p (the
   CPU's order): one thread per (v, c), no atomics. i = v*C + c. */
template <class S> struct gc_wte_bwd {
    const S *dres;
    S *gwte;
    const int *token_start, *positions;
    int C;
    GC_HD void operator()(size_t i) const {
        size_t v = i / (size_t)C, c = i % (size_t)C;
        float acc = gc_ld(gwte[i]);
        for (int j = token_start[v]; j < token_start[v + 1]; j++) acc += gc_ld(dres[(size_t)positions[j] * C + c]);
        gc_put(&gwte[i], acc);
    }
};

/* GPT_KERNELS=2, the same gradient in two launches of bounded work: each segment of at most
   GC_WTE_SEGMENT positions of one token sums its rows (i = s*C + c), then each (token, column)
   adds its segments in order (i = v*C + c). A frequent token (a space: ~15% of a batch) no
   longer makes one thread walk thousands of rows. The sum is blocked: other roundings than the
   CPU's running sum (tests/gpu/test_gpt_gpu.cu's kernels2 part bounds it). */
template <class S> struct gc_wte_segments {
    const S *dres;
    const int *seg_begin, *positions;
    float *partial;
    int C, segments;
    GC_HD void operator()(size_t i) const {
        int s = (int)(i / (size_t)C), c = (int)(i % (size_t)C);
        float acc = 0;
        if (s >= segments) return;
        for (int j = seg_begin[s]; j < seg_begin[s + 1]; j++) acc += gc_ld(dres[(size_t)positions[j] * C + c]);
        partial[i] = acc;
    }
};
template <class S> struct gc_wte_add_segments {
    const float *partial;
    const int *seg_first;
    S *gwte;
    int C;
    GC_HD void operator()(size_t i) const {
        size_t v = i / (size_t)C, c = i % (size_t)C;
        float acc = gc_ld(gwte[i]);
        for (int s = seg_first[v]; s < seg_first[v + 1]; s++) acc += partial[(size_t)s * C + c];
        gc_put(&gwte[i], acc);
    }
};

/* LayerNorm of one row (eps 1e-5, biased variance): mean, then the variance of the centred
   values, as gpt__layernorm. */
template <class S> struct gc_layernorm_fwd {
    const S *x, *w, *b;
    S *out;
    float *mean, *rstd;
    int C;
    template <class Lanes> GC_HD void operator()(const Lanes &g, int row) const {
        const S *xr = x + (size_t)row * C;
        S *o = out + (size_t)row * C;
        float s = 0, v = 0, mu, rs;
        int c;
        for (c = g.lane(); c < C; c += g.size()) s += gc_ld(xr[c]);
        mu = g.sum(s) / (float)C;
        for (c = g.lane(); c < C; c += g.size()) { float d = gc_ld(xr[c]) - mu; v += d * d; }
        rs = 1.0f / sqrtf(g.sum(v) / (float)C + 1e-5f);
        for (c = g.lane(); c < C; c += g.size()) gc_put(&o[c], (gc_ld(xr[c]) - mu) * rs * gc_ld(w[c]) + gc_ld(b[c]));
        if (g.lane() == 0) { mean[row] = mu; rstd[row] = rs; }
    }
};

/* LayerNorm backward, the input's gradient of one row: dx = rstd (dxhat - mean(dxhat) -
   xhat mean(dxhat xhat)), dxhat = dy w; written (accumulate 0) or added (1: the residual). */
template <class S> struct gc_layernorm_bwd_dx {
    const S *x;
    const float *mean, *rstd;
    const S *w, *dout;
    S *dx;
    int C, accumulate;
    template <class Lanes> GC_HD void operator()(const Lanes &g, int row) const {
        const S *xr = x + (size_t)row * C, *dy = dout + (size_t)row * C;
        S *dxr = dx + (size_t)row * C;
        float mu = mean[row], rs = rstd[row], a = 0, b = 0, mdx, mdxx;
        int c;
        for (c = g.lane(); c < C; c += g.size()) {
            float xhat = (gc_ld(xr[c]) - mu) * rs, dxhat = gc_ld(dy[c]) * gc_ld(w[c]);
            a += dxhat;
            b += dxhat * xhat;
        }
        mdx = g.sum(a) / (float)C;
        mdxx = g.sum(b) / (float)C;
        for (c = g.lane(); c < C; c += g.size()) {
            float xhat = (gc_ld(xr[c]) - mu) * rs, dxhat = gc_ld(dy[c]) * gc_ld(w[c]), v = rs * (dxhat - mdx - xhat * mdxx);
            gc_put(&dxr[c], accumulate ? gc_ld(dxr[c]) + v : v);
        }
    }
};

/* Rows per chunk of a column sum. */
static int gc_per_chunk(int rows) { return (rows + GC_CHUNKS - 1) / GC_CHUNKS; }

/* LayerNorm's parameter gradients, chunk k of the rows: pw[k, c] = sum dy xhat, pb[k, c] = sum dy.
   i = k*C + c. */
template <class S> struct gc_layernorm_param_partials {
    const S *x;
    const float *mean, *rstd;
    const S *dout;
    float *pw, *pb;
    int rows, C, per_chunk;
    GC_HD void operator()(size_t i) const {
        int k = (int)(i / (size_t)C), c = (int)(i % (size_t)C), r, r1 = (k + 1) * per_chunk;
        float sw = 0, sb = 0;
        if (r1 > rows) r1 = rows;
        for (r = k * per_chunk; r < r1; r++) {
            float dy = gc_ld(dout[(size_t)r * C + c]);
            sw += dy * ((gc_ld(x[(size_t)r * C + c]) - mean[r]) * rstd[r]);
            sb += dy;
        }
        pw[i] = sw;
        pb[i] = sb;
    }
};

/* GPT_KERNELS=2: LayerNorm's backward in one launch, the two kernels above as one block op
   (their own functions, so their bits). Chunk k of the rows (GC_CHUNKS chunks, as the partials)
   is `tiles` blocks: block (k, s)'s warps take the chunk's rows s*warps + w, then every
   tiles*warps-th (dx, the row's warp butterfly as gc_layernorm_bwd_dx), its threads the columns
   s*threads + t, then every tiles*threads-th (pw, pb: each column summed down the chunk's rows in
   order, as gc_layernorm_param_partials). tiles = ceil(C / threads) gives every thread one column,
   at least 4 so that the launch has 4*GC_CHUNKS = 256 blocks (about two per SM of an H100; 64
   chunks alone would leave half of its SMs idle) and a chunk's rows split over more warps. The
   chunks stay GC_CHUNKS with the same rows, so gc_add_partials adds the same partials. dx and
   dout are distinct buffers (the partials read dout while dx is written). */
template <class S> struct gc_layernorm_bwd_fused {
    gc_layernorm_bwd_dx<S> dx;
    gc_layernorm_param_partials<S> partials;
    int tiles;
    static int tiles_for(int C) { int t = (C + GC_THREADS - 1) / GC_THREADS; return t > 4 ? t : 4; }
    template <class Lanes> GC_HD void rows(const Lanes &g, int block, int warp, int warps) const {
        int k = block / tiles, s = block % tiles, r = k * partials.per_chunk + s * warps + warp, r1 = (k + 1) * partials.per_chunk;
        if (r1 > partials.rows) r1 = partials.rows;
        for (; r < r1; r += tiles * warps) dx(g, r);
    }
    GC_HD void columns(int block, int thread, int threads) const {
        int k = block / tiles, s = block % tiles;
        for (int c = s * threads + thread; c < partials.C; c += tiles * threads) partials((size_t)k * partials.C + c);
    }
};

/* A bias gradient, chunk k of the rows of mat [rows, width]: partial[k, c] = sum mat[r, c]. */
template <class S> struct gc_column_partials {
    const S *mat;
    float *partial;
    int rows, width, per_chunk;
    GC_HD void operator()(size_t i) const {
        int k = (int)(i / (size_t)width), c = (int)(i % (size_t)width), r, r1 = (k + 1) * per_chunk;
        float s = 0;
        if (r1 > rows) r1 = rows;
        for (r = k * per_chunk; r < r1; r++) s += gc_ld(mat[(size_t)r * width + c]);
        partial[i] = s;
    }
};

/* grad[c] += the chunks' partial sums, chunk 0 first (one rounding to S at the end). */
template <class S> struct gc_add_partials {
    const float *partial;
    S *grad;
    int width;
    GC_HD void operator()(size_t c) const {
        float s = 0;
        for (int k = 0; k < GC_CHUNKS; k++) s += partial[(size_t)k * width + c];
        gc_put(&grad[c], gc_ld(grad[c]) + s);
    }
};

/* A linear layer's output before the matmul adds onto it: bias (+ the residual). */
template <class S> struct gc_linear_init {
    const S *bias, *resid;
    S *out;
    int width;
    GC_HD void operator()(size_t i) const {
        float b = gc_ld(bias[i % (size_t)width]);
        gc_put(&out[i], resid ? gc_ld(resid[i]) + b : b);
    }
};

/* Dropout, gpt.h's masks (gpt__drop_key, gpt__drop_factor): element i of x [B, per_sample] is
   sample b = i / per_sample, element i % per_sample of its mask. out = src * mask, plus add[i]
   when add is given (a residual branch joining the stream); out may be src. */
template <class S> struct gc_dropout {
    const S *src, *add;
    S *out;
    uint64_t seed, step, row0, stride;
    uint32_t site, threshold;
    float scale;
    size_t per_sample;
    GC_HD void operator()(size_t i) const {
        uint64_t key = gpt__drop_key(seed, step, row0 + (uint64_t)(i / per_sample) * stride, site);
        float y = gc_ld(src[i]) * gpt__drop_factor(key, i % per_sample, threshold, scale);
        gc_put(&out[i], add ? gc_ld(add[i]) + y : y);
    }
};

/* Causal softmax of row (b, h, t) of att [B NH T, T], in place: over u <= t, 0 above. With
   S = bf16 the exponentials and their sum stay in float; only the probabilities are rounded. */
template <class S> struct gc_causal_softmax_fwd {
    S *att;
    int T;
    template <class Lanes> GC_HD void operator()(const Lanes &g, int row) const {
        S *p = att + (size_t)row * T;
        float mx = -INFINITY, s = 0, inv;
        int n = row % T + 1, u;
        for (u = g.lane(); u < n; u += g.size()) mx = fmaxf(mx, gc_ld(p[u]));
        mx = g.max(mx);
        for (u = g.lane(); u < n; u += g.size()) s += expf(gc_ld(p[u]) - mx);
        inv = 1.0f / g.sum(s);
        for (u = g.lane(); u < n; u += g.size()) gc_put(&p[u], expf(gc_ld(p[u]) - mx) * inv);
        for (u = n + g.lane(); u < T; u += g.size()) gc_put(&p[u], 0.0f);
    }
};

/* GPT_KERNELS=2: the same softmax reading the row twice instead of three times: one pass keeps
   each lane's running max and its sum of exponentials (rescaled when the max grows), the lanes
   combine them (max, then sum s_l exp(m_l - max)), a second pass writes. Other roundings of the
   sum than the three-pass form (within a few ulp of it: the kernels2 test part). */
template <class S> struct gc_causal_softmax_fwd_online {
    S *att;
    int T;
    template <class Lanes> GC_HD void operator()(const Lanes &g, int row) const {
        S *p = att + (size_t)row * T;
        float mx = -INFINITY, s = 0, m_all, inv;
        int n = row % T + 1, u;
        for (u = g.lane(); u < n; u += g.size()) {
            float x = gc_ld(p[u]);
            if (x > mx) { s = s * expf(mx - x) + 1.0f; mx = x; }
            else s += expf(x - mx);
        }
        m_all = g.max(mx);
        inv = 1.0f / g.sum(mx == -INFINITY ? 0.0f : s * expf(mx - m_all));   /* a lane with no element adds 0 */
        for (u = g.lane(); u < n; u += g.size()) gc_put(&p[u], expf(gc_ld(p[u]) - m_all) * inv);
        for (u = n + g.lane(); u < T; u += g.size()) gc_put(&p[u], 0.0f);
    }
};

/* Softmax backward in place: d = P (d - <P, d>) over the row (0 above the diagonal, where P is). */
template <class S> struct gc_causal_softmax_bwd {
    const S *att;
    S *datt;
    int T, lower_only;   /* lower_only (GPT_KERNELS=2): above the diagonal write 0, read nothing */
    template <class Lanes> GC_HD void operator()(const Lanes &g, int row) const {
        const S *p = att + (size_t)row * T;
        S *d = datt + (size_t)row * T;
        float s = 0;
        int n = row % T + 1, u;
        for (u = g.lane(); u < n; u += g.size()) s += gc_ld(p[u]) * gc_ld(d[u]);
        s = g.sum(s);
        for (u = g.lane(); u < (lower_only ? n : T); u += g.size()) gc_put(&d[u], gc_ld(p[u]) * (gc_ld(d[u]) - s));
        if (lower_only)
            for (u = n + g.lane(); u < T; u += g.size()) gc_put(&d[u], 0.0f);
    }
};

/* GPT_ATTENTION=fused: causal attention without the [T, T] matrices. One row function per query
   row (b, h, t) for the forward and dQ, one per key row (b, h, u) for dK and dV; a row's head
   vectors are spread over the lanes (lane l holds elements l, l + lanes, ..., at most
   GC_ATT_MAX_HS / lanes of them, in registers), each dot product is the lanes' butterfly sum,
   so every lane sees the same score bits and takes the same branches. Keys run in increasing
   order: deterministic, no atomics. Dropout on P uses the explicit path's mask: element
   h T^2 + t T + u of sample b's mask at the layer's site (gc_dropout with per_sample NH T^2). */
struct gc_att_shape {
    int T, C, NH;
    float scale;   /* 1 / sqrt(hs) */
    int dropping;
    uint64_t seed, step, row0, stride;
    uint32_t site, threshold;
    float drop_scale;
    GC_HD uint64_t drop_key(int b) const { return gpt__drop_key(seed, step, row0 + (uint64_t)b * stride, site); }
    GC_HD float drop(uint64_t key, int h, int t, int u) const {   /* P's mask factor at (h, t, u) */
        return dropping ? gpt__drop_factor(key, ((uint64_t)h * T + (uint64_t)t) * T + (uint64_t)u, threshold, drop_scale) : 1.0f;
    }
};

/* Forward of query row (b, h, t): online softmax over keys u <= t (the running max mx, the sum l
   of exp(s - mx), the output accumulator rescaled when mx grows), O = acc / l, and the row's
   logsumexp mx + log l (float) for the backward. With dropout, l sums P unmasked (the softmax)
   and acc the masked P times V, as O = dropout(P) V. extra_keys is 0; the test sets 1 (a mask
   off by one, which its bound must catch). */
template <class S> struct gc_att_fused_fwd {
    const S *qkv;
    S *out;
    float *lse;
    gc_att_shape sh;
    int extra_keys;
    template <class Lanes> GC_HD void operator()(const Lanes &g, int row) const {
        enum { PER = (GC_ATT_MAX_HS + Lanes::WIDTH - 1) / Lanes::WIDTH };
        int T = sh.T, C = sh.C, hs = C / sh.NH, t = row % T, h = (row / T) % sh.NH, b = row / T / sh.NH, n = t + 1 + extra_keys, u, j;
        size_t C3 = 3 * (size_t)C;
        const S *q = qkv + ((size_t)b * T + t) * C3 + (size_t)h * hs, *k0 = qkv + (size_t)b * T * C3 + C + (size_t)h * hs;
        float qr[PER], acc[PER], mx = -INFINITY, l = 0;
        uint64_t key = sh.drop_key(b);
        if (n > T) n = T;
        for (j = 0; j < PER; j++) {
            int c = g.lane() + j * g.size();
            qr[j] = c < hs ? gc_ld(q[c]) : 0.0f;
            acc[j] = 0;
        }
        for (u = 0; u < n; u += GC_ATT_KEYS) {   /* GC_ATT_KEYS independent butterflies in flight, then the keys in order */
            float sc[GC_ATT_KEYS];
            int kk, m = n - u < GC_ATT_KEYS ? n - u : GC_ATT_KEYS;
            for (kk = 0; kk < GC_ATT_KEYS; kk++) {
                sc[kk] = 0;
                if (kk < m) {
                    const S *k = k0 + (size_t)(u + kk) * C3;
                    for (j = 0; j < PER; j++) {
                        int c = g.lane() + j * g.size();
                        if (c < hs) sc[kk] += qr[j] * gc_ld(k[c]);
                    }
                }
            }
            for (kk = 0; kk < GC_ATT_KEYS; kk++) sc[kk] = sh.scale * g.sum(sc[kk]);
            for (kk = 0; kk < m; kk++) {
                const S *v = k0 + (size_t)(u + kk) * C3 + C;
                float s = sc[kk], p;
                if (s > mx) {   /* the same in every lane: s is the butterfly's */
                    float corr = expf(mx - s);   /* 0 at the first key */
                    l *= corr;
                    for (j = 0; j < PER; j++) acc[j] *= corr;
                    mx = s;
                }
                p = expf(s - mx);
                l += p;
                p *= sh.drop(key, h, t, u + kk);
                for (j = 0; j < PER; j++) {
                    int c = g.lane() + j * g.size();
                    if (c < hs) acc[j] += p * gc_ld(v[c]);
                }
            }
        }
        {
            S *o = out + ((size_t)b * T + t) * C + (size_t)h * hs;
            float inv = 1.0f / l;
            for (j = 0; j < PER; j++) {
                int c = g.lane() + j * g.size();
                if (c < hs) gc_put(&o[c], acc[j] * inv);
            }
            if (g.lane() == 0) lse[row] = mx + logf(l);
        }
    }
};

/* Backward of query row (b, h, t): D_t = dO_t . O_t (= sum_u Pd_tu dPd_tu, what the explicit
   softmax backward subtracts), kept in D for the key rows; P_tu = exp(s_tu - lse_t) recomputed;
   dS_tu = P_tu (m_tu dO_t . V_u - D_t) with m the dropout factor; dQ_t = scale sum_u dS_tu K_u. */
template <class S> struct gc_att_fused_bwd_q {
    const S *qkv, *out, *dout;
    const float *lse;
    float *D;
    S *dqkv;
    gc_att_shape sh;
    template <class Lanes> GC_HD void operator()(const Lanes &g, int row) const {
        enum { PER = (GC_ATT_MAX_HS + Lanes::WIDTH - 1) / Lanes::WIDTH };
        int T = sh.T, C = sh.C, hs = C / sh.NH, t = row % T, h = (row / T) % sh.NH, b = row / T / sh.NH, u, j;
        size_t C3 = 3 * (size_t)C, at = ((size_t)b * T + t) * C + (size_t)h * hs;
        const S *q = qkv + ((size_t)b * T + t) * C3 + (size_t)h * hs, *k0 = qkv + (size_t)b * T * C3 + C + (size_t)h * hs;
        float qr[PER], dor[PER], dq[PER], Dt = 0, L = lse[row];
        uint64_t key = sh.drop_key(b);
        for (j = 0; j < PER; j++) {
            int c = g.lane() + j * g.size();
            qr[j] = c < hs ? gc_ld(q[c]) : 0.0f;
            dor[j] = c < hs ? gc_ld(dout[at + c]) : 0.0f;
            dq[j] = 0;
            if (c < hs) Dt += dor[j] * gc_ld(out[at + c]);
        }
        Dt = g.sum(Dt);
        if (g.lane() == 0) D[row] = Dt;
        for (u = 0; u <= t; u += GC_ATT_KEYS) {   /* as the forward: the keys' sums together, then in order */
            float d[GC_ATT_KEYS], dp[GC_ATT_KEYS];
            int kk, m = t + 1 - u < GC_ATT_KEYS ? t + 1 - u : GC_ATT_KEYS;
            for (kk = 0; kk < GC_ATT_KEYS; kk++) {
                d[kk] = dp[kk] = 0;
                if (kk < m) {
                    const S *k = k0 + (size_t)(u + kk) * C3, *v = k + C;
                    for (j = 0; j < PER; j++) {
                        int c = g.lane() + j * g.size();
                        if (c < hs) { d[kk] += qr[j] * gc_ld(k[c]); dp[kk] += dor[j] * gc_ld(v[c]); }
                    }
                }
            }
            for (kk = 0; kk < GC_ATT_KEYS; kk++) { d[kk] = g.sum(d[kk]); dp[kk] = g.sum(dp[kk]); }
            for (kk = 0; kk < m; kk++) {
                const S *k = k0 + (size_t)(u + kk) * C3;
                float ds = expf(sh.scale * d[kk] - L) * (dp[kk] * sh.drop(key, h, t, u + kk) - Dt);
                for (j = 0; j < PER; j++) {
                    int c = g.lane() + j * g.size();
                    if (c < hs) dq[j] += ds * gc_ld(k[c]);
                }
            }
        }
        for (j = 0; j < PER; j++) {
            int c = g.lane() + j * g.size();
            if (c < hs) gc_put(&dqkv[((size_t)b * T + t) * C3 + (size_t)h * hs + c], sh.scale * dq[j]);
        }
    }
};

/* Backward of key row (b, h, u), over queries t >= u in increasing order: dV_u = sum_t Pd_tu dO_t,
   dK_u = scale sum_t dS_tu Q_t (lse and D from the forward and the query rows). */
template <class S> struct gc_att_fused_bwd_kv {
    const S *qkv, *dout;
    const float *lse, *D;
    S *dqkv;
    gc_att_shape sh;
    template <class Lanes> GC_HD void operator()(const Lanes &g, int row) const {
        enum { PER = (GC_ATT_MAX_HS + Lanes::WIDTH - 1) / Lanes::WIDTH };
        int T = sh.T, C = sh.C, hs = C / sh.NH, u = row % T, h = (row / T) % sh.NH, b = row / T / sh.NH, t, j;
        size_t C3 = 3 * (size_t)C, bh = (size_t)(row / T) * T;
        const S *k = qkv + ((size_t)b * T + u) * C3 + C + (size_t)h * hs, *v = k + C, *q0 = qkv + (size_t)b * T * C3 + (size_t)h * hs;
        const S *do0 = dout + (size_t)b * T * C + (size_t)h * hs;
        float kr[PER], vr[PER], dk[PER], dv[PER];
        uint64_t key = sh.drop_key(b);
        for (j = 0; j < PER; j++) {
            int c = g.lane() + j * g.size();
            kr[j] = c < hs ? gc_ld(k[c]) : 0.0f;
            vr[j] = c < hs ? gc_ld(v[c]) : 0.0f;
            dk[j] = dv[j] = 0;
        }
        for (t = u; t < T; t += GC_ATT_KEYS) {   /* GC_ATT_KEYS queries' sums together, then in order */
            float d[GC_ATT_KEYS], dp[GC_ATT_KEYS];
            int kk, m = T - t < GC_ATT_KEYS ? T - t : GC_ATT_KEYS;
            for (kk = 0; kk < GC_ATT_KEYS; kk++) {
                d[kk] = dp[kk] = 0;
                if (kk < m) {
                    const S *q = q0 + (size_t)(t + kk) * C3, *dO = do0 + (size_t)(t + kk) * C;
                    for (j = 0; j < PER; j++) {
                        int c = g.lane() + j * g.size();
                        if (c < hs) { d[kk] += gc_ld(q[c]) * kr[j]; dp[kk] += gc_ld(dO[c]) * vr[j]; }
                    }
                }
            }
            for (kk = 0; kk < GC_ATT_KEYS; kk++) { d[kk] = g.sum(d[kk]); dp[kk] = g.sum(dp[kk]); }
            for (kk = 0; kk < m; kk++) {
                const S *q = q0 + (size_t)(t + kk) * C3, *dO = do0 + (size_t)(t + kk) * C;
                float p = expf(sh.scale * d[kk] - lse[bh + t + kk]), f = sh.drop(key, h, t + kk, u);
                float ds = p * (dp[kk] * f - D[bh + t + kk]);
                p *= f;
                for (j = 0; j < PER; j++) {
                    int c = g.lane() + j * g.size();
                    if (c < hs) { dv[j] += p * gc_ld(dO[c]); dk[j] += ds * gc_ld(q[c]); }
                }
            }
        }
        for (j = 0; j < PER; j++) {
            int c = g.lane() + j * g.size();
            if (c < hs) {
                S *dst = dqkv + ((size_t)b * T + u) * C3 + (size_t)h * hs + c;
                gc_put(&dst[C], sh.scale * dk[j]);
                gc_put(&dst[2 * C], dv[j]);
            }
        }
    }
};

/* GELU, tanh form: x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3), as gpt__gelu. */
#define GC_GELU_K 0.7978845608028654f
static GC_HD inline float gc_gelu(float v) {
    float u = GC_GELU_K * (v + 0.044715f * v * v * v);
    return v * (1.0f / (1.0f + expf(-2.0f * u)));
}
static GC_HD inline float gc_gelu_grad(float v, float d) {
    float u = GC_GELU_K * (v + 0.044715f * v * v * v), s = 1.0f / (1.0f + expf(-2.0f * u));
    float du = GC_GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
    return d * (s + v * s * (1.0f - s) * 2.0f * du);
}
template <class S> struct gc_gelu_fwd {
    const S *x;
    S *y;
    GC_HD void operator()(size_t i) const { gc_put(&y[i], gc_gelu(gc_ld(x[i]))); }
};
template <class S> struct gc_gelu_bwd {
    const S *x, *dout;
    S *dx;
    GC_HD void operator()(size_t i) const { gc_put(&dx[i], gc_gelu_grad(gc_ld(x[i]), gc_ld(dout[i]))); }
};

/* GPT_KERNELS=2: elementwise maps with 16 bytes per thread (4 floats or 8 bf16), every load of a
   thread before its stores, one 16-byte access per operand where the operands are 16-byte
   aligned (the launcher checks; else the one-element kernels run). The element arithmetic is the
   one-element kernels' own (gc_gelu, gc_gelu_grad, the bias add), so the bits are theirs. */
template <class S> struct gc_vec { enum { V = 16 / (int)sizeof(S) }; };
template <class S> static GC_HD inline void gc_load16(const S *p, float *f) {
#ifdef __CUDA_ARCH__
    int4 raw = *reinterpret_cast<const int4 *>(p);
    const S *r = reinterpret_cast<const S *>(&raw);
    for (int k = 0; k < gc_vec<S>::V; k++) f[k] = gc_ld(r[k]);
#else
    for (int k = 0; k < gc_vec<S>::V; k++) f[k] = gc_ld(p[k]);
#endif
}
template <class S> static GC_HD inline void gc_store16(S *p, const float *f) {
#ifdef __CUDA_ARCH__
    int4 raw;
    S *r = reinterpret_cast<S *>(&raw);
    for (int k = 0; k < gc_vec<S>::V; k++) gc_put(&r[k], f[k]);
    *reinterpret_cast<int4 *>(p) = raw;
#else
    for (int k = 0; k < gc_vec<S>::V; k++) gc_put(&p[k], f[k]);
#endif
}
static inline int gc_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* out = f(a, b, i) over n elements, V a thread (thread t: elements tV .. tV + V - 1; the last
   thread takes what is left one by one). a and b may be NULL (not read; f gets 0). */
template <class S, class F> struct gc_map_vec {
    const S *a, *b;
    S *out;
    size_t n;
    F f;
    GC_HD void operator()(size_t t) const {
        enum { V = gc_vec<S>::V };
        size_t i0 = t * V, i;
        float fa[V], fb[V], fo[V];
        int k;
        if (i0 + V <= n) {
            if (a) gc_load16(a + i0, fa); else for (k = 0; k < V; k++) fa[k] = 0;
            if (b) gc_load16(b + i0, fb); else for (k = 0; k < V; k++) fb[k] = 0;
            for (k = 0; k < V; k++) fo[k] = f(fa[k], fb[k], i0 + k);
            gc_store16(out + i0, fo);
        } else
            for (i = i0; i < n; i++) gc_put(&out[i], f(a ? gc_ld(a[i]) : 0.0f, b ? gc_ld(b[i]) : 0.0f, i));
    }
};
struct gc_f_gelu { GC_HD float operator()(float x, float, size_t) const { return gc_gelu(x); } };
struct gc_f_gelu_grad { GC_HD float operator()(float x, float d, size_t) const { return gc_gelu_grad(x, d); } };
template <class S> struct gc_f_bias {   /* the bias (+ the residual a), as gc_linear_init */
    const S *bias;
    int width, resid;
    GC_HD float operator()(float r, float, size_t i) const {
        float bv = gc_ld(bias[i % (size_t)width]);
        return resid ? r + bv : bv;
    }
};
/* Launches out = f(a, b, i) vectorized when every operand is 16-byte aligned; 0 otherwise
   (the caller runs its one-element kernel). */
template <class S, class F>
static int gc_map_vec_launch(gc_stream stream, const F &f, const S *a, const S *b, S *out, size_t n, const char *what,
                             const char *file, int line) {
    gc_map_vec<S, F> op;
    if ((a && !gc_aligned16(a)) || (b && !gc_aligned16(b)) || !gc_aligned16(out)) return 0;
    op.a = a; op.b = b; op.out = out; op.n = n; op.f = f;
    gc_for_each(stream, op, (n + gc_vec<S>::V - 1) / gc_vec<S>::V, what, file, line);
    return 1;
}
#define GC_MAP_VEC(m, S, F, fn, A, B, OUT, N) \
    gc_map_vec_launch<S, F>((m)->stream, (fn), (A), (B), (OUT), (N), "the kernel launch of gc_map_vec<" #F ">", __FILE__, __LINE__)

/* Cross-entropy of one row of logits [BT, V]: row_loss = log sum exp(z - max) + max - z[target];
   with dlogits, d = k (softmax - onehot), k = scale / BT, as gpt__cross_entropy. The loss is
   float in both modes. */
template <class S> struct gc_cross_entropy_rows {
    const S *logits;
    const int *targets;
    S *dlogits;
    float *row_loss;
    float k;
    template <class Lanes> GC_HD void operator()(const Lanes &g, int row) const {
        const S *z = logits + (size_t)row * GPT_VOCAB;
        float mx = -INFINITY, s = 0;
        int target = targets[row], v;
        for (v = g.lane(); v < GPT_VOCAB; v += g.size()) mx = fmaxf(mx, gc_ld(z[v]));
        mx = g.max(mx);
        for (v = g.lane(); v < GPT_VOCAB; v += g.size()) s += expf(gc_ld(z[v]) - mx);
        s = g.sum(s);
        if (g.lane() == 0) row_loss[row] = logf(s) + mx - gc_ld(z[target]);
        if (dlogits) {
            S *d = dlogits + (size_t)row * GPT_VOCAB;
            for (v = g.lane(); v < GPT_VOCAB; v += g.size()) {
                float dv = expf(gc_ld(z[v]) - mx) / s * k;
                if (v == target) dv -= k;
                gc_put(&d[v], dv);
            }
        }
    }
};

/* The mean of row_loss[0, n) in double (one row of lanes, a fixed order) into *out. */
struct gc_mean_loss {
    const float *row_loss;
    float *out;
    int n;
    template <class Lanes> GC_HD void operator()(const Lanes &g, int row) const {
        double s = 0;
        (void)row;
        for (int i = g.lane(); i < n; i += g.size()) s += (double)row_loss[i];
        s = g.sum(s);
        if (g.lane() == 0) *out = (float)(s / n);
    }
};

/* Elementwise conversions between the fp32 flat buffers and bf16 copies (phase 1 of --bf16:
   the model's own bf16 working copies and gradients; see gpt_cuda_create). */
struct gc_round_bf16 {
    const float *src;
    gc_bf16 *dst;
    GC_HD void operator()(size_t i) const { dst[i] = ddp_k__to_bf16(src[i]); }
};
struct gc_widen_bf16 {
    const gc_bf16 *src;
    float *dst;
    GC_HD void operator()(size_t i) const { dst[i] = gc_ld(src[i]); }
};
/* ---------------------------------------------------------------------------------------------
   Ops: each launches its forward and, when training, records its backward with the ids of the
   parameters that backward finishes — gpt.h's ops, one for one. Templated on S as the kernels
   are; parameters and gradients come from gc_param / gc_grad only.
   --------------------------------------------------------------------------------------------- */
static void gc_record(gpt_cuda *m, ddp_backward_fn fn, const void *args, size_t size, const int *ids, int n) {
    ddp_result r = ddp_tape_record(m->ddp, fn, args, size, ids, n);
    if (r != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(m->ddp)); exit(1); }
}

/* The one place the model's parameter and gradient pointers come from: ddp.h's fp32 views
   (fp32, TF32); with bf16, ddp.h's bf16 working copies and gradients (a context with
   param_dtype DDP_DTYPE_BF16), or the model's own bf16 copies at the fp32 views' offsets (an
   fp32 context: own16). */
static size_t gc_offset(gpt_cuda *m, int id) { return (size_t)(ddp_param(m->ddp, id) - m->flat_params); }
static void *gc_param_ptr(gpt_cuda *m, int id) {
    if (!m->bf16) return ddp_param(m->ddp, id);
    return m->own16 ? (void *)(m->params16 + gc_offset(m, id)) : (void *)ddp_param_bf16(m->ddp, id);
}
static void *gc_grad_ptr(gpt_cuda *m, int id) {
    if (!m->bf16) return ddp_grad(m->ddp, id);
    return m->own16 ? (void *)(m->grads16 + gc_offset(m, id)) : (void *)ddp_grad_bf16(m->ddp, id);
}
template <class S> static S *gc_param(gpt_cuda *m, int id) { return (S *)gc_param_ptr(m, id); }
template <class S> static S *gc_grad(gpt_cuda *m, int id) { return (S *)gc_grad_ptr(m, id); }

/* out = src * mask (+ add) over `n` values of per_sample each, at `site`: gc_dropout launched. */
template <class S> static void gc_drop(gpt_cuda *m, uint32_t site, const S *src, const S *add, S *out, size_t n, size_t per_sample) {
    gc_dropout<S> d;
    d.src = src; d.add = add; d.out = out;
    d.seed = m->drop_seed; d.step = m->drop_step; d.row0 = m->drop_row0; d.stride = m->drop_stride;
    d.site = site; d.threshold = m->drop_threshold; d.scale = m->drop_scale; d.per_sample = per_sample;
    GC_FOR_EACH(m, d, n);
}

/* Embedding; its backward finishes wte (after the head's share) and wpe. */
typedef struct { gpt_cuda *m; } gc_embed_args;

template <class S> static void gc_embed_backward(void *p) {
    gpt_cuda *m = ((gc_embed_args *)p)->m;
    int C = m->cfg.dim;
    S *dres = (S *)m->dres;
    gc_wpe_bwd<S> wpe = { dres, gc_grad<S>(m, m->wpe), m->B, m->T, C };
    gc_wte_bwd<S> wte = { dres, gc_grad<S>(m, m->wte), m->token_start, m->positions, C };
    gc_time(m, "bwd embedding (wte, wpe)");
    if (m->dropping)   /* dres is not read after this op: mask it in place */
        gc_drop<S>(m, GPT_DROP_EMBED, dres, NULL, dres, (size_t)m->B * m->T * C, (size_t)m->T * C);
    GC_FOR_EACH(m, wpe, (size_t)m->T * C);
    if (m->kernels == 2) {
        gc_wte_segments<S> seg = { dres, m->seg_begin, m->positions, m->wte_partial, C, m->segments };
        gc_wte_add_segments<S> add = { m->wte_partial, m->seg_first, gc_grad<S>(m, m->wte), C };
        GC_FOR_EACH(m, seg, (size_t)m->segments * C);
        GC_FOR_EACH(m, add, (size_t)GPT_VOCAB * C);
    } else
        GC_FOR_EACH(m, wte, (size_t)GPT_VOCAB * C);
    gc_time_end(m);
}

template <class S> static void gc_embed(gpt_cuda *m, int record) {
    int C = m->cfg.dim;
    gc_embed_fwd<S> embed = { gc_param<S>(m, m->wte), gc_param<S>(m, m->wpe), m->tokens, (S *)m->res0, C, m->T };
    gc_time(m, "fwd embedding");
    GC_FOR_EACH(m, embed, (size_t)m->B * m->T * C);
    if (m->dropping) gc_drop<S>(m, GPT_DROP_EMBED, (S *)m->res0, NULL, (S *)m->res0, (size_t)m->B * m->T * C, (size_t)m->T * C);
    gc_time_end(m);
    if (record) {
        gc_embed_args a = { m };
        int ids[2] = { m->wte, m->wpe };
        gc_record(m, gc_embed_backward<S>, &a, sizeof a, ids, 2);
    }
}

/* LayerNorm; the backward writes dx (accumulate 0) or adds to it (1), and finishes w and b. */
template <class S> struct gc_ln_args {
    gpt_cuda *m; int w, b, rows, accumulate;
    const S *x; const float *mean, *rstd; const S *dout; S *dx;
};

template <class S> static void gc_layernorm_backward(void *p) {
    const gc_ln_args<S> *a = (const gc_ln_args<S> *)p;
    gpt_cuda *m = a->m;
    int C = m->cfg.dim;
    gc_layernorm_bwd_dx<S> dx = { a->x, a->mean, a->rstd, gc_param<S>(m, a->w), a->dout, a->dx, C, a->accumulate };
    gc_layernorm_param_partials<S> partials = { a->x, a->mean, a->rstd, a->dout, m->partial_a, m->partial_b, a->rows, C,
                                                gc_per_chunk(a->rows) };
    gc_add_partials<S> gw = { m->partial_a, gc_grad<S>(m, a->w), C };
    gc_add_partials<S> gb = { m->partial_b, gc_grad<S>(m, a->b), C };
    if (m->kernels == 2) {   /* dx and the partials in one launch, then the same sums of the partials */
        gc_layernorm_bwd_fused<S> fused = { dx, partials, gc_layernorm_bwd_fused<S>::tiles_for(C) };
        gc_time(m, "bwd layernorm dx, dw, db (fused)");
        gc_for_blocks(m->stream, fused, GC_CHUNKS * fused.tiles, "the kernel launch of 'fused'", __FILE__, __LINE__);
        GC_FOR_EACH(m, gw, (size_t)C);
        GC_FOR_EACH(m, gb, (size_t)C);
        gc_time_end(m);
        return;
    }
    gc_time(m, "bwd layernorm dx");
    GC_FOR_ROWS(m, dx, a->rows);
    gc_time_end(m);
    gc_time(m, "bwd layernorm dw, db");
    GC_FOR_EACH(m, partials, (size_t)GC_CHUNKS * C);
    GC_FOR_EACH(m, gw, (size_t)C);
    GC_FOR_EACH(m, gb, (size_t)C);
    gc_time_end(m);
}

template <class S> static void gc_layernorm(gpt_cuda *m, int w, int b, const S *x, S *out, float *mean, float *rstd,
                                            const S *dout, S *dx, int accumulate, int record) {
    int rows = m->B * m->T;
    gc_layernorm_fwd<S> ln = { x, gc_param<S>(m, w), gc_param<S>(m, b), out, mean, rstd, m->cfg.dim };
    gc_time(m, "fwd layernorm");
    GC_FOR_ROWS(m, ln, rows);
    gc_time_end(m);
    if (record) {
        gc_ln_args<S> a;
        int ids[2];
        a.m = m; a.w = w; a.b = b; a.rows = rows; a.accumulate = accumulate;
        a.x = x; a.mean = mean; a.rstd = rstd; a.dout = dout; a.dx = dx;
        ids[0] = w; ids[1] = b;
        gc_record(m, gc_layernorm_backward<S>, &a, sizeof a, ids, 2);
    }
}

/* Linear: out[n, outc] = inp[n, in] W[outc, in]^T + b (+ resid). The backward finishes W and b;
   dinp may be NULL. */
template <class S> struct gc_linear_args {
    gpt_cuda *m; int w, b, n, in, out, drop; uint32_t site;
    const S *inp, *dout; S *dinp;
};

/* The linear layers' names in the op times, by shape (C -> 3C, C -> C, C -> 4C, 4C -> C). */
static const char *gc_linear_name(int in, int out, int phase) {
    static const char *const names[4][3] = {
        { "fwd matmul qkv", "bwd matmul qkv dx", "bwd matmul qkv dW" },
        { "fwd matmul attn proj", "bwd matmul attn proj dx", "bwd matmul attn proj dW" },
        { "fwd matmul mlp fc", "bwd matmul mlp fc dx", "bwd matmul mlp fc dW" },
        { "fwd matmul mlp proj", "bwd matmul mlp proj dx", "bwd matmul mlp proj dW" } };
    int k = out == 3 * in ? 0 : out == in ? 1 : out == 4 * in ? 2 : 3;
    return names[k][phase];
}

template <class S> static void gc_linear_backward(void *p) {
    gc_linear_args<S> masked = *(const gc_linear_args<S> *)p;
    const gc_linear_args<S> *a = &masked;
    gpt_cuda *m = a->m;
    if (a->drop) {   /* the branch's gradient: the stream's, masked */
        gc_time(m, "bwd dropout");
        gc_drop<S>(m, a->site, a->dout, NULL, (S *)m->ddrop, (size_t)a->n * a->out, (size_t)m->T * a->out);
        gc_time_end(m);
        masked.dout = (const S *)m->ddrop;
    }
    gc_column_partials<S> partials = { a->dout, m->partial_a, a->n, a->out, gc_per_chunk(a->n) };
    gc_add_partials<S> gb = { m->partial_a, gc_grad<S>(m, a->b), a->out };
    if (a->dinp) {   /* dinp = dout W */
        gc_time(m, gc_linear_name(a->in, a->out, 1));
        GC_MATMUL(m, 0, 0, a->n, a->in, a->out, 1.0f, a->dout, a->out, gc_param<S>(m, a->w), a->in, 0.0f, a->dinp, a->in);
        gc_time_end(m);
    }
    /* grad W += dout^T inp */
    gc_time(m, gc_linear_name(a->in, a->out, 2));
    GC_MATMUL(m, 1, 0, a->out, a->in, a->n, 1.0f, a->dout, a->out, a->inp, a->in, 1.0f, gc_grad<S>(m, a->w), a->in);
    gc_time_end(m);
    gc_time(m, "bwd bias grads");
    GC_FOR_EACH(m, partials, (size_t)GC_CHUNKS * a->out);
    GC_FOR_EACH(m, gb, (size_t)a->out);
    gc_time_end(m);
}

template <class S> static void gc_linear(gpt_cuda *m, int w, int b, const S *inp, S *out, const S *resid, int in, int outc,
                                         const S *dout, S *dinp, uint32_t site, int record) {
    int n = m->B * m->T, drop = resid && m->dropping;
    gc_linear_init<S> init = { gc_param<S>(m, b), drop ? NULL : resid, out, outc };
    gc_time(m, "fwd bias (+ residual) init");
    {
        gc_f_bias<S> fb = { gc_param<S>(m, b), outc, init.resid != NULL };
        if (!(m->kernels == 2 && GC_MAP_VEC(m, S, gc_f_bias<S>, fb, init.resid, (const S *)NULL, out, (size_t)n * outc)))
            GC_FOR_EACH(m, init, (size_t)n * outc);
    }
    gc_time_end(m);
    gc_time(m, gc_linear_name(in, outc, 0));
    GC_MATMUL(m, 0, 1, n, outc, in, 1.0f, inp, in, gc_param<S>(m, w), in, 1.0f, out, outc);
    gc_time_end(m);
    if (drop) {
        gc_time(m, "fwd dropout");
        gc_drop<S>(m, site, out, resid, out, (size_t)n * outc, (size_t)m->T * outc);   /* resid + dropout(branch) */
        gc_time_end(m);
    }
    if (record) {
        gc_linear_args<S> a;
        int ids[2];
        a.m = m; a.w = w; a.b = b; a.n = n; a.in = in; a.out = outc; a.inp = inp; a.dout = dout; a.dinp = dinp;
        a.drop = drop; a.site = site;
        ids[0] = w; ids[1] = b;
        gc_record(m, gc_linear_backward<S>, &a, sizeof a, ids, 2);
    }
}

/* Causal multi-head self-attention on qkv [BT, 3C] (q | k | v, head h at columns h*hs..). Each
   matmul is one gc_attn_gemm over the sequences and heads: head h's q/k/v start h*hs columns
   further, its [T, T] score matrix T*T values further; sequence b's T*3C (qkv), T*C (out, dout)
   and NH*T*T (scores) further. */
template <class S> struct gc_attn_args { gpt_cuda *m; const S *qkv, *att, *dout; S *dqkv; uint32_t site; };

template <class S> static void gc_attention_backward(void *p) {
    const gc_attn_args<S> *a = (const gc_attn_args<S> *)p;
    gpt_cuda *m = a->m;
    int B = m->B, T = m->T, C = m->cfg.dim, NH = m->cfg.heads, hs = C / NH, C3 = 3 * C;
    long long TT = (long long)T * T, sq = (long long)T * C3, so = (long long)T * C;   /* a sequence's step in qkv, in [BT, C] */
    float scale = 1.0f / sqrtf((float)hs);
    S *datt = (S *)m->datt;
    gc_causal_softmax_bwd<S> softmax = { a->att, datt, T, m->kernels == 2 };
    const S *Pd = a->att;   /* what met V: with dropout, P masked (drawn again into datt, used before dP goes there) */
    gc_time(m, "bwd attention dV = P^T dO");
    if (m->dropping) { gc_drop<S>(m, a->site, a->att, NULL, datt, (size_t)B * NH * TT, (size_t)NH * TT); Pd = datt; }
    GC_ATTN_MATMUL(m, 1, 0, T, hs, T, 1.0f, Pd, T, NH * TT, TT, a->dout, C, so, hs, a->dqkv + 2 * C, C3, sq, hs);   /* dV = Pd^T dO */
    gc_time_end(m);
    gc_time(m, "bwd attention dP = dO V^T");
    GC_ATTN_MATMUL(m, 0, 1, T, T, hs, 1.0f, a->dout, C, so, hs, a->qkv + 2 * C, C3, sq, hs, datt, T, NH * TT, TT);   /* dPd = dO V^T */
    if (m->dropping) gc_drop<S>(m, a->site, datt, NULL, datt, (size_t)B * NH * TT, (size_t)NH * TT);   /* dP = dPd * mask */
    gc_time_end(m);
    gc_time(m, "bwd attention softmax");
    GC_FOR_ROWS(m, softmax, B * NH * T);                                                       /* dS, in place */
    gc_time_end(m);
    gc_time(m, "bwd attention dQ, dK");
    GC_ATTN_MATMUL(m, 0, 0, T, hs, T, scale, datt, T, NH * TT, TT, a->qkv + C, C3, sq, hs, a->dqkv, C3, sq, hs);   /* dQ = scale dS K */
    GC_ATTN_MATMUL(m, 1, 0, T, hs, T, scale, datt, T, NH * TT, TT, a->qkv, C3, sq, hs, a->dqkv + C, C3, sq, hs);   /* dK = scale dS^T Q */
    gc_time_end(m);
}

template <class S> static void gc_attention(gpt_cuda *m, const S *qkv, S *att, S *out, const S *dout, S *dqkv, uint32_t site,
                                            int record) {
    int B = m->B, T = m->T, C = m->cfg.dim, NH = m->cfg.heads, hs = C / NH, C3 = 3 * C;
    long long TT = (long long)T * T, sq = (long long)T * C3, so = (long long)T * C;   /* a sequence's step in qkv, in [BT, C] */
    float scale = 1.0f / sqrtf((float)hs);
    S *datt = (S *)m->datt;
    gc_causal_softmax_fwd<S> softmax = { att, T };
    gc_causal_softmax_fwd_online<S> softmax1 = { att, T };
    gc_time(m, "fwd attention S = Q K^T");
    GC_ATTN_MATMUL(m, 0, 1, T, T, hs, scale, qkv, C3, sq, hs, qkv + C, C3, sq, hs, att, T, NH * TT, TT);   /* S = scale Q K^T */
    gc_time_end(m);
    gc_time(m, "fwd attention softmax");
    if (m->kernels == 2) GC_FOR_ROWS(m, softmax1, B * NH * T);
    else GC_FOR_ROWS(m, softmax, B * NH * T);
    gc_time_end(m);
    const S *Pd = att;   /* with dropout, P masked into datt (free until the backward) */
    gc_time(m, "fwd attention O = P V");
    if (m->dropping) { gc_drop<S>(m, site, att, NULL, datt, (size_t)B * NH * TT, (size_t)NH * TT); Pd = datt; }
    /* O = dropout(P) V, the heads side by side in out [BT, C] */
    GC_ATTN_MATMUL(m, 0, 0, T, hs, T, 1.0f, Pd, T, NH * TT, TT, qkv + 2 * C, C3, sq, hs, out, C, so, hs);
    gc_time_end(m);
    if (record) {
        gc_attn_args<S> a;
        a.m = m; a.qkv = qkv; a.att = att; a.dout = dout; a.dqkv = dqkv; a.site = site;
        gc_record(m, gc_attention_backward<S>, &a, sizeof a, NULL, 0);
    }
}

/* GPT_ATTENTION=fused: the same op as gc_attention without the [B, NH, T, T] buffers (see
   gc_att_fused_fwd); lse [B, NH, T] is the layer's, D [B, NH, T] scratch shared by the layers. */
static gc_att_shape gc_att_shape_of(const gpt_cuda *m, uint32_t site) {
    gc_att_shape sh;
    sh.T = m->T; sh.C = m->cfg.dim; sh.NH = m->cfg.heads;
    sh.scale = 1.0f / sqrtf((float)(m->cfg.dim / m->cfg.heads));
    sh.dropping = m->dropping;
    sh.seed = m->drop_seed; sh.step = m->drop_step; sh.row0 = m->drop_row0; sh.stride = m->drop_stride;
    sh.site = site; sh.threshold = m->drop_threshold; sh.drop_scale = m->drop_scale;
    return sh;
}
template <class S> struct gc_att_fused_args { gpt_cuda *m; const S *qkv, *out, *dout; const float *lse; S *dqkv; uint32_t site; };

template <class S> static void gc_attention_fused_backward(void *p) {
    const gc_att_fused_args<S> *a = (const gc_att_fused_args<S> *)p;
    gpt_cuda *m = a->m;
    int rows = m->B * m->cfg.heads * m->T;
    gc_att_fused_bwd_q<S> bq;
    gc_att_fused_bwd_kv<S> bkv;
    bq.qkv = a->qkv; bq.out = a->out; bq.dout = a->dout; bq.lse = a->lse; bq.D = m->att_D; bq.dqkv = a->dqkv;
    bq.sh = gc_att_shape_of(m, a->site);
    bkv.qkv = a->qkv; bkv.dout = a->dout; bkv.lse = a->lse; bkv.D = m->att_D; bkv.dqkv = a->dqkv; bkv.sh = bq.sh;
    gc_time(m, "bwd attention fused dQ (+ D)");
    GC_FOR_ROWS(m, bq, rows);
    gc_time_end(m);
    gc_time(m, "bwd attention fused dK, dV");
    GC_FOR_ROWS(m, bkv, rows);
    gc_time_end(m);
}

template <class S> static void gc_attention_fused(gpt_cuda *m, const S *qkv, float *lse, S *out, const S *dout, S *dqkv, uint32_t site,
                                                  int record) {
    gc_att_fused_fwd<S> f;
    f.qkv = qkv; f.out = out; f.lse = lse; f.sh = gc_att_shape_of(m, site); f.extra_keys = 0;
    gc_time(m, "fwd attention fused");
    GC_FOR_ROWS(m, f, m->B * m->cfg.heads * m->T);
    gc_time_end(m);
    if (record) {
        gc_att_fused_args<S> a;
        a.m = m; a.qkv = qkv; a.out = out; a.dout = dout; a.lse = lse; a.dqkv = dqkv; a.site = site;
        gc_record(m, gc_attention_fused_backward<S>, &a, sizeof a, NULL, 0);
    }
}

/* GELU; the backward recomputes the sigmoid from x (cheaper than keeping it). */
template <class S> struct gc_gelu_args { gpt_cuda *m; size_t n; const S *x, *dout; S *dx; };

template <class S> static void gc_gelu_backward(void *p) {
    const gc_gelu_args<S> *a = (const gc_gelu_args<S> *)p;
    gc_gelu_bwd<S> bwd = { a->x, a->dout, a->dx };
    gc_time(a->m, "bwd gelu");
    if (!(a->m->kernels == 2 && GC_MAP_VEC(a->m, S, gc_f_gelu_grad, gc_f_gelu_grad(), a->x, a->dout, a->dx, a->n)))
        GC_FOR_EACH(a->m, bwd, a->n);
    gc_time_end(a->m);
}

template <class S> static void gc_gelu(gpt_cuda *m, const S *x, S *y, size_t n, const S *dout, S *dx, int record) {
    gc_gelu_fwd<S> fwd = { x, y };
    gc_time(m, "fwd gelu");
    if (!(m->kernels == 2 && GC_MAP_VEC(m, S, gc_f_gelu, gc_f_gelu(), x, (const S *)NULL, y, n))) GC_FOR_EACH(m, fwd, n);
    gc_time_end(m);
    if (record) {
        gc_gelu_args<S> a;
        a.m = m; a.n = n; a.x = x; a.dout = dout; a.dx = dx;
        gc_record(m, gc_gelu_backward<S>, &a, sizeof a, NULL, 0);
    }
}

/* Head tied to wte: logits = lnf wte^T. Its backward adds its share of grad(wte), which the
   embedding's backward finishes. */
typedef struct { gpt_cuda *m; } gc_head_args;

template <class S> static void gc_head_backward(void *p) {
    gpt_cuda *m = ((gc_head_args *)p)->m;
    int C = m->cfg.dim, BT = m->B * m->T;
    /* the tied wte is listed by the embedding's op (which finishes its gradient), not this one:
       its unit is gathered here (kept from the forward; the tape releases it after that op) */
    if (m->units && ddp_unit_gather(m->ddp, 0) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(m->ddp)); exit(1); }
    gc_time(m, "bwd matmul head dx, dW");
    GC_MATMUL(m, 0, 0, BT, C, GPT_VOCAB, 1.0f, (const S *)m->dlogits, GPT_VOCAB, gc_param<S>(m, m->wte), C, 0.0f, (S *)m->dln, C);
    GC_MATMUL(m, 1, 0, GPT_VOCAB, C, BT, 1.0f, (const S *)m->dlogits, GPT_VOCAB, (const S *)m->lnf, C, 1.0f, gc_grad<S>(m, m->wte), C);
    gc_time_end(m);
}

template <class S> static void gc_head(gpt_cuda *m, int record) {
    int C = m->cfg.dim, BT = m->B * m->T;
    gc_time(m, "fwd matmul head");
    GC_MATMUL(m, 0, 1, BT, GPT_VOCAB, C, 1.0f, (const S *)m->lnf, C, gc_param<S>(m, m->wte), C, 0.0f, (S *)m->logits, GPT_VOCAB);
    gc_time_end(m);
    if (record) {
        gc_head_args a = { m };
        gc_record(m, gc_head_backward<S>, &a, sizeof a, NULL, 0);
    }
}

/* Reads the device's unread losses into loss_list (a blocking copy: only gpt_cuda_losses, and a
   forward that finds all GC_LOSS_SLOTS full, come here). */
static void gc_collect_losses(gpt_cuda *m) {
    int n = m->losses_pending, i;
    if (!n) return;
    gpt_cuda_download(m->stream, m->losses_host, m->losses, sizeof(float) * (size_t)n);
    if (m->loss_count + n > m->loss_cap) {
        int cap = 2 * (m->loss_count + n);
        float *grown = (float *)realloc(m->loss_list, sizeof(float) * (size_t)cap);
        if (!grown) gc_die(__FILE__, __LINE__, "realloc", "out of host memory");
        m->loss_list = grown;
        m->loss_cap = cap;
    }
    for (i = 0; i < n; i++) m->loss_list[m->loss_count++] = m->losses_host[i];
    m->losses_pending = 0;
}

/* Mean cross-entropy over the BT positions into the next loss slot; with grad, dlogits =
   scale * d(mean loss)/d(logits) right away (no tape op, as in gpt.h). */
template <class S> static void gc_cross_entropy(gpt_cuda *m, float scale, int grad) {
    int BT = m->B * m->T;
    gc_cross_entropy_rows<S> ce = { (const S *)m->logits, m->targets, grad ? (S *)m->dlogits : NULL, m->row_loss, scale / (float)BT };
    if (m->losses_pending == GC_LOSS_SLOTS) gc_collect_losses(m);
    gc_time(m, "fwd cross-entropy (+ dlogits)");
    GC_FOR_ROWS(m, ce, BT);
    {
        gc_mean_loss mean = { m->row_loss, m->losses + m->losses_pending, BT };
        GC_FOR_ROWS(m, mean, 1);
        m->losses_pending++;
    }
    gc_time_end(m);
}

/* Sharded parameters: gpt.h's gpt_unit_op. A unit gathered before the ops that read it, the next
   one prefetched, each released after (ddp.h gathers them again for the backward); on NCCL each
   is an event the stream waits on, so the host never waits. Nothing without units. */
enum { GC_GATHER = GPT__GATHER, GC_PREFETCH = GPT__PREFETCH, GC_RELEASE = GPT__RELEASE };
static void gc_unit(gpt_cuda *m, int unit, int what) { gpt_unit_op(m->ddp, m->units, m->cfg.layers, unit, what); }

/* The forward of gpt_cuda_forward, in S; the units as gpt_forward gathers them. */
template <class S> static void gc_forward(gpt_cuda *m, int have_targets, float loss_scale, int train) {
    int L = m->cfg.layers, C = m->cfg.dim, l;
    size_t BT = (size_t)m->B * m->T;
    S *dln = (S *)m->dln, *dres = (S *)m->dres, *dqkv = (S *)m->dqkv, *datt_out = (S *)m->datt_out;
    S *dfc = (S *)m->dfc, *dgelu = (S *)m->dgelu;
    gc_unit(m, 0, GC_GATHER);
    gc_unit(m, 1, GC_PREFETCH);
    gc_embed<S>(m, train);
    gc_unit(m, 0, GC_RELEASE);
    for (l = 0; l < L; l++) {
        const gpt_layer_ids *id = &m->layer[l];
        gpt_cuda_layer *a = &m->acts[l];
        S *res_in = (S *)a->res_in, *ln1 = (S *)a->ln1, *qkv = (S *)a->qkv, *att = (S *)a->att, *att_out = (S *)a->att_out;
        S *res_mid = (S *)a->res_mid, *ln2 = (S *)a->ln2, *fc = (S *)a->fc, *gelu = (S *)a->gelu, *res_out = (S *)a->res_out;
        gc_unit(m, l + 1, GC_GATHER);
        gc_unit(m, l + 2, GC_PREFETCH);   /* the next block's (or lnf's) copy overlaps this block */
        gc_layernorm<S>(m, id->ln1w, id->ln1b, res_in, ln1, a->ln1_mean, a->ln1_rstd, dln, dres, 1, train);
        gc_linear<S>(m, id->qkvw, id->qkvb, ln1, qkv, NULL, C, 3 * C, dqkv, dln, 0, train);
        if (m->attention_fused) gc_attention_fused<S>(m, qkv, a->lse, att_out, datt_out, dqkv, GPT_DROP_ATT(l), train);
        else gc_attention<S>(m, qkv, att, att_out, datt_out, dqkv, GPT_DROP_ATT(l), train);
        gc_linear<S>(m, id->projw, id->projb, att_out, res_mid, res_in, C, C, dres, datt_out, GPT_DROP_ATTN_RESID(l), train);
        gc_layernorm<S>(m, id->ln2w, id->ln2b, res_mid, ln2, a->ln2_mean, a->ln2_rstd, dln, dres, 1, train);
        gc_linear<S>(m, id->fcw, id->fcb, ln2, fc, NULL, C, 4 * C, dfc, dln, 0, train);
        gc_gelu<S>(m, fc, gelu, BT * 4 * C, dgelu, dfc, train);
        gc_linear<S>(m, id->fcprojw, id->fcprojb, gelu, res_out, res_mid, 4 * C, C, dres, dgelu, GPT_DROP_MLP_RESID(l), train);
        gc_unit(m, l + 1, GC_RELEASE);
    }
    gc_unit(m, L + 1, GC_GATHER);
    gc_unit(m, 0, GC_PREFETCH);           /* the head reads the tied wte */
    gc_layernorm<S>(m, m->lnfw, m->lnfb, (const S *)m->acts[L - 1].res_out, (S *)m->lnf, m->lnf_mean, m->lnf_rstd, dln, dres, 0, train);
    gc_unit(m, L + 1, GC_RELEASE);
    gc_unit(m, 0, GC_GATHER);
    gc_head<S>(m, train);
    if (!train) gc_unit(m, 0, GC_RELEASE);   /* training keeps it for the head's backward, the first op replayed */
    if (have_targets) gc_cross_entropy<S>(m, loss_scale, train);
}
/* ---------------------------------------------------------------------------------------------
   The batch: tokens, targets, and for the embedding's backward the positions grouped by token
   (a counting sort; increasing within a token), through the next pinned slot.
   --------------------------------------------------------------------------------------------- */
static void gc_upload_batch(gpt_cuda *m, const int *tokens, const int *targets, int BT) {
    size_t max_bt = (size_t)m->cfg.batch * m->cfg.seq;
    int slot = m->upload_next, *h = m->upload[slot], *start, *positions, next[GPT_VOCAB], i, v;
    m->upload_next = (slot + 1) % GC_UPLOAD_SLOTS;
#ifndef GPT_CUDA_EMULATE
    /* Only waits when the host is GC_UPLOAD_SLOTS forwards ahead of the GPU. */
    if (m->upload_used[slot]) GC_CUDA(cudaEventSynchronize(m->upload_done[slot]));
#endif
    start = h + 2 * max_bt;
    positions = start + GPT_VOCAB + 1;
    for (i = 0; i < BT; i++)
        if (tokens[i] < 0 || tokens[i] >= GPT_VOCAB || (targets && (targets[i] < 0 || targets[i] >= GPT_VOCAB))) {
            char why[128];
            snprintf(why, sizeof why, "position %d holds token %d, target %d: not a byte", i, tokens[i], targets ? targets[i] : 0);
            gc_die(__FILE__, __LINE__, "gpt_cuda_forward", why);
        }
    memcpy(h, tokens, sizeof(int) * (size_t)BT);
    if (targets) memcpy(h + max_bt, targets, sizeof(int) * (size_t)BT);
    for (v = 0; v <= GPT_VOCAB; v++) start[v] = 0;
    for (i = 0; i < BT; i++) start[tokens[i] + 1]++;
    for (v = 0; v < GPT_VOCAB; v++) { start[v + 1] += start[v]; next[v] = start[v]; }
    for (i = 0; i < BT; i++) positions[next[tokens[i]]++] = i;
    {   /* GPT_KERNELS=2's segments (cheap: computed always) */
        int *seg_first = positions + max_bt, *seg_begin = seg_first + GPT_VOCAB + 1, nseg = 0;
        for (v = 0; v < GPT_VOCAB; v++) {
            seg_first[v] = nseg;
            for (i = start[v]; i < start[v + 1]; i += GC_WTE_SEGMENT) seg_begin[nseg++] = i;
        }
        seg_first[GPT_VOCAB] = nseg;
        seg_begin[nseg] = BT;
        m->segments = nseg;
    }
#ifdef GPT_CUDA_EMULATE
    memcpy(m->tokens, h, sizeof(int) * m->batch_ints);
#else
    GC_CUDA(cudaMemcpyAsync(m->tokens, h, sizeof(int) * m->batch_ints, cudaMemcpyHostToDevice, m->stream));
    GC_CUDA(cudaEventRecord(m->upload_done[slot], m->stream));
#endif
    m->upload_used[slot] = 1;
}

/* ---------------------------------------------------------------------------------------------
   The model's API.
   --------------------------------------------------------------------------------------------- */

/* gpt_cuda_create's precision. GPT_CUDA_TF32 is 1 so that the old `tf32` flag still means it. */
enum { GPT_CUDA_FP32 = 0, GPT_CUDA_TF32 = 1, GPT_CUDA_BF16 = 2 };

/* Registers and commits the parameters (gpt.h's code: same order, shapes, init), then makes the
   cuBLAS handle on ddp.h's compute stream and the device buffers for the largest batch.
   Call after ddp_init on the NCCL backend (ddp.h chose the device). precision: GPT_CUDA_FP32
   (plain fp32), GPT_CUDA_TF32 (TF32 matmuls), GPT_CUDA_BF16 (bf16 weights, gradients and
   activations; fp32 accumulation, softmax, LayerNorm statistics and loss). bf16 is meant for a
   context with param_dtype DDP_DTYPE_BF16: the model uses ddp.h's bf16 working copies and
   gradients, and ddp_adamw_step updates the fp32 master weights. On an fp32 context the model
   makes its own bf16 copies (rounded from ddp.h's parameters) and gradients, which
   gpt_cuda_bf16_* below move to and from ddp.h's fp32 buffers (one rank: the tests compare the
   two precisions from the same fp32 parameters that way). */
static inline ddp_result gpt_cuda_create(gpt_cuda *m, ddp_context *ddp, const gpt_config *cfg, uint64_t seed, int precision) {
    int L = cfg->layers, C = cfg->dim, NH = cfg->heads, T = cfg->seq, B = cfg->batch, l, s;
    size_t BT = (size_t)B * T, BHTT = (size_t)B * NH * T * T;
    gpt_param_ids ids;
    ddp_result r;
    memset(m, 0, sizeof *m);
    if (precision != GPT_CUDA_FP32 && precision != GPT_CUDA_TF32 && precision != GPT_CUDA_BF16) {
        fprintf(stderr, "gpt_cuda_create: precision %d is none of GPT_CUDA_FP32, GPT_CUDA_TF32, GPT_CUDA_BF16\n", precision);
        return DDP_ERR_INVALID_ARGUMENT;
    }
    m->cfg = *cfg;
    m->ddp = ddp;
    m->drop_stride = 1;   /* as gpt.h */
    m->tf32 = precision == GPT_CUDA_TF32;
    m->bf16 = precision == GPT_CUDA_BF16;
    m->act_bytes = m->bf16 ? sizeof(gc_bf16) : sizeof(float);
    m->layer = (gpt_layer_ids *)calloc((size_t)L, sizeof *m->layer);
    m->acts = (gpt_cuda_layer *)calloc((size_t)L, sizeof *m->acts);
    if (!m->layer || !m->acts) return DDP_ERR_OUT_OF_MEMORY;
    ids.layer = m->layer;
    if ((r = gpt_register_params(ddp, cfg, seed, &ids, &m->num_floats)) != DDP_OK) return r;
    m->wte = ids.wte; m->wpe = ids.wpe; m->lnfw = ids.lnfw; m->lnfb = ids.lnfb;
    m->units = ddp_num_units(ddp) == L + 2;
    m->stream = (gc_stream)ddp_config(ddp)->cuda_stream;
    m->flat_params = ddp_flat_params(ddp, NULL);
    m->flat_grads = ddp_flat_grads(ddp, &m->flat_floats);   /* > num_floats where a tensor's length is no multiple of the padding */
    m->own16 = m->bf16 && ddp_config(ddp)->param_dtype != DDP_DTYPE_BF16;
    if (!m->bf16 && ddp_config(ddp)->param_dtype == DDP_DTYPE_BF16) {
        fprintf(stderr, "gpt_cuda_create: the context's parameters are bf16 (param_dtype DDP_DTYPE_BF16): pass precision "
                        "GPT_CUDA_BF16\n");
        return DDP_ERR_INVALID_ARGUMENT;
    }
    if (m->own16 && ddp_config(ddp)->shard == DDP_SHARD_PARAMETERS) {   /* its copies span the whole flat buffer */
        fprintf(stderr, "gpt_cuda_create: rank %d: precision GPT_CUDA_BF16 on an fp32 context keeps whole bf16 copies of the "
                        "parameters, which ZeRO-3 (DDP_SHARD_PARAMETERS) shards: give the context param_dtype DDP_DTYPE_BF16\n",
                ddp_rank(ddp));
        return DDP_ERR_INVALID_ARGUMENT;
    }
#ifndef GPT_CUDA_EMULATE
    GC_CUBLAS(cublasCreate(&m->blas));
    GC_CUBLAS(cublasSetStream(m->blas, m->stream));
    /* bf16: no reduced-precision reduction, so a split-K GEMM (the weight gradients, K = B*T)
       adds its partial sums in fp32 and C is rounded to bf16 once, as the emulation does. */
    GC_CUBLAS(cublasSetMathMode(m->blas, m->tf32   ? CUBLAS_TF32_TENSOR_OP_MATH
                                         : m->bf16 ? (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)
                                                   : CUBLAS_DEFAULT_MATH));
    GC_CUBLAS(cublasSetAtomicsMode(m->blas, CUBLAS_ATOMICS_NOT_ALLOWED));   /* the default; determinism needs it */
#endif
    {   /* GPT_KERNELS=2: the new kernels (the switch lets one GPU call time old and new) */
        const char *e = getenv("GPT_KERNELS");
        if (e && strcmp(e, "1") != 0 && strcmp(e, "2") != 0) {
            fprintf(stderr, "gpt_cuda_create: GPT_KERNELS is '%s': 1 (the kernels as they were) or 2 (the new ones)\n", e);
            return DDP_ERR_INVALID_ARGUMENT;
        }
        m->kernels = e && strcmp(e, "2") == 0 ? 2 : 1;
    }
    {   /* GPT_ATTENTION=fused: attention without the [T, T] matrices (their buffers are then not made) */
        const char *e = getenv("GPT_ATTENTION");
        if (e && strcmp(e, "explicit") != 0 && strcmp(e, "fused") != 0) {
            fprintf(stderr, "gpt_cuda_create: GPT_ATTENTION is '%s': explicit (the [T, T] matrices, the default) or fused\n", e);
            return DDP_ERR_INVALID_ARGUMENT;
        }
        m->attention_fused = e && strcmp(e, "fused") == 0;
        if (m->attention_fused && C / NH > GC_ATT_MAX_HS) {
            fprintf(stderr, "gpt_cuda_create: rank %d: GPT_ATTENTION=fused takes a head size (dim / heads) of at most %d, not %d\n",
                    ddp_rank(ddp), (int)GC_ATT_MAX_HS, C / NH);
            return DDP_ERR_INVALID_ARGUMENT;
        }
    }
    {   /* GPT_OP_TIMES=1: per-op times (see gc_op_timer) */
        const char *e = getenv("GPT_OP_TIMES");
        if (e && strcmp(e, "0") != 0 && strcmp(e, "1") != 0) {
            fprintf(stderr, "gpt_cuda_create: GPT_OP_TIMES is '%s': 1 (per-op times) or 0 (none)\n", e);
            return DDP_ERR_INVALID_ARGUMENT;
        }
        if (e && strcmp(e, "1") == 0) {
            if (!(m->timer = (gc_op_timer *)calloc(1, sizeof *m->timer))) return DDP_ERR_OUT_OF_MEMORY;
#ifndef GPT_CUDA_EMULATE
            for (s = 0; s < 2 * GC_TIMER_PAIRS; s++) GC_CUDA(cudaEventCreate(&m->timer->ticks[s]));
            GC_CUDA(cudaEventCreate(&m->timer->step_ticks[0]));
            GC_CUDA(cudaEventCreate(&m->timer->step_ticks[1]));
#endif
        }
    }
    if (m->own16) {   /* the bf16 working copies (rounded from the fp32 init) and gradients */
        m->params16 = (gc_bf16 *)gc_device_alloc(m, m->flat_floats * sizeof(gc_bf16));
        m->grads16 = (gc_bf16 *)gc_device_alloc(m, m->flat_floats * sizeof(gc_bf16));
    }
    m->res0 = gc_acts(m, BT * C);
    for (l = 0; l < L; l++) {
        gpt_cuda_layer *a = &m->acts[l];
        a->res_in = l == 0 ? m->res0 : m->acts[l - 1].res_out;
        a->ln1 = gc_acts(m, BT * C); a->ln1_mean = gc_floats(m, BT); a->ln1_rstd = gc_floats(m, BT);
        a->qkv = gc_acts(m, BT * 3 * C); a->att = m->attention_fused ? NULL : gc_acts(m, BHTT);
        a->lse = gc_floats(m, BT * NH);
        a->att_out = gc_acts(m, BT * C); a->res_mid = gc_acts(m, BT * C);
        a->ln2 = gc_acts(m, BT * C); a->ln2_mean = gc_floats(m, BT); a->ln2_rstd = gc_floats(m, BT);
        a->fc = gc_acts(m, BT * 4 * C); a->gelu = gc_acts(m, BT * 4 * C);
        a->res_out = gc_acts(m, BT * C);
    }
    m->lnf = gc_acts(m, BT * C); m->lnf_mean = gc_floats(m, BT); m->lnf_rstd = gc_floats(m, BT);
    m->logits = gc_acts(m, BT * GPT_VOCAB); m->dlogits = gc_acts(m, BT * GPT_VOCAB);
    m->dres = gc_acts(m, BT * C); m->dln = gc_acts(m, BT * C); m->datt_out = gc_acts(m, BT * C);
    m->dqkv = gc_acts(m, BT * 3 * C); m->dfc = gc_acts(m, BT * 4 * C); m->dgelu = gc_acts(m, BT * 4 * C);
    m->datt = m->attention_fused ? NULL : gc_acts(m, BHTT);
    m->att_D = gc_floats(m, BT * NH);
    m->ddrop = gc_acts(m, BT * C);
    m->row_loss = gc_floats(m, BT);
    m->losses = gc_floats(m, GC_LOSS_SLOTS);
    m->attn_ptrs = (void **)gc_device_alloc(m, sizeof(void *) * 3 * (size_t)B * NH);
    m->partial_a = gc_floats(m, (size_t)GC_CHUNKS * 4 * C);
    m->partial_b = gc_floats(m, (size_t)GC_CHUNKS * 4 * C);
    m->max_segments = (int)(BT / GC_WTE_SEGMENT) + GPT_VOCAB;   /* each token: floor(n/SEG) + 1 at most */
    m->batch_ints = 3 * BT + GPT_VOCAB + 1 + GPT_VOCAB + 1 + (size_t)m->max_segments + 1;
    m->tokens = (int *)gc_device_alloc(m, sizeof(int) * m->batch_ints);
    m->targets = m->tokens + BT;
    m->token_start = m->targets + BT;
    m->positions = m->token_start + GPT_VOCAB + 1;
    m->seg_first = m->positions + BT;
    m->seg_begin = m->seg_first + GPT_VOCAB + 1;
    m->wte_partial = gc_floats(m, (size_t)m->max_segments * C);
    for (s = 0; s < GC_UPLOAD_SLOTS; s++) {
        m->upload[s] = (int *)gc_pinned_alloc(sizeof(int) * m->batch_ints);
        memset(m->upload[s], 0, sizeof(int) * m->batch_ints);
#ifndef GPT_CUDA_EMULATE
        GC_CUDA(cudaEventCreateWithFlags(&m->upload_done[s], cudaEventDisableTiming));
#endif
    }
    m->losses_host = (float *)gc_pinned_alloc(sizeof(float) * GC_LOSS_SLOTS);
#ifndef GPT_CUDA_EMULATE
    /* The NaN fills ran on the legacy stream: done before the compute stream uses the buffers,
       whatever kind of stream it is. (Set-up, not a step.) */
    GC_CUDA(cudaDeviceSynchronize());
#endif
    if (m->own16) {
        gc_round_bf16 round = { m->flat_params, m->params16 };
        GC_FOR_EACH(m, round, m->flat_floats);
    }
    return DDP_OK;
}

/* bf16 on an fp32 context: the model's own bf16 copies and ddp.h's fp32 buffers (no-ops
   otherwise: in fp32/TF32, and where ddp.h holds the bf16 copies itself):
   round_params: the working copies = ddp.h's fp32 parameters rounded to bf16 (after each
   ddp_adamw_step, and after a checkpoint is loaded); zero_grads: the bf16 gradients = 0 (with
   ddp_zero_grad); grads_to_fp32: ddp.h's fp32 gradients = the bf16 gradients, widened
   (after ddp_backward, before ddp_adamw_step). On ddp.h's stream, like everything else. */
static inline void gpt_cuda_bf16_round_params(gpt_cuda *m) {
    gc_round_bf16 round = { m->flat_params, m->params16 };
    if (m->own16) GC_FOR_EACH(m, round, m->flat_floats);
}
static inline void gpt_cuda_bf16_zero_grads(gpt_cuda *m) {
    if (!m->own16) return;
#ifdef GPT_CUDA_EMULATE
    memset(m->grads16, 0, m->flat_floats * sizeof(gc_bf16));
#else
    GC_CUDA(cudaMemsetAsync(m->grads16, 0, m->flat_floats * sizeof(gc_bf16), m->stream));
#endif
}
static inline void gpt_cuda_bf16_grads_to_fp32(gpt_cuda *m) {
    gc_widen_bf16 widen = { m->grads16, m->flat_grads };
    if (m->own16) GC_FOR_EACH(m, widen, m->flat_floats);
}

static inline void gpt_cuda_destroy(gpt_cuda *m) {
    int i;
#ifndef GPT_CUDA_EMULATE
    cudaStreamSynchronize(m->stream);
    if (m->blas) cublasDestroy(m->blas);
    for (i = 0; i < GC_UPLOAD_SLOTS; i++) if (m->upload_done[i]) cudaEventDestroy(m->upload_done[i]);
    if (m->timer) {
        for (i = 0; i < 2 * GC_TIMER_PAIRS; i++) cudaEventDestroy(m->timer->ticks[i]);
        cudaEventDestroy(m->timer->step_ticks[0]);
        cudaEventDestroy(m->timer->step_ticks[1]);
    }
    for (i = 0; i < m->num_allocs; i++) cudaFree(m->allocs[i]);
#else
    for (i = 0; i < m->num_allocs; i++) free(m->allocs[i]);
#endif
    for (i = 0; i < GC_UPLOAD_SLOTS; i++) gc_pinned_free(m->upload[i]);
    gc_pinned_free(m->losses_host);
    free(m->allocs); free(m->layer); free(m->acts); free(m->loss_list); free(m->timer);
    memset(m, 0, sizeof *m);
}

/* Forward over B sequences of T tokens (B <= cfg.batch, T <= cfg.seq), enqueued on the stream.
   With targets, the mean cross-entropy goes to the next loss slot (read with gpt_cuda_losses);
   with train, the backward is recorded on the tape and dlogits = loss_scale * d(mean loss)/
   d(logits). gpt_forward's contract, with the loss read later. */
static inline void gpt_cuda_forward(gpt_cuda *m, const int *tokens, const int *targets, int B, int T, float loss_scale, int train) {
    size_t BT = (size_t)B * T;
    if (B < 1 || B > m->cfg.batch || T < 1 || T > m->cfg.seq) {
        fprintf(stderr, "gpt_cuda_forward: shape %dx%d outside the allocated %dx%d\n", B, T, m->cfg.batch, m->cfg.seq);
        exit(1);
    }
    m->B = B;
    m->T = T;
    m->dropping = train && m->drop_p > 0.0f;
    gc_upload_batch(m, tokens, targets, (int)BT);
    if (m->bf16) gc_forward<gc_bf16>(m, targets != NULL, loss_scale, train);
    else gc_forward<float>(m, targets != NULL, loss_scale, train);
}

/* Dropout as gpt_set_dropout (0 <= p < 1; returns 0 otherwise), and where the next forward's rows
   sit in the step's global batch, as gpt_set_rows: the same masks as the CPU model. */
static inline int gpt_cuda_set_dropout(gpt_cuda *m, float p, uint64_t seed) {
    if (!gpt__dropout_setting(p, &m->drop_scale, &m->drop_threshold)) return 0;
    m->drop_p = p;
    m->drop_seed = seed;
    return 1;
}
static inline void gpt_cuda_set_rows(gpt_cuda *m, uint64_t step, uint64_t row0, uint64_t stride) {
    m->drop_step = step;
    m->drop_row0 = row0;
    m->drop_stride = stride;
}

/* The mean loss of every forward with targets since the last call, in forward order: waits for
   the GPU once. The array lives until the next forward. */
static inline const float *gpt_cuda_losses(gpt_cuda *m, int *count) {
    gc_collect_losses(m);
    *count = m->loss_count;
    m->loss_count = 0;
    return m->loss_list;
}

/* Rows [row0, row0 + rows) of the last forward's logits [BT, 256] into out as floats (blocking:
   for sampling and tests; bf16 logits are widened exactly). */
static inline void gpt_cuda_logits_rows(gpt_cuda *m, int row0, int rows, float *out) {
    size_t n = (size_t)rows * GPT_VOCAB, i;
    if (!m->bf16) {
        gpt_cuda_download(m->stream, out, (const float *)m->logits + (size_t)row0 * GPT_VOCAB, sizeof(float) * n);
        return;
    }
    gc_bf16 *h = (gc_bf16 *)malloc(n * sizeof(gc_bf16) + 1);
    if (!h) gc_die(__FILE__, __LINE__, "malloc", "out of host memory");
    gpt_cuda_download(m->stream, h, (const gc_bf16 *)m->logits + (size_t)row0 * GPT_VOCAB, sizeof(gc_bf16) * n);
    for (i = 0; i < n; i++) out[i] = gc_ld(h[i]);
    free(h);
}
/* Row `row` of the last forward's logits into out (blocking: for sampling). */
static inline void gpt_cuda_logits_row(gpt_cuda *m, int row, float *out) { gpt_cuda_logits_rows(m, row, 1, out); }

/* Which kernels (GPT_KERNELS at create; 1: as they were, 2: the segmented token-embedding
   backward and the one-pass causal softmax). Returns 0 for another value. */
static inline int gpt_cuda_set_kernels(gpt_cuda *m, int kernels) {
    if (kernels != 1 && kernels != 2) return 0;
    m->kernels = kernels;
    return 1;
}

/* Which attention (GPT_ATTENTION at create): 0 explicit, 1 fused. Returns 0 (nothing changed)
   for explicit on a model created fused (its [T, T] buffers were never made) or fused with a
   head size over GC_ATT_MAX_HS. */
static inline int gpt_cuda_set_attention(gpt_cuda *m, int fused) {
    if (fused && m->cfg.dim / m->cfg.heads > GC_ATT_MAX_HS) return 0;
    if (!fused && !m->datt) return 0;
    m->attention_fused = fused != 0;
    return 1;
}

/* Per-op times (GPT_OP_TIMES=1; each a no-op when it is off). gpt_cuda_op_times_on: whether
   it is on. gpt_cuda_time_begin / _end: a span of the trainer's own on the compute stream (e.g.
   "ddp adamw step"), not nested in another. gpt_cuda_op_times_step: the end of a step: its span
   and the ops' times are read (a wait for the device; call it where the step waits anyway).
   gpt_cuda_op_times_restart: what ran since the last step's end was no step (an evaluation).
   gpt_cuda_op_times_reset: forget what was summed (after warm-up steps). gpt_cuda_op_times_print:
   the table, ms per step, largest first, and what no op covered. */
static inline int gpt_cuda_op_times_on(const gpt_cuda *m) { return m->timer != NULL; }
static inline void gpt_cuda_time_begin(gpt_cuda *m, const char *name) { gc_time(m, name); }
static inline void gpt_cuda_time_end(gpt_cuda *m) { gc_time_end(m); }
static inline void gpt_cuda_op_times_step(gpt_cuda *m) {
    gc_op_timer *t = m->timer;
    if (!t) return;
    gc_tick_record(&t->step_ticks[t->cur], m->stream);
    gc_tick_wait(&t->step_ticks[t->cur]);
    if (t->step_started) {
        t->step_ms += gc_tick_ms(&t->step_ticks[1 - t->cur], &t->step_ticks[t->cur]);
        t->steps++;
    }
    gc_timer_flush(t);
    t->step_started = 1;
    t->cur = 1 - t->cur;
}
/* What ran since the last step's end is not a step (an evaluation, a checkpoint): dropped, and
   the next step's span starts now. */
static inline void gpt_cuda_op_times_restart(gpt_cuda *m) {
    gc_op_timer *t = m->timer;
    if (!t) return;
    t->npending = 0;
    t->open = 0;
    gc_tick_record(&t->step_ticks[t->cur], m->stream);
    t->step_started = 1;
    t->cur = 1 - t->cur;
}
static inline void gpt_cuda_op_times_reset(gpt_cuda *m) {
    gc_op_timer *t = m->timer;
    if (!t) return;
    gc_timer_flush(t);
    t->nsum = 0;
    t->step_ms = 0;
    t->steps = 0;
    t->overflows = 0;
}
static inline void gpt_cuda_op_times_print(gpt_cuda *m, FILE *f) {
    gc_op_timer *t = m->timer;
    double total = 0, per;
    int i, j, order[GC_TIMER_NAMES];
    if (!t) return;
    gc_timer_flush(t);
    if (t->steps == 0) { fprintf(f, "op times (GPT_OP_TIMES=1): no whole step was timed\n"); return; }
    per = 1.0 / (double)t->steps;
    for (i = 0; i < t->nsum; i++) { total += t->sum[i].ms; order[i] = i; }
    for (i = 1; i < t->nsum; i++)   /* largest first */
        for (j = i; j > 0 && t->sum[order[j]].ms > t->sum[order[j - 1]].ms; j--) { int k = order[j]; order[j] = order[j - 1]; order[j - 1] = k; }
    fprintf(f, "op times (GPT_OP_TIMES=1, %s): %ld step(s), %.3f ms a step from step end to step end\n",
#ifdef GPT_CUDA_EMULATE
            "host clock, emulated model",
#else
            "CUDA events on the compute stream",
#endif
            t->steps, t->step_ms * per);
    fprintf(f, "  %-34s %10s %10s %7s\n", "op", "calls/step", "ms/step", "share");
    for (i = 0; i < t->nsum; i++) {
        const char *name = t->sum[order[i]].name;
        fprintf(f, "  %-34s %10.1f %10.3f %6.1f%%\n", name, t->sum[order[i]].calls * per, t->sum[order[i]].ms * per,
                t->step_ms > 0 ? 100.0 * t->sum[order[i]].ms / t->step_ms : 0.0);
    }
    fprintf(f, "  %-34s %10s %10.3f %6.1f%%\n", "(ops, summed)", "", total * per, t->step_ms > 0 ? 100.0 * total / t->step_ms : 0.0);
    fprintf(f, "  %-34s %10s %10.3f %6.1f%%\n", "(no op: launch gaps, comm wait, host)", "", (t->step_ms - total) * per,
            t->step_ms > 0 ? 100.0 * (t->step_ms - total) / t->step_ms : 0.0);
    if (t->overflows) fprintf(f, "  (%ld time(s) the event pool filled inside a step: a wait there)\n", t->overflows);
    fflush(f);
}

/* "CUDA <device>, cuBLAS fp32" and the like, for the trainer's banner. */
static inline void gpt_cuda_describe(const gpt_cuda *m, char *buf, size_t n) {
#ifdef GPT_CUDA_EMULATE
    snprintf(buf, n, "CUDA model emulated on the host (GPT_CUDA_EMULATE)%s%s%s", m->tf32 ? ", --tf32 ignored" : m->bf16 ? ", bf16" : "",
             m->kernels == 2 ? ", GPT_KERNELS=2" : "", m->attention_fused ? ", GPT_ATTENTION=fused" : "");
#else
    int dev = 0;
    struct cudaDeviceProp prop;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
        cudaGetLastError();
        snprintf(prop.name, sizeof prop.name, "unknown GPU");
    }
    /* ", bf16" as in the emulation's banner: tests/test_gpt.sh looks for it */
    snprintf(buf, n, "CUDA %.120s (device %d), %s%s%s", prop.name, dev,
             m->tf32 ? "cuBLAS TF32 tensor cores" : m->bf16 ? "cuBLAS, bf16 (fp32 accumulation)" : "cuBLAS fp32, TF32 off",
             m->kernels == 2 ? ", GPT_KERNELS=2" : "", m->attention_fused ? ", GPT_ATTENTION=fused" : "");
#endif
}

#endif /* GPT_CUDA_CUH */
