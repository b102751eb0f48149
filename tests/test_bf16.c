/* test_bf16.c — gradient buckets reduced in bf16 (reduce_dtype = DDP_DTYPE_BF16) on the CPU
   backend: the average against a float64 reference within bf16 rounding, the result made of
   bf16 values (so bf16 really went over the wire), the same bits on every rank, NaN kept, and a
   rank with another reduce dtype refused at commit. Also the rounding itself, on chosen bits.
   Run: build/ddprun -n N build/test_bf16      (N >= 2) */
#include "testlib.h"

static float bits_to_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* Round-to-nearest-even on the bits that decide it, NaN and overflow included. */
static void test_rounding(void) {
    static const struct { uint32_t in; uint16_t out; } cases[] = {
        { 0x3f800000u, 0x3f80 },   /* 1.0 */
        { 0x3f808000u, 0x3f80 },   /* tie, even below: stays */
        { 0x3f818000u, 0x3f82 },   /* tie, odd below: rounds up to even */
        { 0x3f808001u, 0x3f81 },   /* just above the tie */
        { 0xbf807fffu, 0xbf80 },   /* just below the tie, negative */
        { 0x7f7fffffu, 0x7f80 },   /* the largest float rounds to infinity */
        { 0x7f800000u, 0x7f80 },   /* inf */
        { 0xff800000u, 0xff80 },   /* -inf */
        { 0x7f800001u, 0x7fc0 },   /* a NaN whose payload is only in the low bits stays NaN */
        { 0xffc00000u, 0xffc0 },   /* -NaN keeps its sign */
        { 0x00000001u, 0x0000 },   /* the smallest subnormal rounds to zero */
        { 0x80000000u, 0x8000 },   /* -0 */
    };
    size_t i;
    int ok = 1;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t got = ddp__to_bf16(bits_to_float(cases[i].in));
        if (got != cases[i].out) { ok = 0; printf("  0x%08x -> 0x%04x, want 0x%04x\n", cases[i].in, got, cases[i].out); }
    }
    for (i = 0; i < 65536; i++) {   /* every bf16 widens and narrows back to itself (NaNs quieted) */
        uint16_t h = (uint16_t)i, back = ddp__to_bf16(ddp__from_bf16(h));
        if (back != h && !((h & 0x7fff) > 0x7f80 && back == (h | 0x40))) ok = 0;
    }
    verdict(ok, "bf16_round_to_nearest_even", "see the lines above");
}

enum { NP = 3 };
static const size_t sizes[NP] = { 1000, 300001, 17 };   /* the middle one spans several chunks */

/* Rank r's gradient element i of parameter k: values from 1e-3 to 1e3 in magnitude. */
static float grad_value(int r, int k, size_t i) {
    float u = test_value((uint64_t)(100 * r + k), i);
    float scale = powf(10.0f, (float)(int)(i % 7) - 3.0f);
    return u * scale;
}

int main(void) {
    ddp_context *ddp;
    ddp_desc d;
    int ids[NP], k, rank, world, bad = 0, not_bf16 = 0, s;
    double worst = 0;
    char name[128];
    memset(&d, 0, sizeof d);
    d.reduce_dtype = DDP_DTYPE_BF16;
    if (ddp_init(&ddp, &d) != DDP_OK) { printf("FAIL bf16_init: %s\n", ddp_last_error(ddp)); return 1; }
    rank = ddp_rank(ddp);
    world = ddp_world_size(ddp);
    test_quiet_others(rank);
    if (rank == 0) test_rounding();
    if (world < 2) { printf("SKIP bf16 reduction: needs 2 or more ranks\n"); ddp_shutdown(ddp); return 0; }

    for (k = 0; k < NP; k++) {
        snprintf(name, sizeof name, "p%d", k);
        ddp_register_param(ddp, name, sizes[k], 0, NULL, &ids[k]);
    }
    if (ddp_commit(ddp) != DDP_OK) { printf("FAIL bf16_commit: %s\n", ddp_last_error(ddp)); return 1; }
    ddp_zero_grad(ddp);
    for (k = 0; k < NP; k++) {
        float *g = ddp_grad(ddp, ids[k]);
        size_t i;
        for (i = 0; i < sizes[k]; i++) g[i] = grad_value(rank, k, i);
    }
    ddp_grad(ddp, ids[2])[5] = rank == world - 1 ? NAN : 1.0f;   /* one NaN on one rank */
    for (k = NP - 1; k >= 0; k--) ddp_grad_ready(ddp, ids[k]);
    if (ddp_finish(ddp) != DDP_OK) { printf("FAIL bf16_finish: %s\n", ddp_last_error(ddp)); return 1; }

    for (k = 0; k < NP; k++) {
        const float *g = ddp_grad(ddp, ids[k]);
        size_t i;
        for (i = 0; i < sizes[k]; i++) {
            double ref = 0, mag = 0, err, tol;
            uint32_t u;
            if (k == 2 && i == 5) continue;
            for (s = 0; s < world; s++) { ref += grad_value(s, k, i); mag += fabs(grad_value(s, k, i)); }
            ref /= world; mag /= world;
            /* each input and the average rounded to 8 significant bits (at most 2^-8 relative
               each); the float sum of world terms adds a few 2^-24 */
            tol = 0x1p-8 * ((1 + 0x1p-7) * mag + fabs(ref)) + 1e-30;
            err = fabs((double)g[i] - ref);
            if (err > tol) bad++;
            if (err / tol > worst) worst = err / tol;
            memcpy(&u, &g[i], 4);
            if (u & 0xffffu) not_bf16++;
        }
    }
    snprintf(name, sizeof name, "bf16_allreduce_ranks%d_vs_float64", world);
    verdict(bad == 0, name, "%d element(s) beyond 2^-8 * (mean|x| + |avg|) (worst %.2f of tolerance)", bad, worst);
    printf("  (%s: worst error %.3f of the bf16 tolerance)\n", name, worst);
    verdict(not_bf16 == 0, "bf16_allreduce_result_is_bf16", "%d element(s) have low mantissa bits set", not_bf16);
    verdict(isnan(ddp_grad(ddp, ids[2])[5]), "bf16_allreduce_keeps_nan", "got %g", ddp_grad(ddp, ids[2])[5]);
    {
        size_t count;
        const float *all = ddp_flat_grads(ddp, &count);
        uint64_t mine = test_hash(all, count * sizeof(float)), rank0 = mine;
        float differ;
        ddp_broadcast(ddp, &rank0, sizeof rank0, 0);
        differ = (float)(mine != rank0);
        ddp_allreduce(ddp, &differ, 1, DDP_SUM);
        verdict(differ == 0, "bf16_allreduce_bitwise_identical_across_ranks", "%g rank(s) differ from rank 0", differ);
    }
    ddp_shutdown(ddp);

    /* Rank 0 reduces in fp32, the others in bf16: refused at commit, on every rank. */
    memset(&d, 0, sizeof d);
    d.reduce_dtype = rank == 0 ? DDP_DTYPE_FP32 : DDP_DTYPE_BF16;
    if (ddp_init(&ddp, &d) != DDP_OK) { printf("FAIL bf16_reinit: %s\n", ddp_last_error(ddp)); return 1; }
    ddp_register_param(ddp, "w", 64, 0, NULL, &ids[0]);
    {
        ddp_result r = ddp_commit(ddp);
        const char *msg = ddp_last_error(ddp);
        verdict(r == DDP_ERR_MISMATCH && strstr(msg, "reduce fp32") && strstr(msg, "reduce bf16") && strstr(msg, "reduce_dtype"),
                "bf16_mismatched_reduce_dtype_refused", "result %d: %s", (int)r, msg);
    }
    ddp_shutdown(ddp);
    return test_summary("test_bf16");
}
