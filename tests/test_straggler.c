/* test_straggler.c — stragglers made visible (ddp_step_stats.slowest_rank and the straggler_*
   waits, the timeline's "wait for rank N"). Three ranks as threads of this process; for some steps
   rank 2 sleeps DELAY_MS before its backward (a slow forward, a slow data loader). Every rank must
   name rank 2, ranks 0 and 1 must have waited most of the delay, rank 2 itself hardly at all, and
   the timeline must hold the waits. Without the delay no rank waits long; a step with sync off
   and a world of one know no straggler (-1). Run: build/test_straggler */
#include "testlib.h"

enum { WORLD = 3, SLOW = 2, LAYERS = 4, LAYER_FLOATS = 256 * 1024, STEPS = 4, DELAY_MS = 150 };

typedef struct rank_out {
    ddp_step_stats before, calm[STEPS], slow[STEPS], off;
    char error[1100];
} rank_out;

static rank_out outs[WORLD];
static char trace_path[256];

typedef struct layer_args { ddp_context *ctx; int id; } layer_args;
static void layer_backward(void *p) {
    const layer_args *a = (const layer_args *)p;
    ddp_grad(a->ctx, a->id)[0] += 1.0f;
}

static int one_step(ddp_context *ctx, const int *ids, int sleep_ms) {
    int l;
    ddp_zero_grad(ctx);
    for (l = 0; l < LAYERS; l++) {
        layer_args a;
        a.ctx = ctx; a.id = ids[l];
        if (ddp_tape_record(ctx, layer_backward, &a, sizeof a, &ids[l], 1) != DDP_OK) return 0;
    }
    if (sleep_ms) usleep((unsigned)sleep_ms * 1000u);
    return ddp_backward(ctx) == DDP_OK;
}

static void rank_main(test_rank *self) {
    rank_out *o = &outs[self->rank];
    ddp_desc d = test_desc(self);
    ddp_context *ctx = NULL;
    int ids[LAYERS], l, s, ok = 1;
    d.bucket_cap_mb = d.first_bucket_mb = 1;   /* one layer per bucket: 4 exchanges a step */
    if (self->world > 1) d.timeline_path = trace_path;
    if (ddp_init(&ctx, &d) != DDP_OK) { snprintf(o->error, sizeof o->error, "init: %s", ddp_last_error(ctx)); ddp_shutdown(ctx); return; }
    for (l = 0; l < LAYERS; l++) {
        char name[24];
        snprintf(name, sizeof name, "layer%d", l);
        ok = ok && ddp_register_param(ctx, name, LAYER_FLOATS, 0, NULL, &ids[l]) == DDP_OK;
    }
    ok = ok && ddp_commit(ctx) == DDP_OK;
    o->before = ddp_last_step_stats(ctx);
    ok = ok && one_step(ctx, ids, 0);   /* warm-up */
    for (s = 0; ok && s < STEPS; s++) { ok = one_step(ctx, ids, 0); o->calm[s] = ddp_last_step_stats(ctx); }
    for (s = 0; ok && s < STEPS; s++) {
        ok = one_step(ctx, ids, self->rank == SLOW && self->world > 1 ? DELAY_MS : 0);
        o->slow[s] = ddp_last_step_stats(ctx);
    }
    if (ok) {   /* a micro-step without sync exchanges nothing: no straggler to name */
        ddp_set_sync(ctx, 0);
        ok = one_step(ctx, ids, 0);
        o->off = ddp_last_step_stats(ctx);
        ddp_set_sync(ctx, 1);
        ok = ok && one_step(ctx, ids, 0);
    }
    if (!ok) snprintf(o->error, sizeof o->error, "%s", ddp_last_error(ctx));
    if (ddp_shutdown(ctx) != DDP_OK && ok) snprintf(o->error, sizeof o->error, "shutdown failed");
}

/* The trace's "wait for rank N" events (one a line, as ddp.h writes them): the longest on `pid`. */
static double longest_wait_us(const char *text, int pid, int for_rank) {
    char name[64], want_pid[32];
    const char *p = text;
    double longest = 0;
    snprintf(name, sizeof name, "\"name\":\"wait for rank %d\"", for_rank);
    snprintf(want_pid, sizeof want_pid, "\"pid\":%d,", pid);
    while ((p = strstr(p, name)) != NULL) {
        const char *end = strchr(p, '\n'), *at = strstr(p, want_pid), *dur = strstr(p, "\"dur\":");
        if (!end) end = p + strlen(p);
        if (at && at < end && dur && dur < end && strtod(dur + 6, NULL) > longest) longest = strtod(dur + 6, NULL);
        p = end;
    }
    return longest;
}

#ifndef TEST_SANITIZED
static double median(double *v, int n) {
    int i, j;
    for (i = 1; i < n; i++) for (j = i; j > 0 && v[j] < v[j - 1]; j--) { double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
    return v[n / 2];
}
#endif

int main(void) {
    void *shared[1];
    test_rank ranks[WORLD];
    const double most = 0.75 * DELAY_MS, little = 0.3 * DELAY_MS;
    int r, s, named = 1, waited = 1, itself = 1, off = 1, before = 1;
    double least_wait = 1e9, least_first = 1e9, most_self = 0, calm[STEPS];
    char *text = NULL;
    FILE *f;
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(trace_path, sizeof trace_path, "%s/ddp_test_straggler_%d.json", tmp, (int)getpid());
    shared[0] = (void *)rank_main;
    test_run_ranks(WORLD, shared, ranks);
    for (r = 0; r < WORLD; r++)
        if (outs[r].error[0]) { printf("FAIL straggler_run: rank %d: %s\n", r, outs[r].error); remove(trace_path); return 1; }
    for (r = 0; r < WORLD; r++) {
        before &= outs[r].before.slowest_rank == -1;
        off &= outs[r].off.slowest_rank == -1 && outs[r].off.straggler_wait_ms == 0 && outs[r].off.straggler_spread_ms == 0;
        for (s = 0; s < STEPS; s++) {
            const ddp_step_stats *st = &outs[r].slow[s];
            named &= st->slowest_rank == SLOW;
            waited &= st->straggler_spread_ms >= most;
            if (r == SLOW) { if (st->straggler_wait_ms > most_self) most_self = st->straggler_wait_ms; continue; }
            if (st->straggler_wait_ms < least_wait) least_wait = st->straggler_wait_ms;
            if (st->straggler_first_wait_ms < least_first) least_first = st->straggler_first_wait_ms;
        }
    }
    itself = most_self < little;
    printf("  (slow steps: rank 0 waited %.1f ms for rank %d (first bucket %.1f ms), rank %d itself %.1f ms; spread %.1f ms)\n",
           outs[0].slow[0].straggler_wait_ms, outs[0].slow[0].slowest_rank, outs[0].slow[0].straggler_first_wait_ms, SLOW,
           outs[SLOW].slow[0].straggler_wait_ms, outs[0].slow[0].straggler_spread_ms);
    for (s = 0; s < STEPS; s++) {   /* the calm steps: the most any rank waited in each */
        calm[s] = 0;
        for (r = 0; r < WORLD; r++) if (outs[r].calm[s].straggler_spread_ms > calm[s]) calm[s] = outs[r].calm[s].straggler_spread_ms;
    }
    verdict(before, "straggler_unknown_before_any_step", "slowest_rank %d %d %d", outs[0].before.slowest_rank,
            outs[1].before.slowest_rank, outs[2].before.slowest_rank);
    verdict(named, "straggler_named_by_every_rank", "rank %d slept %d ms before each backward; ranks named %d %d %d (first slow step)",
            SLOW, DELAY_MS, outs[0].slow[0].slowest_rank, outs[1].slow[0].slowest_rank, outs[2].slow[0].slowest_rank);
    verdict(least_wait >= most && least_first >= most, "straggler_others_waited_most_of_the_delay",
            "least wait %.1f ms, least first-bucket wait %.1f ms, want >= %.1f ms", least_wait, least_first, most);
    verdict(waited, "straggler_spread_covers_the_delay", "spread below %.1f ms in a slow step", most);
    verdict(itself, "straggler_itself_hardly_waits", "rank %d waited up to %.1f ms, want < %.1f ms", SLOW, most_self, little);
    verdict(off, "straggler_unknown_without_sync", "a step with sync off: slowest_rank %d, wait %.3f ms",
            outs[0].off.slowest_rank, outs[0].off.straggler_wait_ms);
#ifndef TEST_SANITIZED   /* a sanitizer's slowdown is not a straggler, but it is no calm either */
    {
        double m = median(calm, STEPS);
        verdict(m < little, "straggler_none_without_delay", "median over steps of the longest spread %.1f ms, want < %.1f ms", m, little);
    }
#endif
    /* the timeline: ranks 0 and 1 waited for rank 2, rank 2 for nobody long */
    if ((f = fopen(trace_path, "rb")) != NULL) {
        long n;
        fseek(f, 0, SEEK_END);
        n = ftell(f);
        fseek(f, 0, SEEK_SET);
        if (n > 0 && (text = (char *)malloc((size_t)n + 1)) != NULL) {
            size_t got = fread(text, 1, (size_t)n, f);
            text[got] = 0;
        }
        fclose(f);
    }
    remove(trace_path);
    if (!text) verdict(0, "straggler_on_the_timeline", "no trace at %s", trace_path);
    else {
        double w0 = longest_wait_us(text, 0, SLOW), w1 = longest_wait_us(text, 1, SLOW), self_w = 0;
        for (r = 0; r < WORLD; r++) if (longest_wait_us(text, SLOW, r) > self_w) self_w = longest_wait_us(text, SLOW, r);
        verdict(w0 >= 1e3 * most && w1 >= 1e3 * most && strstr(text, "\"cat\":\"straggler\"") && self_w < 1e3 * little,
                "straggler_on_the_timeline", "longest 'wait for rank %d' on rank 0 %.0f us, rank 1 %.0f us; rank %d's longest wait %.0f us",
                SLOW, w0, w1, SLOW, self_w);
        free(text);
    }
    {   /* one rank: nobody to wait for */
        test_rank one[1];
        rank_out keep = outs[0];
        test_run_ranks(1, shared, one);
        verdict(!outs[0].error[0] && outs[0].slow[0].slowest_rank == -1 && outs[0].slow[0].straggler_wait_ms == 0,
                "straggler_unknown_on_one_rank", "%s slowest_rank %d", outs[0].error, outs[0].slow[0].slowest_rank);
        outs[0] = keep;
    }
    return test_summary("test_straggler");
}
