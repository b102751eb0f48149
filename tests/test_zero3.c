/* test_zero3.c — sharded parameters (ZeRO-3 / FSDP, ddp_desc.shard = DDP_SHARD_PARAMETERS):
   the same bits as unsharded training, and what the level promises besides.
   A small multi-layer model (three tanh layers and a head, a unit each) is trained twice in one
   process group of N ranks, once at DDP_SHARD_NONE and once at DDP_SHARD_PARAMETERS, by the same
   program (its forward gathers, prefetches and releases units; below PARAMETERS those calls do
   nothing): with the tape (the backward gathers the units itself), with gradient accumulation,
   bf16 parameters, clipping (max_grad_norm below the norm), an unused parameter (find_unused),
   skip_nonfinite (a NaN on one rank at one step), and with the program's own autograd (no tape,
   explicit gathers). Every step: the global norm and the parameters (gathered to rank 0 with
   ddp_gather_to_host) bit for bit equal to the unsharded run's; ddp_param the same address at
   every step; after the step no page of the flat parameter buffer resident (mincore), while
   gathered every page of the unit's range resident; a child process that touches a released
   parameter dies of SIGSEGV. Checkpoints: saved at one level, loaded at the other (same world
   size, training goes on bit for bit), and across world sizes (the modes below). The prefetch
   switch (shard_prefetch_off): on and off the same bits, no prefetched gather on the timeline when
   off. ddp_commit holds no whole copy: under an RLIMIT_DATA far below the model's size (CPU
   backend), and (MPI backend) its peak resident memory grows by the rank's parts and 16 MB. Every
   bad input named. Ranks register different initial values: rank 0's win everywhere. Run: build/ddprun -n N build/test_zero3          (N = 1..4)
        build/ddprun -n N build/test_zero3 save DIR LEVEL  (train 3 steps, save DIR/z3.ckpt and the
                                                            parameters' hash)
        build/ddprun -n M build/test_zero3 load DIR LEVEL  (load it: the same parameters) */
#include "testlib.h"
#ifndef _WIN32
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#endif

enum { D = 40, LAYERS = 3, B = 3, STEPS = 6, UNUSED = 37 };

typedef struct config {
    const char *name;
    int micro, bf16, unused, nan_step, own, keep_last;
    float clip;
} config;

static int rank, world;
static int solo;   /* contexts of one rank of their own (the refusals, on rank 0 only) */
static int check_ready;   /* the next context is a DDP_CHECK_READY debugging run */
static int prefetch_off;  /* the next context: ddp_desc.shard_prefetch_off */
static const char *timeline;   /* the next context's ddp_desc.timeline_path */
static int shard_group;   /* TEST_ZERO3_SHARD_GROUP (hybrid sharding, the MPI build across hosts): the sharded
                             contexts' ddp_desc.shard_group, and the reference is DDP_SHARD_OPTIMIZER in the same
                             groups (bf16 hybrid sums in the hosts' order, not unsharded's: HYBRID SHARDING) */

/* The model: W[l] (D x D), b[l] (D) for each layer, the head h (D), maybe an unused parameter. */
typedef struct model {
    ddp_context *ddp;
    const config *c;
    int W[LAYERS], b[LAYERS], head, unused, unit[LAYERS + 1];
    float act[B][LAYERS + 1][D];   /* act[s][0] the input, act[s][l + 1] = tanh(W[l] act[s][l] + b[l]) */
    float out[B];
    float dact[B][LAYERS + 1][D];  /* the loss's gradient by each activation */
} model;

static float pv(model *m, int id, size_t i) {
    return m->c->bf16 ? ddp__from_bf16(ddp_param_bf16(m->ddp, id)[i]) : ddp_param(m->ddp, id)[i];
}
static void gadd(model *m, int id, size_t i, float v) {
    if (m->c->bf16) { ddp_bf16 *g = ddp_grad_bf16(m->ddp, id); g[i] = ddp__to_bf16(ddp__from_bf16(g[i]) + v); }
    else ddp_grad(m->ddp, id)[i] += v;
}

typedef struct op_args { model *m; int layer; } op_args;   /* layer LAYERS: the head */

static int release_probe = -1;            /* a unit the next backward op tries to release (bad input) */
static ddp_result release_probe_result;

static void backward_op(void *p) {
    op_args *a = (op_args *)p;
    model *m = a->m;
    int s, i, j, l = a->layer;
    if (release_probe >= 0) { release_probe_result = ddp_unit_release(m->ddp, release_probe); release_probe = -1; }
    if (l == LAYERS) {   /* out = head . act[LAYERS]; loss = out^2 / 2 */
        for (s = 0; s < B; s++)
            for (i = 0; i < D; i++) {
                gadd(m, m->head, (size_t)i, m->out[s] * m->act[s][LAYERS][i]);
                m->dact[s][LAYERS][i] = m->out[s] * pv(m, m->head, (size_t)i);
            }
        return;
    }
    for (s = 0; s < B; s++) {
        float da[D];
        for (j = 0; j < D; j++) {
            float h = m->act[s][l + 1][j];
            da[j] = m->dact[s][l + 1][j] * (1.0f - h * h);
            gadd(m, m->b[l], (size_t)j, da[j]);
            for (i = 0; i < D; i++) gadd(m, m->W[l], (size_t)j * D + (size_t)i, da[j] * m->act[s][l][i]);
        }
        for (i = 0; i < D; i++) {
            float acc = 0;
            for (j = 0; j < D; j++) acc += pv(m, m->W[l], (size_t)j * D + (size_t)i) * da[j];
            m->dact[s][l][i] = acc;
        }
    }
}

/* Pages of [p, p + bytes) resident: how many, of how many. */
static void resident(const void *p, size_t bytes, size_t *in, size_t *total) {
#ifndef _WIN32
    size_t page = (size_t)sysconf(_SC_PAGESIZE), i;
    uintptr_t a = (uintptr_t)p / page * page, z = ((uintptr_t)p + bytes + page - 1) / page * page;
    unsigned char *v = (unsigned char *)calloc((z - a) / page + 1, 1);
    *in = 0; *total = (z - a) / page;
    if (v && mincore((void *)a, z - a, v) == 0)
        for (i = 0; i < *total; i++) *in += v[i] & 1;
    else *in = (size_t)-1;
    free(v);
#else
    (void)p; (void)bytes; *in = 0; *total = 0;
#endif
}

static int local_bad;   /* local properties broken (pointers, pages): summed over the ranks at the end */
static char local_why[256];
static void local_fail(const char *fmt, const char *what, long x, long y) {
    if (!local_bad++) snprintf(local_why, sizeof local_why, fmt, what, x, y);
}

static int unit_range_resident(model *m, int u, int want_all) {
    int first = u < LAYERS ? m->W[u] : m->head;
    int last = u < LAYERS ? m->b[u] : (m->unused >= 0 ? m->unused : m->head);
    size_t es = m->c->bf16 ? 2 : 4, in, total;
    const unsigned char *p0 = m->c->bf16 ? (const unsigned char *)ddp_param_bf16(m->ddp, first) : (const unsigned char *)ddp_param(m->ddp, first);
    const unsigned char *p1 = m->c->bf16 ? (const unsigned char *)ddp_param_bf16(m->ddp, last) : (const unsigned char *)ddp_param(m->ddp, last);
    resident(p0, (size_t)(p1 - p0) + ddp_param_count(m->ddp, last) * es, &in, &total);
    return want_all ? in == total : (int)in;
}

static ddp_result forward(model *m, int step, int micro) {
    ddp_context *ddp = m->ddp;
    ddp_result r = DDP_OK;
    int s, i, j, l;
    for (s = 0; s < B; s++)
        for (i = 0; i < D; i++)
            m->act[s][0][i] = test_value(1000 * (uint64_t)step + 10 * (uint64_t)micro + 100000 * (uint64_t)rank + (uint64_t)s, (uint64_t)i);
    for (l = 0; l <= LAYERS && r == DDP_OK; l++) {
        op_args a;
        if ((r = ddp_unit_gather(ddp, m->unit[l])) != DDP_OK) break;
        if (l < LAYERS) r = ddp_unit_prefetch(ddp, m->unit[l + 1]);   /* the next unit's copy overlaps this layer */
        if (r == DDP_OK && l == 0 && step == 0 && micro == 0 && ddp_config(ddp)->shard == DDP_SHARD_PARAMETERS &&
            !unit_range_resident(m, 0, 1))
            local_fail("%s: a gathered unit's pages are not all resident (%ld %ld)", m->c->name, 0, 0);
        if (l < LAYERS)
            for (s = 0; s < B; s++)
                for (j = 0; j < D; j++) {
                    float acc = pv(m, m->b[l], (size_t)j);
                    for (i = 0; i < D; i++) acc += pv(m, m->W[l], (size_t)j * D + (size_t)i) * m->act[s][l][i];
                    m->act[s][l + 1][j] = tanhf(acc);
                }
        else
            for (s = 0; s < B; s++) {
                float acc = 0;
                for (i = 0; i < D; i++) acc += pv(m, m->head, (size_t)i) * m->act[s][LAYERS][i];
                m->out[s] = acc;
                if (step == m->c->nan_step && rank == world - 1 && s == 0 && micro == 0) m->out[s] = NAN;
            }
        a.m = m; a.layer = l;
        if (!m->c->own) {
            int ids[2];
            ids[0] = l < LAYERS ? m->W[l] : m->head;
            ids[1] = l < LAYERS ? m->b[l] : m->head;
            if (r == DDP_OK) r = ddp_tape_record(ddp, backward_op, &a, sizeof a, ids, l < LAYERS ? 2 : 1);
        }
        /* released after its forward, except (keep_last) the last unit, kept for the backward as FSDP does */
        if (r == DDP_OK && !(m->c->keep_last && l == LAYERS)) r = ddp_unit_release(ddp, m->unit[l]);
    }
    return r;
}

/* The program's own backward: units gathered in reverse, released after their gradients. */
static ddp_result own_backward(model *m) {
    ddp_result r = DDP_OK;
    int l;
    for (l = LAYERS; l >= 0 && r == DDP_OK; l--) {
        op_args a;
        a.m = m; a.layer = l;
        if ((r = ddp_unit_gather(m->ddp, m->unit[l])) != DDP_OK) break;
        if (l > 0 && (r = ddp_unit_prefetch(m->ddp, m->unit[l - 1])) != DDP_OK) break;
        backward_op(&a);
        if (l == LAYERS) r = ddp_grad_ready(m->ddp, m->head);
        else if ((r = ddp_grad_ready(m->ddp, m->W[l])) == DDP_OK) r = ddp_grad_ready(m->ddp, m->b[l]);
        if (r == DDP_OK) r = ddp_unit_release(m->ddp, m->unit[l]);
    }
    return r == DDP_OK ? ddp_finish(m->ddp) : r;
}

static ddp_result open_model(model *m, const config *c, ddp_shard level) {
    ddp_desc d;
    ddp_result r;
    int l;
    char name[32];
    static float init[LAYERS + 1][D * D];
    memset(m, 0, sizeof *m);
    m->c = c;
    m->unused = -1;
    memset(&d, 0, sizeof d);
    d.bucket_cap_mb = 0.01;   /* buckets of ~2600 floats: several, cutting across units */
    d.first_bucket_mb = 0.004;
    d.find_unused = c->unused;
    d.skip_nonfinite = c->nan_step >= 0;
    d.param_dtype = c->bf16 ? DDP_DTYPE_BF16 : DDP_DTYPE_FP32;
    d.shard = level;
    if (level >= DDP_SHARD_OPTIMIZER && !solo) d.shard_group = shard_group;
#ifdef DDP_MPI
    if (!solo && world > 1) d.backend = DDP_BACKEND_MPI;   /* on one host auto would pick the cpu backend */
#endif
    if (solo) d.world_size = 1;
    d.check_ready = check_ready;
    d.shard_prefetch_off = prefetch_off;
    d.timeline_path = timeline;
    if ((r = ddp_init(&m->ddp, &d)) != DDP_OK) return r;
    for (l = 0; l <= LAYERS; l++) {
        size_t i;
        /* every rank's own initial values: rank 0's must win everywhere (ddp_commit), at every level */
        for (i = 0; i < D * D; i++) init[l][i] = 0.3f * test_value(77 + (uint64_t)l, i) + (rank ? 0.25f * (float)rank : 0.0f);
    }
    for (l = 0; l < LAYERS && r == DDP_OK; l++) {
        snprintf(name, sizeof name, "layer%d.W", l);
        r = ddp_register_param(m->ddp, name, D * D, 0, init[l], &m->W[l]);
        snprintf(name, sizeof name, "layer%d.b", l);
        if (r == DDP_OK) r = ddp_register_param(m->ddp, name, D, DDP_NO_DECAY, init[LAYERS] + 100 * l, &m->b[l]);
        snprintf(name, sizeof name, "layer%d", l);
        if (r == DDP_OK) r = ddp_register_unit(m->ddp, name, m->W[l], 2, &m->unit[l]);
    }
    if (r == DDP_OK) r = ddp_register_param(m->ddp, "head", D, 0, init[LAYERS] + 500, &m->head);
    if (r == DDP_OK && c->unused) r = ddp_register_param(m->ddp, "never.used", UNUSED, 0, init[LAYERS] + 900, &m->unused);
    if (r == DDP_OK) r = ddp_register_unit(m->ddp, "head", m->head, c->unused ? 2 : 1, &m->unit[LAYERS]);
    return r == DDP_OK ? ddp_commit(m->ddp) : r;
}

typedef struct run_result { float norm[STEPS]; uint64_t hash[STEPS]; } run_result;

/* The parameters, whole, on rank 0 (the fp32 master with bf16 parameters): their hash. */
static uint64_t params_hash(model *m) {
    size_t n;
    float *all;
    uint64_t h = 0;
    if (m->c->bf16) ddp_flat_grads_bf16(m->ddp, &n);   /* the flat buffer's floats */
    else ddp_flat_grads(m->ddp, &n);
    all = (float *)calloc(n, sizeof(float));
    if (ddp_gather_to_host(m->ddp, DDP_PARAMS, 0, rank == 0 ? all : NULL, n, 0) == DDP_OK && rank == 0) h = test_hash(all, n * sizeof(float));
    free(all);
    return h;
}

static ddp_result train_steps(model *m, int from, int to, run_result *out) {
    ddp_adamw opt;
    ddp_result r = DDP_OK;
    int step, u;
    const void *w0 = m->c->bf16 ? (const void *)ddp_param_bf16(m->ddp, m->W[1]) : (const void *)ddp_param(m->ddp, m->W[1]);
    memset(&opt, 0, sizeof opt);
    opt.lr = 0.01f; opt.weight_decay = 0.1f; opt.max_grad_norm = m->c->clip;
    for (step = from; step < to && r == DDP_OK; step++) {
        if ((r = ddp_zero_grad(m->ddp)) != DDP_OK) break;
        for (u = 0; u < m->c->micro && r == DDP_OK; u++) {
            ddp_set_sync(m->ddp, u == m->c->micro - 1);
            if ((r = forward(m, step, u)) != DDP_OK) break;
            r = m->c->own ? own_backward(m) : ddp_backward(m->ddp);
        }
        if (r == DDP_OK) r = ddp_adamw_step(m->ddp, &opt, &out->norm[step]);
        if (r != DDP_OK) break;
        out->hash[step] = params_hash(m);
        if ((m->c->bf16 ? (const void *)ddp_param_bf16(m->ddp, m->W[1]) : (const void *)ddp_param(m->ddp, m->W[1])) != w0)
            local_fail("%s: ddp_param moved at step %ld (%ld)", m->c->name, step, 0);
        if (ddp_config(m->ddp)->shard == DDP_SHARD_PARAMETERS) {
            int k;
            for (k = 0; k <= LAYERS; k++)
                if (unit_range_resident(m, k, 0) != 0)
                    local_fail("%s: released unit %ld has %ld resident page(s) after the step", m->c->name, k, unit_range_resident(m, k, 0));
        }
    }
    return r;
}

#ifndef _WIN32
/* A child that reads a released parameter: killed by SIGSEGV (not a stale value). */
static int touch_faults(const float *p) {
    pid_t pid;
    int status = 0;
    fflush(stdout);
    if ((pid = fork()) == 0) {
        volatile float x;
        signal(SIGSEGV, SIG_DFL);   /* not a sanitizer's report: the plain fault */
        x = p[1];
        (void)x;
        _exit(0);
    }
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return 0;
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
}

/* Under check_ready: the child's stderr names the parameter and unit it touched, then it dies of SIGSEGV. */
static int touch_named(const float *p, char *said, size_t cap) {
    int fd[2], status = 0;
    ssize_t n, got = 0;
    pid_t pid;
    if (pipe(fd) != 0) return 0;
    fflush(stdout); fflush(stderr);
    if ((pid = fork()) == 0) {
        volatile float x;
        dup2(fd[1], 2);
        close(fd[0]);
        x = p[3];
        (void)x;
        _exit(0);
    }
    close(fd[1]);
    while (pid > 0 && (size_t)got < cap - 1 && (n = read(fd[0], said + got, cap - 1 - (size_t)got)) > 0) got += n;
    said[got > 0 ? got : 0] = 0;
    close(fd[0]);
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return 0;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    /* ddp.h hands the fault on to the handler before its own: here the sanitizer's, which
       reports the SEGV and exits non-zero instead of dying of the signal */
    if (WIFEXITED(status) && WEXITSTATUS(status) != 0) return 1;
#endif
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
}
#endif

static void run_config(const config *c) {
    model a, z;
    run_result ra, rz;
    ddp_result r;
    char name[96];
    int step, same = 1, first_diff = -1;
    memset(&ra, 0, sizeof ra); memset(&rz, 0, sizeof rz);
    r = open_model(&a, c, shard_group ? DDP_SHARD_OPTIMIZER : DDP_SHARD_NONE);
    if (r == DDP_OK) r = train_steps(&a, 0, STEPS, &ra);
    if (r != DDP_OK) { printf("FAIL zero3_%s_unsharded: %s\n", c->name, ddp_last_error(a.ddp)); test_failures++; }
    ddp_shutdown(a.ddp);
    r = open_model(&z, c, DDP_SHARD_PARAMETERS);
#ifdef DDP_MPI
    if (r == DDP_OK && rank == 0 && world > 1) {   /* what this build is for */
        snprintf(name, sizeof name, "zero3_%s_on_the_mpi_backend_%dranks", c->name, world);
        verdict(ddp_config(z.ddp)->backend == DDP_BACKEND_MPI, name, "backend %s", ddp_backend_name(z.ddp));
    }
#endif
    if (r == DDP_OK) r = train_steps(&z, 0, STEPS, &rz);
#ifndef _WIN32
    if (r == DDP_OK && rank == 0 && !c->bf16 && !c->own) {
        snprintf(name, sizeof name, "zero3_released_touch_faults_%dranks", world);
        verdict(touch_faults(ddp_param(z.ddp, z.W[2])), name, "a read of a released parameter did not fault");
    }
#endif
    if (r == DDP_OK && world > 1 && !c->bf16 && !c->own) {   /* a host copy of parameters: this rank's parts only */
        float x[2];
        size_t n;
        ddp_result q;
        ddp_flat_grads(z.ddp, &n);
        q = ddp_copy_to_host(z.ddp, DDP_PARAMS, rank == 0 ? n - 2 : 0, x, 2);
        if (rank == 0) {
            snprintf(name, sizeof name, "zero3_%s_host_copy_outside_part_named_%dranks", c->name, world);
            verdict(q == DDP_ERR_INVALID_ARGUMENT && strstr(ddp_last_error(z.ddp), "the parameters (DDP_SHARD_PARAMETERS"), name,
                    "%s: %s", ddp_result_string(q), ddp_last_error(z.ddp));
        }
    }
    if (r != DDP_OK) { printf("FAIL zero3_%s_sharded: %s\n", c->name, ddp_last_error(z.ddp)); test_failures++; }
    ddp_shutdown(z.ddp);
    for (step = 0; step < STEPS; step++)
        if (memcmp(&ra.norm[step], &rz.norm[step], sizeof(float)) || ra.hash[step] != rz.hash[step] || (rank == 0 && !ra.hash[step])) { same = 0; if (first_diff < 0) first_diff = step; }
    if (rank == 0) {
        snprintf(name, sizeof name, "zero3_%s_equals_unsharded_%dranks", c->name, world);
        verdict(r == DDP_OK && same, name, "step %d: norm %.9g vs %.9g, hash %llx vs %llx", first_diff,
                first_diff >= 0 ? ra.norm[first_diff] : 0.0, first_diff >= 0 ? rz.norm[first_diff] : 0.0,
                first_diff >= 0 ? (unsigned long long)ra.hash[first_diff] : 0ull, first_diff >= 0 ? (unsigned long long)rz.hash[first_diff] : 0ull);
    }
}

/* How often `what` occurs in the file at path (-1: unreadable). */
static long count_in_file(const char *path, const char *what) {
    FILE *f = fopen(path, "rb");
    char *text;
    long n = 0, len;
    const char *p;
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    text = (char *)calloc((size_t)(len > 0 ? len : 0) + 1, 1);
    if (!text || (len > 0 && fread(text, 1, (size_t)len, f) != (size_t)len)) { free(text); fclose(f); return -1; }
    fclose(f);
    for (p = text; (p = strstr(p, what)) != NULL; p++) n++;
    free(text);
    return n;
}

/* The prefetch switch (desc.shard_prefetch_off): ZeRO-3 with prefetch on and off, the same bits
   (the tape, accumulation, keep_last); the timeline's gather events: prefetched ones with it on,
   none with it off (each unit gathered by the rank's own thread when needed). */
static void prefetch_switch(const char *dir) {
    static const config c = { "prefetch", 2, 0, 0, -1, 0, 1, 0.5f };
    run_result res[2];
    long gathers[2], prefetched[2];
    char path[2][600], name[96];
    int k, step, same = 1, first_diff = -1, ok = 1;
    memset(res, 0, sizeof res);
    for (k = 0; k < 2; k++) {
        model z;
        ddp_result r;
        snprintf(path[k], sizeof path[k], "%s/prefetch_%s.json", dir, k ? "off" : "on");
        prefetch_off = k;
        timeline = path[k];
        r = open_model(&z, &c, DDP_SHARD_PARAMETERS);
        if (r == DDP_OK && ddp_config(z.ddp)->shard_prefetch_off != k) {
            printf("FAIL zero3_prefetch_config: ddp_config()->shard_prefetch_off %d, set %d\n", ddp_config(z.ddp)->shard_prefetch_off, k);
            test_failures++;
        }
        if (r == DDP_OK) r = train_steps(&z, 0, STEPS, &res[k]);
        if (r != DDP_OK) { printf("FAIL zero3_prefetch_%s: %s\n", k ? "off" : "on", ddp_last_error(z.ddp)); test_failures++; ok = 0; }
        ddp_shutdown(z.ddp);   /* the timeline written by rank 0 */
        prefetch_off = 0;
        timeline = NULL;
        gathers[k] = rank == 0 ? count_in_file(path[k], "\"name\":\"gather unit") : 0;
        prefetched[k] = rank == 0 ? count_in_file(path[k], "\"prefetched\":1") : 0;
        if (rank == 0) remove(path[k]);
    }
    for (step = 0; step < STEPS; step++)
        if (memcmp(&res[0].norm[step], &res[1].norm[step], sizeof(float)) || res[0].hash[step] != res[1].hash[step] ||
            (rank == 0 && !res[0].hash[step])) { same = 0; if (first_diff < 0) first_diff = step; }
    if (rank != 0) return;
    snprintf(name, sizeof name, "zero3_prefetch_off_equals_on_%dranks", world);
    verdict(ok && same, name, "step %d: norm %.9g vs %.9g", first_diff, first_diff >= 0 ? res[0].norm[first_diff] : 0.0,
            first_diff >= 0 ? res[1].norm[first_diff] : 0.0);
    /* every rank's events are in rank 0's file: with prefetch on, the forward's prefetches at least
       (LAYERS a micro-step); off, not one, and still every unit gathered in the forward and the backward */
    snprintf(name, sizeof name, "zero3_prefetch_on_events_%dranks", world);
    verdict(gathers[0] > 0 && prefetched[0] >= (long)world * STEPS * c.micro * LAYERS, name,
            "%ld gather events, %ld prefetched (want >= %d)", gathers[0], prefetched[0], world * STEPS * c.micro * LAYERS);
    snprintf(name, sizeof name, "zero3_prefetch_off_no_prefetch_%dranks", world);
    verdict(prefetched[1] == 0 && gathers[1] >= (long)world * STEPS * c.micro * (2 * LAYERS + 1), name,
            "%ld gather events, %ld prefetched (want 0 prefetched, >= %d gathers)", gathers[1], prefetched[1],
            world * STEPS * c.micro * (2 * LAYERS + 1));
}

#if !defined(_WIN32) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__) && !defined(DDP_MPI)
/* This process's private writable memory (VmData, what RLIMIT_DATA caps), in bytes; 0: unknown. */
static size_t vm_data(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kb = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmData:", 7)) kb = (size_t)strtoull(line + 7, NULL, 10);
    fclose(f);
    return kb * 1024;
}

/* ddp_commit at PARAMETERS holds no whole copy of the model: under an RLIMIT_DATA of what the
   rank holds before the commit plus 40 MB, a 64 MB model (8 units of 8 MB) commits and gathers a
   unit; a commit that made the private flat buffers (parameters and gradients, 128 MB) fails.
   bf16 parameters: the cap grows by the fp32 master's parts (64 MB / world), which the rank keeps;
   the whole master, working copies and gradients (128 MB) do not fit. */
static void commit_under_cap(int bf16) {
    enum { UNITS = 8, COUNT = 2 << 20 };
    struct rlimit old, cap;
    ddp_context *ddp;
    ddp_desc d;
    ddp_result r;
    size_t vm, before;
    int i, id, capped = 0;
    char name[96];
    memset(&d, 0, sizeof d);
    d.shard = DDP_SHARD_PARAMETERS;
    d.param_dtype = bf16 ? DDP_DTYPE_BF16 : DDP_DTYPE_FP32;
    if ((r = ddp_init(&ddp, &d)) == DDP_OK)
        for (i = 0; i < UNITS && r == DDP_OK; i++) {   /* zeros: the program holds no initial values either */
            snprintf(name, sizeof name, "big%d", i);
            if ((r = ddp_register_param(ddp, name, COUNT, 0, NULL, &id)) == DDP_OK) r = ddp_register_unit(ddp, name, id, 1, NULL);
        }
    vm = vm_data();
    before = vm + (40u << 20) + (bf16 ? (size_t)UNITS * COUNT * sizeof(float) / (size_t)world : 0);
    if (r == DDP_OK && vm && getrlimit(RLIMIT_DATA, &old) == 0 && (old.rlim_cur == RLIM_INFINITY || old.rlim_cur > before)) {
        cap = old;
        cap.rlim_cur = (rlim_t)before;
        capped = setrlimit(RLIMIT_DATA, &cap) == 0;
    }
    if (r == DDP_OK) r = ddp_commit(ddp);
    if (r == DDP_OK && (r = ddp_unit_gather(ddp, 3)) == DDP_OK) {
        if (bf16) ddp_param_bf16(ddp, 3)[COUNT - 1] = ddp__to_bf16(1.0f);   /* its pages are this rank's now */
        else ddp_param(ddp, 3)[COUNT - 1] = 1.0f;
        r = ddp_unit_release(ddp, 3);
    }
    if (capped) setrlimit(RLIMIT_DATA, &old);
    if (r != DDP_OK || !capped) local_fail("commit under a data cap: %s (capped %ld)", r != DDP_OK ? ddp_last_error(ddp) : "no cap set", capped, 0);
    if (rank == 0) {
        snprintf(name, sizeof name, "zero3_commit_holds_no_whole_copy_%s_%dranks", bf16 ? "bf16" : "fp32", world);
        verdict(r == DDP_OK && capped, name, "a 64 MB model under a cap of 40 MB (and the master's parts) more than before ddp_commit: %s",
                r != DDP_OK ? ddp_last_error(ddp) : "no cap could be set");
    }
    ddp_shutdown(ddp);
}
#endif

#if defined(DDP_MPI) && defined(__linux__) && !defined(TEST_SANITIZED)
/* This process's VmHWM or VmRSS (/proc/self/status), in bytes; 0: unknown. */
static size_t vm_status(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kb = 0, n = strlen(key);
    if (!f) return 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') kb = (size_t)strtoull(line + n + 1, NULL, 10);
    fclose(f);
    return kb * 1024;
}

/* The MPI backend's ddp_commit at PARAMETERS holds no whole copy of the model: the peak resident
   memory (VmHWM, reset to the resident size just before by `echo 5 > /proc/self/clear_refs`)
   grows by this rank's parts (fp32: the parameters' parts; bf16: the fp32 master's parts and the
   working copies' parts) plus at most SLACK_MB (the commit's 4 MB chunk, the allocator's and
   MPI's own), for a 64 MB model (8 units of 8 MB) with rank 0's
   real initial values (the others register none: rank 0's win). A commit that broadcast the
   whole model (or touched the whole gradients' buffer) grows by 64 MB or more. Then every value
   of a gathered unit is rank 0's (bf16: rounded). Every rank's growth is checked; rank 0 says. */
static void commit_rss(int bf16) {
    enum { UNITS = 8, COUNT = 2 << 20, SLACK_MB = 16 };
    ddp_context *ddp;
    ddp_desc d;
    ddp_result r;
    float *init = NULL, *all;
    size_t base = 0, peak = 0, i, wrong = 0;
    double parts;
    int u, id, team = shard_group > 0 ? shard_group : world, reset = 0;
    char name[96];
    FILE *f;
    memset(&d, 0, sizeof d);
    d.shard = DDP_SHARD_PARAMETERS;
    d.shard_group = shard_group;
    d.backend = DDP_BACKEND_MPI;
    d.param_dtype = bf16 ? DDP_DTYPE_BF16 : DDP_DTYPE_FP32;
    if (rank == 0 && !(init = (float *)malloc((size_t)UNITS * COUNT * sizeof(float)))) {
        printf("FAIL zero3_mpi_commit_rss: out of memory for the initial values\n");
        test_failures++;
    }
    for (i = 0; init && i < (size_t)UNITS * COUNT; i++) init[i] = test_value(91, i);   /* resident before the measure */
    if ((r = ddp_init(&ddp, &d)) == DDP_OK)
        for (u = 0; u < UNITS && r == DDP_OK; u++) {
            snprintf(name, sizeof name, "big%d", u);
            if ((r = ddp_register_param(ddp, name, COUNT, 0, init ? init + (size_t)u * COUNT : NULL, &id)) == DDP_OK)
                r = ddp_register_unit(ddp, name, id, 1, NULL);
        }
    if ((f = fopen("/proc/self/clear_refs", "w"))) { reset = fputs("5", f) >= 0; reset &= fclose(f) == 0; }
    base = vm_status("VmHWM");
    if (r == DDP_OK) r = ddp_commit(ddp);
    peak = vm_status("VmHWM");
    parts = (double)UNITS * COUNT * (bf16 ? sizeof(float) + sizeof(ddp_bf16) : sizeof(float)) / team / 1048576.0;
    if (r == DDP_OK && (r = ddp_unit_gather(ddp, 3)) == DDP_OK) {   /* rank 0's initial values, every one */
        for (i = 0; i < COUNT; i++) {
            float want = init ? init[3 * (size_t)COUNT + i] : test_value(91, 3 * (size_t)COUNT + i);
            if (bf16 ? ddp_param_bf16(ddp, 3)[i] != ddp__to_bf16(want) : memcmp(&ddp_param(ddp, 3)[i], &want, sizeof want)) wrong++;
        }
        r = ddp_unit_release(ddp, 3);
    }
    all = (float *)calloc((size_t)world * 3, sizeof(float));
    if (all) {   /* every rank's growth (MB), whether it measured, its wrong values */
        all[3 * rank] = peak >= base ? (float)((double)(peak - base) / 1048576.0) : 0.0f;
        all[3 * rank + 1] = (float)(reset && base && peak >= base);
        all[3 * rank + 2] = (float)wrong;
        if (r == DDP_OK) r = ddp_allreduce(ddp, all, (size_t)world * 3, DDP_SUM);
    }
    if (rank == 0) {
        char why[512];
        size_t at = 0;
        int ok = r == DDP_OK && all != NULL, measured = 1, q;
        why[0] = 0;
        for (q = 0; all && q < world; q++) {
            measured &= all[3 * q + 1] == 1;
            ok &= all[3 * q] <= parts + SLACK_MB && all[3 * q + 2] == 0;
            if (at < sizeof why - 1)
                at += (size_t)snprintf(why + at, sizeof why - at, "%srank %d %.1f MB%s%s", q ? ", " : "", q, all[3 * q],
                                       all[3 * q + 1] == 1 ? "" : " (no measure)", all[3 * q + 2] ? " (values not rank 0's)" : "");
        }
        if (at >= sizeof why) at = sizeof why - 1;
        printf("# zero3_mpi_commit_rss %s, %d ranks (team %d): peak growth %s; parts %.1f MB\n", bf16 ? "bf16" : "fp32", world, team, why, parts);
        snprintf(name, sizeof name, "zero3_commit_holds_no_whole_copy_%s_%dranks", bf16 ? "bf16" : "fp32", world);
        if (ok && !measured) printf("SKIP %s: /proc/self/clear_refs could not reset VmHWM (%s)\n", name, why);
        else verdict(ok, name, "a 64 MB model: peak growth of ddp_commit over this rank's parts (%.1f MB) + %d MB: %s%s%s", parts,
                SLACK_MB, why, r != DDP_OK ? ": " : "", r != DDP_OK ? ddp_last_error(ddp) : "");
    }
    free(all);
    ddp_shutdown(ddp);
    free(init);
}
#endif

/* Checkpoints at the same world size: saved at one level after 3 steps, loaded at the other,
   3 more steps: the hashes of the run that never stopped. */
static void checkpoint_levels(const char *dir) {
    static const config c = { "ckpt", 1, 0, 0, -1, 0, 0, 0.5f };
    model m;
    run_result full, part;
    char path[512], name[96];
    int dir_level, ok = 1;
    ddp_result r = DDP_OK;
    memset(&full, 0, sizeof full);
    snprintf(path, sizeof path, "%s/levels.ckpt", dir);
    if (open_model(&m, &c, DDP_SHARD_NONE) == DDP_OK) r = train_steps(&m, 0, STEPS, &full);
    ddp_shutdown(m.ddp);
    for (dir_level = 0; dir_level < 2; dir_level++) {
        ddp_shard from = dir_level ? DDP_SHARD_NONE : DDP_SHARD_PARAMETERS, to = dir_level ? DDP_SHARD_PARAMETERS : DDP_SHARD_NONE;
        int step;
        memset(&part, 0, sizeof part);
        if ((r = open_model(&m, &c, from)) == DDP_OK && (r = train_steps(&m, 0, 3, &part)) == DDP_OK) r = ddp_save(m.ddp, path, NULL, 0);
        if (r != DDP_OK) printf("FAIL zero3_ckpt_save: %s\n", ddp_last_error(m.ddp));
        ddp_shutdown(m.ddp);
        if (r == DDP_OK && (r = open_model(&m, &c, to)) == DDP_OK && (r = ddp_load(m.ddp, path, NULL, 0, NULL, NULL, NULL)) == DDP_OK)
            r = train_steps(&m, 3, STEPS, &part);
        if (r != DDP_OK) printf("FAIL zero3_ckpt_load: %s\n", ddp_last_error(m.ddp));
        ddp_shutdown(m.ddp);
        for (step = 0; step < STEPS; step++) ok &= r == DDP_OK && part.hash[step] == full.hash[step];
        if (rank == 0) {
            snprintf(name, sizeof name, "zero3_checkpoint_%s_to_%s_%dranks", dir_level ? "none" : "parameters", dir_level ? "parameters" : "none", world);
            verdict(ok, name, "the resumed run's parameters differ from the uninterrupted run's");
        }
        ok = 1;
    }
}

static int contains(const char *s, const char *a, const char *b) { return strstr(s, a) && (!b || strstr(s, b)); }

/* Bad input, on a context of one rank of its own. */
static void refusals(void) {
    static const config c = { "bad", 1, 0, 0, -1, 0, 0, 0 };
    ddp_context *ddp;
    ddp_desc d;
    ddp_result r;
    int id[4], u, i;
    float w[64];
    model m;
    memset(w, 0, sizeof w);
    memset(&d, 0, sizeof d);
    d.world_size = 1;
    d.shard = DDP_SHARD_PARAMETERS;
    if (ddp_init(&ddp, &d) != DDP_OK) { printf("FAIL zero3_refusals_init: %s\n", ddp_last_error(ddp)); test_failures++; return; }
    for (i = 0; i < 4; i++) {
        char name[16];
        snprintf(name, sizeof name, "q%d", i);
        ddp_register_param(ddp, name, 64, 0, w, &id[i]);
    }
    ddp_register_unit(ddp, "a", 0, 2, &u);
    r = ddp_register_unit(ddp, "b", 1, 2, &u);
    verdict(r == DDP_ERR_INVALID_ARGUMENT && contains(ddp_last_error(ddp), "overlap unit 'a'", "'q1'"), "zero3_unit_overlap_named", "%s", ddp_last_error(ddp));
    r = ddp_register_unit(ddp, "e", 2, 0, &u);
    verdict(r == DDP_ERR_INVALID_ARGUMENT && contains(ddp_last_error(ddp), "empty unit", "'e'"), "zero3_unit_empty_named", "%s", ddp_last_error(ddp));
    r = ddp_register_unit(ddp, "far", 3, 5, &u);
    verdict(r == DDP_ERR_INVALID_ARGUMENT && contains(ddp_last_error(ddp), "not all registered", "'far'"), "zero3_unit_out_of_range_named", "%s", ddp_last_error(ddp));
    ddp_register_unit(ddp, "c", 2, 1, &u);
    r = ddp_commit(ddp);
    verdict(r == DDP_ERR_INVALID_STATE && contains(ddp_last_error(ddp), "'q3'", "no unit"), "zero3_param_in_no_unit_named", "%s", ddp_last_error(ddp));
    ddp_register_unit(ddp, "d", 3, 1, &u);
    r = ddp_commit(ddp);
    verdict(r == DDP_OK, "zero3_commit_after_fixing_units", "%s", ddp_last_error(ddp));
    r = ddp_register_unit(ddp, "late", 3, 1, &u);
    verdict(r == DDP_ERR_INVALID_STATE && contains(ddp_last_error(ddp), "after ddp_commit", "'late'"), "zero3_unit_after_commit_named", "%s", ddp_last_error(ddp));
    r = ddp_unit_release(ddp, 0);
    verdict(r == DDP_ERR_INVALID_STATE && contains(ddp_last_error(ddp), "'a'", "not gathered"), "zero3_release_of_released_named", "%s", ddp_last_error(ddp));
    r = ddp_unit_gather(ddp, 9);
    verdict(r == DDP_ERR_INVALID_ARGUMENT && contains(ddp_last_error(ddp), "no unit 9", NULL), "zero3_no_such_unit_named", "%s", ddp_last_error(ddp));
    ddp_shutdown(ddp);

    /* uneven inputs: run on the CPU backend, refused on NCCL (tests/test_shard_join.c) */

    /* the prefetch switch: a field out of range, a typo in the variable, the variable over the field */
    d.shard_prefetch_off = 2;
    r = ddp_init(&ddp, &d);
    verdict(r == DDP_ERR_INVALID_ARGUMENT && contains(ddp_last_error(ddp), "shard_prefetch_off 2", NULL), "zero3_prefetch_field_range_refused",
            "%s", ddp_last_error(ddp));
    ddp_shutdown(ddp);
    d.shard_prefetch_off = 1;
    setenv("DDP_SHARD_PREFETCH", "of", 1);
    r = ddp_init(&ddp, &d);
    verdict(r == DDP_ERR_BAD_ENV && contains(ddp_last_error(ddp), "DDP_SHARD_PREFETCH='of'", "neither on nor off"),
            "zero3_prefetch_env_typo_refused", "%s", ddp_last_error(ddp));
    ddp_shutdown(ddp);
    setenv("DDP_SHARD_PREFETCH", "on", 1);
    r = ddp_init(&ddp, &d);
    verdict(r == DDP_OK && ddp_config(ddp)->shard_prefetch_off == 0, "zero3_prefetch_env_wins", "%s", ddp_last_error(ddp));
    ddp_shutdown(ddp);
    unsetenv("DDP_SHARD_PREFETCH");
    d.shard_prefetch_off = 0;

    /* the model, one rank: tape records of a released unit, a step with a unit gathered, a release in the backward */
    if (open_model(&m, &c, DDP_SHARD_PARAMETERS) != DDP_OK) { printf("FAIL zero3_refusals_model: %s\n", ddp_last_error(m.ddp)); test_failures++; ddp_shutdown(m.ddp); return; }
    {
        op_args a;
        int ids[1];
        ddp_adamw opt;
        float norm;
        memset(&opt, 0, sizeof opt);
        opt.lr = 0.01f;
        a.m = &m; a.layer = 0;
        ids[0] = m.b[1];
        r = ddp_tape_record(m.ddp, backward_op, &a, sizeof a, ids, 1);
        verdict(r == DDP_ERR_INVALID_STATE && contains(ddp_last_error(m.ddp), "'layer1.b'", "unit 'layer1'"), "zero3_record_of_released_unit_named",
                "%s", ddp_last_error(m.ddp));
        ddp_tape_reset(m.ddp);
        {   /* buckets follow units: each bucket's parameters are in one unit (a layer's W and b, or the head) */
            int k, bad = 0, nb = ddp_num_buckets(m.ddp);
            for (k = 0; k < nb; k++) {
                ddp_bucket_info bi;
                ddp_bucket(m.ddp, k, &bi);
                if (bi.first_param != bi.last_param && !(bi.last_param == bi.first_param + 1 && bi.first_param != m.head && bi.first_param % 2 == 0)) bad++;
            }
            verdict(bad == 0 && nb >= LAYERS + 1, "zero3_buckets_follow_units", "%d of %d buckets span two units", bad, nb);
        }
        ddp_zero_grad(m.ddp);
        r = forward(&m, 0, 0);
        release_probe = m.unit[0];   /* the head's op (replayed first) releases layer 0, which the last op needs */
        if (r == DDP_OK) r = ddp_backward(m.ddp);
        verdict(r == DDP_OK && release_probe_result == DDP_ERR_INVALID_STATE && contains(ddp_last_error(m.ddp), "still in use by a recorded op", "'layer0'"),
                "zero3_release_in_use_named", "%s / %s", ddp_result_string(release_probe_result), ddp_last_error(m.ddp));
        for (i = 0; i <= LAYERS; i++) if (ddp_unit_gathered(m.ddp, m.unit[i]) != 0) r = DDP_ERR_INVALID_STATE;
        verdict(r == DDP_OK, "zero3_backward_releases_every_unit", "a unit is still gathered after ddp_backward");
        ddp_unit_gather(m.ddp, m.unit[2]);
        r = ddp_adamw_step(m.ddp, &opt, &norm);
        verdict(r == DDP_ERR_INVALID_STATE && contains(ddp_last_error(m.ddp), "'layer2'", "without a release"), "zero3_step_with_gathered_unit_named",
                "%s", ddp_last_error(m.ddp));
        ddp_unit_release(m.ddp, m.unit[2]);
        r = ddp_adamw_step(m.ddp, &opt, &norm);
        verdict(r == DDP_OK, "zero3_step_after_release", "%s", ddp_last_error(m.ddp));
        r = ddp_consume_grads(m.ddp);
        verdict(r == DDP_ERR_INVALID_STATE && contains(ddp_last_error(m.ddp), "DDP_SHARD_PARAMETERS", NULL), "zero3_own_optimizer_refused", "%s", ddp_last_error(m.ddp));
    }
    ddp_shutdown(m.ddp);
#ifndef _WIN32
    check_ready = 1;
    if (open_model(&m, &c, DDP_SHARD_PARAMETERS) == DDP_OK) {
        char said[1024];
        int died;
        ddp_unit_gather(m.ddp, m.unit[1]);
        ddp_unit_release(m.ddp, m.unit[1]);
        died = touch_named(ddp_param(m.ddp, m.b[1]), said, sizeof said);
        verdict(died && contains(said, "'layer1.b'", "unit 'layer1'") && contains(said, "released", NULL),
                "zero3_check_ready_names_the_touched_parameter", "died of SIGSEGV: %d; said: %s", died, said);
    } else { printf("FAIL zero3_check_ready_open: %s\n", ddp_last_error(m.ddp)); test_failures++; }
    ddp_shutdown(m.ddp);
    check_ready = 0;
#endif
}

/* Across world sizes: `save` trains 3 steps at LEVEL and saves; `load` (another world size and
   level) loads and compares the parameters' hash with the one `save` wrote. */
static int ckpt_mode(const char *mode, const char *dir, const char *level) {
    static const config c = { "xworld", 1, 0, 0, -1, 0, 0, 0.5f };
    ddp_shard lv = !strcmp(level, "parameters") ? DDP_SHARD_PARAMETERS : DDP_SHARD_NONE;
    char path[512], hpath[512], name[96];
    model m;
    run_result rr;
    ddp_result r;
    unsigned long long want = 0;
    uint64_t h;
    memset(&rr, 0, sizeof rr);
    snprintf(path, sizeof path, "%s/z3.ckpt", dir);
    snprintf(hpath, sizeof hpath, "%s/z3.hash", dir);
    if ((r = open_model(&m, &c, lv)) == DDP_OK) {
        if (!strcmp(mode, "save")) {
            if ((r = train_steps(&m, 0, 3, &rr)) == DDP_OK) r = ddp_save(m.ddp, path, NULL, 0);
        } else r = ddp_load(m.ddp, path, NULL, 0, NULL, NULL, NULL);
    }
    h = r == DDP_OK ? params_hash(&m) : 0;
    if (r != DDP_OK) printf("FAIL zero3_ckpt_%s: %s\n", mode, ddp_last_error(m.ddp));
    ddp_shutdown(m.ddp);
    if (rank != 0 || r != DDP_OK) return r != DDP_OK;
    if (!strcmp(mode, "save")) {
        FILE *f = fopen(hpath, "w");
        if (f) { fprintf(f, "%llx\n", (unsigned long long)h); fclose(f); }
        printf("PASS zero3_ckpt_saved_%s_%dranks\n", level, world);
        return 0;
    } else {
        FILE *f = fopen(hpath, "r");
        if (!f || fscanf(f, "%llx", &want) != 1) want = 0;
        if (f) fclose(f);
        snprintf(name, sizeof name, "zero3_ckpt_loaded_at_%s_%dranks", level, world);
        verdict(want != 0 && h == want, name, "hash %llx, saved %llx", (unsigned long long)h, want);
        return want == 0 || h != want;
    }
}

#ifdef DDP_MPI
/* `mismatch` (MPI build, 2+ ranks; tests/test_zero3_mpi.sh): rank 0 gathers unit 0, the others
   unit 1, a collective each on the MPI backend: every rank names it (the gathers' signature),
   none hangs. The group is failed after it, so this mode is a job of its own. */
static int mismatch_mode(void) {
    static const config c = { "mismatch", 1, 0, 0, -1, 0, 0, 0 };
    model m;
    ddp_result r = open_model(&m, &c, DDP_SHARD_PARAMETERS);
    const char *e;
    char name[96];
    if (r == DDP_OK) r = ddp_unit_gather(m.ddp, rank == 0 ? m.unit[0] : m.unit[1]);
    e = ddp_last_error(m.ddp);
    snprintf(name, sizeof name, "zero3_mpi_gather_of_other_units_named_rank%d", rank);
    verdict(r == DDP_ERR_MISMATCH && strstr(e, "ranks called different collectives") && strstr(e, "gathers unit 'layer"), name,
            "%s: %s", ddp_result_string(r), e);
    ddp_shutdown(m.ddp);
    return test_summary("test_zero3 mismatch");
}
#endif

int main(int argc, char **argv) {
    static const config configs[] = {
        /* name          micro bf16 unused nan own keep clip */
        { "fp32_tape",       1, 0, 0, -1, 0, 0, 0.5f },
        { "accumulate",      2, 0, 0, -1, 0, 1, 0.5f },
        { "unused_nan",      1, 0, 1,  2, 0, 0, 0.5f },
        { "bf16",            2, 1, 1, -1, 0, 1, 0.5f },
        { "own_autograd",    1, 0, 0, -1, 1, 0, 0.5f },
    };
    size_t i;
    const char *r = getenv("RANK"), *w = getenv("WORLD_SIZE");
    if (!r || !w) { r = getenv("OMPI_COMM_WORLD_RANK"); w = getenv("OMPI_COMM_WORLD_SIZE"); }   /* mpirun (the MPI build) */
    rank = r ? atoi(r) : 0;
    world = w ? atoi(w) : 1;
    shard_group = getenv("TEST_ZERO3_SHARD_GROUP") ? atoi(getenv("TEST_ZERO3_SHARD_GROUP")) : 0;
    if (argc == 4) return ckpt_mode(argv[1], argv[2], argv[3]);
#ifdef DDP_MPI
    if (argc == 2 && !strcmp(argv[1], "mismatch")) return mismatch_mode();
#endif
    for (i = 0; i < sizeof configs / sizeof configs[0]; i++) run_config(&configs[i]);
    {
        char dir[] = "/tmp/test_zero3_XXXXXX";
        if (rank == 0 && !mkdtemp(dir)) dir[0] = 0;
        {   /* every rank needs the directory's name: through a context of the group */
            ddp_context *ddp;
            if (ddp_init(&ddp, NULL) == DDP_OK) { ddp_broadcast(ddp, dir, sizeof dir, 0); ddp_shutdown(ddp); }
        }
        if (dir[0]) {
            char path[600];
            checkpoint_levels(dir);
            prefetch_switch(dir);
            if (rank == 0) { snprintf(path, sizeof path, "%s/levels.ckpt", dir); remove(path); rmdir(dir); }
        }
    }
    if (rank == 0) { solo = 1; refusals(); solo = 0; }
#if defined(DDP_MPI) && defined(__linux__) && !defined(TEST_SANITIZED)
    if (world > 1) { commit_rss(0); commit_rss(1); }   /* the peak resident memory (no data cap: the heap block is reserved whole) */
#elif defined(DDP_MPI)
    if (world > 1 && rank == 0) printf("SKIP zero3_commit_holds_no_whole_copy: peak resident memory is /proc's (Linux) and means nothing under sanitizers\n");
#elif !defined(_WIN32) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    if (world > 1) { commit_under_cap(0); commit_under_cap(1); }   /* one rank: the whole model is its part */
#endif
    {   /* the local properties, every rank's */
        ddp_context *ddp;
        float bad = (float)local_bad;
        if (ddp_init(&ddp, NULL) == DDP_OK) { ddp_allreduce(ddp, &bad, 1, DDP_SUM); ddp_shutdown(ddp); }
        if (rank == 0) verdict(bad == 0, "zero3_pointers_fixed_and_released_pages_gone", "%g rank(s): %s", bad, local_why);
        else if (local_bad) printf("FAIL zero3_local_rank%d: %s\n", rank, local_why);
    }
    return test_summary("test_zero3");
}
