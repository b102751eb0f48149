/* test_sampler.c — the distributed sampler (ddp_sampler, ddp_sample, ddp_sampler_count).
   Without a launcher: every property computed for every rank of a world in this one process, no
   context at all (the sampler needs none). Under ddprun -n N: the same shares taken by N real
   processes, their coverage summed with ddp_allreduce and every rank's view of the whole epoch
   compared with rank 0's.
     - counts: PyTorch's formulas, written out here independently (padding: ceil(n/world);
       drop_last: ceil((n - world)/world) when n is not a multiple, else n/world)
     - each epoch's shares are disjoint and cover the dataset: with padding every sample at least
       once and the extra world*count - n ones are the epoch's first positions again; with
       drop_last every sample at most once and exactly floor(n/world)*world distinct; for many
       (n, world), n < world, n = 1, primes, shuffle on and off
     - shuffle off is the dataset's order split like PyTorch's (rank r: r, r + world, ...)
     - the permutation is the same for every rank and world, differs across epochs and seeds,
       and is uniform: n = 5, all 120 orders (chi-square); n = 40, 100, pairs of positions
     - n = 2^40, 2^62 + 1 and 2^64 - 1 at sample positions: in range, no two positions alike
     - resuming mid-epoch from a stored (epoch, i) continues the same sequence
     - bad input: each a named DDP_ERR_INVALID_ARGUMENT, *index_out = UINT64_MAX */
#include "testlib.h"
#include <math.h>
#include <stdlib.h>

static uint64_t torch_count(uint64_t n, int world, int drop_last) {
    uint64_t w = (uint64_t)world;
    if (drop_last && n % w) return n < w ? 0 : (n - w + w - 1) / w;   /* ceil((n - w)/w): 0 when n < w */
    return n / w + (n % w != 0);                                        /* ceil(n/w), without overflow */
}

static uint64_t sample_of(const ddp_sampler *s, uint64_t epoch, uint64_t i) {
    uint64_t x = UINT64_MAX;
    if (ddp_sample(s, epoch, i, &x) != DDP_OK) {
        printf("FAIL sampler_unexpected_error: %s\n", ddp_last_error(NULL));
        test_failures++;
    }
    return x;
}

/* The epoch's global sequence (world*count entries, position i*world + r from rank r's sampler)
   into seq; returns its length, or 0 on a failure already reported. */
static uint64_t global_sequence(uint64_t n, int world, uint64_t seed, int shuffle, int drop_last, uint64_t epoch, uint64_t *seq) {
    ddp_sampler s;
    uint64_t count = 0, i;
    int r;
    memset(&s, 0, sizeof s);
    s.n = n; s.world = world; s.seed = seed; s.shuffle = shuffle; s.drop_last = drop_last;
    for (r = 0; r < world; r++) {
        uint64_t c;
        s.rank = r;
        if (ddp_sampler_count(&s, &c) != DDP_OK) { printf("FAIL sampler_count: %s\n", ddp_last_error(NULL)); test_failures++; return 0; }
        if (r > 0 && c != count) return 0;
        count = c;
        for (i = 0; i < count; i++) seq[i * (uint64_t)world + (uint64_t)r] = sample_of(&s, epoch, i);
    }
    return count * (uint64_t)world;
}

/* Disjoint and complete cover, counts, padding rule, unshuffled order: for many (n, world). */
static void test_cover(void) {
    static const uint64_t ns[] = { 1, 2, 3, 4, 5, 7, 8, 13, 31, 64, 97, 100, 127, 1000, 1031, 4096, 10007 };
    static const int worlds[] = { 1, 2, 3, 4, 7, 8, 16, 64 };
    uint64_t *seq = (uint64_t *)malloc(sizeof(uint64_t) * (10007 + 64)), *hits = (uint64_t *)malloc(sizeof(uint64_t) * 10007);
    unsigned a, b;
    int shuffle, drop, cases = 0, bad_count = 0, bad_cover = 0, bad_pad = 0, bad_order = 0;
    char first[512] = "";
    for (a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (b = 0; b < sizeof worlds / sizeof worlds[0]; b++)
            for (shuffle = 0; shuffle <= 1; shuffle++)
                for (drop = 0; drop <= 1; drop++) {
                    uint64_t n = ns[a], epoch, total, want = torch_count(n, worlds[b], drop), g, distinct;
                    int w = worlds[b];
                    for (epoch = 0; epoch < 2; epoch++) {
                        cases++;
                        total = global_sequence(n, w, 99, shuffle, drop, epoch * 7, seq);
                        if (total != want * (uint64_t)w) {
                            if (!bad_count++) snprintf(first, sizeof first, "n %llu world %d drop_last %d: %llu a rank, PyTorch %llu",
                                                       (unsigned long long)n, w, drop, (unsigned long long)(total / (uint64_t)w), (unsigned long long)want);
                            continue;
                        }
                        memset(hits, 0, sizeof(uint64_t) * n);
                        for (g = 0; g < total; g++) {
                            if (seq[g] >= n) { bad_cover++; break; }
                            hits[seq[g]]++;
                        }
                        for (g = 0, distinct = 0; g < n; g++) distinct += hits[g] > 0;
                        /* padding: every sample, and the extras repeat the first positions; drop: none twice */
                        if (drop ? distinct != total : distinct != n) {
                            if (!bad_cover++) snprintf(first, sizeof first, "n %llu world %d shuffle %d drop_last %d epoch %llu: %llu distinct of %llu",
                                                       (unsigned long long)n, w, shuffle, drop, (unsigned long long)epoch,
                                                       (unsigned long long)distinct, (unsigned long long)total);
                        }
                        for (g = n; g < total; g++)
                            if (seq[g] != seq[g % n]) { if (!bad_pad++) snprintf(first, sizeof first, "n %llu world %d: padded position %llu is not position %llu again",
                                                                                (unsigned long long)n, w, (unsigned long long)g, (unsigned long long)(g % n)); break; }
                        if (!shuffle)
                            for (g = 0; g < total; g++)
                                if (seq[g] != g % n) { if (!bad_order++) snprintf(first, sizeof first, "n %llu world %d: unshuffled position %llu holds %llu",
                                                                                 (unsigned long long)n, w, (unsigned long long)g, (unsigned long long)seq[g]); break; }
                    }
                }
    verdict(bad_count == 0, "sampler_counts_equal_pytorch_formula", "%d case(s); first: %s", bad_count, first);
    verdict(bad_cover == 0, "sampler_epoch_disjoint_and_complete", "%d case(s); first: %s", bad_cover, first);
    verdict(bad_pad == 0, "sampler_padding_repeats_first_samples", "%d case(s); first: %s", bad_pad, first);
    verdict(bad_order == 0, "sampler_unshuffled_is_dataset_order_split_by_rank", "%d case(s); first: %s", bad_order, first);
    printf("  (%d cases: %u sizes incl. n < world, n = 1, primes; worlds 1..64; shuffle and drop_last on and off; 2 epochs)\n",
           cases, (unsigned)(sizeof ns / sizeof ns[0]));
    free(seq);
    free(hits);
}

/* The permutation: the same whatever the world, different across epochs and seeds, and uniform. */
static void test_permutation(void) {
    enum { N = 1000 };
    static uint64_t base[N], other[N + 16];
    uint64_t i, same;
    int w, ok = 1, fixed = 0, e;
    global_sequence(N, 1, 5, 1, 0, 3, base);
    for (i = 0; i < N; i++) fixed += base[i] == i;
    /* a random permutation of 1000 has ~1 fixed point; the identity or a rotation would have 1000 or 0 with structure */
    verdict(fixed < 10, "sampler_shuffle_moves_samples", "%d of %d samples stay in place", fixed, N);
    for (w = 2; w <= 16 && ok; w++) {   /* drop_last keeps only positions < floor(n/w)*w: compare those */
        uint64_t total = global_sequence(N, w, 5, 1, 1, 3, other);
        for (i = 0; i < total; i++) if (other[i] != base[i]) { ok = 0; break; }
        if (!ok) verdict(0, "sampler_permutation_independent_of_world", "world %d differs at position %llu", w, (unsigned long long)i);
    }
    if (ok) verdict(1, "sampler_permutation_independent_of_world", "");
    for (e = 0; e < 2; e++) {   /* e = 0: another epoch, e = 1: another seed */
        global_sequence(N, 1, e ? 6 : 5, 1, 0, e ? 3 : 4, other);
        for (i = 0, same = 0; i < N; i++) same += other[i] == base[i];
        verdict(same < 10, e ? "sampler_differs_across_seeds" : "sampler_differs_across_epochs",
                "%llu of %d positions hold the same sample", (unsigned long long)same, N);
    }
    {   /* n = 5 (the exact shuffle): over 24000 epochs every one of the 120 orders, chi-square */
        static int seen[5 * 5 * 5 * 5 * 5];
        int orders = 0, k;
        uint64_t seq[5], epoch;
        double chi = 0, z;
        memset(seen, 0, sizeof seen);
        for (epoch = 0; epoch < 24000; epoch++) {
            global_sequence(5, 1, 11, 1, 0, epoch, seq);
            seen[(((seq[0] * 5 + seq[1]) * 5 + seq[2]) * 5 + seq[3]) * 5 + seq[4]]++;
        }
        for (k = 0; k < 3125; k++)
            if (seen[k]) { orders++; chi += (seen[k] - 200.0) * (seen[k] - 200.0) / 200.0; }
        z = (chi - 119) / sqrt(2.0 * 119);   /* chi-square with 119 degrees of freedom, as a z-score */
        verdict(orders == 120 && z < 5, "sampler_orders_uniform_n5", "%d distinct orders of 120, chi-square %.1f (z %.1f; uniform: 119 +- 15)", orders, chi, z);
        printf("  (n = 5, 24000 epochs: %d orders, chi-square %.1f for 119 degrees of freedom)\n", orders, chi);
    }
    {   /* n = 40 and 100 (the Feistel network): the pair (sample at position 3, at the last) over
           100 x n(n-1) epochs, chi-square over the n(n-1) pairs */
        static const int sizes[] = { 40, 100 };
        int a;
        for (a = 0; a < 2; a++) {
            ddp_sampler s;
            uint64_t cells = (uint64_t)sizes[a] * (uint64_t)(sizes[a] - 1), epoch, k, n = (uint64_t)sizes[a];
            int *cnt = (int *)calloc(cells, sizeof(int));
            double chi = 0, z;
            char name[64];
            memset(&s, 0, sizeof s);
            s.n = n; s.world = 1; s.seed = 1; s.shuffle = 1;
            for (epoch = 0; epoch < 100 * cells; epoch++) {
                uint64_t x = sample_of(&s, epoch, 3), y = sample_of(&s, epoch, n - 1);
                cnt[x * (n - 1) + (y > x ? y - 1 : y)]++;
            }
            for (k = 0; k < cells; k++) chi += (cnt[k] - 100.0) * (cnt[k] - 100.0) / 100.0;
            z = (chi - (double)(cells - 1)) / sqrt(2.0 * (double)(cells - 1));
            snprintf(name, sizeof name, "sampler_pairs_uniform_n%d", sizes[a]);
            verdict(fabs(z) < 5, name, "chi-square %.0f for %llu degrees of freedom (z %.1f)", chi, (unsigned long long)(cells - 1), z);
            printf("  (n = %d: chi-square %.0f for %llu degrees of freedom, z %.1f)\n", sizes[a], chi, (unsigned long long)(cells - 1), z);
            free(cnt);
        }
    }
}

/* Huge datasets at sample positions only (each rank's first and last 256 of epoch 1): indices in
   range, no two positions alike except the padded ones (the last positions of the epoch repeat
   its first: count*world - n of them), spread over the range, padding and drop_last agreeing. */
static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}
static void test_large(void) {
    static const uint64_t ns[] = { 1ull << 40, (1ull << 62) + 1, UINT64_MAX };
    static const char *names[] = { "2pow40", "2pow62_plus_1", "2pow64_minus_1" };
    enum { WORLD = 8, PER_RANK = 512 };
    static uint64_t got[WORLD * PER_RANK], first_pad[64];
    unsigned a;
    for (a = 0; a < 3; a++) {
        int drop;
        for (drop = 0; drop <= 1; drop++) {
            ddp_sampler s;
            uint64_t count, i, m = 0, dup = 0, want_dup, out = 0, moved = 0, upper = 0, agree = 0;
            int r;
            char name[96];
            memset(&s, 0, sizeof s);
            s.n = ns[a]; s.world = WORLD; s.seed = 3; s.shuffle = 1; s.drop_last = drop;
            ddp_sampler_count(&s, &count);
            want_dup = drop ? 0 : count * WORLD - s.n;   /* mod 2^64: right even where count*WORLD is 2^64 */
            for (r = 0; r < WORLD; r++) {
                s.rank = r;
                for (i = 0; i < PER_RANK; i++) {
                    uint64_t pos = i < PER_RANK / 2 ? i : count - (PER_RANK - i);
                    uint64_t x = sample_of(&s, 1, pos);
                    out += x >= s.n;
                    moved += x != pos * WORLD + (uint64_t)r;
                    upper += x >= s.n / 2;
                    if (r == 0 && i < 64) { if (drop) agree += x == first_pad[i]; else first_pad[i] = x; }
                    got[m++] = x;
                }
            }
            qsort(got, m, sizeof got[0], cmp_u64);
            for (i = 1; i < m; i++) dup += got[i] == got[i - 1];
            snprintf(name, sizeof name, "sampler_large_n_%s_%s", names[a], drop ? "drop_last" : "padded");
            verdict(out == 0 && count == torch_count(s.n, WORLD, drop) && dup == want_dup && moved > m - 8 &&
                    upper > m / 4 && upper < 3 * m / 4 && (!drop || agree == 64), name,
                    "%llu out of range, count %llu (PyTorch %llu), %llu repeats (want %llu) of %llu, %llu moved, %llu in the upper "
                    "half, %llu of 64 first positions as padded", (unsigned long long)out, (unsigned long long)count,
                    (unsigned long long)torch_count(s.n, WORLD, drop), (unsigned long long)dup, (unsigned long long)want_dup,
                    (unsigned long long)m, (unsigned long long)moved, (unsigned long long)upper, (unsigned long long)agree);
        }
    }
}

/* A loader that stops after k samples, stores (epoch, i) as bytes, and a fresh sampler continues. */
static void test_resume(void) {
    ddp_sampler s;
    uint64_t count, straight[300], resumed[300], k, epoch, i;
    unsigned char saved[16];
    int ok = 1, rank;
    for (rank = 0; rank < 3 && ok; rank++) {
        memset(&s, 0, sizeof s);
        s.n = 101; s.world = 3; s.rank = rank; s.seed = 8; s.shuffle = 1;
        ddp_sampler_count(&s, &count);   /* 34: 300 samples cross 8 epochs */
        for (k = 0; k < 300; k++) straight[k] = sample_of(&s, k / count, k % count);
        for (k = 0; k < 137; k++) resumed[k] = sample_of(&s, k / count, k % count);
        epoch = 137 / count; i = 137 % count;   /* the checkpoint: mid-epoch */
        memcpy(saved, &epoch, 8); memcpy(saved + 8, &i, 8);
        {
            ddp_sampler fresh;
            memset(&fresh, 0, sizeof fresh);
            fresh.n = 101; fresh.world = 3; fresh.rank = rank; fresh.seed = 8; fresh.shuffle = 1;
            memcpy(&epoch, saved, 8); memcpy(&i, saved + 8, 8);
            for (k = 137; k < 300; k++) {
                resumed[k] = sample_of(&fresh, epoch, i);
                if (++i == count) { i = 0; epoch++; }
            }
        }
        ok = memcmp(straight, resumed, sizeof straight) == 0 && 137 % count != 0;
    }
    verdict(ok, "sampler_resume_mid_epoch_same_sequence", "rank %d: the resumed sequence differs", rank - 1);
}

/* Bad input: a named error, nothing read past the struct, *index_out = UINT64_MAX. */
static void expect_error(const char *name, ddp_result r, uint64_t out, const char *words) {
    verdict(r == DDP_ERR_INVALID_ARGUMENT && out == UINT64_MAX && strstr(ddp_last_error(NULL), words), name,
            "result %d, index %llu, message '%s' (want '%s')", (int)r, (unsigned long long)out, ddp_last_error(NULL), words);
}
static void test_bad_input(void) {
    ddp_sampler s;
    uint64_t x, count = 7;
    ddp_result r;
    memset(&s, 0, sizeof s);
    s.n = 10; s.world = 4; s.rank = 1; s.shuffle = 1;
    x = 0; r = ddp_sample(NULL, 0, 0, &x); expect_error("sampler_null_named", r, x, "ddp_sample: the sampler is NULL");
    s.n = 0; x = 0; r = ddp_sample(&s, 0, 0, &x); expect_error("sampler_empty_dataset_named", r, x, "rank 1: the sampler's dataset is empty (n = 0)");
    s.n = 10; s.world = 0; x = 0; r = ddp_sample(&s, 0, 0, &x); expect_error("sampler_world_0_named", r, x, "the sampler's world is 0; it must be >= 1");
    s.world = -3; x = 0; r = ddp_sample(&s, 0, 0, &x); expect_error("sampler_world_negative_named", r, x, "the sampler's world is -3");
    s.world = 4; s.rank = 4; x = 0; r = ddp_sample(&s, 0, 0, &x); expect_error("sampler_rank_too_large_named", r, x, "rank 4 is out of range for world 4 (0 .. 3)");
    s.rank = -1; x = 0; r = ddp_sample(&s, 0, 0, &x); expect_error("sampler_rank_negative_named", r, x, "rank -1 is out of range for world 4");
    s.rank = 2; x = 0; r = ddp_sample(&s, 5, 3, &x);
    expect_error("sampler_position_past_count_named", r, x, "ddp_sample: rank 2: position 3 is past this rank's 3 sample(s) an epoch (n = 10, world 4, padded: ceil(n/world))");
    s.drop_last = 1; x = 0; r = ddp_sample(&s, 5, 2, &x);
    expect_error("sampler_position_past_drop_last_count_named", r, x, "position 2 is past this rank's 2 sample(s) an epoch (n = 10, world 4, drop_last: floor(n/world))");
    s.n = 3; s.world = 4; s.rank = 3; x = 0; r = ddp_sample(&s, 0, 0, &x);   /* drop_last with n < world: nothing for anyone */
    expect_error("sampler_drop_last_fewer_samples_than_ranks", r, x, "position 0 is past this rank's 0 sample(s)");
    r = ddp_sample(&s, 0, 0, NULL);
    verdict(r == DDP_ERR_INVALID_ARGUMENT && strstr(ddp_last_error(NULL), "index_out is NULL"), "sampler_null_out_named", "%s", ddp_last_error(NULL));
    r = ddp_sampler_count(&s, NULL);
    verdict(r == DDP_ERR_INVALID_ARGUMENT && strstr(ddp_last_error(NULL), "count_out is NULL"), "sampler_count_null_out_named", "%s", ddp_last_error(NULL));
    s.world = 0; r = ddp_sampler_count(&s, &count);
    verdict(r == DDP_ERR_INVALID_ARGUMENT && count == 0 && strstr(ddp_last_error(NULL), "ddp_sampler_count: the sampler's world is 0"),
            "sampler_count_bad_world_named", "result %d, count %llu, '%s'", (int)r, (unsigned long long)count, ddp_last_error(NULL));
}

/* N real processes: each takes its own share of epochs of several datasets; the summed coverage
   is exact, and every rank's view of the whole epoch has rank 0's bits. */
static int test_processes(void) {
    static const uint64_t ns[] = { 1, 2, 5, 97, 1000, 1031 };
    ddp_context *ddp;
    unsigned a;
    int rank, world, drop, bad = 0, differ = 0;
    static float hits[1031];
    static uint64_t seq[1031 + 64];
    if (ddp_init(&ddp, NULL) != DDP_OK) { printf("FAIL sampler_ddp_init: %s\n", ddp_last_error(ddp)); ddp_shutdown(ddp); return 0; }
    rank = ddp_rank(ddp);
    world = ddp_world_size(ddp);
    test_quiet_others(rank);
    for (a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (drop = 0; drop <= 1; drop++) {
            ddp_sampler s;
            uint64_t count, i, total, want, mine, rank0, k;
            float covered = 0, extra = 0;
            memset(&s, 0, sizeof s);
            s.n = ns[a]; s.world = world; s.rank = rank; s.seed = 2026; s.shuffle = 1; s.drop_last = drop;
            memset(hits, 0, sizeof hits);
            ddp_sampler_count(&s, &count);
            for (i = 0; i < count; i++) hits[sample_of(&s, 4, i)] += 1.0f;
            if (ddp_allreduce(ddp, hits, (size_t)s.n, DDP_SUM) != DDP_OK) { printf("FAIL sampler_allreduce: %s\n", ddp_last_error(ddp)); bad++; break; }
            total = count * (uint64_t)world;
            for (k = 0; k < s.n; k++) { covered += hits[k] > 0; extra += hits[k] > 1 ? hits[k] - 1 : 0; }
            want = drop ? total : s.n;
            if ((uint64_t)covered != want || (drop && extra != 0) || (!drop && (uint64_t)(covered + extra) != total)) bad++;
            global_sequence(s.n, world, 2026, 1, drop, 4, seq);
            mine = rank0 = test_hash(seq, sizeof(uint64_t) * total);
            ddp_broadcast(ddp, &rank0, sizeof rank0, 0);
            differ += mine != rank0;
        }
    {
        float f[2] = { (float)bad, (float)differ };
        ddp_allreduce(ddp, f, 2, DDP_SUM);
        verdict(f[0] == 0, "sampler_processes_disjoint_complete_cover", "%g case(s) where %d processes' shares do not cover the epoch exactly", f[0], world);
        verdict(f[1] == 0, "sampler_processes_same_permutation_every_rank", "%g rank-case(s) differ from rank 0", f[1]);
        if (rank == 0) printf("  (%d processes, 6 dataset sizes incl. n = 1 < world, padding and drop_last)\n", world);
    }
    return ddp_shutdown(ddp) == DDP_OK;
}

int main(void) {
    if (getenv("WORLD_SIZE")) {   /* under a launcher: the multi-process half only */
        if (!test_processes()) test_failures++;
        return test_failures ? 1 : 0;
    }
    test_cover();
    test_permutation();
    test_large();
    test_resume();
    test_bad_input();
    printf("test_sampler: %d failure(s)\n", test_failures);
    return test_failures ? 1 : 0;
}
