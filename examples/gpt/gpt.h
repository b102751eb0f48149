/* gpt.h — a byte-level GPT-2-style decoder whose every op records its backward on the ddp.h tape.

   Token + learned position embeddings, pre-LayerNorm blocks (causal multi-head self-attention,
   GELU-tanh MLP of 4x width), a final LayerNorm, and an output head tied to the token embedding.
   Dropout (gpt_set_dropout; off by default) where nanoGPT puts it: on the embedding sum, the
   attention probabilities, and each residual branch before it joins the stream. CPU math: matmuls through OpenBLAS (cblas_sgemm), or a portable blocked fallback
   when built with -DGPT_NO_BLAS; the other kernels are plain loops written to vectorize.

   Include after ddp.h (the file that defines DDP_IMPLEMENTATION includes ddp.h first).
   Used by examples/gpt/train_gpt.c and tests/test_gpt.c.

   Gradient flow: one residual-gradient buffer (dres) serves the whole residual stream. The
   final LayerNorm's backward writes it; every block's LayerNorm backward adds its branch into
   it; the residual projections read it. So the residual additions need no backward op at all.
   The tied embedding: the head's backward adds into grad(wte), the embedding op's backward (the
   last one replayed) adds the rest and is the op that finishes wte.

   Dropout masks are never stored: a unit is kept when a counter-based hash of (dropout seed,
   optimizer step, the sample's position in the step's GLOBAL batch, site, element) clears the
   threshold, and the backward draws the same mask again. A sample's mask so depends only on
   where it sits in the global batch: N ranks (each told where its rows sit, gpt_set_rows) drop
   exactly what 1 rank drops at N times the batch, and the CUDA model (gpt_cuda.cuh) draws the
   same bits. */
#ifndef GPT_H
#define GPT_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef GPT_NO_BLAS
#include <cblas.h>
#include <unistd.h>   /* sysconf: the CPUs OpenBLAS may use */
void openblas_set_num_threads(int num_threads);
#endif

/* C99's restrict; nvcc and g++ (gpt_cuda.cuh's builds compile this file as C++) spell it __restrict__. */
#ifdef __cplusplus
#define GPT_RESTRICT __restrict__
#else
#define GPT_RESTRICT restrict
#endif
/* The dropout hash runs on the host and, in gpt_cuda.cuh's kernels, on the device. */
#ifdef __CUDACC__
#define GPT_HD __host__ __device__
#else
#define GPT_HD
#endif

enum { GPT_VOCAB = 256, GPT_LANES = 16 };

typedef struct gpt_config {
    int layers, heads, dim, seq;   /* seq: the context length (max T) */
    int batch;                     /* the largest micro-batch a forward will see */
} gpt_config;

/* Parameter ids, in registration (= forward) order. */
typedef struct gpt_layer_ids {
    int ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
} gpt_layer_ids;

/* One block's saved activations. */
typedef struct gpt_layer_acts {
    float *res_in;                 /* [BT, C] block input (residual stream) */
    float *ln1, *ln1_mean, *ln1_rstd;
    float *qkv;                    /* [BT, 3C] */
    float *att;                    /* [B, NH, T, T] softmax probabilities (0 above the diagonal) */
    float *att_out;                /* [BT, C] heads merged */
    float *res_mid;                /* [BT, C] res_in + attention branch */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fc;                     /* [BT, 4C] before GELU */
    float *gelu;                   /* [BT, 4C] */
    float *gelu_s;                 /* [BT, 4C] sigmoid(2u), saved for the backward */
    float *res_out;                /* [BT, C] = next block's res_in */
} gpt_layer_acts;

typedef struct gpt {
    gpt_config cfg;
    ddp_context *ddp;
    int wte, wpe, lnfw, lnfb;
    int units;                     /* units declared (sharded parameters): unit 0 the embeddings, 1..L the
                                      blocks, L + 1 the final LayerNorm; the forward gathers and releases them */
    gpt_layer_ids *layer;
    gpt_layer_acts *acts;
    float *res0, *lnf, *lnf_mean, *lnf_rstd, *logits;
    /* gradient scratch, reused by every layer (backward runs one op at a time) */
    float *dres, *dln, *dqkv, *datt_out, *dfc, *dgelu, *dlogits, *datt_row;
    int *tokens, *targets;         /* this forward's batch */
    int B, T;                      /* this forward's shape */
    /* dropout: p, its threshold and scale (gpt_set_dropout); where this forward's rows sit in
       the step's global batch (gpt_set_rows); the masked branch gradient and dropped
       probabilities (scratch) */
    float drop_p, drop_scale;
    uint32_t drop_threshold;
    uint64_t drop_seed, drop_step, drop_row0, drop_stride;
    int dropping;                  /* this forward trains with dropout on */
    float *ddrop, *patt;
    void *arena;
    size_t num_floats;             /* total parameters */
} gpt;

/* ---------------------------------------------------------------------------------------------
   Small vectorizable helpers. Reductions keep GPT_LANES partial sums so the compiler vectorizes
   them without -ffast-math; the final fold is in a fixed order (deterministic).
   --------------------------------------------------------------------------------------------- */
static inline float gpt__sum(const float *x, int n) {
    float acc[GPT_LANES] = {0}, s = 0;
    int i = 0, j;
    for (; i + GPT_LANES <= n; i += GPT_LANES)
        for (j = 0; j < GPT_LANES; j++) acc[j] += x[i + j];
    for (; i < n; i++) s += x[i];
    for (j = 0; j < GPT_LANES; j++) s += acc[j];
    return s;
}

static inline float gpt__dot(const float *x, const float *y, int n) {
    float acc[GPT_LANES] = {0}, s = 0;
    int i = 0, j;
    for (; i + GPT_LANES <= n; i += GPT_LANES)
        for (j = 0; j < GPT_LANES; j++) acc[j] += x[i + j] * y[i + j];
    for (; i < n; i++) s += x[i] * y[i];
    for (j = 0; j < GPT_LANES; j++) s += acc[j];
    return s;
}

static inline float gpt__max(const float *x, int n) {
    float acc[GPT_LANES], m = x[0];
    int i = 0, j;
    for (j = 0; j < GPT_LANES; j++) acc[j] = x[0];
    for (; i + GPT_LANES <= n; i += GPT_LANES)
        for (j = 0; j < GPT_LANES; j++) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    for (j = 0; j < GPT_LANES; j++) m = acc[j] > m ? acc[j] : m;
    return m;
}

/* exp(x) to ~1 ulp on [-80, 80] (inputs are clamped there: no overflow, no denormals), in
   straight-line code the compiler vectorizes: 2^n * e^r with |r| <= ln2/2, degree-7 Taylor. */
static inline float gpt__exp(float x) {
    float t, n, r, p, scale;
    int32_t i;
    uint32_t bits;
    x = x < -80.0f ? -80.0f : x;
    x = x > 80.0f ? 80.0f : x;
    t = x * 1.44269504088896341f + 12582912.0f;     /* round to nearest via 1.5 * 2^23 */
    n = t - 12582912.0f;
    r = x - n * 0.693145751953125f;                  /* ln2 split in two for accuracy */
    r = r - n * 1.428606765330187e-06f;
    p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720 + r * (1.0f / 5040)))))));
    i = (int32_t)n;
    bits = (uint32_t)(i + 127) << 23;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* ---------------------------------------------------------------------------------------------
   Matmul: C = alpha * op(A) op(B) + beta * C, row-major, op = transpose when ta/tb.
   --------------------------------------------------------------------------------------------- */
#ifdef GPT_NO_BLAS
/* Portable fallback. Per block of KB values of k: B is packed as a KB x N row-major panel
   (transposed when tb), A as panels of 4 rows (k-major); a 4 x 16 tile of C then accumulates in
   local arrays the compiler keeps in vector registers, and is added to C once per k-block. */
enum { GPT__KB = 256, GPT__MR = 4, GPT__NR = 16 };
static void gpt_gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc) {
    float *panel = (float *)malloc(sizeof(float) * ((size_t)GPT__KB * (size_t)(N + GPT__NR) + (size_t)GPT__KB * GPT__MR));
    float *apack = panel + (size_t)GPT__KB * (size_t)(N + GPT__NR);
    int i, j, k, k0, r, jj;
    if (!panel) { fprintf(stderr, "gpt_gemm: out of memory\n"); exit(1); }
    for (i = 0; i < M; i++) {
        float *c = C + (size_t)i * ldc;
        if (beta == 0.0f) for (j = 0; j < N; j++) c[j] = 0.0f;
        else if (beta != 1.0f) for (j = 0; j < N; j++) c[j] *= beta;
    }
    for (k0 = 0; k0 < K; k0 += GPT__KB) {
        int kn = K - k0 < GPT__KB ? K - k0 : GPT__KB, np = (N + GPT__NR - 1) / GPT__NR * GPT__NR;
        for (k = 0; k < kn; k++) {   /* panel row k: B(k0+k, 0..N), zero-padded to np */
            float *p = panel + (size_t)k * np;
            if (tb) for (j = 0; j < N; j++) p[j] = B[(size_t)j * ldb + k0 + k];
            else memcpy(p, B + (size_t)(k0 + k) * ldb, sizeof(float) * (size_t)N);
            for (j = N; j < np; j++) p[j] = 0.0f;
        }
        for (i = 0; i < M; i += GPT__MR) {
            int mr = M - i < GPT__MR ? M - i : GPT__MR;
            for (k = 0; k < kn; k++)   /* apack[k][r] = alpha * A(i+r, k0+k), zero rows past M */
                for (r = 0; r < GPT__MR; r++)
                    apack[k * GPT__MR + r] = r >= mr ? 0.0f : alpha * (ta ? A[(size_t)(k0 + k) * lda + i + r] : A[(size_t)(i + r) * lda + k0 + k]);
            for (j = 0; j < np; j += GPT__NR) {
                float c0[GPT__NR], c1[GPT__NR], c2[GPT__NR], c3[GPT__NR], *rows[GPT__MR];
                int nr = N - j < GPT__NR ? N - j : GPT__NR;
                for (jj = 0; jj < GPT__NR; jj++) c0[jj] = c1[jj] = c2[jj] = c3[jj] = 0.0f;
                for (k = 0; k < kn; k++) {
                    const float *p = panel + (size_t)k * np + j, *a = apack + k * GPT__MR;
                    float a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
                    for (jj = 0; jj < GPT__NR; jj++) {
                        c0[jj] += a0 * p[jj]; c1[jj] += a1 * p[jj]; c2[jj] += a2 * p[jj]; c3[jj] += a3 * p[jj];
                    }
                }
                rows[0] = c0; rows[1] = c1; rows[2] = c2; rows[3] = c3;
                for (r = 0; r < mr; r++) {
                    float *c = C + (size_t)(i + r) * ldc + j;
                    for (jj = 0; jj < nr; jj++) c[jj] += rows[r][jj];
                }
            }
        }
    }
    free(panel);
}
static void gpt_blas_init(int ranks_on_host) { (void)ranks_on_host; }
static inline const char *gpt_blas_name(void) { return "portable fallback (GPT_NO_BLAS)"; }
#else
static void gpt_gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
/* OpenBLAS's threads: OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS, when set (ddprun sets each
   rank's share of the CPUs), else this host's CPUs shared among the ranks on it. One rank alone
   on a 2-core machine then uses both cores for its matmuls; N ranks on N cores one each, so the
   ranks are the parallelism and OpenBLAS's idle workers do not compete with them. */
static int gpt__blas_threads = 1;
static void gpt_blas_init(int ranks_on_host) {
    const char *e = getenv("OPENBLAS_NUM_THREADS");
    long cpus = sysconf(_SC_NPROCESSORS_ONLN), n;
    if (!e || atoi(e) <= 0) e = getenv("OMP_NUM_THREADS");
    n = e && atoi(e) > 0 ? atoi(e) : cpus / (ranks_on_host > 0 ? ranks_on_host : 1);
    gpt__blas_threads = n < 1 ? 1 : (int)n;
    openblas_set_num_threads(gpt__blas_threads);
}
static inline const char *gpt_blas_name(void) {
    static char name[48];
    snprintf(name, sizeof name, "OpenBLAS, %d thread%s", gpt__blas_threads, gpt__blas_threads == 1 ? "" : "s");
    return name;
}
#endif

/* ---------------------------------------------------------------------------------------------
   Dropout masks: a counter-based hash, so a mask costs no memory and the backward redraws it.
   --------------------------------------------------------------------------------------------- */
GPT_HD static inline uint64_t gpt__mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Sites: the embedding, then per layer the attention probabilities and the two residual branches. */
enum { GPT_DROP_EMBED = 0 };
#define GPT_DROP_ATT(l) (1u + 3u * (uint32_t)(l))
#define GPT_DROP_ATTN_RESID(l) (2u + 3u * (uint32_t)(l))
#define GPT_DROP_MLP_RESID(l) (3u + 3u * (uint32_t)(l))

/* The key of one sample's mask at one site; element i is kept when gpt__drop_keep says so. */
GPT_HD static inline uint64_t gpt__drop_key(uint64_t seed, uint64_t step, uint64_t row, uint32_t site) {
    return gpt__mix(gpt__mix(seed ^ 0xd6e8feb86659fd93ull) + step * 0xa0761d6478bd642full +
                    row * 0xe7037ed1a0b428dbull + (uint64_t)site * 0x8ebc6af09c88c6e3ull);
}
GPT_HD static inline float gpt__drop_factor(uint64_t key, uint64_t i, uint32_t threshold, float scale) {
    return (uint32_t)(gpt__mix(key + i * 0x9e3779b97f4a7c15ull) >> 32) >= threshold ? scale : 0.0f;
}

/* A dropout probability's scale 1/(1 - p) and threshold p * 2^32 (what gpt__drop_factor takes);
   0 for a p outside [0, 1). The CPU and the CUDA model both set theirs here. */
static inline int gpt__dropout_setting(float p, float *scale, uint32_t *threshold) {
    double t = (double)p * 4294967296.0;
    if (!(p >= 0.0f && p < 1.0f)) return 0;
    *scale = 1.0f / (1.0f - p);
    *threshold = t >= 4294967295.0 ? 4294967295u : (uint32_t)t;
    return 1;
}

/* Dropout with probability p (0 <= p < 1; 0: off, the default), masks drawn from seed. Returns 0
   for a p out of range. */
static inline int gpt_set_dropout(gpt *m, float p, uint64_t seed) {
    if (!gpt__dropout_setting(p, &m->drop_scale, &m->drop_threshold)) return 0;
    m->drop_p = p;
    m->drop_seed = seed;
    return 1;
}

/* Where the next forward's rows sit: optimizer step `step`; its row b is the sample at global
   position row0 + b * stride (with ddp_sampler: rank r's samples first.. of the epoch are global
   positions first * world + r, stride world). Positions must not repeat within a step. */
static inline void gpt_set_rows(gpt *m, uint64_t step, uint64_t row0, uint64_t stride) {
    m->drop_step = step;
    m->drop_row0 = row0;
    m->drop_stride = stride;
}

/* x[i] *= mask of (row b of this forward, site, element base + i), for n elements. */
static void gpt__drop(const gpt *m, uint32_t site, int b, uint64_t base, float *x, size_t n) {
    uint64_t key = gpt__drop_key(m->drop_seed, m->drop_step, m->drop_row0 + (uint64_t)b * m->drop_stride, site);
    size_t i;
    for (i = 0; i < n; i++) x[i] *= gpt__drop_factor(key, base + i, m->drop_threshold, m->drop_scale);
}

/* ---------------------------------------------------------------------------------------------
   Ops. Each forward computes its output and, when training, records its backward with the ids
   of the parameters whose gradients that backward finishes. Parameter gradients accumulate
   (+=), so gradient accumulation over micro-steps needs nothing special.
   --------------------------------------------------------------------------------------------- */
static void gpt__record(gpt *m, ddp_backward_fn fn, const void *args, size_t size, const int *ids, int n) {
    ddp_result r = ddp_tape_record(m->ddp, fn, args, size, ids, n);
    if (r != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(m->ddp)); exit(1); }
}

/* Embedding: res0[b,t] = wte[token] + wpe[t]. Its backward finishes wte (after the head's
   share) and wpe. */
typedef struct { gpt *m; } gpt__embed_args;

static void gpt__embed_backward(void *p) {
    gpt *m = ((gpt__embed_args *)p)->m;
    int C = m->cfg.dim, BT = m->B * m->T, i, c;
    float *gwte = ddp_grad(m->ddp, m->wte), *gwpe = ddp_grad(m->ddp, m->wpe);
    if (m->dropping)   /* dres is not read after this op: mask it in place */
        for (i = 0; i < BT; i++) gpt__drop(m, GPT_DROP_EMBED, i / m->T, (uint64_t)(i % m->T) * C, m->dres + (size_t)i * C, (size_t)C);
    for (i = 0; i < BT; i++) {
        const float *d = m->dres + (size_t)i * C;
        float *gt = gwte + (size_t)m->tokens[i] * C, *gp = gwpe + (size_t)(i % m->T) * C;
        for (c = 0; c < C; c++) { gt[c] += d[c]; gp[c] += d[c]; }
    }
}

static void gpt__embed(gpt *m, int record) {
    int C = m->cfg.dim, BT = m->B * m->T, i, c;
    const float *wte = ddp_param(m->ddp, m->wte), *wpe = ddp_param(m->ddp, m->wpe);
    for (i = 0; i < BT; i++) {
        const float *e = wte + (size_t)m->tokens[i] * C, *q = wpe + (size_t)(i % m->T) * C;
        float *o = m->res0 + (size_t)i * C;
        for (c = 0; c < C; c++) o[c] = e[c] + q[c];
        if (m->dropping) gpt__drop(m, GPT_DROP_EMBED, i / m->T, (uint64_t)(i % m->T) * C, o, (size_t)C);
    }
    if (record) {
        gpt__embed_args a = { m };
        int ids[2] = { m->wte, m->wpe };
        gpt__record(m, gpt__embed_backward, &a, sizeof a, ids, 2);
    }
}

/* LayerNorm over the last dimension (eps 1e-5, biased variance, as PyTorch). The backward
   writes dx (accumulate = 0) or adds to it (accumulate = 1: the residual stream). */
typedef struct {
    gpt *m; int w, b, rows, accumulate;
    const float *x, *mean, *rstd, *dout; float *dx;
} gpt__ln_args;

static void gpt__layernorm_backward(void *p) {
    const gpt__ln_args *a = (const gpt__ln_args *)p;
    int C = a->m->cfg.dim, i, c;
    const float *GPT_RESTRICT w = ddp_param(a->m->ddp, a->w);
    float *GPT_RESTRICT gw = ddp_grad(a->m->ddp, a->w), *GPT_RESTRICT gb = ddp_grad(a->m->ddp, a->b);
    float *GPT_RESTRICT xhat = a->m->datt_row, *GPT_RESTRICT dxhat = xhat + C;   /* scratch: datt_row >= 2C */
    for (i = 0; i < a->rows; i++) {
        const float *GPT_RESTRICT x = a->x + (size_t)i * C, *GPT_RESTRICT dy = a->dout + (size_t)i * C;
        float *GPT_RESTRICT dx = a->dx + (size_t)i * C, mu = a->mean[i], rs = a->rstd[i], mdx, mdxx;
        for (c = 0; c < C; c++) {
            xhat[c] = (x[c] - mu) * rs;
            dxhat[c] = dy[c] * w[c];
        }
        for (c = 0; c < C; c++) {
            gw[c] += dy[c] * xhat[c];
            gb[c] += dy[c];
        }
        mdx = gpt__sum(dxhat, C) / (float)C;
        mdxx = gpt__dot(dxhat, xhat, C) / (float)C;
        if (a->accumulate) for (c = 0; c < C; c++) dx[c] += rs * (dxhat[c] - mdx - xhat[c] * mdxx);
        else for (c = 0; c < C; c++) dx[c] = rs * (dxhat[c] - mdx - xhat[c] * mdxx);
    }
}

static void gpt__layernorm(gpt *m, int w, int b, const float *x, float *out, float *mean, float *rstd,
                           const float *dout, float *dx, int accumulate, int record) {
    int C = m->cfg.dim, rows = m->B * m->T, i, c;
    const float *W = ddp_param(m->ddp, w), *Bv = ddp_param(m->ddp, b);
    for (i = 0; i < rows; i++) {
        const float *xi = x + (size_t)i * C;
        float *o = out + (size_t)i * C, mu, var, rs;
        mu = gpt__sum(xi, C) / (float)C;
        for (c = 0; c < C; c++) o[c] = xi[c] - mu;          /* centred, then scaled in place */
        var = gpt__dot(o, o, C) / (float)C;
        rs = 1.0f / sqrtf(var + 1e-5f);
        for (c = 0; c < C; c++) o[c] = o[c] * rs * W[c] + Bv[c];
        mean[i] = mu;
        rstd[i] = rs;
    }
    if (record) {
        gpt__ln_args a;
        int ids[2];
        a.m = m; a.w = w; a.b = b; a.rows = rows; a.accumulate = accumulate;
        a.x = x; a.mean = mean; a.rstd = rstd; a.dout = dout; a.dx = dx;
        ids[0] = w; ids[1] = b;
        gpt__record(m, gpt__layernorm_backward, &a, sizeof a, ids, 2);
    }
}

/* Linear: out[N, OC] = inp[N, IC] W[OC, IC]^T + b (+ resid, the residual add, when given).
   Its backward finishes W and b; dinp may be NULL. */
typedef struct {
    gpt *m; int w, b, n, in, out, drop; uint32_t site;
    const float *inp, *dout; float *dinp;
} gpt__linear_args;

static void gpt__linear_backward(void *p) {
    gpt__linear_args a = *(const gpt__linear_args *)p;
    float *gw = ddp_grad(a.m->ddp, a.w), *gb = ddp_grad(a.m->ddp, a.b);
    int i, o;
    if (a.drop) {   /* the branch's gradient is the stream's, masked (the stream's own passes on as is) */
        gpt *m = a.m;
        memcpy(m->ddrop, a.dout, sizeof(float) * (size_t)a.n * a.out);
        for (i = 0; i < a.n; i++) gpt__drop(m, a.site, i / m->T, (uint64_t)(i % m->T) * a.out, m->ddrop + (size_t)i * a.out, (size_t)a.out);
        a.dout = m->ddrop;
    }
    if (a.dinp)
        gpt_gemm(0, 0, a.n, a.in, a.out, 1.0f, a.dout, a.out, ddp_param(a.m->ddp, a.w), a.in, 0.0f, a.dinp, a.in);
    gpt_gemm(1, 0, a.out, a.in, a.n, 1.0f, a.dout, a.out, a.inp, a.in, 1.0f, gw, a.in);
    for (i = 0; i < a.n; i++) {
        const float *d = a.dout + (size_t)i * a.out;
        for (o = 0; o < a.out; o++) gb[o] += d[o];
    }
}

/* out = inp W^T + b, plus resid when given: a residual branch, which dropout (when on) masks
   at `site` before it joins the stream. */
static void gpt__linear(gpt *m, int w, int b, const float *inp, float *out, const float *resid, int in, int outc,
                        const float *dout, float *dinp, uint32_t site, int record) {
    int n = m->B * m->T, i, o, drop = resid && m->dropping;
    const float *Bv = ddp_param(m->ddp, b);
    for (i = 0; i < n; i++) {
        float *y = out + (size_t)i * outc;
        if (resid && !drop) { const float *r = resid + (size_t)i * outc; for (o = 0; o < outc; o++) y[o] = r[o] + Bv[o]; }
        else for (o = 0; o < outc; o++) y[o] = Bv[o];
    }
    gpt_gemm(0, 1, n, outc, in, 1.0f, inp, in, ddp_param(m->ddp, w), in, 1.0f, out, outc);
    for (i = 0; drop && i < n; i++) {
        float *y = out + (size_t)i * outc;
        const float *r = resid + (size_t)i * outc;
        gpt__drop(m, site, i / m->T, (uint64_t)(i % m->T) * outc, y, (size_t)outc);
        for (o = 0; o < outc; o++) y[o] += r[o];
    }
    if (record) {
        gpt__linear_args a;
        int ids[2];
        a.m = m; a.w = w; a.b = b; a.n = n; a.in = in; a.out = outc; a.inp = inp; a.dout = dout; a.dinp = dinp;
        a.drop = drop; a.site = site;
        ids[0] = w; ids[1] = b;
        gpt__record(m, gpt__linear_backward, &a, sizeof a, ids, 2);
    }
}

/* Causal multi-head self-attention on qkv [BT, 3C] (q | k | v, head h at columns h*hs..). */
typedef struct { gpt *m; const float *qkv, *att, *dout; float *dqkv; uint32_t site; } gpt__attn_args;

/* The dropped probabilities of (row b, head h): P with the site's mask, into m->patt. */
static const float *gpt__dropped_probs(gpt *m, uint32_t site, int b, int h, const float *P) {
    size_t TT = (size_t)m->T * m->T;
    memcpy(m->patt, P, sizeof(float) * TT);
    gpt__drop(m, site, b, (uint64_t)h * TT, m->patt, TT);
    return m->patt;
}

static void gpt__attention_backward(void *p) {
    const gpt__attn_args *a = (const gpt__attn_args *)p;
    gpt *m = a->m;
    int B = m->B, T = m->T, C = m->cfg.dim, NH = m->cfg.heads, hs = C / NH, C3 = 3 * C, b, h, t;
    float scale = 1.0f / sqrtf((float)hs);
    float *ds = m->datt_row;   /* [T, T] scratch */
    for (b = 0; b < B; b++)
        for (h = 0; h < NH; h++) {
            const float *q = a->qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
            const float *P = a->att + ((size_t)b * NH + h) * T * T;
            const float *dO = a->dout + (size_t)b * T * C + h * hs;
            const float *Pd = m->dropping ? gpt__dropped_probs(m, a->site, b, h, P) : P;   /* what met V */
            float *dq = a->dqkv + (size_t)b * T * C3 + h * hs, *dk = dq + C, *dv = dq + 2 * C;
            gpt_gemm(0, 1, T, T, hs, 1.0f, dO, C, v, C3, 0.0f, ds, T);     /* dPd = dO V^T */
            gpt_gemm(1, 0, T, hs, T, 1.0f, Pd, T, dO, C, 0.0f, dv, C3);    /* dV = Pd^T dO */
            if (m->dropping) gpt__drop(m, a->site, b, (uint64_t)h * T * T, ds, (size_t)T * T);   /* dP = dPd * mask */
            for (t = 0; t < T; t++) {                                      /* dS = P (dP - <P, dP>) */
                const float *pr = P + (size_t)t * T;
                float *d = ds + (size_t)t * T, s = gpt__dot(pr, d, t + 1);
                int u;
                for (u = 0; u < T; u++) d[u] = pr[u] * (d[u] - s);
            }
            gpt_gemm(0, 0, T, hs, T, scale, ds, T, k, C3, 0.0f, dq, C3);   /* dQ = scale dS K */
            gpt_gemm(1, 0, T, hs, T, scale, ds, T, q, C3, 0.0f, dk, C3);   /* dK = scale dS^T Q */
        }
}

static void gpt__attention(gpt *m, const float *qkv, float *att, float *out, const float *dout, float *dqkv, uint32_t site,
                           int record) {
    int B = m->B, T = m->T, C = m->cfg.dim, NH = m->cfg.heads, hs = C / NH, C3 = 3 * C, b, h, t, u;
    float scale = 1.0f / sqrtf((float)hs);
    for (b = 0; b < B; b++)
        for (h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
            float *P = att + ((size_t)b * NH + h) * T * T;
            gpt_gemm(0, 1, T, T, hs, scale, q, C3, k, C3, 0.0f, P, T);    /* S = scale Q K^T */
            for (t = 0; t < T; t++) {                                     /* causal softmax */
                float *row = P + (size_t)t * T, mx = gpt__max(row, t + 1), sum, inv;
                for (u = 0; u <= t; u++) row[u] = gpt__exp(row[u] - mx);
                sum = gpt__sum(row, t + 1);
                inv = 1.0f / sum;
                for (u = 0; u <= t; u++) row[u] *= inv;
                for (u = t + 1; u < T; u++) row[u] = 0.0f;
            }
            gpt_gemm(0, 0, T, hs, T, 1.0f, m->dropping ? gpt__dropped_probs(m, site, b, h, P) : P, T, v, C3, 0.0f,
                     out + (size_t)b * T * C + h * hs, C);                /* O = dropout(P) V */
        }
    if (record) {
        gpt__attn_args a;
        a.m = m; a.qkv = qkv; a.att = att; a.dout = dout; a.dqkv = dqkv; a.site = site;
        gpt__record(m, gpt__attention_backward, &a, sizeof a, NULL, 0);
    }
}

/* GELU, tanh approximation: 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi)(x + 0.044715 x^3). */
#define GPT__GELU_K 0.7978845608028654f
typedef struct { size_t n; const float *x, *s, *dout; float *dx; } gpt__gelu_args;

static void gpt__gelu_backward(void *p) {
    const gpt__gelu_args *a = (const gpt__gelu_args *)p;
    size_t i;
    for (i = 0; i < a->n; i++) {
        float x = a->x[i], s = a->s[i];
        float du = GPT__GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        a->dx[i] = a->dout[i] * (s + x * s * (1.0f - s) * 2.0f * du);
    }
}

static void gpt__gelu(gpt *m, const float *x, float *y, float *sig, size_t n, const float *dout, float *dx, int record) {
    size_t i;
    for (i = 0; i < n; i++) {
        float v = x[i], u = GPT__GELU_K * (v + 0.044715f * v * v * v);
        float s = 1.0f / (1.0f + gpt__exp(-2.0f * u));
        sig[i] = s;
        y[i] = v * s;
    }
    if (record) {
        gpt__gelu_args a;
        a.n = n; a.x = x; a.s = sig; a.dout = dout; a.dx = dx;
        gpt__record(m, gpt__gelu_backward, &a, sizeof a, NULL, 0);
    }
}

/* Head tied to wte: logits[BT, V] = lnf[BT, C] wte[V, C]^T. Its backward adds its share of
   grad(wte) but does not finish it: the embedding's backward does. */
typedef struct { gpt *m; } gpt__head_args;

static void gpt__head_backward(void *p) {
    gpt *m = ((gpt__head_args *)p)->m;
    int C = m->cfg.dim, BT = m->B * m->T;
    /* the tied wte is listed by the embedding's op (which finishes its gradient), not this one:
       its unit is gathered here (kept from the forward; the tape releases it after that op) */
    if (m->units && ddp_unit_gather(m->ddp, 0) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(m->ddp)); exit(1); }
    gpt_gemm(0, 0, BT, C, GPT_VOCAB, 1.0f, m->dlogits, GPT_VOCAB, ddp_param(m->ddp, m->wte), C, 0.0f, m->dln, C);
    gpt_gemm(1, 0, GPT_VOCAB, C, BT, 1.0f, m->dlogits, GPT_VOCAB, m->lnf, C, 1.0f, ddp_grad(m->ddp, m->wte), C);
}

static void gpt__head(gpt *m, int record) {
    int C = m->cfg.dim, BT = m->B * m->T;
    gpt_gemm(0, 1, BT, GPT_VOCAB, C, 1.0f, m->lnf, C, ddp_param(m->ddp, m->wte), C, 0.0f, m->logits, GPT_VOCAB);
    if (record) {
        gpt__head_args a = { m };
        gpt__record(m, gpt__head_backward, &a, sizeof a, NULL, 0);
    }
}

/* Mean cross-entropy over the BT positions; with grad, dlogits = scale * (softmax - onehot) / BT
   right away (it needs nothing else), so no tape op. */
static float gpt__cross_entropy(gpt *m, float scale, int grad) {
    int BT = m->B * m->T, i, v;
    double loss = 0;
    float *tmp = m->datt_row;
    for (i = 0; i < BT; i++) {
        const float *z = m->logits + (size_t)i * GPT_VOCAB;
        float *d = grad ? m->dlogits + (size_t)i * GPT_VOCAB : tmp, mx = gpt__max(z, GPT_VOCAB), sum, k;
        for (v = 0; v < GPT_VOCAB; v++) d[v] = gpt__exp(z[v] - mx);
        sum = gpt__sum(d, GPT_VOCAB);
        loss += (double)(logf(sum) + mx - z[m->targets[i]]);
        if (grad) {
            k = scale / (float)BT;
            for (v = 0; v < GPT_VOCAB; v++) d[v] = d[v] / sum * k;
            d[m->targets[i]] -= k;
        }
    }
    return (float)(loss / BT);
}

/* ---------------------------------------------------------------------------------------------
   Model: registration, init, forward
   --------------------------------------------------------------------------------------------- */
/* A standard normal for (seed, stream, index): counter-based, so every rank (and the PyTorch
   reference, which reads our dump) sees the same numbers. Box-Muller in double. */
static float gpt__normal(uint64_t seed, uint64_t stream, uint64_t index) {
    uint64_t a = gpt__mix(seed * 0x9e3779b97f4a7c15ull ^ gpt__mix(stream + 0x632be59bd9b4e019ull) ^ (2 * index));
    uint64_t b = gpt__mix(a ^ (2 * index + 1) * 0xd1b54a32d192ed03ull);
    double u1 = ((double)(a >> 11) + 1.0) / 9007199254740993.0;   /* (0, 1] */
    double u2 = (double)(b >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static inline int gpt_config_check(const gpt_config *c, char *why, size_t n) {
    if (c->layers < 1 || c->heads < 1 || c->dim < 1 || c->seq < 1 || c->batch < 1) {
        snprintf(why, n, "layers, heads, dim, seq and batch must all be >= 1 (got %d, %d, %d, %d, %d)",
                 c->layers, c->heads, c->dim, c->seq, c->batch);
        return 0;
    }
    if (c->dim % c->heads) { snprintf(why, n, "heads (%d) must divide dim (%d)", c->heads, c->dim); return 0; }
    {   /* sizes in double, so that no product wraps before it is judged (size_t and int below) */
        double L = c->layers, C = c->dim, T = c->seq, BT = (double)c->batch * c->seq, limit = 70368744177664.0;   /* 2^46 */
        double params = (double)GPT_VOCAB * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
        double acts = L * (BT * C * 6 + BT * 4 + BT * 3 * C + (double)c->batch * c->heads * T * T + BT * 4 * C * 3) +
                      BT * C * 6 + T * T + BT * 2 + BT * GPT_VOCAB * 2 + BT * 3 * C + BT * 4 * C * 2 + 2 * C;
        if (BT > 1073741824.0 || params > limit || acts > limit) {
            snprintf(why, n, "the model is too large for this program: %.3g parameters, %.3g activation floats, batch x seq "
                     "%.3g (each must stay below 2^46 floats, and batch x seq below 2^30)", params, acts, BT);
            return 0;
        }
    }
    return 1;
}

static size_t gpt__round16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Units (ddp.h's sharded parameters): declared when the run shards parameters, or at every level
   when this is 1 (train_gpt --units): declared units cut the buckets at their boundaries, so
   runs at every level then have the same buckets and the same bits. */
static int gpt_declare_units = 0;

/* The parameter ids of a model, in registration (= forward) order. */
typedef struct gpt_param_ids {
    int wte, wpe, lnfw, lnfb;
    gpt_layer_ids *layer;          /* cfg.layers entries, filled by gpt_register_params */
} gpt_param_ids;

/* Registers every parameter (forward order, initial values from seed) and commits. Matrices
   (wte and wpe included) decay; biases and LayerNorm parameters do not. The initial values are
   made here on the host for both models (gpt.h's and gpt_cuda.cuh's): ddp_commit copies them
   into its flat buffer (device memory on the NCCL backend), so a seed gives the same bits. Only
   rank 0 makes them: ddp_commit gives every rank rank 0's, so the others register NULL and never
   hold a whole copy of the model (what --shard parameters is for). */
static ddp_result gpt_register_params(ddp_context *ddp, const gpt_config *cfg, uint64_t seed, gpt_param_ids *ids_out,
                                      size_t *num_floats) {
    int L = cfg->layers, C = cfg->dim, T = cfg->seq, l, stream = 0;
    size_t total, used = 0, k;
    float *init;
    ddp_result r = DDP_OK;
    float proj_std = 0.02f / sqrtf(2.0f * (float)L);
    char name[64];
    total = (size_t)GPT_VOCAB * C + (size_t)T * C + (size_t)L * (12 * (size_t)C * C + 13 * (size_t)C) + 2 * (size_t)C;
    init = ddp_rank(ddp) == 0 ? (float *)calloc(total, sizeof(float)) : NULL;   /* read by ddp_commit: lives until then */
    if (!init && ddp_rank(ddp) == 0) return DDP_ERR_OUT_OF_MEMORY;

    /* Each tensor is its own stream of the seeded normal generator. */
#define GPT__REG(nm, count, flags, kind, std, id) do { \
        float *v_ = init ? init + used : NULL; size_t n_ = (size_t)(count); \
        if (v_) for (k = 0; k < n_; k++) v_[k] = (kind) == 0 ? 0.0f : (kind) == 1 ? 1.0f : (std) * gpt__normal(seed, (uint64_t)stream, k); \
        stream++; used += n_; \
        if (r == DDP_OK) r = ddp_register_param(ddp, nm, n_, flags, v_, id); } while (0)
#define GPT__NAME(s) (snprintf(name, sizeof name, "h%d.%s", l, s), name)
    GPT__REG("wte", (size_t)GPT_VOCAB * C, 0, 2, 0.02f, &ids_out->wte);
    GPT__REG("wpe", (size_t)T * C, 0, 2, 0.02f, &ids_out->wpe);
    for (l = 0; l < L; l++) {
        gpt_layer_ids *ids = &ids_out->layer[l];
        GPT__REG(GPT__NAME("ln1.w"), C, DDP_NO_DECAY, 1, 0.0f, &ids->ln1w);
        GPT__REG(GPT__NAME("ln1.b"), C, DDP_NO_DECAY, 0, 0.0f, &ids->ln1b);
        GPT__REG(GPT__NAME("attn.qkv.w"), (size_t)3 * C * C, 0, 2, 0.02f, &ids->qkvw);
        GPT__REG(GPT__NAME("attn.qkv.b"), 3 * C, DDP_NO_DECAY, 0, 0.0f, &ids->qkvb);
        GPT__REG(GPT__NAME("attn.proj.w"), (size_t)C * C, 0, 2, proj_std, &ids->projw);
        GPT__REG(GPT__NAME("attn.proj.b"), C, DDP_NO_DECAY, 0, 0.0f, &ids->projb);
        GPT__REG(GPT__NAME("ln2.w"), C, DDP_NO_DECAY, 1, 0.0f, &ids->ln2w);
        GPT__REG(GPT__NAME("ln2.b"), C, DDP_NO_DECAY, 0, 0.0f, &ids->ln2b);
        GPT__REG(GPT__NAME("mlp.fc.w"), (size_t)4 * C * C, 0, 2, 0.02f, &ids->fcw);
        GPT__REG(GPT__NAME("mlp.fc.b"), 4 * C, DDP_NO_DECAY, 0, 0.0f, &ids->fcb);
        GPT__REG(GPT__NAME("mlp.proj.w"), (size_t)4 * C * C, 0, 2, proj_std, &ids->fcprojw);
        GPT__REG(GPT__NAME("mlp.proj.b"), C, DDP_NO_DECAY, 0, 0.0f, &ids->fcprojb);
    }
    GPT__REG("lnf.w", C, DDP_NO_DECAY, 1, 0.0f, &ids_out->lnfw);
    GPT__REG("lnf.b", C, DDP_NO_DECAY, 0, 0.0f, &ids_out->lnfb);
    /* a unit per block, one for the embeddings (wte is also the head's) and one for the final LayerNorm */
    if (r == DDP_OK && (gpt_declare_units || ddp_config(ddp)->shard == DDP_SHARD_PARAMETERS)) {
        r = ddp_register_unit(ddp, "embeddings", ids_out->wte, 2, NULL);
        for (l = 0; l < L && r == DDP_OK; l++) r = ddp_register_unit(ddp, GPT__NAME("block"), ids_out->layer[l].ln1w, 12, NULL);
        if (r == DDP_OK) r = ddp_register_unit(ddp, "lnf", ids_out->lnfw, 2, NULL);
    }
#undef GPT__NAME
#undef GPT__REG
    if (r == DDP_OK) r = ddp_commit(ddp);
    free(init);
    if (r == DDP_OK) *num_floats = total;
    return r;
}

/* The CPU model: registers and commits the parameters, then allocates the activations. */
static ddp_result gpt_create(gpt *m, ddp_context *ddp, const gpt_config *cfg, uint64_t seed) {
    int L = cfg->layers, C = cfg->dim, NH = cfg->heads, T = cfg->seq, B = cfg->batch, l;
    size_t BT = (size_t)B * T;
    gpt_param_ids ids;
    ddp_result r;
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->ddp = ddp;
    m->drop_stride = 1;   /* gpt_set_rows: row b of a forward is sample b unless told otherwise */
    m->layer = (gpt_layer_ids *)calloc((size_t)L, sizeof *m->layer);
    m->acts = (gpt_layer_acts *)calloc((size_t)L, sizeof *m->acts);
    if (!m->layer || !m->acts) return DDP_ERR_OUT_OF_MEMORY;
    ids.layer = m->layer;
    if ((r = gpt_register_params(ddp, cfg, seed, &ids, &m->num_floats)) != DDP_OK) return r;
    m->wte = ids.wte; m->wpe = ids.wpe; m->lnfw = ids.lnfw; m->lnfb = ids.lnfb;
    m->units = ddp_num_units(ddp) == L + 2;

    /* Activations for the largest batch: one arena, every buffer 64-byte aligned. */
    {
        size_t per_layer = gpt__round16(BT * C) * 6 + gpt__round16(BT) * 4 + gpt__round16(BT * 3 * C) +
                           gpt__round16((size_t)B * NH * T * T) + gpt__round16(BT * 4 * C) * 3;
        size_t row = (size_t)T * T > (size_t)2 * C ? (size_t)T * T : (size_t)2 * C;
        size_t rest, floats, bytes;
        float *p;
        row = gpt__round16(row > (size_t)GPT_VOCAB ? row : (size_t)GPT_VOCAB);
        rest = gpt__round16(BT * C) * 6 + gpt__round16((size_t)T * T) + gpt__round16(BT) * 2 + gpt__round16(BT * GPT_VOCAB) * 2 +
               gpt__round16(BT * 3 * C) + gpt__round16(BT * 4 * C) * 2 + row;
        floats = per_layer * (size_t)L + rest;
        bytes = (sizeof(float) * floats + 63) & ~(size_t)63;
        m->arena = aligned_alloc(64, bytes);
        m->tokens = (int *)malloc(sizeof(int) * BT);
        m->targets = (int *)malloc(sizeof(int) * BT);
        if (!m->arena || !m->tokens || !m->targets) return DDP_ERR_OUT_OF_MEMORY;
        memset(m->arena, 0, bytes);
        p = (float *)m->arena;
#define GPT__TAKE(dst, n) do { (dst) = p; p += gpt__round16(n); } while (0)
        GPT__TAKE(m->res0, BT * C);
        for (l = 0; l < L; l++) {
            gpt_layer_acts *a = &m->acts[l];
            a->res_in = l == 0 ? m->res0 : m->acts[l - 1].res_out;
            GPT__TAKE(a->ln1, BT * C); GPT__TAKE(a->ln1_mean, BT); GPT__TAKE(a->ln1_rstd, BT);
            GPT__TAKE(a->qkv, BT * 3 * C); GPT__TAKE(a->att, (size_t)B * NH * T * T);
            GPT__TAKE(a->att_out, BT * C); GPT__TAKE(a->res_mid, BT * C);
            GPT__TAKE(a->ln2, BT * C); GPT__TAKE(a->ln2_mean, BT); GPT__TAKE(a->ln2_rstd, BT);
            GPT__TAKE(a->fc, BT * 4 * C); GPT__TAKE(a->gelu, BT * 4 * C); GPT__TAKE(a->gelu_s, BT * 4 * C);
            GPT__TAKE(a->res_out, BT * C);
        }
        GPT__TAKE(m->lnf, BT * C); GPT__TAKE(m->lnf_mean, BT); GPT__TAKE(m->lnf_rstd, BT);
        GPT__TAKE(m->logits, BT * GPT_VOCAB); GPT__TAKE(m->dlogits, BT * GPT_VOCAB);
        GPT__TAKE(m->dres, BT * C); GPT__TAKE(m->dln, BT * C); GPT__TAKE(m->datt_out, BT * C);
        GPT__TAKE(m->dqkv, BT * 3 * C); GPT__TAKE(m->dfc, BT * 4 * C); GPT__TAKE(m->dgelu, BT * 4 * C);
        GPT__TAKE(m->datt_row, row);
        GPT__TAKE(m->ddrop, BT * C); GPT__TAKE(m->patt, (size_t)T * T);
#undef GPT__TAKE
        if ((size_t)(p - (float *)m->arena) > floats) { fprintf(stderr, "gpt: arena overflow\n"); exit(1); }
    }
    return DDP_OK;
}

static void gpt_destroy(gpt *m) {
    free(m->layer); free(m->acts); free(m->arena); free(m->tokens); free(m->targets);
    memset(m, 0, sizeof *m);
}

/* Sharded parameters: a unit gathered before the ops that read it, the next one prefetched,
   each released after (ddp.h gathers them again for the backward). Nothing without units. */
enum { GPT__GATHER, GPT__PREFETCH, GPT__RELEASE };
/* What both models' forwards call (gpt_cuda.cuh too): `units` says whether the model declared
   them, `layers` its blocks (units 0 .. layers + 1). */
static void gpt_unit_op(ddp_context *ddp, int units, int layers, int unit, int what) {
    ddp_result r;
    if (!units || unit > layers + 1) return;
    r = what == GPT__GATHER ? ddp_unit_gather(ddp, unit) : what == GPT__PREFETCH ? ddp_unit_prefetch(ddp, unit)
                                                                                  : ddp_unit_release(ddp, unit);
    if (r != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(ddp)); exit(1); }
}
static void gpt__unit(gpt *m, int unit, int what) { gpt_unit_op(m->ddp, m->units, m->cfg.layers, unit, what); }

/* Forward over B sequences of T tokens (B <= cfg.batch, T <= cfg.seq). With targets, returns the
   mean cross-entropy; with train, records the backward on the tape and leaves dlogits =
   loss_scale * d(mean loss)/d(logits) (loss_scale: 1/accumulation steps). */
static float gpt_forward(gpt *m, const int *tokens, const int *targets, int B, int T, float loss_scale, int train) {
    int L = m->cfg.layers, C = m->cfg.dim, l;
    size_t BT = (size_t)B * T;
    float loss = 0;
    if (B < 1 || B > m->cfg.batch || T < 1 || T > m->cfg.seq) {
        fprintf(stderr, "gpt_forward: shape %dx%d outside the allocated %dx%d\n", B, T, m->cfg.batch, m->cfg.seq);
        exit(1);
    }
    m->B = B;
    m->T = T;
    m->dropping = train && m->drop_p > 0.0f;
    memcpy(m->tokens, tokens, sizeof(int) * BT);
    if (targets) memcpy(m->targets, targets, sizeof(int) * BT);
    gpt__unit(m, 0, GPT__GATHER);
    gpt__unit(m, 1, GPT__PREFETCH);
    gpt__embed(m, train);
    gpt__unit(m, 0, GPT__RELEASE);
    for (l = 0; l < L; l++) {
        const gpt_layer_ids *id = &m->layer[l];
        gpt_layer_acts *a = &m->acts[l];
        gpt__unit(m, l + 1, GPT__GATHER);
        gpt__unit(m, l + 2, GPT__PREFETCH);   /* the next block's (or lnf's) copy overlaps this block */
        gpt__layernorm(m, id->ln1w, id->ln1b, a->res_in, a->ln1, a->ln1_mean, a->ln1_rstd, m->dln, m->dres, 1, train);
        gpt__linear(m, id->qkvw, id->qkvb, a->ln1, a->qkv, NULL, C, 3 * C, m->dqkv, m->dln, 0, train);
        gpt__attention(m, a->qkv, a->att, a->att_out, m->datt_out, m->dqkv, GPT_DROP_ATT(l), train);
        gpt__linear(m, id->projw, id->projb, a->att_out, a->res_mid, a->res_in, C, C, m->dres, m->datt_out, GPT_DROP_ATTN_RESID(l), train);
        gpt__layernorm(m, id->ln2w, id->ln2b, a->res_mid, a->ln2, a->ln2_mean, a->ln2_rstd, m->dln, m->dres, 1, train);
        gpt__linear(m, id->fcw, id->fcb, a->ln2, a->fc, NULL, C, 4 * C, m->dfc, m->dln, 0, train);
        gpt__gelu(m, a->fc, a->gelu, a->gelu_s, BT * 4 * C, m->dgelu, m->dfc, train);
        gpt__linear(m, id->fcprojw, id->fcprojb, a->gelu, a->res_out, a->res_mid, 4 * C, C, m->dres, m->dgelu, GPT_DROP_MLP_RESID(l), train);
        gpt__unit(m, l + 1, GPT__RELEASE);
    }
    gpt__unit(m, L + 1, GPT__GATHER);
    gpt__unit(m, 0, GPT__PREFETCH);           /* the head reads the tied wte */
    gpt__layernorm(m, m->lnfw, m->lnfb, m->acts[L - 1].res_out, m->lnf, m->lnf_mean, m->lnf_rstd, m->dln, m->dres, 0, train);
    gpt__unit(m, L + 1, GPT__RELEASE);
    gpt__unit(m, 0, GPT__GATHER);
    gpt__head(m, train);
    if (!train) gpt__unit(m, 0, GPT__RELEASE);   /* training keeps it for the head's backward, the first op replayed */
    if (targets) loss = gpt__cross_entropy(m, loss_scale, train);
    return loss;
}

/* ---------------------------------------------------------------------------------------------
   Fixed windows (validation, tests): window i of batch `step` starts at a position drawn from
   (seed, step, i) alone, so every rank can make any rank's slice.
   --------------------------------------------------------------------------------------------- */
static size_t gpt_window_start(uint64_t seed, uint64_t step, uint64_t index, size_t span) {
    uint64_t z = gpt__mix(gpt__mix(seed ^ 0x5851f42d4c957f2dull) + step * 0x9e3779b97f4a7c15ull + index * 0xda942042e4dd58b5ull);
    return (size_t)(z % span);
}

/* Fills tokens/targets [B, T] with windows first..first+B-1 of (seed, step) from data[0, len).
   (Not every file that includes gpt.h needs it since training batches come from the sampler.) */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((unused))
#endif
static void gpt_make_batch(const unsigned char *data, size_t len, uint64_t seed, uint64_t step, int first, int B, int T,
                           int *tokens, int *targets) {
    size_t span = len - (size_t)T;   /* starts 0 .. len-T-1 keep T+1 bytes in range */
    int b, t;
    for (b = 0; b < B; b++) {
        size_t s = gpt_window_start(seed, step, (uint64_t)(first + b), span);
        for (t = 0; t < T; t++) {
            tokens[b * T + t] = data[s + t];
            targets[b * T + t] = data[s + t + 1];
        }
    }
}

/* FNV-1a over bytes: the trainer's and the tests' fingerprints (not every includer takes one). */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((unused))
#endif
static uint64_t gpt_fnv1a(const void *data, size_t bytes, uint64_t h) {
    const unsigned char *p = (const unsigned char *)data;
    size_t i;
    for (i = 0; i < bytes; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}
#define GPT_FNV_INIT 1469598103934665603ull

#endif /* GPT_H */
