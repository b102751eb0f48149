/* test_bf16_params.c — bf16 parameters with fp32 master weights (ddp_desc.param_dtype = BF16),
   ranks as threads of one process, on the CPU backend and on the NCCL backend run on the host
   emulation (tests/fakegpu, built like test_fake_nccl.c). Checks:
   - the recipe against a float64 reference: bf16 gradients given on every rank, averaged
     (bf16 or fp32 reduce) and rounded to bf16, the norm and clipping from them, AdamW on the
     master in double, the working copy = the master rounded to nearest even; 1, 2, 3 ranks,
     6 steps, clipping on, weight decay with a no-decay parameter; with accumulation (the program
     adds micro-steps into its bf16 gradients), an unused parameter (find_unused), a NaN step
     skipped (skip_nonfinite), the timeline on;
   - every rank holds the same bits (master, working copies, bf16 gradients);
   - the NCCL backend gives the bits of the CPU backend, sharded (ZeRO-1) and not, bf16 and fp32
     reduce; sharded gives the bits of unsharded;
   - ddp_copy_from_host and ddp_save / ddp_load: the working copies follow the master;
   - bad input: accessors of the wrong dtype (NULL and a named error), ranks that disagree on
     param_dtype (DDP_ERR_MISMATCH naming it), a bad $DDP_PARAM_DTYPE or param_dtype value;
   - the gradients are reduced in bf16 where they are: the bytes a rank allocates per parameter
     (ddp.h's heap through DDP_MALLOC, the CPU backend's gradient segment, the fake GPU's device
     memory) are the recipe's 16, no fp32 gradient buffer exists (reduce_dtype FP32: one bucket's
     floats more on NCCL); the staging-slot path (DDP_STAGED_GRADS=1) gives the in-place bits.
   Run: build/test_bf16_params */
#include <stddef.h>
/* ddp.h's heap, counted (every rank's thread alike): the bytes a model costs per parameter. */
static void *test_counted_malloc(size_t n);
static void test_counted_free(void *p);
#define DDP_MALLOC(n) test_counted_malloc(n)
#define DDP_FREE(p) test_counted_free(p)
#include "testlib.h"
#include "fakegpu/fakegpu.h"
#include <math.h>

#define MAX_WORLD 3
#define NP 4
#define STEPS 6
static const size_t sizes[NP] = { 3000, 17, 2100, 40 };   /* several buckets and norm blocks */
#define UNUSED_PARAM 3                                    /* no gradient, in the find_unused runs */
#define NAN_STEP 3                                        /* rank 1's NaN, in the skip_nonfinite runs */

static struct {
    ddp_backend backend;
    ddp_dtype reduce;
    int shard, micro, find_unused, nan_step, timeline;
    const char *ckpt;              /* save after training, load into a fresh context, compare */
    int load_shard;                /* load_rank: the loading contexts' shard_optimizer */
} cfg;

typedef struct out {
    ddp_result r;
    char err[DDP__ERR_MAX];
    size_t count;
    float *master;                 /* fp32 master after training */
    ddp_bf16 *work, *grad;         /* working copies, last bf16 gradients */
    float norms[STEPS];
    int load_ok, copy_ok;
    int grads_copy_ok;             /* ddp_copy_to_host / _from_host of DDP_GRADS: widened, rounded */
    size_t held, held_want;        /* floats of the fp32 master this rank holds; its parts by the manual's rule */
    size_t device_bytes;           /* NCCL (fake): what the rank's device holds after training */
    int refused_ok;                /* sharded: host copies outside its parts refused by name, its part read */
    int in_segment;                /* CPU, several ranks: the bf16 gradients live in the shared segment */
    int no_fp32_grads;             /* no fp32 gradient buffer exists */
    char refused[DDP__ERR_MAX];
} out;
static out res[MAX_WORLD];

static size_t heap_live;   /* bytes ddp.h holds through DDP_MALLOC, all ranks (atomic) */
static void *test_counted_malloc(size_t n) {
    size_t *p = (size_t *)malloc(n + 16);
    if (!p) return NULL;
    *p = n;
    __atomic_add_fetch(&heap_live, n, __ATOMIC_SEQ_CST);
    return (unsigned char *)p + 16;
}
static void test_counted_free(void *q) {
    size_t *p;
    if (!q) return;
    p = (size_t *)(void *)((unsigned char *)q - 16);
    __atomic_sub_fetch(&heap_live, *p, __ATOMIC_SEQ_CST);
    free(p);
}
static int ckpt_port;              /* the loading contexts' process group */

/* The bf16 nearest to x (ties to even), as a double; the reference's own rounding. */
static double round_bf16(double x) {
    int e;
    double m;
    if (x == 0 || !isfinite(x)) return x;
    m = frexp(x, &e);                       /* |m| in [0.5, 1): 8 significant bits */
    return ldexp(rint(ldexp(m, 8)), e - 8); /* rint: the default mode, nearest even */
}
/* The bits of f rounded to bf16 (finite f). */
static ddp_bf16 bits_of(float f) { uint32_t u; f = (float)round_bf16(f); memcpy(&u, &f, 4); return (ddp_bf16)(u >> 16); }
static float float_of(ddp_bf16 h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }

/* Rank r's gradient of parameter k, element i, micro-step u of step s: bf16 values. */
static float grad_value(int s, int u, int r, int k, size_t i) {
    if (cfg.nan_step && s == cfg.nan_step && r == 1 % MAX_WORLD && k == 2 && i == 5) return NAN;
    return (float)round_bf16(0.5 * test_value((uint64_t)(((s * 4 + u) * 8 + r) * 8 + k), i));
}
static float init_value(int k, size_t i) { return 0.3f * test_value(1000 + (uint64_t)k, i); }
static int used(int k) { return !(cfg.find_unused && k == UNUSED_PARAM); }

static ddp_adamw options(void) {
    ddp_adamw o;
    memset(&o, 0, sizeof o);
    o.lr = 0.02f; o.weight_decay = 0.1f; o.max_grad_norm = 1.0f;   /* the norms are ~20: clipped */
    return o;
}

/* This rank's parts by the manual's rule (SHARDED OPTIMIZER: 1/world of a bucket rounded down to
   1024 floats, the last rank the rest), from the buckets ddp.h reports: the floats it should hold. */
static size_t parts_of(ddp_context *ctx, int rank, int world, size_t *first_lo, size_t *first_hi) {
    ddp_bucket_info b;
    size_t total = 0, part;
    int i;
    *first_lo = *first_hi = 0;
    for (i = 0; i < ddp_num_buckets(ctx) && ddp_bucket(ctx, i, &b) == DDP_OK; i++) {
        size_t lo, hi;
        part = world == 1 ? b.count : b.count / (size_t)world / 1024 * 1024;
        lo = b.offset + part * (size_t)rank;
        hi = rank == world - 1 ? b.offset + b.count : lo + part;
        if (hi > lo && *first_hi == *first_lo) { *first_lo = lo; *first_hi = hi; }
        total += hi - lo;
    }
    return total;
}

/* The whole fp32 master into every rank's `dst`: sharded, it is in parts (ddp_gather_to_host,
   once per root); otherwise every rank's own copy. */
static ddp_result read_master(ddp_context *ctx, int rank, int world, int sharded, float *dst, size_t count) {
    ddp_result r = DDP_OK;
    int root;
    if (!sharded || world == 1) return ddp_copy_to_host(ctx, DDP_PARAMS, 0, dst, count);
    for (root = 0; root < world && r == DDP_OK; root++) r = ddp_gather_to_host(ctx, DDP_PARAMS, 0, rank == root ? dst : NULL, count, root);
    return r;
}

/* Sharded: a host copy of the master outside this rank's parts, and any host write of it, are
   refused by name; a copy of its own part gives the gathered values. */
static int check_refusals(ddp_context *ctx, int rank, int world, out *o) {
    size_t lo, hi;
    float one = 1.0f, *mine;
    ddp_result a, b, c;
    int ok;
    char e1[DDP__ERR_MAX], e2[DDP__ERR_MAX], want[32];
    parts_of(ctx, rank, world, &lo, &hi);
    a = ddp_copy_to_host(ctx, DDP_PARAMS, 0, o->master, o->count);   /* the whole buffer: never all held */
    snprintf(e1, sizeof e1, "%s", ddp_last_error(ctx));
    b = ddp_copy_from_host(ctx, DDP_PARAMS, lo, &one, 1);           /* even inside its own part */
    snprintf(e2, sizeof e2, "%s", ddp_last_error(ctx));
    mine = (float *)malloc((hi - lo + 1) * sizeof(float));
    c = ddp_copy_to_host(ctx, DDP_PARAMS, lo, mine, hi - lo);
    snprintf(want, sizeof want, "rank %d", rank);
    ok = a == DDP_ERR_INVALID_ARGUMENT && strstr(e1, "not all held by") && strstr(e1, want) && strstr(e1, "fp32 master") &&
         b == DDP_ERR_INVALID_ARGUMENT && strstr(e2, want) && strstr(e2, "ddp_scatter_from_host") && strstr(e2, "ddp_copy_from_host") &&
         c == DDP_OK && !memcmp(mine, o->master + lo, (hi - lo) * sizeof(float));   /* no part (tiny buckets): nothing read */
    snprintf(o->refused, sizeof o->refused, "%d %d %d: %.400s | %.400s", (int)a, (int)b, (int)c, e1, e2);
    free(mine);
    return ok;
}

static void train_rank(test_rank *self) {
    out *o = &res[self->rank];
    ddp_desc d = test_desc(self);
    ddp_context *ctx = NULL;
    ddp_adamw opt = options();
    int ids[NP], k, s, u;
    float *init[NP];
    char tl[128];
    d.backend = self->world == 1 && cfg.backend == DDP_BACKEND_CPU ? DDP_BACKEND_SINGLE : cfg.backend;
    d.param_dtype = DDP_DTYPE_BF16;
    d.reduce_dtype = cfg.reduce;
    d.shard_optimizer = cfg.shard;
    d.find_unused = cfg.find_unused;
    d.skip_nonfinite = cfg.nan_step != 0;
    d.bucket_cap_mb = 0.006;   /* several buckets for these sizes */
    d.first_bucket_mb = 0.001;
    snprintf(tl, sizeof tl, "/tmp/ddp_bf16_tl_%d.json", (int)getpid());
    if (cfg.timeline) d.timeline_path = tl;
    memset(o, 0, sizeof *o);
    o->r = ddp_init(&ctx, &d);
    for (k = 0; k < NP; k++) {   /* read at commit: kept until then */
        size_t i;
        init[k] = (float *)malloc(sizes[k] * sizeof(float));
        for (i = 0; i < sizes[k]; i++) init[k][i] = init_value(k, i);
    }
    for (k = 0; k < NP && o->r == DDP_OK; k++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", k);
        o->r = ddp_register_param(ctx, name, sizes[k], k == 1 ? DDP_NO_DECAY : 0, init[k], &ids[k]);
    }
    if (o->r == DDP_OK) o->r = ddp_commit(ctx);
    for (k = 0; k < NP; k++) free(init[k]);
    if (o->r == DDP_OK) {
        o->in_segment = ctx->be->id == DDP_BACKEND_CPU && ctx->impl.cpu->grads_shm && (unsigned char *)ctx->flat.grads_bf16 >= ctx->impl.cpu->grads_shm &&
                        (unsigned char *)ctx->flat.grads_bf16 < ctx->impl.cpu->grads_shm + ctx->impl.cpu->grads_shm_bytes;
        o->no_fp32_grads = ctx->flat.grads == NULL;
    }
    for (s = 0; s < STEPS && o->r == DDP_OK; s++) {
        if ((o->r = ddp_zero_grad(ctx)) != DDP_OK) break;
        for (u = 0; u < cfg.micro && o->r == DDP_OK; u++) {
            ddp_set_sync(ctx, u == cfg.micro - 1);
            for (k = NP - 1; k >= 0 && o->r == DDP_OK; k--) {   /* backward: the last parameter first */
                ddp_bf16 *g = ddp_grad_bf16(ctx, ids[k]);
                size_t i;
                if (!used(k)) continue;
                /* the program accumulates its micro-steps in bf16 (the fake's device memory is host memory) */
                for (i = 0; i < sizes[k]; i++) g[i] = bits_of((float)round_bf16((double)float_of(g[i]) + grad_value(s, u, self->rank, k, i)));
                o->r = ddp_grad_ready(ctx, ids[k]);
            }
            if (o->r == DDP_OK) o->r = ddp_finish(ctx);
        }
        if (o->r == DDP_OK) o->r = ddp_adamw_step(ctx, &opt, &o->norms[s]);
        if (o->r == DDP_OK && cfg.nan_step && cfg.nan_step == s && !(o->norms[s] != o->norms[s]))
            o->r = ddp__fail(ctx, DDP_ERR_INVALID_STATE, "the NaN step's norm is %g", o->norms[s]);
    }
    if (o->r == DDP_OK) {
        ddp_bf16 *w = ddp_flat_params_bf16(ctx, &o->count), *g = ddp_flat_grads_bf16(ctx, NULL);
        o->master = (float *)malloc(o->count * sizeof(float));
        o->work = (ddp_bf16 *)malloc(o->count * sizeof(ddp_bf16));
        o->grad = (ddp_bf16 *)malloc(o->count * sizeof(ddp_bf16));
        size_t lo, hi;
        if (cfg.backend == DDP_BACKEND_NCCL) {   /* before the host copies below (their scratch is device memory) */
            int dev = -1;
            if (cudaGetDevice(&dev) == cudaSuccess) o->device_bytes = fakegpu_device_bytes(dev);
        }
        o->r = read_master(ctx, self->rank, self->world, cfg.shard, o->master, o->count);
        memcpy(o->work, w, o->count * sizeof(ddp_bf16));
        memcpy(o->grad, g, o->count * sizeof(ddp_bf16));
        if (o->r == DDP_OK) {   /* host copies of the gradients: widened; sharded, gathered from the parts' owners */
            float *gh = (float *)malloc(o->count * sizeof(float));
            size_t i;
            int root;
            o->r = ddp_copy_to_host(ctx, DDP_GRADS, 0, gh, o->count);
            o->grads_copy_ok = o->r == DDP_OK;
            for (i = 0; o->grads_copy_ok && i < o->count; i++) o->grads_copy_ok = gh[i] == float_of(g[i]) || (gh[i] != gh[i] && g[i] == bits_of(gh[i]));
            for (root = 0; cfg.shard && self->world > 1 && root < self->world && o->r == DDP_OK; root++)
                o->r = ddp_gather_to_host(ctx, DDP_GRADS, 0, self->rank == root ? gh : NULL, o->count, root);
            /* every rank's gathered averages replace its local gradients (outside its parts not averaged) */
            for (i = 0; cfg.shard && self->world > 1 && o->r == DDP_OK && i < o->count; i++) {
                uint32_t u;
                memcpy(&u, &gh[i], 4);
                o->grad[i] = (ddp_bf16)(u >> 16);   /* exact: the gathered floats are bf16 values */
            }
            free(gh);
        }
        ddp_flat_params(ctx, &o->held);
        o->held_want = cfg.shard ? parts_of(ctx, self->rank, self->world, &lo, &hi) : o->count;
        if (o->r == DDP_OK && cfg.shard && self->world > 1) o->refused_ok = check_refusals(ctx, self->rank, self->world, o);
    }
    if (o->r == DDP_OK && cfg.ckpt) {   /* save, then a fresh context loads it */
        ddp_context *c2 = NULL;
        ddp_desc d2 = d;
        int id2;
        if ((o->r = ddp_save(ctx, cfg.ckpt, NULL, 0)) == DDP_OK) {
            d2.timeline_path = NULL;
            d2.master_port = ckpt_port;
            ddp_shutdown(ctx);
            ctx = NULL;
            o->r = ddp_init(&c2, &d2);
            for (k = 0; k < NP && o->r == DDP_OK; k++) {
                char name[16];
                snprintf(name, sizeof name, "p%d", k);
                o->r = ddp_register_param(c2, name, sizes[k], k == 1 ? DDP_NO_DECAY : 0, NULL, &id2);
            }
            if (o->r == DDP_OK) o->r = ddp_commit(c2);
            if (o->r == DDP_OK) o->r = ddp_load(c2, cfg.ckpt, NULL, 0, NULL, NULL, NULL);
            if (o->r == DDP_OK) {
                float *m2 = (float *)malloc(o->count * sizeof(float));
                const ddp_bf16 *w2 = ddp_flat_params_bf16(c2, NULL);
                size_t i;
                o->r = read_master(c2, self->rank, self->world, cfg.shard, m2, o->count);
                o->load_ok = o->r == DDP_OK && !memcmp(m2, o->master, o->count * sizeof(float));
                for (i = 0; o->load_ok && i < o->count; i++) o->load_ok = w2[i] == bits_of(m2[i]) && w2[i] == o->work[i];
                free(m2);
            }
            ctx = c2;
        }
    }
    if (o->r == DDP_OK && !cfg.ckpt && !cfg.shard) {   /* a host write of the master reaches the working copy */
        float v[5] = { 1.0f, -2.5f, 3.14159f, 1e-3f, 65504.7f };
        size_t at = ddp_param_bf16(ctx, ids[2]) - ddp_flat_params_bf16(ctx, NULL), i;
        o->r = ddp_copy_from_host(ctx, DDP_PARAMS, at + 10, v, 5);
        o->copy_ok = o->r == DDP_OK;
        for (i = 0; o->copy_ok && i < 5; i++) o->copy_ok = ddp_param_bf16(ctx, ids[2])[10 + i] == bits_of(v[i]);
        if (o->r == DDP_OK) o->r = ddp_copy_from_host(ctx, DDP_GRADS, at + 20, v, 5);   /* the bf16 gradients get them rounded */
        for (i = 0; o->copy_ok && i < 5; i++) o->copy_ok = ddp_grad_bf16(ctx, ids[2])[20 + i] == bits_of(v[i]);
    }
    if (o->r != DDP_OK && ctx) snprintf(o->err, sizeof o->err, "%s", ddp_last_error(ctx));
    ddp_shutdown(ctx);
}

/* A fresh context of `world` ranks (cfg.backend, cfg.load_shard) loads cfg.ckpt: every rank's
   whole master (gathered when in parts) and working copies into res. */
static void load_rank(test_rank *self) {
    out *o = &res[self->rank];
    ddp_desc d = test_desc(self);
    ddp_context *ctx = NULL;
    int k, id;
    d.backend = self->world == 1 && cfg.backend == DDP_BACKEND_CPU ? DDP_BACKEND_SINGLE : cfg.backend;
    d.param_dtype = DDP_DTYPE_BF16;
    d.reduce_dtype = cfg.reduce;
    d.shard_optimizer = cfg.load_shard;
    d.bucket_cap_mb = 0.006;
    d.first_bucket_mb = 0.001;
    memset(o, 0, sizeof *o);
    o->r = ddp_init(&ctx, &d);
    for (k = 0; k < NP && o->r == DDP_OK; k++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", k);
        o->r = ddp_register_param(ctx, name, sizes[k], k == 1 ? DDP_NO_DECAY : 0, NULL, &id);
    }
    if (o->r == DDP_OK) o->r = ddp_commit(ctx);
    if (o->r == DDP_OK) o->r = ddp_load(ctx, cfg.ckpt, NULL, 0, NULL, NULL, NULL);
    if (o->r == DDP_OK) {
        const ddp_bf16 *w = ddp_flat_params_bf16(ctx, &o->count);
        o->master = (float *)malloc(o->count * sizeof(float));
        o->work = (ddp_bf16 *)malloc(o->count * sizeof(ddp_bf16));
        memcpy(o->work, w, o->count * sizeof(ddp_bf16));
        o->r = read_master(ctx, self->rank, self->world, cfg.load_shard, o->master, o->count);
    }
    if (o->r != DDP_OK && ctx) snprintf(o->err, sizeof o->err, "%s", ddp_last_error(ctx));
    ddp_shutdown(ctx);
}

static int run_fn(int world, void (*fn)(test_rank *)) {
    void *shared[1];
    test_rank ranks[MAX_WORLD];
    int r, ok = 1;
    shared[0] = (void *)fn;
    for (r = 0; r < MAX_WORLD; r++) { free(res[r].master); free(res[r].work); free(res[r].grad); memset(&res[r], 0, sizeof res[r]); }
    fakegpu_reset();
    ckpt_port = test_free_port();
    test_run_ranks(world, shared, ranks);
    for (r = 0; r < world; r++)
        if (res[r].r != DDP_OK) { printf("  rank %d: %s (%s)\n", r, ddp_result_string(res[r].r), res[r].err); ok = 0; }
    return ok;
}
static int run(int world) { return run_fn(world, train_rank); }

/* The float64 reference of the recipe on `world` ranks: the master after STEPS steps, and the
   last averaged bf16 gradient. */
static void reference(int world, double *p, double *gavg) {
    static double m[8192], v[8192];
    ddp_adamw o = options();
    size_t off[NP], i, n = 0;
    int k, s, u, r, t = 0;
    for (k = 0; k < NP; k++) { off[k] = n; n += sizes[k]; }
    for (k = 0; k < NP; k++) for (i = 0; i < sizes[k]; i++) { p[off[k] + i] = init_value(k, i); m[off[k] + i] = v[off[k] + i] = 0; }
    for (s = 0; s < STEPS; s++) {
        double sq = 0, clip = 1, nan = 0;
        for (k = 0; k < NP; k++)
            for (i = 0; i < sizes[k]; i++) {
                double sum = 0;
                for (r = 0; r < world; r++) {
                    double acc = 0;   /* the rank's micro-steps, accumulated in bf16 */
                    if (used(k)) for (u = 0; u < cfg.micro; u++) acc = round_bf16(acc + grad_value(s, u, r, k, i));
                    sum += acc;
                }
                gavg[off[k] + i] = round_bf16(sum / world);
                if (gavg[off[k] + i] != gavg[off[k] + i]) nan = 1;
                sq += gavg[off[k] + i] * gavg[off[k] + i];
            }
        if (nan) continue;   /* skip_nonfinite: nothing changes, the step count neither */
        t++;
        if (sqrt(sq) > o.max_grad_norm) clip = o.max_grad_norm / (sqrt(sq) + 1e-6);
        for (k = 0; k < NP; k++)
            for (i = 0; i < sizes[k]; i++) {
                size_t j = off[k] + i;
                double g = gavg[j] * clip, wd = k == 1 ? 0 : o.weight_decay;
                m[j] = 0.9 * m[j] + 0.1 * g;
                v[j] = 0.999 * v[j] + 0.001 * g * g;
                p[j] -= o.lr * wd * p[j];
                p[j] -= o.lr / (1 - pow(0.9, t)) * m[j] / (sqrt(v[j]) / sqrt(1 - pow(0.999, t)) + 1e-8);
            }
    }
}

/* Training on `world` ranks against the reference; returns 1 when it ran (res holds it). */
static int check_reference(int world, const char *name) {
    static double p[8192], g[8192];
    size_t i, at = 0, n = 0;
    double worst = 0;
    int k, r, ok, same = 1, rounded = 1, grads = 1, near = 1;
    char full[160];
    snprintf(full, sizeof full, "bf16_params_reference_%s_%d_ranks", name, world);
    if (!run(world)) { verdict(0, full, "training failed"); return 0; }
    reference(world, p, g);
    for (k = 0; k < NP; k++) {
        for (i = 0; i < sizes[k]; i++, n++) {
            double ref = p[n], got = res[0].master[at + i], err = fabs(got - ref) / (1e-6 + 1e-5 * fabs(ref));
            if (err > worst) worst = err;
            if (res[0].work[at + i] != bits_of(res[0].master[at + i])) {
                if (rounded && getenv("DBG")) printf("  k %d i %zu work %04x master %.9g\n", k, i, res[0].work[at + i], res[0].master[at + i]);
                rounded = 0;
            }
            /* the working copy is the rounded reference, or a neighbour where the master is within 1e-5 of a tie */
            if (fabs(float_of(res[0].work[at + i]) - round_bf16(ref)) > 1e-5 * fabs(ref) + 1e-7 &&
                fabs(float_of(res[0].work[at + i]) - ref) > fabs(ref) / 256) near = 0;
            if ((double)float_of(res[0].grad[at + i]) != g[n] && !(g[n] != g[n])) grads = 0;
        }
        at += (sizes[k] + 15) / 16 * 16;   /* the flat layout: parameters on 16-float boundaries */
    }
    for (r = 1; r < world; r++)
        same &= !memcmp(res[r].master, res[0].master, res[0].count * sizeof(float)) &&
                !memcmp(res[r].work, res[0].work, res[0].count * sizeof(ddp_bf16)) &&
                !memcmp(res[r].grad, res[0].grad, res[0].count * sizeof(ddp_bf16));   /* sharded: gathered */
    ok = worst <= 1 && rounded && near && grads && same && (cfg.shard || res[0].copy_ok) && res[0].grads_copy_ok;
    verdict(ok, full, "worst master error %.3g of the bound (1e-6 + 1e-5|ref|), working copy = rounded master %d, "
            "near the reference %d, averaged bf16 gradients exact %d, same bits on every rank %d, host writes followed %d, "
            "gradients read back widened %d", worst, rounded, near, grads, same, res[0].copy_ok, res[0].grads_copy_ok);
    return 1;
}

typedef struct snapshot { size_t count; float *master; ddp_bf16 *work, *grad; float norms[STEPS]; } snapshot;
static void keep(snapshot *s) {
    s->count = res[0].count;
    s->master = res[0].master; s->work = res[0].work; s->grad = res[0].grad;
    memcpy(s->norms, res[0].norms, sizeof s->norms);
    res[0].master = NULL; res[0].work = NULL; res[0].grad = NULL;
}
static int same_bits(const snapshot *a, int grads) {
    return a->count == res[0].count && !memcmp(a->master, res[0].master, a->count * sizeof(float)) &&
           !memcmp(a->work, res[0].work, a->count * sizeof(ddp_bf16)) && !memcmp(a->norms, res[0].norms, sizeof a->norms) &&
           (!grads || !memcmp(a->grad, res[0].grad, a->count * sizeof(ddp_bf16)));
}
static void drop(snapshot *s) { free(s->master); free(s->work); free(s->grad); memset(s, 0, sizeof *s); }

/* One rank's context for the bad-input checks. */
static ddp_context *one_rank_on(ddp_backend backend, ddp_dtype param, ddp_result *r) {
    ddp_desc d;
    ddp_context *ctx = NULL;
    float init[4] = { 1, 2, 3, 4 };
    int id;
    memset(&d, 0, sizeof d);
    d.world_size = 1; d.backend = backend; d.log_level = DDP_LOG_OFF;
    d.param_dtype = param;
    *r = ddp_init(&ctx, &d);
    if (*r == DDP_OK) *r = ddp_register_param(ctx, "w", 4, 0, init, &id);
    if (*r == DDP_OK) *r = ddp_commit(ctx);
    return ctx;
}

static ddp_context *one_rank(ddp_dtype param, ddp_result *r) { return one_rank_on(DDP_BACKEND_SINGLE, param, r); }

/* A write of the working copy alone, then of the master alone: the AdamW pass finds each (the
   NCCL backend one step later, when the device's count reaches the host) and fails by name. */
static void test_diverged(ddp_backend backend, const char *name) {
    ddp_result r, first, second, third;
    ddp_context *ctx;
    ddp_adamw opt = options();
    char e1[DDP__ERR_MAX] = "", e2[DDP__ERR_MAX] = "";
    int late = backend == DDP_BACKEND_NCCL, ok, s;
    fakegpu_reset();
    ctx = one_rank_on(backend, DDP_DTYPE_BF16, &r);
    if (r == DDP_OK) r = ddp_zero_grad(ctx);
    for (s = 0; s < 2 && r == DDP_OK; s++) {   /* clean steps: no error */
        if ((r = ddp_grad_ready(ctx, 0)) == DDP_OK && (r = ddp_finish(ctx)) == DDP_OK) r = ddp_adamw_step(ctx, &opt, NULL);
    }
    if (r != DDP_OK) { verdict(0, name, "clean steps failed: %s", ddp_last_error(ctx)); ddp_shutdown(ctx); return; }
    ddp_param_bf16(ctx, 0)[1] ^= 0x0100;          /* the program writes the working copy only */
    ddp_grad_ready(ctx, 0); ddp_finish(ctx);
    first = ddp_adamw_step(ctx, &opt, NULL);
    snprintf(e1, sizeof e1, "%s", ddp_last_error(ctx));
    ddp_flat_params(ctx, NULL)[2] += 0.5f;        /* ... then the master only */
    ddp_grad_ready(ctx, 0); ddp_finish(ctx);
    second = ddp_adamw_step(ctx, &opt, NULL);
    if (second != DDP_OK) snprintf(e2, sizeof e2, "%s", ddp_last_error(ctx));
    ddp_grad_ready(ctx, 0); ddp_finish(ctx);
    third = ddp_adamw_step(ctx, &opt, NULL);       /* NCCL: the master write's count arrives */
    if (late) { ok = first == DDP_OK && second == DDP_ERR_INVALID_STATE && third == DDP_ERR_INVALID_STATE; snprintf(e1, sizeof e1, "%s", e2); }
    else ok = first == DDP_ERR_INVALID_STATE && second == DDP_ERR_INVALID_STATE && third == DDP_OK && strstr(e1, "'w'");
    ok = ok && strstr(e1, "1 element(s) of the bf16 working copies") && strstr(e1, "ddp_copy_from_host");
    verdict(ok, name, "results %d %d %d: %s", (int)first, (int)second, (int)third, e1);
    ddp_shutdown(ctx);
}

static ddp_result mismatch_r[2];
static char mismatch_err[2][DDP__ERR_MAX];
static void mismatch_rank(test_rank *self) {
    ddp_desc d = test_desc(self);
    ddp_context *ctx = NULL;
    int id;
    d.backend = DDP_BACKEND_CPU;
    d.param_dtype = self->rank == 0 ? DDP_DTYPE_BF16 : DDP_DTYPE_FP32;
    d.reduce_dtype = DDP_DTYPE_FP32;   /* only the parameters' dtype differs */
    mismatch_r[self->rank] = ddp_init(&ctx, &d);
    if (mismatch_r[self->rank] == DDP_OK) mismatch_r[self->rank] = ddp_register_param(ctx, "w", 100, 0, NULL, &id);
    if (mismatch_r[self->rank] == DDP_OK) mismatch_r[self->rank] = ddp_commit(ctx);
    snprintf(mismatch_err[self->rank], sizeof mismatch_err[0], "%s", ddp_last_error(ctx));
    ddp_shutdown(ctx);
}

static void test_bad_input(void) {
    ddp_result r;
    ddp_context *ctx = one_rank(DDP_DTYPE_FP32, &r);
    size_t n = 7;
    int ok;
    void *shared[1] = { (void *)mismatch_rank };
    test_rank ranks[2];
    ddp_desc d;

    ok = r == DDP_OK && ddp_param_bf16(ctx, 0) == NULL && strstr(ddp_last_error(ctx), "ddp_param_bf16") &&
         strstr(ddp_last_error(ctx), "fp32") && ddp_grad_bf16(ctx, 0) == NULL && strstr(ddp_last_error(ctx), "ddp_grad_bf16") &&
         ddp_flat_params_bf16(ctx, &n) == NULL && ddp_flat_grads_bf16(ctx, NULL) == NULL && ddp_param(ctx, 0) != NULL &&
         ddp_config(ctx)->param_dtype == DDP_DTYPE_FP32 && ddp_config(ctx)->reduce_dtype == DDP_DTYPE_FP32;
    verdict(ok, "bf16_accessors_on_fp32_context_refused", "%s", ctx ? ddp_last_error(ctx) : "no context");
    ddp_shutdown(ctx);

    ctx = one_rank(DDP_DTYPE_BF16, &r);
    ok = r == DDP_OK && ddp_param(ctx, 0) == NULL && strstr(ddp_last_error(ctx), "ddp_param") &&
         strstr(ddp_last_error(ctx), "ddp_param_bf16") && ddp_grad(ctx, 0) == NULL && strstr(ddp_last_error(ctx), "ddp_grad_bf16") &&
         ddp_flat_grads(ctx, NULL) == NULL && ddp_flat_params(ctx, NULL) != NULL && ddp_param_bf16(ctx, 0) != NULL &&
         ddp_param_bf16(ctx, 0)[2] == bits_of(3.0f) && ddp_config(ctx)->reduce_dtype == DDP_DTYPE_BF16;
    verdict(ok, "fp32_accessors_on_bf16_context_refused", "%s", ctx ? ddp_last_error(ctx) : "no context");
    ddp_shutdown(ctx);

    test_run_ranks(2, shared, ranks);
    ok = mismatch_r[0] == DDP_ERR_MISMATCH && mismatch_r[1] == DDP_ERR_MISMATCH && strstr(mismatch_err[1], "param_dtype") &&
         strstr(mismatch_err[1], "param bf16") && strstr(mismatch_err[1], "param fp32");
    verdict(ok, "bf16_params_mismatched_param_dtype_refused", "results %d %d: %s", (int)mismatch_r[0], (int)mismatch_r[1], mismatch_err[1]);

    setenv("DDP_PARAM_DTYPE", "fp16", 1);
    ctx = one_rank(DDP_DTYPE_DEFAULT, &r);
    ok = r == DDP_ERR_BAD_ENV && strstr(ddp_last_error(ctx), "DDP_PARAM_DTYPE='fp16'");
    verdict(ok, "bf16_params_bad_env_refused", "result %d: %s", (int)r, ddp_last_error(ctx));
    ddp_shutdown(ctx);
    setenv("DDP_PARAM_DTYPE", "bf16", 1);
    ctx = one_rank(DDP_DTYPE_DEFAULT, &r);
    ok = r == DDP_OK && ddp_config(ctx)->param_dtype == DDP_DTYPE_BF16 && ddp_param_bf16(ctx, 0) != NULL;
    verdict(ok, "bf16_params_from_env", "result %d: %s", (int)r, ddp_last_error(ctx));
    ddp_shutdown(ctx);
    unsetenv("DDP_PARAM_DTYPE");

    test_diverged(DDP_BACKEND_SINGLE, "bf16_params_lone_write_of_working_copy_or_master_named_cpu");
    test_diverged(DDP_BACKEND_NCCL, "bf16_params_lone_write_of_working_copy_or_master_named_nccl_fake");

    memset(&d, 0, sizeof d);
    d.world_size = 1; d.backend = DDP_BACKEND_SINGLE; d.log_level = DDP_LOG_OFF; d.param_dtype = (ddp_dtype)7;
    ctx = NULL;
    r = ddp_init(&ctx, &d);
    ok = r == DDP_ERR_INVALID_ARGUMENT && strstr(ddp_last_error(ctx), "param_dtype 7");
    verdict(ok, "bf16_params_bad_dtype_refused", "result %d: %s", (int)r, ddp_last_error(ctx));
    ddp_shutdown(ctx);
}

static size_t unsharded_bytes[MAX_WORLD];

/* Uneven inputs with bf16 parameters: rank r has join_batches[r] steps, then ddp_join. Rank 0
   (the most batches) checks each step's averaged bf16 gradients against the host's arithmetic:
   the ranks with data added in float in rank order (a joined rank's zeros change nothing), / world,
   rounded; DIVIDE_BY_ACTIVE: times world / active, rounded again. After the last join every rank
   holds the same master and working copies. */
#define JOIN_N 300
static struct { ddp_backend backend; ddp_join_mode mode; int batches[MAX_WORLD]; } join_cfg;
static struct { ddp_result r; char err[DDP__ERR_MAX]; int wrong; float master[JOIN_N + 16]; ddp_bf16 work[JOIN_N + 16]; } join_res[MAX_WORLD];

static float join_grad(int t, int r, size_t i) { return (float)round_bf16(0.25 * test_value((uint64_t)(900 + t * 8 + r), i)); }

static void join_rank(test_rank *self) {
    ddp_desc d = test_desc(self);
    ddp_context *ctx = NULL;
    ddp_adamw opt = options();
    float init[JOIN_N];
    int id, t, s, active;
    size_t i, n = 0;
    __typeof__(join_res[0]) *o = &join_res[self->rank];
    d.backend = join_cfg.backend;
    d.param_dtype = DDP_DTYPE_BF16;
    d.uneven_inputs = join_cfg.mode;
    for (i = 0; i < JOIN_N; i++) init[i] = init_value(0, i);
    o->r = ddp_init(&ctx, &d);
    if (o->r == DDP_OK) o->r = ddp_register_param(ctx, "w", JOIN_N, 0, init, &id);
    if (o->r == DDP_OK) o->r = ddp_commit(ctx);
    for (t = 0; t < join_cfg.batches[self->rank] && o->r == DDP_OK; t++) {
        ddp_bf16 *g;
        if ((o->r = ddp_zero_grad(ctx)) != DDP_OK) break;
        g = ddp_grad_bf16(ctx, id);
        for (i = 0; i < JOIN_N; i++) g[i] = bits_of(join_grad(t, self->rank, i));
        if ((o->r = ddp_grad_ready(ctx, id)) != DDP_OK || (o->r = ddp_finish(ctx)) != DDP_OK) break;
        if (self->rank == 0) {   /* the expected average of this step */
            for (active = 0, s = 0; s < self->world; s++) active += t < join_cfg.batches[s];
            for (i = 0; i < JOIN_N; i++) {
                float sum = 0, avg;
                for (s = 0; s < self->world; s++) sum += t < join_cfg.batches[s] ? join_grad(t, s, i) : 0.0f;
                avg = float_of(bits_of(sum / (float)self->world));
                if (join_cfg.mode == DDP_JOIN_DIVIDE_BY_ACTIVE && active < self->world)
                    avg = float_of(bits_of(avg * (float)((double)self->world / active)));
                o->wrong += g[i] != bits_of(avg);
            }
        }
        o->r = ddp_adamw_step(ctx, &opt, NULL);
    }
    if (o->r == DDP_OK) o->r = ddp_join(ctx);
    if (o->r == DDP_OK) o->r = ddp_copy_to_host(ctx, DDP_PARAMS, 0, o->master, JOIN_N);
    if (o->r == DDP_OK) {
        const ddp_bf16 *w = ddp_flat_params_bf16(ctx, &n);
        memcpy(o->work, w, JOIN_N * sizeof(ddp_bf16));
    }
    if (o->r != DDP_OK && ctx) snprintf(o->err, sizeof o->err, "%s", ddp_last_error(ctx));
    ddp_shutdown(ctx);
}

static void test_join(int world, ddp_join_mode mode) {
    void *shared[1] = { (void *)join_rank };
    test_rank ranks[MAX_WORLD];
    static float cpu_master[JOIN_N];
    char name[128];
    size_t i;
    int b, r, ok, same = 1;
    for (b = 0; b < 2; b++) {
        memset(join_res, 0, sizeof join_res);
        join_cfg.backend = b ? DDP_BACKEND_NCCL : DDP_BACKEND_CPU;
        join_cfg.mode = mode;
        join_cfg.batches[0] = 5; join_cfg.batches[1] = 2; join_cfg.batches[2] = 3;
        fakegpu_reset();
        test_run_ranks(world, shared, ranks);
        ok = 1;
        for (r = 0; r < world; r++) {
            ok &= join_res[r].r == DDP_OK && !memcmp(join_res[r].master, join_res[0].master, sizeof join_res[0].master) &&
                  !memcmp(join_res[r].work, join_res[0].work, sizeof join_res[0].work);
            for (i = 0; i < JOIN_N; i++) ok &= join_res[r].work[i] == bits_of(join_res[r].master[i]);
        }
        if (b == 0) memcpy(cpu_master, join_res[0].master, sizeof cpu_master);
        else same = !memcmp(cpu_master, join_res[0].master, sizeof cpu_master);
        snprintf(name, sizeof name, "bf16_params_uneven_inputs_%s_%s_%d_ranks", b ? "nccl_fake" : "cpu",
                 mode == DDP_JOIN_DIVIDE_BY_ACTIVE ? "divide_by_active" : "divide_by_world", world);
        verdict(ok && join_res[0].wrong == 0 && same, name, "%d averaged bf16 gradients differ from the host's arithmetic, "
                "ranks agree and working copies = master rounded %d, NCCL = CPU %d (%s)", join_res[0].wrong, ok, same,
                join_res[0].err[0] ? join_res[0].err : join_res[world - 1].err);
    }
}

/* What one rank of a 1M-parameter bf16 model allocates: ddp.h's heap (through DDP_MALLOC, all
   ranks together: divided by the world), the CPU backend's gradient segment (its share), the
   fake GPU's device memory; measured after a first AdamW step (m and v exist from then on). */
static struct { ddp_backend backend; ddp_dtype reduce; } bytes_cfg;
static struct { ddp_result r; char err[DDP__ERR_MAX]; size_t count, largest, segment, device; int no_fp32; } bytes_res[2];
static size_t heap_before;
static pthread_barrier_t bytes_barrier;
#define BYTES_N ((size_t)1 << 19)

static void bytes_rank(test_rank *self) {
    ddp_desc d = test_desc(self);
    ddp_context *ctx = NULL;
    ddp_adamw opt = options();
    ddp_bucket_info b;
    int ids[2], k;
    __typeof__(bytes_res[0]) *o = &bytes_res[self->rank];
    d.backend = self->world == 1 && bytes_cfg.backend == DDP_BACKEND_CPU ? DDP_BACKEND_SINGLE : bytes_cfg.backend;
    d.param_dtype = DDP_DTYPE_BF16;
    d.reduce_dtype = bytes_cfg.reduce;
    o->r = ddp_init(&ctx, &d);
    for (k = 0; k < 2 && o->r == DDP_OK; k++) o->r = ddp_register_param(ctx, k ? "b" : "a", BYTES_N, 0, NULL, &ids[k]);
    if (o->r == DDP_OK) o->r = ddp_commit(ctx);
    if (o->r == DDP_OK) o->r = ddp_zero_grad(ctx);
    for (k = 1; k >= 0 && o->r == DDP_OK; k--) o->r = ddp_grad_ready(ctx, ids[k]);
    if (o->r == DDP_OK) o->r = ddp_finish(ctx);
    if (o->r == DDP_OK) o->r = ddp_adamw_step(ctx, &opt, NULL);
    if (o->r == DDP_OK) {
        ddp_flat_params_bf16(ctx, &o->count);
        for (k = 0; k < ddp_num_buckets(ctx) && ddp_bucket(ctx, k, &b) == DDP_OK; k++) if (b.count > o->largest) o->largest = b.count;
        o->segment = ctx->be->id == DDP_BACKEND_CPU && ctx->impl.cpu->grads_shm ? ctx->impl.cpu->grads_shm_bytes / (size_t)self->world : 0;
        o->no_fp32 = ctx->flat.grads == NULL;
        if (bytes_cfg.backend == DDP_BACKEND_NCCL) {
            int dev = -1;
            if (cudaGetDevice(&dev) == cudaSuccess) o->device = fakegpu_device_bytes(dev);
        }
    }
    pthread_barrier_wait(&bytes_barrier);   /* every rank's allocations are made: the heap is read once, by rank 0 */
    if (self->rank == 0) heap_before = __atomic_load_n(&heap_live, __ATOMIC_SEQ_CST) - heap_before;
    pthread_barrier_wait(&bytes_barrier);
    if (o->r != DDP_OK && ctx) snprintf(o->err, sizeof o->err, "%s", ddp_last_error(ctx));
    ddp_shutdown(ctx);
}

static void test_bytes_per_parameter(ddp_backend backend, ddp_dtype reduce, int world) {
    void *shared[1] = { (void *)bytes_rank };
    test_rank ranks[2];
    char name[128];
    double per, extra;
    int ok;
    memset(bytes_res, 0, sizeof bytes_res);
    bytes_cfg.backend = backend; bytes_cfg.reduce = reduce;
    fakegpu_reset();
    heap_before = __atomic_load_n(&heap_live, __ATOMIC_SEQ_CST);
    pthread_barrier_init(&bytes_barrier, NULL, (unsigned)world);
    test_run_ranks(world, shared, ranks);
    pthread_barrier_destroy(&bytes_barrier);
    snprintf(name, sizeof name, "bf16_params_16_bytes_per_parameter_%s_%s_reduce_%d_ranks",
             backend == DDP_BACKEND_NCCL ? "nccl_fake" : "cpu", reduce == DDP_DTYPE_FP32 ? "fp32" : "bf16", world);
    if (bytes_res[0].r != DDP_OK || (world > 1 && bytes_res[1].r != DDP_OK)) {
        verdict(0, name, "%s / %s", bytes_res[0].err, bytes_res[1].err);
        return;
    }
    /* heap_before now holds what the ranks' contexts allocated, all ranks together */
    if (backend == DDP_BACKEND_NCCL) {
        /* device memory: master 4 + working copy 2 + gradient 2 + m, v 8; fp32 reduce on several ranks:
           one bucket's floats to reduce in (the largest bucket), not a whole model's */
        extra = reduce == DDP_DTYPE_FP32 && world > 1 ? 4.0 * (double)bytes_res[0].largest : 0;
        per = ((double)bytes_res[0].device - extra) / (double)bytes_res[0].count;
        ok = per >= 16 && per < 16.01 && bytes_res[0].no_fp32;
        verdict(ok, name, "%.4f device bytes a parameter besides %.0f bytes of one bucket (want 16, the fp32 staging made it 20), "
                "no fp32 gradients %d", per, extra, bytes_res[0].no_fp32);
    } else {
        /* ddp.h's heap (master, working copy, m, v; one rank: the gradients too) and the segment's share; a
           context's fixed ~20 KB (the norm's block sums, the tape, the store's buffers) is under 0.05 B a parameter */
        per = ((double)heap_before / world + (double)bytes_res[0].segment) / (double)bytes_res[0].count;
        ok = per >= 16 && per < 16.05 && bytes_res[0].no_fp32 && (world == 1 || bytes_res[0].segment >= 2 * bytes_res[0].count);
        verdict(ok, name, "%.4f bytes a parameter (heap %zu of all ranks, segment %zu a rank; want 16, the fp32 staging made "
                "it 20), no fp32 gradients %d", per, heap_before, bytes_res[0].segment, bytes_res[0].no_fp32);
    }
}

/* After a sharded run: every rank holds the master of its parts only (its allocation's size, by
   the manual's rule), and its refused host copies were named. */
static void held_and_refusals(const char *backend, int k, int world) {
    char name[128];
    int r, ok = 1, refused = 1;
    size_t all = 0;
    for (r = 0; r < world; r++) { ok &= res[r].held == res[r].held_want; all += res[r].held; }
    ok &= all == res[0].count;   /* each float's master on exactly one rank */
    snprintf(name, sizeof name, "bf16_params_sharded_master_held_in_parts_%s_%s_reduce_%d_ranks", backend, k ? "fp32" : "bf16", world);
    verdict(world == 1 ? res[0].held == res[0].count : ok, name, "rank 0 holds %zu floats of the master, its parts are %zu of %zu",
            res[0].held, res[0].held_want, res[0].count);
    if (world == 1) return;
    for (r = 0; r < world; r++) refused &= res[r].refused_ok;
    snprintf(name, sizeof name, "bf16_params_sharded_host_copies_refused_by_name_%s_%s_reduce_%d_ranks", backend, k ? "fp32" : "bf16", world);
    verdict(refused, name, "rank %d: %s", world - 1, res[world - 1].refused);
}

/* A checkpoint saved by `save_world` ranks (sharded or not) loads on `load_world` ranks (sharded
   or not): every rank holds the saved master bit for bit, and its rounding as working copies. */
static void checkpoint_across(ddp_backend save_be, int save_world, int save_shard, ddp_backend load_be, int load_world,
                              int load_shard, const char *path) {
    char name[160];
    snapshot saved;
    int ok, r;
    size_t i;
    memset(&cfg, 0, sizeof cfg);
    cfg.backend = save_be; cfg.reduce = DDP_DTYPE_BF16; cfg.micro = 1; cfg.shard = save_shard; cfg.ckpt = path;
    snprintf(name, sizeof name, "bf16_params_checkpoint_%s_%s_%d_ranks_loads_on_%s_%s_%d_ranks",
             save_be == DDP_BACKEND_NCCL ? "nccl_fake" : "cpu", save_shard ? "sharded" : "unsharded", save_world,
             load_be == DDP_BACKEND_NCCL ? "nccl_fake" : "cpu", load_shard ? "sharded" : "unsharded", load_world);
    if (!run(save_world) || !res[0].load_ok) { verdict(0, name, "the saving run failed"); unlink(path); return; }
    keep(&saved);
    cfg.backend = load_be; cfg.shard = load_shard; cfg.load_shard = load_shard;
    ok = run_fn(load_world, load_rank);
    for (r = 0; ok && r < load_world; r++) {
        ok = res[r].count == saved.count && !memcmp(res[r].master, saved.master, saved.count * sizeof(float));
        for (i = 0; ok && i < saved.count; i++) ok = res[r].work[i] == bits_of(saved.master[i]);
    }
    verdict(ok, name, "a rank's loaded master or working copies differ from the saved ones");
    drop(&saved);
    unlink(path);
}

int main(void) {
    static const ddp_dtype reduces[2] = { DDP_DTYPE_BF16, DDP_DTYPE_FP32 };
    char name[128], path[128];
    int world, k, shard;
    test_bad_input();
    for (k = 0; k < 2; k++)
        for (world = 1; world <= 2; world++) {
            test_bytes_per_parameter(DDP_BACKEND_CPU, reduces[k], world);
            test_bytes_per_parameter(DDP_BACKEND_NCCL, reduces[k], world);
        }

    /* the reference, CPU backend; then the NCCL backend (fake GPU) against the CPU bits */
    for (k = 0; k < 2; k++)
        for (world = 1; world <= MAX_WORLD; world++) {
            snapshot cpu, cpu_unsharded;
            memset(&cfg, 0, sizeof cfg);
            cfg.backend = DDP_BACKEND_CPU; cfg.reduce = reduces[k]; cfg.micro = 1;
            snprintf(name, sizeof name, "%s_reduce", k ? "fp32" : "bf16");
            if (!check_reference(world, name)) continue;
            keep(&cpu_unsharded);
            for (shard = 0; shard < 2; shard++) {
                const snapshot *want = &cpu_unsharded;
                int ok, r;
                cfg.shard = shard;
                memset(&cpu, 0, sizeof cpu);
                if (shard) {   /* sharded CPU: the same bits as unsharded (sharded, the gradients outside a rank's part are not averaged) */
                    cfg.backend = DDP_BACKEND_CPU;
                    ok = run(world) && same_bits(&cpu_unsharded, 1) && res[0].grads_copy_ok;   /* gradients: gathered */
                    snprintf(name, sizeof name, "bf16_params_sharded_cpu_equals_unsharded_%s_reduce_%d_ranks", k ? "fp32" : "bf16", world);
                    verdict(ok, name, "master, working copies or norms differ");
                    if (ok) held_and_refusals("cpu", k, world);
                    keep(&cpu);
                    want = &cpu;
                }
                cfg.backend = DDP_BACKEND_NCCL;
                ok = run(world) && same_bits(want, 1) && res[0].grads_copy_ok;
                snprintf(name, sizeof name, "bf16_params_nccl_fake_equals_cpu_%s_reduce_%s_%d_ranks", k ? "fp32" : "bf16",
                         shard ? "sharded" : "unsharded", world);
                verdict(ok, name, "master, working copies, bf16 gradients or norms differ from the CPU backend's");
                if (ok && !shard) for (r = 0; r < world; r++) unsharded_bytes[r] = res[r].device_bytes;
                if (ok && shard) {   /* the master, m and v in parts: 12 bytes less per float not held */
                    held_and_refusals("nccl_fake", k, world);
                    ok = 1;
                    for (r = 0; r < world; r++)   /* a rank with no part still allocates one float of each */
                        ok &= unsharded_bytes[r] - res[r].device_bytes == 12 * (res[r].count - (res[r].held_want ? res[r].held_want : 1));
                    snprintf(name, sizeof name, "bf16_params_sharded_device_bytes_per_rank_%s_reduce_%d_ranks", k ? "fp32" : "bf16", world);
                    verdict(ok, name, "rank 0 holds %zu bytes sharded, %zu unsharded; it should save 12 x %zu",
                            res[0].device_bytes, unsharded_bytes[0], res[0].count - res[0].held_want);
                }
                drop(&cpu);
                cfg.backend = DDP_BACKEND_CPU;
            }
            drop(&cpu_unsharded);
        }

    /* accumulation, find_unused, skip_nonfinite, the timeline: against the reference, both backends alike */
    for (world = 2; world <= MAX_WORLD; world++) {
        snapshot cpu;
        int ok;
        memset(&cfg, 0, sizeof cfg);
        cfg.backend = DDP_BACKEND_CPU; cfg.reduce = DDP_DTYPE_BF16; cfg.micro = 2; cfg.find_unused = 1;
        cfg.nan_step = NAN_STEP; cfg.timeline = world == 2;
        if (!check_reference(world, "accumulation_find_unused_skip_nonfinite")) continue;
        keep(&cpu);
        cfg.backend = DDP_BACKEND_NCCL; cfg.timeline = 0;
        ok = run(world) && same_bits(&cpu, 1);
        snprintf(name, sizeof name, "bf16_params_nccl_fake_equals_cpu_accumulation_find_unused_skip_nonfinite_%d_ranks", world);
        verdict(ok, name, "the NCCL backend's bits differ from the CPU backend's");
        drop(&cpu);
    }
    for (world = 2; world <= MAX_WORLD; world++) {
        test_join(world, DDP_JOIN_DIVIDE_BY_ACTIVE);
        test_join(world, DDP_JOIN_DIVIDE_BY_WORLD);
    }

    /* the staging-slot path (DDP_STAGED_GRADS=1: no gradient segment) gives the in-place bits */
    for (world = 2; world <= MAX_WORLD; world++)
        for (k = 0; k < 2; k++)
            for (shard = 0; shard < 2; shard++) {
                snapshot in_place;
                int ok, seg;
                memset(&cfg, 0, sizeof cfg);
                cfg.backend = DDP_BACKEND_CPU; cfg.reduce = reduces[k]; cfg.micro = 1; cfg.shard = shard;
                snprintf(name, sizeof name, "bf16_params_staged_grads_equals_in_place_%s_reduce_%s_%d_ranks", k ? "fp32" : "bf16",
                         shard ? "sharded" : "unsharded", world);
                if (!run(world)) { verdict(0, name, "the in-place run failed"); continue; }
                seg = res[0].in_segment && res[0].no_fp32_grads;
                keep(&in_place);
                setenv("DDP_STAGED_GRADS", "1", 1);
                ok = run(world) && same_bits(&in_place, 1);   /* sharded: the gradients gathered */
                unsetenv("DDP_STAGED_GRADS");
                verdict(ok && seg && !res[0].in_segment && res[0].no_fp32_grads, name, "same bits %d, in-place run in the "
                        "segment %d, staged run in it %d, no fp32 gradients %d", ok, seg, res[0].in_segment, res[0].no_fp32_grads);
                drop(&in_place);
            }
    {
        char tl[128];
        FILE *f;
        long size = 0;
        snprintf(tl, sizeof tl, "/tmp/ddp_bf16_tl_%d.json", (int)getpid());
        if ((f = fopen(tl, "rb")) != NULL) { fseek(f, 0, SEEK_END); size = ftell(f); fclose(f); }
        verdict(size > 100, "bf16_params_timeline_written", "%s: %ld bytes", tl, size);
        unlink(tl);
    }

    /* checkpoints: the master saved and loaded, the working copies its rounding; both backends, sharded too */
    snprintf(path, sizeof path, "/tmp/ddp_bf16_ckpt_%d.bin", (int)getpid());
    for (k = 0; k < 3; k++) {
        int r, ok = 1;
        memset(&cfg, 0, sizeof cfg);
        cfg.backend = k == 1 ? DDP_BACKEND_NCCL : DDP_BACKEND_CPU; cfg.reduce = DDP_DTYPE_FP32; cfg.micro = 1;
        cfg.shard = k == 2; cfg.ckpt = path;
        ok = run(2);
        for (r = 0; r < 2; r++) ok &= res[r].load_ok;
        snprintf(name, sizeof name, "bf16_params_checkpoint_roundtrip_%s%s", k == 1 ? "nccl_fake" : "cpu", k == 2 ? "_sharded" : "");
        verdict(ok, name, "the loaded master or working copies differ (rank 0 %d, rank 1 %d)", res[0].load_ok, res[1].load_ok);
        unlink(path);
    }
    checkpoint_across(DDP_BACKEND_CPU, 3, 1, DDP_BACKEND_CPU, 2, 0, path);
    checkpoint_across(DDP_BACKEND_CPU, 3, 1, DDP_BACKEND_CPU, 2, 1, path);
    checkpoint_across(DDP_BACKEND_CPU, 2, 1, DDP_BACKEND_CPU, 1, 0, path);
    checkpoint_across(DDP_BACKEND_CPU, 2, 0, DDP_BACKEND_CPU, 3, 1, path);
    checkpoint_across(DDP_BACKEND_NCCL, 2, 1, DDP_BACKEND_CPU, 3, 1, path);
    checkpoint_across(DDP_BACKEND_CPU, 3, 1, DDP_BACKEND_NCCL, 2, 1, path);
    for (k = 0; k < MAX_WORLD; k++) { free(res[k].master); free(res[k].work); free(res[k].grad); }
    verdict(fakegpu_misuse_count() == 0 && fakegpu_live_device_bytes() == 0, "bf16_params_fake_gpu_no_misuse_no_leak",
            "%d misuse(s) of the CUDA/NCCL API (first: %s), %zu bytes of device memory left", fakegpu_misuse_count(),
            fakegpu_misuse_first(), fakegpu_live_device_bytes());
    return test_summary("test_bf16_params");
}
