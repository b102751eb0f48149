/* mpi_parity.c — the MPI backend gives the CPU backend's bits: bf16 parameters, the sharded
   optimizer (ZeRO-1), both, and a bf16 wire under fp32 parameters (tests/test_mpi_parity.sh and
   tests/test_mpi_hosts.sh run it under ddprun on the CPU backend and under mpirun on the MPI
   backend, then compare what the ranks wrote, file by file).
   Each configuration trains 6 steps of a small model (several buckets, parts of 1024-float
   grains, a no-decay parameter, clipping) from gradients that depend on the parameters, with
   accumulation, an unused parameter (find_unused) and a NaN on the last rank at step 3
   (skip_nonfinite) where it says so. Rank r writes DIR/CONFIG.rankR: a line a step with its own
   loss, the global grad norm ddp_adamw_step used, a hash of the gradients after ddp_finish in
   the parts it holds (all of them unsharded; bf16 widened) and of its parameters (the working
   copies with bf16 parameters); rank 0 adds a last line with the master, m and v gathered from
   their owners, the working copies and the step count. The *_join runs have uneven inputs:
   rank r stops after STEPS - r % 3 steps and calls ddp_join, answering the others' last steps
   with zeros (their averages divided by the world size); the replicas must end equal; sharded
   (*_shard_join, *_zero2_join) a joined rank also steps its parts, and the final line is the
   unsharded run's (tests/test_mpi_parity.sh compares). The bf16_shard run is saved to
   DIR/bf16_shard.ck. In the program: every rank's parameters equal rank 0's after every step,
   and the shard_accumulate + uneven_inputs combination (no backend runs it) refused by name.
   Usage: mpi_parity train DIR
          mpi_parity load CHECKPOINT SHARD OUT   (a fresh bf16 model, sharded or not, loads the
            checkpoint; rank 0 writes the last line's form to OUT; the working copies must be
            the loaded master rounded, and equal on every rank)
   The MPI build (build/mpi/mpi_parity) asks for the MPI backend: under mpirun on one host too. */
#include "testlib.h"

enum { NP = 6, STEPS = 6, NAN_STEP = 3, UNUSED = 5 };
static const size_t sizes[NP] = { 5000, 17, 2100, 40, 3100, 300 };

typedef struct config {
    const char *name;
    int bf16, wire_bf16, shard, micro, find_unused, nan, uneven;   /* shard: 1 ZeRO-1, 2 ZeRO-2 */
    int outer;                 /* replica groups of one rank: 1 DiLoCo every 2 steps (bf16 wire), 2 streaming every
                                  4 (int8, 2 fragments, delay 1, mix 0.5: the exchange on its thread) */
} config;

/* pairs that differ only in shard_optimizer (sharded = unsharded: the hierarchical fp32 check) */
static const config configs[] = {
    { "fp32", 0, 0, 0, 2, 1, 1, 0, 0 },
    { "fp32_shard", 0, 0, 1, 2, 1, 1, 0, 0 },
    { "bf16", 1, 1, 0, 2, 1, 1, 0, 0 },
    { "bf16_shard", 1, 1, 1, 2, 1, 1, 0, 0 },
    { "fp32_bf16wire", 0, 1, 0, 1, 0, 0, 0, 0 },
    { "bf16_fp32wire_shard", 1, 0, 1, 1, 0, 0, 0, 0 },
    { "fp32_join", 0, 0, 0, 2, 0, 0, 1, 0 },
    { "bf16_join", 1, 1, 0, 1, 0, 0, 1, 0 },
    { "fp32_shard_join", 0, 0, 1, 2, 0, 0, 1, 0 },      /* = fp32_join at ZeRO-1 (the joined ranks step their parts) */
    { "fp32_zero2_join", 0, 0, 2, 2, 0, 0, 1, 0 },      /* and at ZeRO-2 */
    { "bf16_shard_join", 1, 1, 1, 1, 0, 0, 1, 0 },
    { "fp32_diloco", 0, 0, 0, 1, 0, 0, 0, 1 },
    { "bf16_streaming", 1, 1, 0, 1, 0, 0, 0, 2 },
};

static int rank, world;

static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return f != f ? 0x7fc00000u : u; }
static ddp_bf16 to_bf16(float f) { uint32_t u = bits(f); return (ddp_bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }
static float from_bf16(ddp_bf16 h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }

static ddp_result open_model(const config *c, int shard, ddp_context **out, int *ids, int with_init) {
    ddp_desc d;
    ddp_result r;
    int k;
    memset(&d, 0, sizeof d);
#ifdef DDP_MPI
    d.backend = DDP_BACKEND_MPI;
#endif
    if (c->outer) {
        d.outer.mode = c->outer == 1 ? DDP_OUTER_DILOCO : DDP_OUTER_STREAMING;
        d.outer.group_size = 1;
        d.outer.inner_steps = c->outer == 1 ? 2 : 4;
        if (c->outer == 2) { d.outer.fragments = 2; d.outer.delay_steps = 1; d.outer.mix = 0.5f; d.outer.wire = DDP_WIRE_INT8; }
    }
    d.bucket_cap_mb = 0.02;   /* ~5200 floats: several buckets, parts of 1024-float grains on 2-4 ranks */
    d.first_bucket_mb = 0.005;
    d.param_dtype = c->bf16 ? DDP_DTYPE_BF16 : DDP_DTYPE_FP32;
    d.reduce_dtype = c->wire_bf16 ? DDP_DTYPE_BF16 : DDP_DTYPE_FP32;
    d.shard_optimizer = shard == 1;
    if (shard == 2) d.shard = DDP_SHARD_GRADIENTS;
    d.find_unused = c->find_unused;
    d.skip_nonfinite = c->nan;
    d.uneven_inputs = c->uneven ? DDP_JOIN_DIVIDE_BY_WORLD : DDP_JOIN_OFF;
    if ((r = ddp_init(out, &d)) != DDP_OK) return r;
    for (k = 0; k < NP; k++) {
        static float init[NP][5000];   /* read at ddp_commit */
        char name[16];
        size_t i;
        for (i = 0; i < sizes[k]; i++) init[k][i] = 0.4f * test_value(500 + (uint64_t)k, i);
        snprintf(name, sizeof name, "p%d", k);
        if ((r = ddp_register_param(*out, name, sizes[k], k == 1 ? DDP_NO_DECAY : 0, with_init ? init[k] : NULL, &ids[k])) != DDP_OK)
            return r;
    }
    return ddp_commit(*out);
}

/* This rank's parameter values (bf16: the working copies, widened). */
static float param_at(ddp_context *ddp, const config *c, int id, size_t i) {
    return c->bf16 ? from_bf16(ddp_param_bf16(ddp, id)[i]) : ddp_param(ddp, id)[i];
}

/* The loss 0.5 sum (p - t)^2 / n against a target of this rank's, step's and micro-step's, and
   its gradient added into the parameter's (bf16: rounded, as a bf16 program accumulates). */
static double forward_backward(ddp_context *ddp, const config *c, int id, int k, int step, int micro) {
    double loss = 0;
    size_t i;
    for (i = 0; i < sizes[k]; i++) {
        float p = param_at(ddp, c, id, i);
        float t = test_value(10000 + 1000 * (uint64_t)step + 100 * (uint64_t)micro + (uint64_t)rank, (uint64_t)k * 100000 + i);
        float g = (p - t) * (step % 3 == 0 ? 4.0f : 0.25f);   /* some steps clipped, some not */
        if (c->nan && step == NAN_STEP && rank == world - 1 && k == 2 && i == 7) g = NAN;
        loss += 0.5 * (double)(p - t) * (double)(p - t);
        if (c->bf16) ddp_grad_bf16(ddp, id)[i] = to_bf16(from_bf16(ddp_grad_bf16(ddp, id)[i]) + g);
        else ddp_grad(ddp, id)[i] += g;
    }
    return loss / (double)sizes[k];
}

/* The floats of the flat buffer this rank holds the average of (its parts; all unsharded), by
   the manual's rule, from the buckets ddp.h reports. */
static int held(ddp_context *ddp, int shard, size_t i) {
    int b;
    for (b = 0; b < ddp_num_buckets(ddp); b++) {
        ddp_bucket_info k;
        size_t part, lo, hi;
        if (ddp_bucket(ddp, b, &k) != DDP_OK || i < k.offset || i >= k.offset + k.count) continue;
        if (!shard || world == 1) return 1;
        part = k.count / (size_t)world / 1024 * 1024;
        lo = k.offset + part * (size_t)rank;
        hi = rank == world - 1 ? k.offset + k.count : lo + part;
        return i >= lo && i < hi;
    }
    return 0;
}

static uint64_t grads_hash(ddp_context *ddp, int shard, float *tmp, size_t n) {
    uint64_t h = 1469598103934665603ull;
    size_t i;
    if (ddp_copy_to_host(ddp, DDP_GRADS, 0, tmp, n) != DDP_OK) return 0;
    for (i = 0; i < n; i++) if (held(ddp, shard, i)) h = (h ^ bits(tmp[i])) * 1099511628211ull;
    return h;
}

static uint64_t params_hash(ddp_context *ddp, const config *c) {
    size_t n;
    if (c->bf16) { const ddp_bf16 *w = ddp_flat_params_bf16(ddp, &n); return test_hash(w, n * sizeof *w); }
    { const float *p = ddp_flat_params(ddp, &n); return test_hash(p, n * sizeof *p); }
}

/* Rank 0's last line: the master, m and v gathered from their owners, the working copies, the step. */
static ddp_result final_line(ddp_context *ddp, const config *c, char *line, size_t cap) {
    size_t n = ddp->flat.count;
    float *buf = (float *)calloc(3 * n, sizeof(float));
    float *m, *v;
    int64_t *step = NULL;
    ddp_result r = ddp_gather_to_host(ddp, DDP_PARAMS, 0, rank == 0 ? buf : NULL, n, 0);
    if (r == DDP_OK) r = ddp_gather_to_host(ddp, DDP_ADAM_M, 0, rank == 0 ? buf + n : NULL, n, 0);
    if (r == DDP_OK) r = ddp_gather_to_host(ddp, DDP_ADAM_V, 0, rank == 0 ? buf + 2 * n : NULL, n, 0);
    if (r == DDP_OK) r = ddp_adamw_state(ddp, &m, &v, &step);
    if (r == DDP_OK)
        snprintf(line, cap, "final master %016llx work %016llx m %016llx v %016llx step %lld\n",
                 (unsigned long long)test_hash(buf, n * sizeof(float)),
                 (unsigned long long)(c->bf16 ? params_hash(ddp, c) : 0),
                 (unsigned long long)test_hash(buf + n, n * sizeof(float)),
                 (unsigned long long)test_hash(buf + 2 * n, n * sizeof(float)), (long long)*step);
    free(buf);
    return r;
}

static FILE *open_out(const char *dir, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.rank%d", dir, name, rank);
    return fopen(path, "w");
}

static void train(const char *dir, const config *c) {
    ddp_context *ddp = NULL;
    ddp_adamw opt;
    ddp_result r;
    int ids[NP], step, u, k, differ = 0, steps = c->uneven ? STEPS - rank % 3 : STEPS;
    float *tmp = NULL;
    char name[128], line[256];
    FILE *f = open_out(dir, c->name);
    memset(&opt, 0, sizeof opt);
    opt.lr = 0.01f; opt.weight_decay = 0.1f; opt.max_grad_norm = 8.0f;
    r = open_model(c, c->shard, &ddp, ids, 1);
    if (r == DDP_OK) tmp = (float *)malloc(ddp->flat.count * sizeof(float));
    for (step = 0; step < steps && r == DDP_OK && f; step++) {
        double loss = 0;
        float norm = 0;
        uint64_t mine, root;
        if ((r = ddp_zero_grad(ddp)) != DDP_OK) break;
        for (u = 0; u < c->micro && r == DDP_OK; u++) {
            ddp_set_sync(ddp, u == c->micro - 1);
            for (k = NP - 1; k >= 0 && r == DDP_OK; k--) {
                if (c->find_unused && k == UNUSED && rank == 0 && step % 2 == 0) continue;
                loss += forward_backward(ddp, c, ids[k], k, step, u);
                r = ddp_grad_ready(ddp, ids[k]);
            }
            if (r == DDP_OK) r = ddp_finish(ddp);
        }
        if (r != DDP_OK) break;
        fprintf(f, "step %d loss %08x grads %016llx", step, bits((float)loss), (unsigned long long)grads_hash(ddp, c->shard, tmp, ddp->flat.count));
        if ((r = ddp_adamw_step(ddp, &opt, &norm)) != DDP_OK) break;
        mine = root = params_hash(ddp, c);
        if (!c->uneven && (r = ddp_broadcast(ddp, &root, sizeof root, 0)) != DDP_OK) break;   /* joined ranks: no collectives */
        if (mine != root && !c->outer) differ++;   /* replica groups differ between their syncs */
        fprintf(f, " norm %08x params %016llx\n", bits(norm), (unsigned long long)mine);
    }
    if (r == DDP_OK && c->uneven && (r = ddp_join(ddp)) == DDP_OK) {   /* the replicas synced: equal now */
        uint64_t mine = params_hash(ddp, c), root = mine;
        if ((r = ddp_broadcast(ddp, &root, sizeof root, 0)) == DDP_OK && mine != root) differ++;
        if (f) fprintf(f, "joined params %016llx\n", (unsigned long long)mine);
    }
    if (r == DDP_OK && f && (r = final_line(ddp, c, line, sizeof line)) == DDP_OK && rank == 0) fputs(line, f);
    if (r == DDP_OK && !strcmp(c->name, "bf16_shard")) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s.ck", dir, c->name);
        r = ddp_save(ddp, path, NULL, 0);
    }
    snprintf(name, sizeof name, "parity_%s_%s_ranks%d_trained_identical_on_every_rank", c->name, ddp_backend_name(ddp), world);
    verdict(r == DDP_OK && f && !differ, name, "%s", !f ? "cannot write the output" : r != DDP_OK ? ddp_last_error(ddp) :
            "the parameters differ from rank 0's");
    if (f) fclose(f);
    free(tmp);
    ddp_shutdown(ddp);
}

static void load(const char *path, int shard, const char *out_path) {
    static const config bf16 = { "load", 1, 1, 0, 1, 0, 0, 0, 0 };
    ddp_context *ddp = NULL;
    ddp_result r;
    int ids[NP], bad = 0;
    char line[256], name[128];
    r = open_model(&bf16, shard, &ddp, ids, 0);
    if (r == DDP_OK) r = ddp_load(ddp, path, NULL, 0, NULL, NULL, NULL);
    if (r == DDP_OK) {   /* the working copies are the loaded master rounded (rank 0), the same on every rank */
        size_t n, i;
        const ddp_bf16 *w = ddp_flat_params_bf16(ddp, &n);
        float *master = (float *)calloc(n, sizeof(float));
        uint64_t mine = test_hash(w, n * sizeof *w), root = mine;
        r = ddp_gather_to_host(ddp, DDP_PARAMS, 0, rank == 0 ? master : NULL, n, 0);
        for (i = 0; r == DDP_OK && rank == 0 && i < n; i++) bad += w[i] != to_bf16(master[i]);
        if (r == DDP_OK) r = ddp_broadcast(ddp, &root, sizeof root, 0);
        bad += root != mine;
        free(master);
    }
    if (r == DDP_OK) r = final_line(ddp, &bf16, line, sizeof line);
    if (r == DDP_OK && rank == 0) {
        FILE *f = fopen(out_path, "w");
        if (!f || fputs(line, f) < 0) bad++;
        if (f) fclose(f);
    }
    snprintf(name, sizeof name, "parity_load_%s_ranks%d_%s", ddp_backend_name(ddp), world, shard ? "sharded" : "unsharded");
    verdict(r == DDP_OK && !bad, name, "%s", r != DDP_OK ? ddp_last_error(ddp) : "working copies not the master rounded, or no output");
    ddp_shutdown(ddp);
}

/* Nothing is left that the MPI backend alone refuses; the combination no backend runs is
   refused on it by name too, before any network. */
static void refusals(void) {
    ddp_context *ddp = NULL;
    ddp_desc d;
    ddp_result r;
    char name[96];
    memset(&d, 0, sizeof d);
#ifdef DDP_MPI
    d.backend = DDP_BACKEND_MPI;
#define MPI_OR_CPU "mpi"
#else
#define MPI_OR_CPU "cpu"
#endif
    d.shard = DDP_SHARD_GRADIENTS;
    d.shard_accumulate = 1;
    d.param_dtype = DDP_DTYPE_BF16;
    d.uneven_inputs = DDP_JOIN_DIVIDE_BY_WORLD;
    d.log_level = DDP_LOG_OFF;
    snprintf(name, sizeof name, "parity_shard_accumulate_with_uneven_inputs_refused_by_name_%s_ranks%d", MPI_OR_CPU, world);
    r = ddp_init(&ddp, &d);
    verdict(r == DDP_ERR_INVALID_ARGUMENT && strstr(ddp_last_error(ddp), "shard_accumulate 1 cannot be combined with uneven_inputs"),
            name, "%s: %s", ddp_result_string(r), ddp_last_error(ddp));
    ddp_shutdown(ddp);
}

/* Stragglers (mpi_parity straggler): the last rank sleeps 100 ms before each backward; every rank
   must name it in ddp_step_stats, the others must have waited most of it, it hardly at all; fp32
   buckets (through the host groups and leaders) and a bf16 wire (among all ranks). */
static void stragglers(void) {
    static const config plain = { "fp32", 0, 0, 0, 1, 0, 0, 0, 0 }, wire = { "bf16wire", 0, 1, 0, 1, 0, 0, 0, 0 };
    const config *cs[2];
    int n, k, step, ids[NP];
    cs[0] = &plain; cs[1] = &wire;
    for (n = 0; n < 2; n++) {
        const config *c = cs[n];
        ddp_context *ddp = NULL;
        ddp_result r = open_model(c, 0, &ddp, ids, 1);
        int named = 1, slow = world - 1;
        double least = 1e9, self_most = 0;
        char name[160];
        for (step = 0; r == DDP_OK && step < 4; step++) {
            ddp_step_stats st;
            ddp_zero_grad(ddp);
            if (step > 0 && rank == slow) usleep(100 * 1000);   /* step 0: the exchanges' zero is set */
            for (k = NP - 1; k >= 0 && r == DDP_OK; k--) {   /* registered last, ready first */
                forward_backward(ddp, c, ids[k], k, step, 0);
                r = ddp_grad_ready(ddp, ids[k]);
            }
            if (r == DDP_OK) r = ddp_finish(ddp);
            st = ddp_last_step_stats(ddp);
            if (step == 0) continue;
            named &= st.slowest_rank == slow;
            if (rank == slow) { if (st.straggler_wait_ms > self_most) self_most = st.straggler_wait_ms; }
            else if (st.straggler_first_wait_ms < least) least = st.straggler_first_wait_ms;
            if (rank == 0 && step == 1)
                printf("  (%s %s: rank 0 waited %.1f ms for rank %d, first exchange %.1f ms, spread %.1f ms)\n", MPI_OR_CPU, c->name,
                       st.straggler_wait_ms, st.slowest_rank, st.straggler_first_wait_ms, st.straggler_spread_ms);
        }
        snprintf(name, sizeof name, "parity_straggler_named_%s_%s_ranks%d", c->name, MPI_OR_CPU, world);
        verdict(r == DDP_OK && named && (rank == slow ? self_most < 30 : least >= 75), name,
                "rank %d: %s; named %d, least wait %.1f ms, the slow rank's own %.1f ms", rank,
                r == DDP_OK ? "ok" : ddp_last_error(ddp), named, least, self_most);
        ddp_shutdown(ddp);
    }
}

int main(int argc, char **argv) {
    const char *env_rank = getenv("OMPI_COMM_WORLD_RANK") ? getenv("OMPI_COMM_WORLD_RANK") : getenv("RANK");
    size_t i;
    rank = env_rank ? atoi(env_rank) : 0;
    world = getenv("OMPI_COMM_WORLD_SIZE") ? atoi(getenv("OMPI_COMM_WORLD_SIZE")) : getenv("WORLD_SIZE") ? atoi(getenv("WORLD_SIZE")) : 1;
    if (argc == 3 && !strcmp(argv[1], "train")) {
        for (i = 0; i < sizeof configs / sizeof configs[0]; i++) train(argv[2], &configs[i]);
        refusals();
    } else if (argc == 5 && !strcmp(argv[1], "load")) load(argv[2], atoi(argv[3]), argv[4]);
    else if (argc == 2 && !strcmp(argv[1], "straggler") && world > 1) stragglers();
    else { fprintf(stderr, "usage: mpi_parity train DIR | load CHECKPOINT SHARD OUT | straggler (2 ranks or more)\n"); return 2; }
    return test_summary("mpi_parity");
}
