/* test_kernel_math_host.cu — the arithmetic of ddp_kernels.cuh on the HOST, no GPU needed: run
   by `make test` wherever nvcc built it, GPU or not. The kernels' element functions are
   __host__ __device__ (ddp_k__mul & co. are the _rn intrinsics on the device, plain IEEE float
   operations here; this file is built with -ffp-contract=off so nothing is fused), and
   DDP_KERNELS_HOST_REFERENCE adds host drivers that walk the buffers in the launchers' split
   (float4 body, scalar tail) and sum squares in the kernels' order. Checks:
   - AdamW: the kernels' element math over the same flat buffers and no-decay mask equals ddp.h's
     CPU ddp_adamw_step bit for bit (parameters, m, v, step count), step after step, with weight
     decay, no-decay parameters, clipping, bias correction and skipped non-finite steps; on the
     float4 path, with a scalar tail, and all scalar (unaligned);
   - bf16 parameters: ddp_k_scale_bf16 and ddp_k_adamw_bf16's element math equal ddp.h's CPU
     step on param_dtype DDP_DTYPE_BF16 bit for bit (master, working copies, m, v), 40 steps;
   - the no-decay mask ddp.h builds for the device against the parameters' flags;
   - fp32 -> bf16 (round to nearest even) against an independent reference written in double
     arithmetic, over the special cases and sweeps of bit patterns, and against the CPU
     backend's cast; bf16 -> fp32 over all 2^16;
   - ZeRO-2's shard_accumulate: ddp_k_accumulate and its bf16 variant equal ddp.h's CPU
     accumulator bit for bit over three micro-steps (signed zeros, denormals, infinities);
   - the two-stage sum of squares in the kernels' order against float64, and exactly on data
     whose sum is exact (an element missed or counted twice shows);
   - the watchdog's clock (ddp__watch): a host running ahead of the GPU for 1000 s is never a
     timeout, a GPU that stops is one within timeout_s;
   - the communicator's life (ddp__life): an abort asked for during an NCCL call waits for the
     last thread out, the communicator is freed exactly once and never under a call, and nothing
     enters it after; over fixed cases and a million random interleavings. */
#define DDP_KERNELS_HOST_REFERENCE
#include "../testlib.h"

static float *alloc_floats16(size_t n) {   /* 16-byte aligned, zeroed, one float of slack */
    void *p = NULL;
    if (posix_memalign(&p, 64, (n + 4) * sizeof(float))) { printf("FAIL out of memory\n"); exit(1); }
    memset(p, 0, (n + 4) * sizeof(float));
    return (float *)p;
}

static int same_bits(const float *a, const float *b, size_t n, size_t *first) {
    size_t i;
    for (i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float))) { *first = i; return 0; }
    return 1;
}

/* ---- AdamW: kernel element math == ddp.h's CPU step, bit for bit ---- */
enum { NPARAMS = 7, STEPS = 60, RUNS = 3 };
static const size_t param_sizes[NPARAMS] = { 1000, 37, 4096, 3, 777, 16, 1 };
static const unsigned param_flags[NPARAMS] = { 0, DDP_NO_DECAY, 0, DDP_NO_DECAY, 0, DDP_NO_DECAY, 0 };

/* One kernel-side replica: the float4 path over all n, the float4 path with a 3-element scalar
   tail (it covers n - 3), or everything scalar (buffers shifted off 16-byte alignment). */
typedef struct replica {
    const char *name;
    size_t count;
    int shift;
    float *buf[4], *p, *g, *m, *v;
    ddp_k_adamw_state state;
    size_t bad_step, bad_at;
    const char *bad_what;
    double got, want;
} replica;

static void grads_for_step(float *g, const ddp_context *ctx, int step) {
    int i;
    size_t k;
    for (i = 0; i < ddp_num_params(ctx); i++) {
        size_t off = ctx->model.params[i].offset;
        for (k = 0; k < ctx->model.params[i].count; k++)
            g[off + k] = test_value(100 + (uint64_t)step, off + k) * (k % 5 == 0 ? 0.5f : 0.01f);
    }
    if (step == 17) g[ctx->model.params[2].offset + 5] = NAN;         /* skipped steps: NaN and Inf */
    if (step == 41) g[ctx->model.params[4].offset + 776] = -INFINITY;
}

static void test_adamw_parity(void) {
    ddp_context *ctx;
    ddp_desc d;
    ddp_result r;
    unsigned char *mask;
    replica rep[RUNS];
    float *cpu_p, *cpu_g, *cpu_m, *cpu_v, *init[NPARAMS];
    int64_t *cpu_step;
    const float b1 = 0.85f, b2 = 0.995f, eps = 1e-7f;
    size_t n, k;
    int i, j, step, clipped = 0, id, steps_ok = 1;
    memset(&d, 0, sizeof d);
    d.world_size = 1;
    d.backend = DDP_BACKEND_CPU;
    d.skip_nonfinite = 1;          /* a NaN step is skipped alike by both */
    d.log_level = DDP_LOG_OFF;
    if (ddp_init(&ctx, &d) != DDP_OK) { printf("FAIL host_adamw_init: %s\n", ddp_last_error(ctx)); exit(1); }
    for (i = 0; i < NPARAMS; i++) {
        char name[16];
        init[i] = (float *)malloc(param_sizes[i] * sizeof(float));
        for (k = 0; k < param_sizes[i]; k++) init[i][k] = 0.5f * test_value(1 + (uint64_t)i, k);
        snprintf(name, sizeof name, "p%d", i);
        ddp_register_param(ctx, name, param_sizes[i], param_flags[i], init[i], &id);
    }
    if (ddp_commit(ctx) != DDP_OK) { printf("FAIL host_adamw_commit: %s\n", ddp_last_error(ctx)); exit(1); }
    cpu_p = ddp_flat_params(ctx, &n);
    cpu_g = ddp_flat_grads(ctx, NULL);
    ddp_adamw_state(ctx, &cpu_m, &cpu_v, &cpu_step);
    mask = ddp__gpu_no_decay_mask(ctx, &r);   /* what ddp.h uploads for ddp_k_adamw */

    {   /* the mask against the flags, element by element */
        size_t bad = 0;
        for (i = 0; i < NPARAMS; i++)
            for (k = 0; k < ctx->model.params[i].count; k++)
                bad += ddp_k__decay_on(mask, ctx->model.params[i].offset + k) != ((param_flags[i] & DDP_NO_DECAY) ? 0.0f : 1.0f);
        verdict(mask && r == DDP_OK && bad == 0 && n % DDP_K_MASK_GROUP == 0, "host_no_decay_mask_matches_param_flags",
                "%zu element(s) with the wrong decay (mask %p, %zu floats)", bad, (void *)mask, n);
    }

    for (j = 0; j < RUNS; j++) {
        replica *x = &rep[j];
        memset(x, 0, sizeof *x);
        x->name = j == 0 ? "float4_path" : j == 1 ? "float4_path_with_scalar_tail" : "scalar_path_unaligned";
        x->count = j == 1 ? n - 3 : n;
        x->shift = j == 2;
        for (i = 0; i < 4; i++) x->buf[i] = alloc_floats16(n);
        x->p = x->buf[0] + x->shift; x->g = x->buf[1] + x->shift; x->m = x->buf[2] + x->shift; x->v = x->buf[3] + x->shift;
        memcpy(x->p, cpu_p, n * sizeof(float));
        x->bad_step = 0;
    }
    for (step = 1; step <= STEPS; step++) {
        ddp_adamw opt;
        double norm_sq;
        memset(&opt, 0, sizeof opt);
        opt.lr = 1e-2f * (1.0f + 0.5f * (float)(step % 7));   /* a schedule: lr changes every step */
        opt.beta1 = b1; opt.beta2 = b2; opt.eps = eps;
        opt.weight_decay = 0.1f;
        opt.max_grad_norm = step % 3 == 0 ? 0.0f : step % 3 == 1 ? 0.5f : 1e9f;   /* off, clipping, above the norm */
        grads_for_step(cpu_g, ctx, step);
        norm_sq = ddp__sum_squares(cpu_g, n);   /* the CPU step's norm, given to the device's prepare */
        for (i = ddp_num_params(ctx) - 1; i >= 0; i--) r = ddp_grad_ready(ctx, i);   /* the step takes a finished backward */
        if (ddp_finish(ctx) != DDP_OK || r != DDP_OK || ddp_adamw_step(ctx, &opt, NULL) != DDP_OK) {
            printf("FAIL host_adamw_cpu_step %d: %s\n", step, ddp_last_error(ctx));
            exit(1);
        }
        for (j = 0; j < RUNS; j++) {
            replica *x = &rep[j];
            size_t at;
            memcpy(x->g, cpu_g, n * sizeof(float));
            ddp_k__adamw_prepare_host(&x->state, &norm_sq, opt.max_grad_norm, opt.lr, b1, b2);
            ddp_k__adamw_host(x->p, x->g, x->m, x->v, x->count, mask, opt.lr, b1, b2, eps, opt.weight_decay, &x->state);
            if (j == 0 && !x->state.skip && x->state.clip < 1.0f) clipped++;
            if (x->bad_step) continue;
            {
                const float *got[3] = { x->p, x->m, x->v }, *want[3] = { cpu_p, cpu_m, cpu_v };
                for (i = 0; i < 3 && !x->bad_step; i++)
                    if (!same_bits(got[i], want[i], x->count, &at)) {
                        x->bad_step = (size_t)step; x->bad_at = at; x->bad_what = i == 0 ? "p" : i == 1 ? "m" : "v";
                        x->got = got[i][at]; x->want = want[i][at];
                    }
            }
            if (x->state.step != *cpu_step) steps_ok = 0;
        }
    }
    for (j = 0; j < RUNS; j++) {
        char name[96];
        snprintf(name, sizeof name, "host_adamw_kernel_math_equals_cpu_bits_%s", rep[j].name);
        verdict(rep[j].bad_step == 0, name, "first difference at step %zu: %s[%zu] is %a, the CPU's %a", rep[j].bad_step,
                rep[j].bad_what, rep[j].bad_at, rep[j].got, rep[j].want);
    }
    verdict(steps_ok && *cpu_step == STEPS - 2 && rep[0].state.skipped == 2 && clipped >= STEPS / 4,
            "host_adamw_step_count_skips_and_clipping_exercised", "cpu step %lld, kernel step %lld, %lld skipped, %d clipped steps",
            (long long)*cpu_step, rep[0].state.step, rep[0].state.skipped, clipped);
    printf("  (%d steps over %zu floats: %d clipped, %lld skipped; %zu elements compared per replica and step)\n", STEPS, n,
           clipped, rep[0].state.skipped, n);
    for (j = 0; j < RUNS; j++) for (i = 0; i < 4; i++) free(rep[j].buf[i]);
    for (i = 0; i < NPARAMS; i++) free(init[i]);
    DDP_FREE(mask);
    ddp_shutdown(ctx);
}

/* ---- bf16 parameters: ddp_k_scale_bf16 then ddp_k_adamw_bf16's element math == ddp.h's CPU
   step on param_dtype DDP_DTYPE_BF16 (fp32 master, bf16 working copies and gradients), bit for
   bit: master, working copies, m, v, the step count; the gradients scaled as uneven_inputs'
   DIVIDE_BY_ACTIVE rescale does (ddp__host_scale on the CPU), clipping, a skipped NaN step. The
   norm given to the kernels' prepare is the CPU step's own (its blocks, its order). ---- */
static void test_adamw_bf16_parity(void) {
    ddp_context *ctx;
    ddp_desc d;
    ddp_result r;
    unsigned char *mask;
    float *cpu_p, *cpu_m, *cpu_v, *init[NPARAMS], *p, *m, *v;
    ddp_bf16 *cpu_w, *cpu_g;
    uint16_t *w, *g;
    int64_t *cpu_step;
    ddp_k_adamw_state state;
    const float b1 = 0.9f, b2 = 0.99f, eps = 1e-8f;
    size_t n, k, bad_at = 0;
    int i, step, id, bad_step = 0, clipped = 0;
    const char *bad_what = "";
    memset(&d, 0, sizeof d);
    memset(&state, 0, sizeof state);
    d.world_size = 1;
    d.backend = DDP_BACKEND_CPU;
    d.param_dtype = DDP_DTYPE_BF16;
    d.skip_nonfinite = 1;
    d.log_level = DDP_LOG_OFF;
    if (ddp_init(&ctx, &d) != DDP_OK) { printf("FAIL host_adamw_bf16_init: %s\n", ddp_last_error(ctx)); exit(1); }
    for (i = 0; i < NPARAMS; i++) {
        char name[16];
        init[i] = (float *)malloc(param_sizes[i] * sizeof(float));
        for (k = 0; k < param_sizes[i]; k++) init[i][k] = 0.5f * test_value(11 + (uint64_t)i, k);
        snprintf(name, sizeof name, "p%d", i);
        ddp_register_param(ctx, name, param_sizes[i], param_flags[i], init[i], &id);
    }
    if (ddp_commit(ctx) != DDP_OK) { printf("FAIL host_adamw_bf16_commit: %s\n", ddp_last_error(ctx)); exit(1); }
    cpu_p = ddp_flat_params(ctx, &n);
    cpu_w = ctx->flat.params_bf16;
    cpu_g = ctx->flat.grads_bf16;
    ddp_adamw_state(ctx, &cpu_m, &cpu_v, &cpu_step);
    mask = ddp__gpu_no_decay_mask(ctx, &r);
    p = alloc_floats16(n); m = alloc_floats16(n); v = alloc_floats16(n);
    w = (uint16_t *)malloc(n * sizeof(uint16_t) + 2);
    g = (uint16_t *)malloc(n * sizeof(uint16_t) + 2);
    memcpy(p, cpu_p, n * sizeof(float));
    memcpy(w, cpu_w, n * sizeof(uint16_t));
    for (step = 1; step <= 40 && !bad_step; step++) {
        ddp_adamw opt;
        double norm_sq;
        float factor = step % 4 == 0 ? 2.0f / 3.0f : 1.0f;   /* DIVIDE_BY_ACTIVE's rescale, now and then */
        memset(&opt, 0, sizeof opt);
        opt.lr = 3e-3f * (1.0f + 0.25f * (float)(step % 5));
        opt.beta1 = b1; opt.beta2 = b2; opt.eps = eps;
        opt.weight_decay = 0.1f;
        opt.max_grad_norm = step % 2 ? 0.5f : 0.0f;
        for (i = 0; i < NPARAMS; i++)   /* the padding between parameters keeps its zero gradient, as on a device */
            for (k = ctx->model.params[i].offset; k < ctx->model.params[i].offset + ctx->model.params[i].count; k++)
                cpu_g[k] = ddp__to_bf16(test_value(300 + (uint64_t)step, k) * (k % 7 == 0 ? 0.3f : 0.02f));
        if (step == 13) cpu_g[ctx->model.params[2].offset + 9] = ddp__to_bf16(NAN);
        memcpy(g, cpu_g, n * sizeof(uint16_t));
        if (factor != 1.0f) {
            ddp__host_scale(ctx, 0, n, factor);
            ddp_k__scale_bf16_host(g, n, factor);
            if (memcmp(g, cpu_g, n * sizeof(uint16_t))) { bad_step = step; bad_what = "scaled gradient"; break; }
        }
        for (i = ddp_num_params(ctx) - 1; i >= 0; i--) r = ddp_grad_ready(ctx, i);
        if (ddp_finish(ctx) != DDP_OK || r != DDP_OK || ddp_adamw_step(ctx, &opt, NULL) != DDP_OK) {
            printf("FAIL host_adamw_bf16_cpu_step %d: %s\n", step, ddp_last_error(ctx));
            exit(1);
        }
        norm_sq = ddp__norm_sum(ctx->shard.norm_sums, ctx->shard.norm_blocks);   /* what the CPU step's norm was made of */
        ddp_k__adamw_prepare_host(&state, &norm_sq, opt.max_grad_norm, opt.lr, b1, b2);
        ddp_k__adamw_bf16_host(p, w, g, m, v, n, mask, opt.lr, b1, b2, eps, opt.weight_decay, &state);
        if (!state.skip && state.clip < 1.0f) clipped++;
        if (!same_bits(p, cpu_p, n, &bad_at)) { bad_step = step; bad_what = "master"; }
        else if (!same_bits(m, cpu_m, n, &bad_at)) { bad_step = step; bad_what = "m"; }
        else if (!same_bits(v, cpu_v, n, &bad_at)) { bad_step = step; bad_what = "v"; }
        else if (memcmp(w, cpu_w, n * sizeof(uint16_t))) { bad_step = step; bad_what = "working copy"; }
        else if (state.step != *cpu_step) { bad_step = step; bad_what = "step count"; }
    }
    verdict(bad_step == 0, "host_adamw_bf16_and_scale_bf16_kernel_math_equal_cpu_bits",
            "first difference at step %d: the %s (element %zu)", bad_step, bad_what, bad_at);
    verdict(*cpu_step == 39 && state.skipped == 1 && clipped >= 5 && state.diverged == 0, "host_adamw_bf16_skip_and_clipping_exercised",
            "cpu step %lld, %lld skipped, %d clipped, %llu diverged", (long long)*cpu_step, state.skipped, clipped, state.diverged);
    printf("  (40 steps over %zu bf16 parameters: %d clipped, %lld skipped, 10 rescaled)\n", n, clipped, state.skipped);
    free(p); free(m); free(v); free(w); free(g);
    for (i = 0; i < NPARAMS; i++) free(init[i]);
    DDP_FREE(mask);
    ddp_shutdown(ctx);
}

/* ---- bf16 ---- */
/* Round to nearest even written as arithmetic in double (no bit tricks): bf16 keeps 8
   significant bits, its spacing at |x| is 2^(e-8) for x in [2^(e-1), 2^e), at least 2^-133 (the
   subnormal spacing); a result of 2^128 or more is infinity. NaN: quiet, sign and top payload
   kept (the project's convention). */
static uint16_t ref_to_bf16(uint32_t u) {
    float f;
    double a, spacing, lo, hi, q, pick;
    int e;
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    memcpy(&f, &u, 4);
    /* NaN and Inf by their bits: the fast-math build of this test (-ffinite-math-only) folds f != f */
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    a = fabs((double)f);
    if ((u & 0x7fffffffu) == 0x7f800000u) return (uint16_t)(sign | 0x7f80u);
    if (a == 0) return sign;
    frexp(a, &e);
    spacing = ldexp(1.0, e - 8 > -133 ? e - 8 : -133);
    q = floor(a / spacing);
    lo = q * spacing;
    hi = lo + spacing;
    if (a - lo < hi - a) pick = lo;
    else if (a - lo > hi - a) pick = hi;
    else pick = fmod(q, 2.0) == 0 ? lo : hi;
    if (pick >= ldexp(1.0, 128)) return (uint16_t)(sign | 0x7f80u);
    {
        float pf = (float)pick;   /* exact: every bf16 value is a float */
        uint32_t pu;
        memcpy(&pu, &pf, 4);
        return (uint16_t)(sign | (pu >> 16));
    }
}

static uint32_t xorshift32(uint32_t *s) { *s ^= *s << 13; *s ^= *s >> 17; *s ^= *s << 5; return *s; }

static void test_bf16(void) {
    static const struct { uint32_t in; uint16_t want; } special[] = {
        { 0x00000000u, 0x0000 }, { 0x80000000u, 0x8000 },            /* signed zeros */
        { 0x00000001u, 0x0000 }, { 0x80000001u, 0x8000 },            /* smallest denormal: to zero */
        { 0x00008000u, 0x0000 }, { 0x00018000u, 0x0002 },            /* denormal ties: to even */
        { 0x00008001u, 0x0001 }, { 0x007fffffu, 0x0080 },            /* above a tie; largest denormal up to min normal */
        { 0x00800000u, 0x0080 },                                     /* smallest normal */
        { 0x3f800000u, 0x3f80 }, { 0x3f808000u, 0x3f80 },            /* 1.0; the tie above it stays (even) */
        { 0x3f818000u, 0x3f82 }, { 0x3f80ffffu, 0x3f81 },            /* a tie up to even; just below the next */
        { 0xbf818000u, 0xbf82 },                                     /* sign kept through rounding */
        { 0x7f7f7fffu, 0x7f7f }, { 0x7f7f8000u, 0x7f80 },            /* below / at the top tie: max finite / inf */
        { 0x7f7fffffu, 0x7f80 }, { 0xff7fffffu, 0xff80 },            /* max finite float overflows to +-inf */
        { 0x7f800000u, 0x7f80 }, { 0xff800000u, 0xff80 },            /* infinities */
        { 0x7fc00000u, 0x7fc0 }, { 0xffc00000u, 0xffc0 },            /* quiet NaNs */
        { 0x7f800001u, 0x7fc0 }, { 0xff800001u, 0xffc0 },            /* signalling NaN, low payload: stays NaN, not inf */
        { 0x7fbfffffu, 0x7fff },                                     /* NaN payload top kept, quieted */
    };
    size_t i, bad = 0, bad_cpu = 0, checked = 0;
    uint32_t first_bad = 0, seed = 0x9e3779b9u, lows[8] = { 0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff, 0, 0 };
    for (i = 0; i < sizeof special / sizeof special[0]; i++) {
        float f;
        uint32_t u = special[i].in;
        memcpy(&f, &u, 4);
        if (ddp_k__to_bf16(f) != special[i].want || ref_to_bf16(u) != special[i].want) {
            if (!bad) first_bad = u;
            bad++;
        }
    }
    verdict(bad == 0, "host_f32_to_bf16_special_cases", "%zu of %zu wrong, first input 0x%08x", bad,
            sizeof special / sizeof special[0], first_bad);
    bad = 0;
    for (i = 0; i < ((size_t)1 << 16) * 8 + ((size_t)1 << 24); i++) {
        uint32_t u;
        float f;
        uint16_t got;
        if (i < ((size_t)1 << 16) * 8) {   /* every sign/exponent/7-bit mantissa, with the low halves that decide ties */
            if (i % 8 >= 6) lows[i % 8] = xorshift32(&seed) & 0xffffu;
            u = (uint32_t)(i / 8) << 16 | lows[i % 8];
        } else u = xorshift32(&seed);      /* random bit patterns */
        memcpy(&f, &u, 4);
        got = ddp_k__to_bf16(f);
        if (got != ref_to_bf16(u)) { if (!bad) first_bad = u; bad++; }
        bad_cpu += got != ddp__to_bf16(f);
        checked++;
    }
    verdict(bad == 0, "host_f32_to_bf16_rne_vs_independent_reference", "%zu of %zu differ, first input 0x%08x", bad, checked, first_bad);
    verdict(bad_cpu == 0, "host_f32_to_bf16_equals_cpu_backend_cast", "%zu of %zu differ", bad_cpu, checked);
    bad = 0;
    for (i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = ddp_k__from_bf16(h), want;
        uint32_t w = (uint32_t)h << 16;
        memcpy(&want, &w, 4);
        if (memcmp(&f, &want, 4)) bad++;
        if ((w & 0x7fffffffu) <= 0x7f800000u && ddp_k__to_bf16(f) != h) bad++;                         /* exact round trip */
        if ((w & 0x7fffffffu) > 0x7f800000u && ddp_k__to_bf16(f) != (uint16_t)(h | 0x0040u)) bad++;   /* NaN stays NaN, quieted */
    }
    verdict(bad == 0, "host_bf16_to_f32_all_2^16_and_round_trip", "%zu wrong", bad);
}

/* ---- ZeRO-2's shard_accumulate: ddp_k_accumulate(_bf16)'s element math == ddp.h's CPU
   accumulator (ddp__z2_accumulate: acc = g, acc += g, g = acc + g; bf16 gradients widened,
   the sum rounded once), over three micro-steps of values with signed zeros, denormals,
   infinities and magnitudes far apart ---- */
static float acc_value(uint32_t *seed, int k) {
    static const uint32_t special[] = { 0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x7f800000u, 0xff7fffffu,
                                        0x3f800000u, 0x33800000u };
    uint32_t u = xorshift32(seed);
    float f;
    if (k % 17 < 8) u = special[k % 17];
    else if (k % 3 == 0) u = (u & 0x807fffffu) | (uint32_t)(100 + u % 60) << 23;   /* near 1, cancellations */
    memcpy(&f, &u, 4);
    return f;
}
static void test_accumulate(void) {
    enum { N = 4099, MICRO = 3 };
    static float acc[N], ref_acc[N], g[N], ref_g[N];
    static uint16_t gb[N], ref_gb[N];
    uint32_t seed = 0x2545f491u;
    size_t i, bad = 0, bad_bf16 = 0;
    int u;
    for (u = 0; u < MICRO; u++) {
        int mode = u == MICRO - 1 ? DDP_K_ACC_FINAL : u == 0 ? DDP_K_ACC_FIRST : DDP_K_ACC_ADD;
        for (i = 0; i < N; i++) {
            ref_g[i] = g[i] = acc_value(&seed, (int)(i + (size_t)u * 5));
            ref_gb[i] = gb[i] = ddp__to_bf16(acc_value(&seed, (int)(i + (size_t)u * 7)));
        }
        ddp_k__accumulate_host(acc, g, N, mode);
        for (i = 0; i < N; i++) {   /* the CPU backend's loop */
            if (mode == DDP_K_ACC_FIRST) ref_acc[i] = ref_g[i];
            else if (mode == DDP_K_ACC_ADD) ref_acc[i] += ref_g[i];
            else ref_g[i] = ref_acc[i] + ref_g[i];
        }
        for (i = 0; i < N; i++) bad += memcmp(&acc[i], &ref_acc[i], 4) != 0 || memcmp(&g[i], &ref_g[i], 4) != 0;
    }
    memset(acc, 0, sizeof acc); memset(ref_acc, 0, sizeof ref_acc);
    for (u = 0; u < MICRO; u++) {
        int mode = u == MICRO - 1 ? DDP_K_ACC_FINAL : u == 0 ? DDP_K_ACC_FIRST : DDP_K_ACC_ADD;
        for (i = 0; i < N; i++) ref_gb[i] = gb[i] = ddp__to_bf16(acc_value(&seed, (int)(i + (size_t)u * 7)));
        ddp_k__accumulate_bf16_host(acc, gb, N, mode);
        for (i = 0; i < N; i++) {
            if (mode == DDP_K_ACC_FIRST) ref_acc[i] = ddp__from_bf16(ref_gb[i]);
            else if (mode == DDP_K_ACC_ADD) ref_acc[i] = ref_acc[i] + ddp__from_bf16(ref_gb[i]);
            else ref_gb[i] = ddp__to_bf16(ref_acc[i] + ddp__from_bf16(ref_gb[i]));
        }
        for (i = 0; i < N; i++) bad_bf16 += memcmp(&acc[i], &ref_acc[i], 4) != 0 || gb[i] != ref_gb[i];
    }
    verdict(bad == 0, "host_accumulate_kernel_math_equals_cpu_zero2_accumulator", "%zu of %d element-steps differ", bad, N * MICRO);
    verdict(bad_bf16 == 0, "host_accumulate_bf16_kernel_math_equals_cpu_zero2_accumulator", "%zu of %d element-steps differ",
            bad_bf16, N * MICRO);
}

/* ---- the two-stage sum of squares ---- */
static void test_norm(void) {
    static const size_t sizes[] = { 0, 1, 3, 4, 5, 17, 1023, 262143, 262144 * 4 + 3, 3000001 };
    const size_t most = 3000001 + 1;
    float *x = alloc_floats16(most), *ints = alloc_floats16(most);
    size_t s, i, worst_n = 0;
    double worst = 0;
    int shift, exact = 1;
    for (i = 0; i < most; i++) {
        x[i] = test_value(7, i) * (i % 11 == 0 ? 1e3f : 1.0f);
        ints[i] = (float)((int)((i * 7) % 13) - 6);   /* squares and sums exact in double */
    }
    for (shift = 0; shift < 2; shift++) {   /* 0: the float4 path, 1: the scalar path */
        for (s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            size_t n = sizes[s];
            long double ref = 0;
            double seq = 0, got = ddp_k__sum_squares_host(x + shift, n), rel;
            for (i = 0; i < n; i++) ref += (long double)x[shift + i] * x[shift + i];
            rel = n ? fabs((double)((long double)got - ref) / (double)ref) : fabs(got);
            if (rel > worst) { worst = rel; worst_n = n; }
            for (i = 0; i < n; i++) seq += (double)ints[shift + i] * ints[shift + i];
            if (ddp_k__sum_squares_host(ints + shift, n) != seq) exact = 0;
        }
    }
    verdict(worst <= 1e-12, "host_sum_squares_kernel_order_vs_float64", "relative error %.3g at n = %zu", worst, worst_n);
    verdict(exact, "host_sum_squares_counts_every_element_once", "an exact sum came out different");
    free(x);
    free(ints);
}

/* ---- the watchdog's clock ---- */
/* The host enqueues communication every 10 ms for `seconds`; each operation completes `lag`
   seconds after its enqueue (a GPU that far behind), or never once the GPU hangs at `hang_at`.
   The watchdog polls every 100 ms. Returns the time of the first timeout, or -1. */
static double simulate_watch(double seconds, double lag, double hang_at, double timeout_s, char *what, size_t cap) {
    ddp__watch w;
    double recorded[2] = { 0, 0 };   /* when each event was last recorded: it completes lag after */
    int oldest = 0, tick;
    memset(&w, 0, sizeof w);
    for (tick = 0; tick * 0.01 <= seconds; tick++) {
        double now = tick * 0.01;
        char name[32];
        snprintf(name, sizeof name, "op at %.2f s", now);
        recorded[ddp__watch_enqueue(&w, now, name) ? oldest ^ 1 : oldest] = now;
        if (tick % 10) continue;
        for (;;) {   /* as ddp__gpu_inspect_locked */
            double done_at = recorded[oldest] + lag;
            int done = done_at <= now && done_at < hang_at;
            if (ddp__watch_progress(&w, done, now)) { oldest ^= 1; continue; }
            if (ddp__watch_expired(&w, now, timeout_s)) { snprintf(what, cap, "%s", w.what); return now; }
            break;
        }
    }
    return -1;
}

static void test_watch(void) {
    char what[96] = "";
    double t = simulate_watch(1000, 2.0, 1e9, 5.0, what, sizeof what);
    verdict(t < 0, "host_watchdog_no_timeout_while_the_host_runs_ahead", "timed out at %.2f s in %s (GPU 2 s behind, timeout 5 s)", t, what);
    t = simulate_watch(1000, 0.005, 1e9, 5.0, what, sizeof what);
    verdict(t < 0, "host_watchdog_no_timeout_when_the_gpu_keeps_up", "timed out at %.2f s in %s", t, what);
    t = simulate_watch(1000, 2.0, 500, 5.0, what, sizeof what);
    verdict(t >= 500 && t <= 500 + 5.0 + 0.3, "host_watchdog_times_out_a_stopped_gpu_within_timeout",
            "timeout at %.2f s for a GPU stopped at 500 s (timeout 5 s)", t);
    printf("  (stopped GPU: timed out at %.2f s in \"%s\")\n", t, what);
    {   /* The whole job stopped (Ctrl-Z) from 10.15 s to 30.15 s with a collective pending since
           10 s: the watchdog's 0.1 s wait that began at 10.1 s ends at 30.2 s. Not a timeout
           (timeout 5 s); a collective still pending 5 s of running time later is one. */
        ddp__watch w;
        int ok;
        memset(&w, 0, sizeof w);
        ddp__watch_enqueue(&w, 10.0, "op");
        ddp__watch_slept(&w, 0.1);
        ok = w.since == 10.0;                                   /* a normal wait moves nothing */
        ddp__watch_slept(&w, 30.2 - 10.1);
        ok &= !ddp__watch_expired(&w, 30.2, 5.0) && !ddp__watch_expired(&w, 34.9, 5.0) && ddp__watch_expired(&w, 35.3, 5.0);
        verdict(ok, "host_watchdog_stopped_time_is_not_waiting", "since %.2f after a 20.1 s wait (pending since 10 s)", w.since);
        memset(&w, 0, sizeof w);
        ddp__watch_slept(&w, 20.0);
        verdict(w.since == 0, "host_watchdog_stopped_time_with_nothing_pending", "since %.2f", w.since);
    }
}

/* ---- the communicator's life ---- */
static void test_life(void) {
    ddp__life l;
    int ok = 1, run, step, frees_bad = 0, late_bad = 0, lost_abort = 0;
    unsigned rng = 12345;
    memset(&l, 0, sizeof l);
    l.live = 1;
    ok &= ddp__life_abort(&l) == 1 && ddp__life_abort(&l) == 0 && ddp__life_enter(&l) == 0 && ddp__life_claim(&l) == 0;
    verdict(ok, "host_life_abort_idle_once", "an idle communicator: abort once, then nothing enters or frees it");
    memset(&l, 0, sizeof l);
    l.live = 1;
    ok = ddp__life_enter(&l) && ddp__life_enter(&l);            /* two calls in flight */
    ok &= ddp__life_abort(&l) == 0 && ddp__life_claim(&l) == 0;  /* deferred; teardown must not take it */
    ok &= ddp__life_enter(&l) == 0;                              /* nobody new gets in */
    ok &= ddp__life_leave(&l) == 0 && ddp__life_leave(&l) == 1;  /* the last one out aborts */
    ok &= ddp__life_abort(&l) == 0 && ddp__life_enter(&l) == 0;
    verdict(ok, "host_life_abort_during_calls_deferred_to_the_last_out", "two calls in flight, then an abort");
    memset(&l, 0, sizeof l);
    l.live = 1;
    ok = ddp__life_enter(&l) && ddp__life_leave(&l) == 0 && ddp__life_claim(&l) == 1 && ddp__life_abort(&l) == 0 &&
         ddp__life_enter(&l) == 0;
    verdict(ok, "host_life_claimed_for_teardown_once", "a clean teardown: claimed once, never aborted after");
    /* Random interleavings of up to 3 threads' calls, aborts from the watchdog, a teardown claim. */
    for (run = 0; run < 20000; run++) {
        int frees = 0, asked = 0;
        memset(&l, 0, sizeof l);
        l.live = 1;
        for (step = 0; step < 50; step++) {
            unsigned op;
            rng = rng * 1103515245u + 12345u;
            op = (rng >> 16) % 4;
            if (op == 0 && l.in_call < 3) { if (ddp__life_enter(&l) && frees) late_bad++; }
            else if (op == 1 && l.in_call > 0) { if (ddp__life_leave(&l)) { frees++; if (l.in_call) frees_bad++; } }
            else if (op == 2) { asked |= l.live; if (ddp__life_abort(&l)) { frees++; if (l.in_call) frees_bad++; } }
            else if (op == 3) { if (ddp__life_claim(&l)) { frees++; if (l.in_call) frees_bad++; } }
        }
        while (l.in_call > 0) if (ddp__life_leave(&l)) frees++;   /* everyone leaves */
        if (frees > 1) frees_bad++;
        if (asked && frees == 0) lost_abort++;
    }
    verdict(!frees_bad && !late_bad && !lost_abort, "host_life_random_interleavings",
            "%d double or in-call frees, %d entries after a free, %d aborts never carried out", frees_bad, late_bad, lost_abort);
}

int main(void) {
    test_life();
    test_adamw_parity();
    test_adamw_bf16_parity();
    test_bf16();
    test_accumulate();
    test_norm();
    test_watch();
    return test_summary("test_kernel_math_host");
}
