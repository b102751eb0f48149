/* test_equivalence.c — the central property: N ranks at batch B/N each train exactly the model
   that 1 rank trains at batch B, to float32 rounding, and all ranks hold the same bits.
   A 2-layer MLP (linear, tanh, linear, softmax cross-entropy) whose ops record their backward
   on the ddp tape; AdamW with weight decay, a no-decay bias and clipping; 30 steps.
   Each rank also trains the 1-rank reference itself, in a second single-rank context.
   Run: build/ddprun -n N build/test_equivalence      (N = 1, 2, 4; N must divide 32)
        build/test_equivalence --threads N           (the same, ranks as threads of one process)
   Rank 0 prints a hash of the final parameters ("params_hash"): the same N gives the same bits
   as processes or threads. Built with -DTEST_PORTABLE_MATH (and -ffp-contract=off) the model's
   own arithmetic is +, -, *, / only (the model's own exp, and tanh from it), which every C
   library rounds alike, so the Linux and Windows builds must print the same hashes
   (tests/test_windows.sh compares them); by default it uses libm's expf and tanhf. The model is
   tests/support/equivalence_model.h (tests/test_fake_nccl.c and the GPU tests train it too). */
#include "testlib.h"
#include "support/equivalence_model.h"   /* the MLP, its data and its CPU ops */

static int reinit_port;   /* --threads: the second process group's store (both probed by main) */

/* One rank's whole run: desc NULL = the process group from the environment (ddprun), else by
   hand (a thread-rank). Only a loud rank prints. Returns the failures it saw. */
static int run_rank(const ddp_desc *desc, int loud) {
    ddp_context *ddp, *solo;
    ddp_desc solo_desc;
    mlp *model = (mlp *)calloc(1, sizeof(mlp)), *reference = (mlp *)calloc(1, sizeof(mlp));
    int rank, world, step, micro, bad = 0, failures = 0;
    size_t count, i;
    double worst = 0, tol_abs = 2e-6, tol_rel = 2e-5;
    char name[96];
    memset(&solo_desc, 0, sizeof solo_desc);
    solo_desc.world_size = 1;
    if (!model || !reference) { printf("FAIL equivalence: out of memory\n"); return 1; }
    if (ddp_init(&ddp, desc) != DDP_OK || ddp_init(&solo, &solo_desc) != DDP_OK) {
        fprintf(stderr, "%s\n", ddp_last_error(ddp));
        return 1;
    }
    rank = ddp_rank(ddp);
    world = ddp_world_size(ddp);
    if (GLOBAL_BATCH % (world * MICRO)) { printf("FAIL equivalence: world %d must divide %d\n", world, GLOBAL_BATCH / MICRO); return 1; }
    for (micro = 1; micro <= MICRO; micro++) {
        ddp_context *d = ddp;
        if (micro == 2) {   /* a fresh process group for the accumulation run */
            ddp_desc again;
            ddp_shutdown(ddp);
            ddp_shutdown(solo);
            ddp_init(&solo, &solo_desc);
            /* the first store's port may linger (TIME_WAIT: Windows' exclusive bind refuses it): a
               second one, probed free before the ranks started */
            if (desc) { again = *desc; again.master_port = reinit_port; }
            if (ddp_init(&d, desc ? &again : NULL) != DDP_OK) { printf("FAIL reinit: %s\n", ddp_last_error(d)); return 1; }
        }
        memset(model, 0, sizeof *model);
        memset(reference, 0, sizeof *reference);
        if (mlp_init(model, d) != DDP_OK || mlp_init(reference, solo) != DDP_OK) {
            printf("FAIL init: %s / %s\n", ddp_last_error(d), ddp_last_error(solo));
            return 1;
        }
        for (step = 0; step < STEPS; step++) {
            int n = GLOBAL_BATCH / world;
            if (mlp_step(model, step, rank * n, n, micro) != DDP_OK) {
                printf("FAIL equivalence_ranks%d: step %d: %s\n", world, step, ddp_last_error(d));
                return 1;
            }
            if (mlp_step(reference, step, 0, GLOBAL_BATCH, 1) != DDP_OK) {
                printf("FAIL reference: %s\n", ddp_last_error(solo));
                return 1;
            }
        }
        {
            const float *got = ddp_flat_params(d, &count), *want = ddp_flat_params(solo, NULL);
            uint64_t mine = test_hash(got, count * sizeof(float)), rank0 = mine;
            float fails;
            for (i = 0; i < count; i++) {
                double err = fabs((double)got[i] - want[i]), tol = tol_abs + tol_rel * fabs(want[i]);
                if (err > tol) bad++;
                if (err / tol > worst) worst = err / tol;
            }
            ddp_broadcast(d, &rank0, sizeof rank0, 0);
            fails = (float)bad;
            ddp_allreduce(d, &fails, 1, DDP_SUM);
            failures += fails != 0;
            snprintf(name, sizeof name, "equivalence_ranks%d_accum%d_vs_1rank_batch%d", world, micro, GLOBAL_BATCH);
            if (loud) {
                verdict(fails == 0, name, "%g parameter(s) beyond |err| <= %g + %g*|ref| (worst %.2f of tolerance)",
                        fails, tol_abs, tol_rel, worst);
                printf("  (%s: worst error %.3f of the tolerance |err| <= %g + %g*|ref|)\n", name, worst, tol_abs, tol_rel);
                printf("params_hash ranks%d_accum%d %016llx reference %016llx\n", world, micro, (unsigned long long)rank0,
                       (unsigned long long)test_hash(want, count * sizeof(float)));
            }
            fails = (float)(rank0 != mine);
            ddp_allreduce(d, &fails, 1, DDP_SUM);
            failures += fails != 0;
            snprintf(name, sizeof name, "equivalence_ranks%d_accum%d_bitwise_identical_across_ranks", world, micro);
            if (loud) verdict(fails == 0, name, "%g rank(s) differ from rank 0", fails);
            if (world == 1 && micro == 1 && loud) {   /* one rank through ddp.h is the reference, bit for bit */
                verdict(memcmp(got, want, count * sizeof(float)) == 0, "equivalence_ranks1_bitwise_equals_reference", "differs");
            }
        }
        ddp = d;
    }
    ddp_shutdown(solo);
    if (ddp_shutdown(ddp) != DDP_OK) { printf("FAIL shutdown: %s\n", ddp_last_error(ddp)); return 1; }
    free(model);
    free(reference);
    return failures;
}

typedef struct { ddp_desc desc; int failures; } thread_rank;
static void *thread_rank_main(void *arg) {
    thread_rank *t = (thread_rank *)arg;
    t->failures = run_rank(&t->desc, t->desc.rank == 0);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--threads")) {   /* ranks as threads of this process */
        thread_rank ranks[16];
        pthread_t threads[16];
        int world = atoi(argv[2]), r, port = test_free_port(), failures = 0;
        reinit_port = test_free_port();
        if (reinit_port == port) reinit_port = port + 1;
        if (world < 1 || world > 16) { printf("FAIL equivalence: --threads takes 1 to 16\n"); return 2; }
        for (r = 0; r < world; r++) {
            memset(&ranks[r], 0, sizeof ranks[r]);
            ranks[r].desc.world_size = world;
            ranks[r].desc.rank = r;
            ranks[r].desc.master_port = port;
            ranks[r].desc.timeout_s = 60;
            ranks[r].desc.job_token = "test-equivalence-threads";
            pthread_create(&threads[r], NULL, thread_rank_main, &ranks[r]);
        }
        for (r = 0; r < world; r++) { pthread_join(threads[r], NULL); failures += ranks[r].failures; }
        if (failures && !test_failures) printf("FAIL equivalence_threads%d: a rank saw %d failure(s)\n", world, failures);
        return failures || test_failures ? 1 : test_summary("test_equivalence");
    }
    if (argc != 1) { printf("usage: test_equivalence [--threads N]   (without it: launched by ddprun)\n"); return 2; }
    {
        const char *rank = getenv("RANK");
#ifdef _WIN32
        const char *null_device = "NUL";
#else
        const char *null_device = "/dev/null";
#endif
        if (rank && strcmp(rank, "0")) { FILE *quiet = freopen(null_device, "w", stdout); (void)quiet; }
    }
    if (run_rank(NULL, 1) && !test_failures) return 1;
    return test_summary("test_equivalence");
}
