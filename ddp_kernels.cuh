/* ddp_kernels.cuh — the CUDA kernels of ddp.h's NCCL backend, usable on their own.

   What is here: fused AdamW over flat fp32 buffers (float4 loads, bias correction, decoupled
   weight decay with a no-decay mask, an optional clip factor and skip flag read from device
   memory so clipping needs no host synchronisation); a deterministic global sum of squares
   (fixed grid, per-block partial sums in double, a second kernel that adds the partials in a
   fixed order: the same bits on every run and every GPU); the sums of squares of fixed blocks
   in ddp.h's CPU order, of fp32 or bf16 values, and their sum in order (ddp.h's norm, the same bits as its CPU backend); scale (fp32, bf16); fill; fp32 <-> bf16 casts with
   round-to-nearest-even (NaN stays NaN, sign kept); ZeRO-2's accumulator of a rank's gradient parts
   (fp32, bf16 gradients); AdamW on an fp32 master from bf16 gradients
   that writes its bf16 working copy in the same pass, and the rounding of fp32 values to bf16 in place; and a spin kernel that holds a stream for a
   while (tests and benchmarks stand it in for a slow network).

   Use: every translation unit may include this file for the declarations (C or C++). Exactly
   one CUDA translation unit defines DDP_KERNELS_IMPLEMENTATION first to get the definitions.
   ddp.h does that itself when its implementation is compiled by nvcc; a program that compiles
   the ddp.h implementation with a C compiler and -DDDP_CUDA compiles one small .cu file with
       #define DDP_KERNELS_IMPLEMENTATION
       #include "ddp_kernels.cuh"
   Every launcher checks its launch (cudaGetLastError) and returns the cudaError_t.
   The element arithmetic (AdamW, its step scalars, the no-decay lookup, the bf16 casts, each
   thread's share of the sum of squares) is __host__ __device__; defining
   DDP_KERNELS_HOST_REFERENCE as well adds host drivers that run it as the kernels do, so
   tests/gpu/test_kernel_math_host.cu checks it against the CPU on machines without a GPU.

   The AdamW arithmetic is ddp.h's CPU loop (PyTorch's AdamW), operation for operation, with
   every product, sum, quotient and square root rounded on its own (no fused multiply-add), so a
   GPU step equals a CPU step bit for bit when the inputs are equal:
       g = g * clip
       m = b1 * m + (1 - b1) * g
       v = b2 * v + (1 - b2) * g * g
       p = p - (lr * wd) * p
       p = p - (step_size * m) / (sqrt(v) / bc2_sqrt + eps)   step_size = lr / (1 - b1^t),
                                                              bc2_sqrt = sqrt(1 - b2^t)
   The bf16 rounding (ddp_k__to_bf16, ddp_k__from_bf16) is there for any C++ translation unit,
   CUDA or not: a program's own kernels (examples/gpt) round exactly as these kernels do. Define
   DDP_KERNELS_BF16_ONLY before the include to get only those two (no CUDA headers needed).
   License: MIT, as ddp.h. */
#if defined(__cplusplus) && !defined(DDP_KERNELS__BF16)
#define DDP_KERNELS__BF16
#include <stdint.h>
#include <string.h>
#ifdef __CUDACC__
#define DDP_K__HD __host__ __device__ __forceinline__
#else
#define DDP_K__HD inline
#endif
/* ---- bf16: the upper half of the float, rounded to nearest even ---- */
static DDP_K__HD uint16_t ddp_k__to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);   /* NaN: quiet, sign kept */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static DDP_K__HD float ddp_k__from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
#endif /* __cplusplus && !DDP_KERNELS__BF16 */

#if !defined(DDP_KERNELS_CUH) && !defined(DDP_KERNELS_BF16_ONLY)
#define DDP_KERNELS_CUH

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#define DDP_K_MASK_GROUP 16      /* the no-decay mask has one byte per 16 elements */
#define DDP_K_NORM_BLOCKS 1024   /* fixed grid of the sum of squares: the result never depends on the GPU */
#define DDP_K_NORM_THREADS 256

#ifdef __cplusplus
extern "C" {
#endif

/* Per-step optimizer scalars, in device memory. ddp_k_adamw_prepare writes them; ddp_k_adamw
   reads them, so the step needs no host round trip. */
typedef struct ddp_k_adamw_state {
    double norm_sq;            /* sum of squares of the gradients this step (before clipping) */
    long long step;            /* optimizer steps taken (skipped steps do not count) */
    long long skipped;         /* steps skipped because the gradients were not finite */
    float clip;                /* gradient scale: min(1, max_norm / (norm + 1e-6)) */
    float step_size;           /* lr / (1 - beta1^step) */
    float bc2_sqrt;            /* sqrt(1 - beta2^step) */
    int skip;                  /* 1: this step's gradients hold NaN/Inf; ddp_k_adamw changes nothing */
    unsigned long long diverged; /* ddp_k_adamw_bf16: working copies that were not the master rounded, so far */
} ddp_k_adamw_state;

/* Sum of squares of x[0..n) in double, into *out (device): two kernels, DDP_K_NORM_BLOCKS
   partials in `partials` (device, that many doubles). */
cudaError_t ddp_k_sum_squares(const float *x, size_t n, double *partials, double *out, cudaStream_t stream);

/* The sum of squares of each block of `grain` floats of x[0..n) (the last may be shorter) into
   out[0..ceil(n / grain)), in double, with ddp.h's CPU arithmetic (eight running sums, in its
   order): ddp.h's global norm adds these blocks in order, so the NCCL backend's norm equals the
   CPU backend's bit for bit, sharded or not. */
cudaError_t ddp_k_norm_blocks(const float *x, size_t n, size_t grain, double *out, cudaStream_t stream);
/* The same over bf16 values (each widened exactly): ddp_k_norm_blocks' bits on the widened x. */
cudaError_t ddp_k_norm_blocks_bf16(const uint16_t *x, size_t n, size_t grain, double *out, cudaStream_t stream);
/* *out = the sum of x[0..n) in ddp.h's fixed order (ddp__norm_sum: 256 running sums, sum j
   taking x[j], x[j + 256], ... in order, then the 256 added in order): the same bits as the CPU. */
cudaError_t ddp_k_sum_doubles(const double *x, size_t n, double *out, cudaStream_t stream);

/* One thread: reads *norm_sq (NULL: no clipping, no finite check), decides skip/clip, advances
   the step and the bias corrections. max_grad_norm <= 0: no clipping. */
cudaError_t ddp_k_adamw_prepare(ddp_k_adamw_state *state, const double *norm_sq, float max_grad_norm,
                                float lr, float beta1, float beta2, cudaStream_t stream);

/* The fused AdamW step over n elements. no_decay: NULL, or one byte per DDP_K_MASK_GROUP
   elements (non-zero: no weight decay for that group). state: from ddp_k_adamw_prepare. */
cudaError_t ddp_k_adamw(float *p, const float *g, float *m, float *v, size_t n, const unsigned char *no_decay,
                        float lr, float beta1, float beta2, float eps, float weight_decay,
                        const ddp_k_adamw_state *state, cudaStream_t stream);

/* The same step on an fp32 master p from bf16 gradients g (widened exactly) that also writes
   its bf16 working copy w (round to nearest even) in the same pass; a skipped step leaves both.
   Working copies that were not the master rounded before the step (written alone) are counted
   into state->diverged. */
cudaError_t ddp_k_adamw_bf16(float *p, uint16_t *w, const uint16_t *g, float *m, float *v, size_t n,
                             const unsigned char *no_decay, float lr, float beta1, float beta2, float eps,
                             float weight_decay, ddp_k_adamw_state *state, cudaStream_t stream);
/* x rounded to bf16 into out, and x set to the rounded values (out widened back). */
cudaError_t ddp_k_bf16_round(float *x, uint16_t *out, size_t n, cudaStream_t stream);

cudaError_t ddp_k_scale(float *x, size_t n, float factor, cudaStream_t stream);
/* bf16 x: x = bf16(float(x) * factor), rounded to nearest even. */
cudaError_t ddp_k_scale_bf16(uint16_t *x, size_t n, float factor, cudaStream_t stream);
cudaError_t ddp_k_fill(float *x, size_t n, float value, cudaStream_t stream);
cudaError_t ddp_k_f32_to_bf16(const float *in, uint16_t *out, size_t n, cudaStream_t stream);
cudaError_t ddp_k_bf16_to_f32(const uint16_t *in, float *out, size_t n, cudaStream_t stream);
/* Keep `stream` busy for about `ms` milliseconds (one thread spinning on the global timer). */
cudaError_t ddp_k_spin(double ms, cudaStream_t stream);
/* ZeRO-2's shard_accumulate (ddp.h): g is this rank's part of a bucket after a micro-step's
   reduce-scatter (its average), acc the sum of the earlier micro-steps' parts, in float.
   DDP_K_ACC_FIRST: acc = g; DDP_K_ACC_ADD: acc = acc + g; DDP_K_ACC_FINAL: g = acc + g (the
   synchronizing micro-step). The _bf16 variant widens g exactly and, in FINAL, rounds the sum
   to bf16 once (nearest even): ddp.h's CPU accumulator, operation for operation. */
enum { DDP_K_ACC_FIRST = 0, DDP_K_ACC_ADD = 1, DDP_K_ACC_FINAL = 2 };
cudaError_t ddp_k_accumulate(float *acc, float *g, size_t n, int mode, cudaStream_t stream);
cudaError_t ddp_k_accumulate_bf16(float *acc, uint16_t *g, size_t n, int mode, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

/* ============================================================================================
   Definitions
   ============================================================================================ */
#if defined(DDP_KERNELS_IMPLEMENTATION) && defined(__CUDACC__) && !defined(DDP_KERNELS__IMPLEMENTED)
#define DDP_KERNELS__IMPLEMENTED

/* Grid for an elementwise kernel over `items` work items: enough blocks to fill any current
   GPU, grid-stride loops for the rest. */
static unsigned ddp_k__blocks(size_t items, unsigned threads) {
    size_t blocks = (items + threads - 1) / threads;
    if (blocks == 0) blocks = 1;
    return blocks > 65535u ? 65535u : (unsigned)blocks;
}

static int ddp_k__aligned16(const void *a, const void *b, const void *c, const void *d) {
    return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d) & 15u) == 0;
}


/* ---- rounding: every operation rounded on its own, never fused into a multiply-add. On the
   device the _rn intrinsics; on the host (tests/gpu/test_kernel_math_host.cu, no GPU needed)
   plain IEEE float operations, which round identically when the host compiler does not
   contract them (that test is built with -ffp-contract=off). ---- */
static __host__ __device__ __forceinline__ float ddp_k__mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
static __host__ __device__ __forceinline__ float ddp_k__add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
static __host__ __device__ __forceinline__ float ddp_k__sub(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}
static __host__ __device__ __forceinline__ float ddp_k__div(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}
static __host__ __device__ __forceinline__ float ddp_k__sqrt(float a) {
#ifdef __CUDA_ARCH__
    return __fsqrt_rn(a);
#else
    return sqrtf(a);
#endif
}

/* ---- AdamW ---- */
struct ddp_k__adamw_consts { float lr, b1, b2, one_minus_b1, one_minus_b2, eps, lr_wd; };

/* On the host, as the CPU rounds them (float operations, like ddp.h's CPU loop). */
static ddp_k__adamw_consts ddp_k__adamw_make_consts(float lr, float beta1, float beta2, float eps, float weight_decay) {
    ddp_k__adamw_consts c;
    c.lr = lr; c.b1 = beta1; c.b2 = beta2; c.eps = eps;
    c.one_minus_b1 = 1.0f - beta1; c.one_minus_b2 = 1.0f - beta2;
    c.lr_wd = lr * weight_decay;
    return c;
}

static __host__ __device__ __forceinline__ void ddp_k__adamw_one(float &p, float g, float &m, float &v, float decay_on,
                                                                 const ddp_k__adamw_consts &c, float clip,
                                                                 float step_size, float bc2_sqrt) {
    float grad = ddp_k__mul(g, clip);
    float lr_wd = decay_on != 0.0f ? c.lr_wd : 0.0f;
    m = ddp_k__add(ddp_k__mul(c.b1, m), ddp_k__mul(c.one_minus_b1, grad));
    v = ddp_k__add(ddp_k__mul(c.b2, v), ddp_k__mul(ddp_k__mul(c.one_minus_b2, grad), grad));
    p = ddp_k__sub(p, ddp_k__mul(lr_wd, p));
    p = ddp_k__sub(p, ddp_k__div(ddp_k__mul(step_size, m), ddp_k__add(ddp_k__div(ddp_k__sqrt(v), bc2_sqrt), c.eps)));
}

static __host__ __device__ __forceinline__ float ddp_k__decay_on(const unsigned char *no_decay, size_t i) {
    return no_decay && no_decay[i / DDP_K_MASK_GROUP] ? 0.0f : 1.0f;
}

/* Float4 number i: elements 4i .. 4i+3 (a group of 16 never straddles a float4). */
static __host__ __device__ __forceinline__ void ddp_k__adamw_vec4_at(float4 *p, const float4 *g, float4 *m, float4 *v, size_t i,
                                                                     const unsigned char *no_decay, const ddp_k__adamw_consts &c,
                                                                     float clip, float step_size, float bc2_sqrt) {
    float4 pp = p[i], gg = g[i], mm = m[i], vv = v[i];
    float d = ddp_k__decay_on(no_decay, 4 * i);
    ddp_k__adamw_one(pp.x, gg.x, mm.x, vv.x, d, c, clip, step_size, bc2_sqrt);
    ddp_k__adamw_one(pp.y, gg.y, mm.y, vv.y, d, c, clip, step_size, bc2_sqrt);
    ddp_k__adamw_one(pp.z, gg.z, mm.z, vv.z, d, c, clip, step_size, bc2_sqrt);
    ddp_k__adamw_one(pp.w, gg.w, mm.w, vv.w, d, c, clip, step_size, bc2_sqrt);
    p[i] = pp; m[i] = mm; v[i] = vv;
}

/* How many leading elements the float4 kernel takes (all four buffers 16-byte aligned); the
   scalar kernel takes the rest. */
static size_t ddp_k__adamw_vec4_count(const float *p, const float *g, const float *m, const float *v, size_t n) {
    return ddp_k__aligned16(p, g, m, v) && n >= 4 ? n / 4 * 4 : 0;
}

/* Four elements per thread; n4 = n / 4 float4s, the scalar kernel takes the tail. */
static __global__ void ddp_k__adamw_vec4(float4 *p, const float4 *g, float4 *m, float4 *v, size_t n4,
                                         const unsigned char *no_decay, ddp_k__adamw_consts c,
                                         const ddp_k_adamw_state *state) {
    size_t i;
    float clip, step_size, bc2_sqrt;
    if (state->skip) return;
    clip = state->clip; step_size = state->step_size; bc2_sqrt = state->bc2_sqrt;
    for (i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x)
        ddp_k__adamw_vec4_at(p, g, m, v, i, no_decay, c, clip, step_size, bc2_sqrt);
}

static __global__ void ddp_k__adamw_scalar(float *p, const float *g, float *m, float *v, size_t begin, size_t n,
                                           const unsigned char *no_decay, ddp_k__adamw_consts c,
                                           const ddp_k_adamw_state *state) {
    size_t i;
    if (state->skip) return;
    for (i = begin + blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        ddp_k__adamw_one(p[i], g[i], m[i], v[i], ddp_k__decay_on(no_decay, i), c, state->clip,
                         state->step_size, state->bc2_sqrt);
}

/* bf16 parameters, element i: the step on the fp32 master, the working copy rounded from it in
   the same pass. Returns 1 when the working copy was not the master rounded before the step. */
static __host__ __device__ __forceinline__ int ddp_k__adamw_bf16_at(float *p, uint16_t *w, const uint16_t *g, float *m, float *v,
                                                                    size_t i, const unsigned char *no_decay,
                                                                    const ddp_k__adamw_consts &c, float clip, float step_size,
                                                                    float bc2_sqrt) {
    float pi = p[i], mi = m[i], vi = v[i];
    int diverged = w[i] != ddp_k__to_bf16(pi);
    ddp_k__adamw_one(pi, ddp_k__from_bf16(g[i]), mi, vi, ddp_k__decay_on(no_decay, i), c, clip, step_size, bc2_sqrt);
    p[i] = pi; m[i] = mi; v[i] = vi;
    w[i] = ddp_k__to_bf16(pi);
    return diverged;
}

static __global__ void ddp_k__adamw_bf16_kernel(float *p, uint16_t *w, const uint16_t *g, float *m, float *v, size_t n,
                                                const unsigned char *no_decay, ddp_k__adamw_consts c,
                                                ddp_k_adamw_state *state) {
    size_t i;
    unsigned long long diverged = 0;
    if (state->skip) return;
    for (i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        diverged += ddp_k__adamw_bf16_at(p, w, g, m, v, i, no_decay, c, state->clip, state->step_size, state->bc2_sqrt);
    if (diverged) atomicAdd(&state->diverged, diverged);   /* rare: a program's mistake */
}

/* The step scalars, in double as ddp.h's CPU step computes them (pow and sqrt of the host's
   libm on the host, CUDA's on the device). */
/* NaN/Inf by the exponent bits, not isfinite(): no fast-math flag (--use_fast_math, the host
   compiler's -ffast-math) may fold this check away (ddp.h's ddp__finite_d says why). */
static __host__ __device__ __forceinline__ int ddp_k__finite_d(double x) {
#ifdef __CUDA_ARCH__
    unsigned long long u = (unsigned long long)__double_as_longlong(x);
#else
    unsigned long long u;
    memcpy(&u, &x, sizeof u);
#if defined(__GNUC__)
    __asm__("" : "+r"(u));
#endif
#endif
    return (u & 0x7ff0000000000000ull) != 0x7ff0000000000000ull;
}

static __host__ __device__ __forceinline__ void ddp_k__adamw_prepare_one(ddp_k_adamw_state *s, const double *norm_sq,
                                                                         float max_grad_norm, float lr, float beta1,
                                                                         float beta2) {
    double norm;
    s->norm_sq = norm_sq ? *norm_sq : 0.0;
    norm = sqrt(s->norm_sq);
    s->skip = !ddp_k__finite_d(norm);
    if (s->skip) { s->skipped++; return; }
    s->clip = 1.0f;
    if (max_grad_norm > 0 && norm > (double)max_grad_norm) s->clip = (float)((double)max_grad_norm / (norm + 1e-6));
    s->step++;
    s->step_size = (float)((double)lr / (1.0 - pow((double)beta1, (double)s->step)));
    s->bc2_sqrt = (float)sqrt(1.0 - pow((double)beta2, (double)s->step));
}

static __global__ void ddp_k__adamw_prepare(ddp_k_adamw_state *s, const double *norm_sq, float max_grad_norm,
                                            float lr, float beta1, float beta2) {
    ddp_k__adamw_prepare_one(s, norm_sq, max_grad_norm, lr, beta1, beta2);
}

/* ---- the sum of squares: each block sums its grid-stride share in double and reduces it in
   shared memory in a fixed tree; the second kernel adds the partials in a fixed tree ---- */
static __device__ __forceinline__ double ddp_k__block_sum(double x, double *shared) {
    unsigned t = threadIdx.x, stride;
    shared[t] = x;
    __syncthreads();
    for (stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (t < stride) shared[t] += shared[t + stride];
        __syncthreads();
    }
    return shared[0];
}

/* One thread's share of the sum of squares: first, first + stride, ... (float4s when vec4,
   then the scalar tail), in double. */
static __host__ __device__ __forceinline__ double ddp_k__sum_squares_thread(const float *x, size_t n, int vec4,
                                                                            size_t first, size_t stride) {
    double acc = 0;
    size_t i;
    if (vec4) {
        const float4 *x4 = (const float4 *)x;
        for (i = first; i < n / 4; i += stride) {
            float4 a = x4[i];
            acc += (double)a.x * a.x + (double)a.y * a.y + (double)a.z * a.z + (double)a.w * a.w;
        }
        for (i = n / 4 * 4 + first; i < n; i += stride) acc += (double)x[i] * x[i];
    } else {
        for (i = first; i < n; i += stride) acc += (double)x[i] * x[i];
    }
    return acc;
}

static __global__ void ddp_k__sum_squares_partials(const float *x, size_t n, int vec4, double *partials) {
    __shared__ double shared[DDP_K_NORM_THREADS];
    double acc = ddp_k__sum_squares_thread(x, n, vec4, blockIdx.x * (size_t)blockDim.x + threadIdx.x,
                                           (size_t)gridDim.x * blockDim.x);
    acc = ddp_k__block_sum(acc, shared);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

static __global__ void ddp_k__sum_partials(const double *partials, double *out) {
    __shared__ double shared[DDP_K_NORM_BLOCKS];
    double total = ddp_k__block_sum(partials[threadIdx.x], shared);
    if (threadIdx.x == 0) *out = total;
}

/* ---- the norm's blocks, as ddp.h's CPU sums them (ddp__sum_squares: eight running sums, the
   tail into the first lanes, the lanes added in order). A float's square is exact in double, so
   a fused multiply-add rounds exactly like a multiply then an add: no intrinsics needed. ---- */
static __host__ __device__ __forceinline__ double ddp_k__square(float x) { return (double)x * (double)x; }
static __host__ __device__ __forceinline__ double ddp_k__square(uint16_t x) { return ddp_k__square(ddp_k__from_bf16(x)); }
template <typename T> static __host__ __device__ __forceinline__ double ddp_k__block_squares(const T *x, size_t n) {
    double lane[8] = { 0, 0, 0, 0, 0, 0, 0, 0 }, total = 0;
    size_t i = 0;
    int j;
    for (; i + 8 <= n; i += 8)
        for (j = 0; j < 8; j++) lane[j] += ddp_k__square(x[i + j]);
    for (j = 0; i < n; i++, j++) lane[j] += ddp_k__square(x[i]);
    for (j = 0; j < 8; j++) total += lane[j];
    return total;
}

/* One norm block per 8 threads: thread j of a block sums its elements i = j, j + 8, ... in order,
   which are exactly lane j of ddp_k__block_squares (its tail elements go to lanes 0, 1, ... and
   are these same i), then the block's first thread adds the 8 lanes in order: the same bits as
   the CPU. A warp reads four blocks' 32-byte rows a load (ddp_k__block_squares in one thread a
   block read 4 KiB strides, uncoalesced: 2.6 ms of a 16.7 ms step on an H100). Threads past the
   last block take part in the shuffles with nothing to add. */
#define DDP_K_BLOCK_LANES 8
template <typename T> static __global__ void ddp_k__norm_blocks(const T *x, size_t n, size_t grain, double *out) {
    size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x, b = t / DDP_K_BLOCK_LANES, blocks = (n + grain - 1) / grain;
    size_t nb = 0, i;
    unsigned j = (unsigned)(t % DDP_K_BLOCK_LANES), first = (threadIdx.x & 31u) & ~(unsigned)(DDP_K_BLOCK_LANES - 1);
    const T *xb = x;
    double acc = 0, total = 0;
    int k;
    if (b < blocks) { xb = x + b * grain; nb = n - b * grain < grain ? n - b * grain : grain; }
    for (i = j; i < nb; i += DDP_K_BLOCK_LANES) acc += ddp_k__square(xb[i]);
    for (k = 0; k < DDP_K_BLOCK_LANES; k++) {
        double lane = __shfl_sync(0xffffffffu, acc, (int)first + k);
        if (j == 0) total += lane;
    }
    if (j == 0 && b < blocks) out[b] = total;
}

/* The blocks' sums in ddp.h's order (ddp__norm_sum): DDP_K_SUM_LANES running sums, sum j
   taking x[j], x[j + 256], ... in order, then the sums added in order. A chain of one add an
   element was 32768 dependent adds for 32 Mi parameters. */
#define DDP_K_SUM_LANES 256
static __global__ void ddp_k__sum_doubles(const double *x, size_t n, double *out) {
    __shared__ double lane[DDP_K_SUM_LANES];
    double acc = 0;
    size_t i;
    for (i = threadIdx.x; i < n; i += DDP_K_SUM_LANES) acc += x[i];
    lane[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0;
        int j;
        for (j = 0; j < DDP_K_SUM_LANES; j++) total += lane[j];
        *out = total;
    }
}

/* ---- small elementwise kernels ---- */
static __global__ void ddp_k__scale(float *x, size_t n, float factor) {
    size_t i;
    for (i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) x[i] *= factor;
}
static __host__ __device__ __forceinline__ uint16_t ddp_k__scale_bf16_one(uint16_t x, float factor) {
    return ddp_k__to_bf16(ddp_k__mul(ddp_k__from_bf16(x), factor));
}
static __global__ void ddp_k__scale_bf16(uint16_t *x, size_t n, float factor) {
    size_t i;
    for (i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = ddp_k__scale_bf16_one(x[i], factor);
}
static __global__ void ddp_k__fill(float *x, size_t n, float value) {
    size_t i;
    for (i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) x[i] = value;
}
static __global__ void ddp_k__to_bf16_kernel(const float *in, uint16_t *out, size_t n, int vec4) {
    size_t i, stride = (size_t)gridDim.x * blockDim.x, first = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (vec4) {
        for (i = first; i < n / 4; i += stride) {
            float4 a = ((const float4 *)in)[i];
            ushort4 h;
            h.x = ddp_k__to_bf16(a.x); h.y = ddp_k__to_bf16(a.y); h.z = ddp_k__to_bf16(a.z); h.w = ddp_k__to_bf16(a.w);
            ((ushort4 *)out)[i] = h;
        }
        first += n / 4 * 4;
    }
    for (i = first; i < n; i += stride) out[i] = ddp_k__to_bf16(in[i]);
}
static __global__ void ddp_k__from_bf16_kernel(const uint16_t *in, float *out, size_t n, int vec4) {
    size_t i, stride = (size_t)gridDim.x * blockDim.x, first = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (vec4) {
        for (i = first; i < n / 4; i += stride) {
            ushort4 h = ((const ushort4 *)in)[i];
            float4 a;
            a.x = ddp_k__from_bf16(h.x); a.y = ddp_k__from_bf16(h.y); a.z = ddp_k__from_bf16(h.z); a.w = ddp_k__from_bf16(h.w);
            ((float4 *)out)[i] = a;
        }
        first += n / 4 * 4;
    }
    for (i = first; i < n; i += stride) out[i] = ddp_k__from_bf16(in[i]);
}
static __global__ void ddp_k__round_bf16_kernel(float *x, uint16_t *out, size_t n) {
    size_t i;
    for (i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint16_t h = ddp_k__to_bf16(x[i]);
        out[i] = h;
        x[i] = ddp_k__from_bf16(h);
    }
}
/* shard_accumulate's element step (ddp_k_accumulate): every sum rounded on its own */
static __host__ __device__ __forceinline__ void ddp_k__accumulate_one(float *acc, float *g, size_t i, int mode) {
    if (mode == DDP_K_ACC_FIRST) acc[i] = g[i];
    else if (mode == DDP_K_ACC_ADD) acc[i] = ddp_k__add(acc[i], g[i]);
    else g[i] = ddp_k__add(acc[i], g[i]);
}
static __host__ __device__ __forceinline__ void ddp_k__accumulate_bf16_one(float *acc, uint16_t *g, size_t i, int mode) {
    float w = ddp_k__from_bf16(g[i]);
    if (mode == DDP_K_ACC_FIRST) acc[i] = w;
    else if (mode == DDP_K_ACC_ADD) acc[i] = ddp_k__add(acc[i], w);
    else g[i] = ddp_k__to_bf16(ddp_k__add(acc[i], w));
}
static __global__ void ddp_k__accumulate(float *acc, float *g, size_t n, int mode) {
    size_t i;
    for (i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        ddp_k__accumulate_one(acc, g, i, mode);
}
static __global__ void ddp_k__accumulate_bf16(float *acc, uint16_t *g, size_t n, int mode) {
    size_t i;
    for (i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        ddp_k__accumulate_bf16_one(acc, g, i, mode);
}
static __global__ void ddp_k__spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}

/* ---- launchers ---- */
/* cudaEventQuery/cudaStreamQuery record cudaErrorNotReady in the thread's last-error slot like an
   error. Left there by a caller's polling, it would be what the cudaGetLastError after a launch
   below returns: a healthy launch reported as failed. Only that value is cleared; any other
   pending error stays for the check to report. */
static void ddp_k__forget_not_ready(void) {
    if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
}

extern "C" cudaError_t ddp_k_sum_squares(const float *x, size_t n, double *partials, double *out, cudaStream_t stream) {
    cudaError_t e;
    ddp_k__forget_not_ready();
    ddp_k__sum_squares_partials<<<DDP_K_NORM_BLOCKS, DDP_K_NORM_THREADS, 0, stream>>>(x, n, ((uintptr_t)x & 15u) == 0, partials);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    ddp_k__sum_partials<<<1, DDP_K_NORM_BLOCKS, 0, stream>>>(partials, out);
    return cudaGetLastError();
}

template <typename T> static cudaError_t ddp_k__norm_blocks_launch(const T *x, size_t n, size_t grain, double *out,
                                                                    cudaStream_t stream) {
    size_t blocks = grain ? (n + grain - 1) / grain : 0;
    ddp_k__forget_not_ready();
    if (blocks == 0) return cudaSuccess;
    if (blocks > ((size_t)1 << 31) / DDP_K_BLOCK_LANES * 128) return cudaErrorInvalidValue;
    ddp_k__norm_blocks<T><<<(unsigned)((blocks * DDP_K_BLOCK_LANES + 127) / 128), 128, 0, stream>>>(x, n, grain, out);
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_norm_blocks(const float *x, size_t n, size_t grain, double *out, cudaStream_t stream) {
    return ddp_k__norm_blocks_launch(x, n, grain, out, stream);
}

extern "C" cudaError_t ddp_k_norm_blocks_bf16(const uint16_t *x, size_t n, size_t grain, double *out, cudaStream_t stream) {
    return ddp_k__norm_blocks_launch(x, n, grain, out, stream);
}

extern "C" cudaError_t ddp_k_sum_doubles(const double *x, size_t n, double *out, cudaStream_t stream) {
    ddp_k__forget_not_ready();
    ddp_k__sum_doubles<<<1, DDP_K_SUM_LANES, 0, stream>>>(x, n, out);
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_adamw_prepare(ddp_k_adamw_state *state, const double *norm_sq, float max_grad_norm,
                                           float lr, float beta1, float beta2, cudaStream_t stream) {
    ddp_k__forget_not_ready();
    ddp_k__adamw_prepare<<<1, 1, 0, stream>>>(state, norm_sq, max_grad_norm, lr, beta1, beta2);
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_adamw(float *p, const float *g, float *m, float *v, size_t n, const unsigned char *no_decay,
                                   float lr, float beta1, float beta2, float eps, float weight_decay,
                                   const ddp_k_adamw_state *state, cudaStream_t stream) {
    ddp_k__adamw_consts c = ddp_k__adamw_make_consts(lr, beta1, beta2, eps, weight_decay);
    size_t done = ddp_k__adamw_vec4_count(p, g, m, v, n);
    cudaError_t e;
    ddp_k__forget_not_ready();
    if (n == 0) return cudaSuccess;
    if (done) {
        size_t n4 = done / 4;
        ddp_k__adamw_vec4<<<ddp_k__blocks(n4, 256), 256, 0, stream>>>((float4 *)p, (const float4 *)g, (float4 *)m,
                                                                     (float4 *)v, n4, no_decay, c, state);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    if (done == n) return cudaSuccess;
    ddp_k__adamw_scalar<<<ddp_k__blocks(n - done, 256), 256, 0, stream>>>(p, g, m, v, done, n, no_decay, c, state);
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_scale(float *x, size_t n, float factor, cudaStream_t stream) {
    ddp_k__forget_not_ready();
    if (n == 0) return cudaSuccess;
    ddp_k__scale<<<ddp_k__blocks(n, 256), 256, 0, stream>>>(x, n, factor);
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_scale_bf16(uint16_t *x, size_t n, float factor, cudaStream_t stream) {
    ddp_k__forget_not_ready();
    if (n == 0) return cudaSuccess;
    ddp_k__scale_bf16<<<ddp_k__blocks(n, 256), 256, 0, stream>>>(x, n, factor);
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_fill(float *x, size_t n, float value, cudaStream_t stream) {
    ddp_k__forget_not_ready();
    if (n == 0) return cudaSuccess;
    ddp_k__fill<<<ddp_k__blocks(n, 256), 256, 0, stream>>>(x, n, value);
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_f32_to_bf16(const float *in, uint16_t *out, size_t n, cudaStream_t stream) {
    int vec4 = (((uintptr_t)in & 15u) | ((uintptr_t)out & 7u)) == 0;
    ddp_k__forget_not_ready();
    if (n == 0) return cudaSuccess;
    ddp_k__to_bf16_kernel<<<ddp_k__blocks(vec4 ? n / 4 + 1 : n, 256), 256, 0, stream>>>(in, out, n, vec4);
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_bf16_to_f32(const uint16_t *in, float *out, size_t n, cudaStream_t stream) {
    int vec4 = (((uintptr_t)in & 7u) | ((uintptr_t)out & 15u)) == 0;
    ddp_k__forget_not_ready();
    if (n == 0) return cudaSuccess;
    ddp_k__from_bf16_kernel<<<ddp_k__blocks(vec4 ? n / 4 + 1 : n, 256), 256, 0, stream>>>(in, out, n, vec4);
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_adamw_bf16(float *p, uint16_t *w, const uint16_t *g, float *m, float *v, size_t n,
                                        const unsigned char *no_decay, float lr, float beta1, float beta2, float eps,
                                        float weight_decay, ddp_k_adamw_state *state, cudaStream_t stream) {
    ddp_k__adamw_consts c = ddp_k__adamw_make_consts(lr, beta1, beta2, eps, weight_decay);
    ddp_k__forget_not_ready();
    if (n == 0) return cudaSuccess;
    ddp_k__adamw_bf16_kernel<<<ddp_k__blocks(n, 256), 256, 0, stream>>>(p, w, g, m, v, n, no_decay, c, state);
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_bf16_round(float *x, uint16_t *out, size_t n, cudaStream_t stream) {
    ddp_k__forget_not_ready();
    if (n == 0) return cudaSuccess;
    ddp_k__round_bf16_kernel<<<ddp_k__blocks(n, 256), 256, 0, stream>>>(x, out, n);
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_spin(double ms, cudaStream_t stream) {
    ddp_k__forget_not_ready();
    if (!(ms > 0)) return cudaSuccess;
    ddp_k__spin<<<1, 1, 0, stream>>>((unsigned long long)(ms * 1e6));
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_accumulate(float *acc, float *g, size_t n, int mode, cudaStream_t stream) {
    ddp_k__forget_not_ready();
    if (n == 0) return cudaSuccess;
    ddp_k__accumulate<<<ddp_k__blocks(n, 256), 256, 0, stream>>>(acc, g, n, mode);
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_accumulate_bf16(float *acc, uint16_t *g, size_t n, int mode, cudaStream_t stream) {
    ddp_k__forget_not_ready();
    if (n == 0) return cudaSuccess;
    ddp_k__accumulate_bf16<<<ddp_k__blocks(n, 256), 256, 0, stream>>>(acc, g, n, mode);
    return cudaGetLastError();
}

#ifdef DDP_KERNELS_HOST_REFERENCE
/* ---- the kernels' arithmetic on the host, for tests on machines without a GPU
   (tests/gpu/test_kernel_math_host.cu): the same element functions in the same split as the
   launchers, and the sum of squares in the kernels' order (threads of the fixed grid, each
   block's tree, the tree over the partials). ---- */
static inline void ddp_k__adamw_prepare_host(ddp_k_adamw_state *state, const double *norm_sq, float max_grad_norm,
                                             float lr, float beta1, float beta2) {
    ddp_k__adamw_prepare_one(state, norm_sq, max_grad_norm, lr, beta1, beta2);
}

static inline void ddp_k__adamw_host(float *p, const float *g, float *m, float *v, size_t n, const unsigned char *no_decay,
                                     float lr, float beta1, float beta2, float eps, float weight_decay,
                                     const ddp_k_adamw_state *state) {
    ddp_k__adamw_consts c = ddp_k__adamw_make_consts(lr, beta1, beta2, eps, weight_decay);
    size_t i, done = ddp_k__adamw_vec4_count(p, g, m, v, n);
    if (state->skip) return;
    for (i = 0; i < done / 4; i++)
        ddp_k__adamw_vec4_at((float4 *)p, (const float4 *)g, (float4 *)m, (float4 *)v, i, no_decay, c, state->clip,
                             state->step_size, state->bc2_sqrt);
    for (i = done; i < n; i++)
        ddp_k__adamw_one(p[i], g[i], m[i], v[i], ddp_k__decay_on(no_decay, i), c, state->clip, state->step_size,
                         state->bc2_sqrt);
}

/* ddp_k_adamw_bf16 and ddp_k_scale_bf16 on the host: the kernels' element functions over every
   element (elements are independent: any order gives the kernels' bits). */
static inline void ddp_k__adamw_bf16_host(float *p, uint16_t *w, const uint16_t *g, float *m, float *v, size_t n,
                                          const unsigned char *no_decay, float lr, float beta1, float beta2, float eps,
                                          float weight_decay, ddp_k_adamw_state *state) {
    ddp_k__adamw_consts c = ddp_k__adamw_make_consts(lr, beta1, beta2, eps, weight_decay);
    size_t i;
    if (state->skip) return;
    for (i = 0; i < n; i++)
        state->diverged += ddp_k__adamw_bf16_at(p, w, g, m, v, i, no_decay, c, state->clip, state->step_size, state->bc2_sqrt);
}
static inline void ddp_k__scale_bf16_host(uint16_t *x, size_t n, float factor) {
    size_t i;
    for (i = 0; i < n; i++) x[i] = ddp_k__scale_bf16_one(x[i], factor);
}

/* ddp_k_accumulate and ddp_k_accumulate_bf16 on the host (elements are independent). */
static inline void ddp_k__accumulate_host(float *acc, float *g, size_t n, int mode) {
    size_t i;
    for (i = 0; i < n; i++) ddp_k__accumulate_one(acc, g, i, mode);
}
static inline void ddp_k__accumulate_bf16_host(float *acc, uint16_t *g, size_t n, int mode) {
    size_t i;
    for (i = 0; i < n; i++) ddp_k__accumulate_bf16_one(acc, g, i, mode);
}

/* ddp_k__block_sum's order: at each level t += t + stride, strides halving. */
static inline double ddp_k__tree_sum_host(double *x, unsigned count) {
    unsigned t, stride;
    for (stride = count / 2; stride > 0; stride /= 2)
        for (t = 0; t < stride; t++) x[t] += x[t + stride];
    return x[0];
}

static inline double ddp_k__sum_squares_host(const float *x, size_t n) {
    static double threads[DDP_K_NORM_THREADS], partials[DDP_K_NORM_BLOCKS];
    const size_t stride = (size_t)DDP_K_NORM_BLOCKS * DDP_K_NORM_THREADS;
    int vec4 = ((uintptr_t)x & 15u) == 0;   /* as ddp_k_sum_squares decides */
    unsigned b, t;
    for (b = 0; b < DDP_K_NORM_BLOCKS; b++) {
        for (t = 0; t < DDP_K_NORM_THREADS; t++)
            threads[t] = ddp_k__sum_squares_thread(x, n, vec4, (size_t)b * DDP_K_NORM_THREADS + t, stride);
        partials[b] = ddp_k__tree_sum_host(threads, DDP_K_NORM_THREADS);
    }
    return ddp_k__tree_sum_host(partials, DDP_K_NORM_BLOCKS);
}
#endif /* DDP_KERNELS_HOST_REFERENCE */

#endif /* DDP_KERNELS_IMPLEMENTATION && __CUDACC__ */
#endif /* DDP_KERNELS_CUH */
