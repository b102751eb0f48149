/* test_outer_checkpoint.c — checkpoints of the outer sync (ddp_desc.outer; CHECKPOINTS in the
   manual): ranks are threads of this process, every rank its own replica group (group_size 1),
   and each "run" is a fresh process group (a new ddp_init on a new port).

     build/test_outer_checkpoint

   Resume: a run that trains T steps straight, against one that trains k steps, saves, ends, and
   a new run that loads and trains the rest: after the load every rank holds, bit for bit, what
   its rank held at the save (parameters, AdamW m, v, step, the outer parameters, momentum, the
   schedule), and at step T every rank's state equals the straight run's, bit for bit: DiLoCo
   between outer steps and at one, averaging, streaming DiLoCo with a fragment in flight (int8
   and bf16 wires, mixing).
   Changed group counts (2 -> 3, 3 -> 2): group g takes saved group g mod G's parameters, m and v,
   the outer state is every group's; a fragment in flight stays in flight. Another schedule (a
   streaming checkpoint loaded by a DiLoCo run): the fragment in flight lands at the load. The
   outer sync off: group 0's state. Another outer mode (averaging <-> DiLoCo): the outer
   parameters kept, momentum zeros or dropped. A file without outer state into an outer run: the outer
   parameters are the loaded ones, momentum 0, the schedule from its start. A damaged outer
   block: refused by name.
   The library's chunk is made small (DDP__CKPT_CHUNK) so that parameters cross chunk borders. */
#define DDP__CKPT_CHUNK ((size_t)100)
#include "testlib.h"
#include <pthread.h>
#ifndef _WIN32
#include <unistd.h>
#endif

#define MAXR 3
static const size_t sizes[3] = { 1003, 17, 250 };
static const char *const names[3] = { "embed", "bias", "proj" };

typedef struct snap {
    float *params, *m, *v, *theta, *mom;
    size_t n;
    int64_t step;
    ddp_outer_status st;
    size_t frag_lo, frag_hi;   /* the fragment in flight's floats (none: 0, 0) */
} snap;

typedef struct job {
    int world, rank, port;
    ddp_outer outer;
    int from, to;              /* the steps this run trains */
    const char *load, *save;   /* loaded before the steps, saved after them (NULL: none) */
    snap at_load, at_end;
    ddp_checkpoint_info info;
    int failed;
    char err[600];
    float init[3][1003];       /* the initial values, kept until ddp_commit */
} job;

static float *dup_floats(const float *x, size_t n) {
    float *y;
    if (!x) return NULL;
    y = (float *)malloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

static void take_snap(ddp_context *ddp, snap *s) {
    float *m, *v;
    int64_t *step;
    const float *p = ddp_flat_params(ddp, &s->n);
    s->params = dup_floats(p, s->n);
    if (ddp_adamw_state(ddp, &m, &v, &step) == DDP_OK) {
        s->m = dup_floats(m, s->n);
        s->v = dup_floats(v, s->n);
        s->step = *step;
    }
    s->theta = dup_floats(ddp->outer.theta, s->n);   /* the outer state itself: this test sees ddp.h's inside */
    s->mom = dup_floats(ddp->outer.mom, s->n);
    s->st = ddp_outer_state(ddp);
    if (s->st.in_flight >= 0) {
        s->frag_lo = ddp->outer.frag[s->st.in_flight];
        s->frag_hi = ddp->outer.frag[s->st.in_flight + 1];
    }
}

static void free_snap(snap *s) {
    free(s->params); free(s->m); free(s->v); free(s->theta); free(s->mom);
    memset(s, 0, sizeof *s);
}

/* The loss of rank r at step t: 0.5 |p - target(r, t)|^2, so the groups' data differ. */
typedef struct grad_args { ddp_context *ddp; int rank, step; } grad_args;
static void grad_backward(void *a) {
    const grad_args *g = (const grad_args *)a;
    int i;
    for (i = 0; i < 3; i++) {
        const float *p = ddp_param(g->ddp, i);
        float *d = ddp_grad(g->ddp, i);
        size_t k;
        for (k = 0; k < sizes[i]; k++) d[k] += p[k] - test_value((uint64_t)(1000 * g->rank + g->step), k + 7919 * (size_t)i);
    }
}

static void *rank_main(void *arg) {
    job *j = (job *)arg;
    ddp_context *ddp = NULL;
    ddp_desc desc;
    ddp_adamw opt;
    int i, t, ids[3] = { 0, 1, 2 };
    memset(&desc, 0, sizeof desc);
    desc.world_size = j->world;
    desc.rank = j->rank;
    desc.master_port = j->port;
    desc.timeout_s = 60;
    desc.job_token = "test-outer-checkpoint";
    desc.log_level = DDP_LOG_OFF;
    desc.outer = j->outer;
    memset(&opt, 0, sizeof opt);
    opt.lr = 0.05f;
    opt.weight_decay = 0.01f;
#define J_FAIL(what) do { snprintf(j->err, sizeof j->err, "rank %d: %s: %.400s", j->rank, what, ddp_last_error(ddp)); \
                          j->failed = 1; ddp_shutdown(ddp); return NULL; } while (0)
    if (ddp_init(&ddp, &desc) != DDP_OK) J_FAIL("ddp_init");
    for (i = 0; i < 3; i++) {   /* the initial values are read at commit */
        size_t k;
        for (k = 0; k < sizes[i]; k++) j->init[i][k] = 0.5f * test_value(100 + (uint64_t)i, k);
        if (ddp_register_param(ddp, names[i], sizes[i], i == 1 ? DDP_NO_DECAY : 0, j->init[i], NULL) != DDP_OK) J_FAIL("register");
    }
    if (ddp_commit(ddp) != DDP_OK) J_FAIL("commit");
    if (j->load) {
        if (ddp_load(ddp, j->load, NULL, 0, NULL, NULL, &j->info) != DDP_OK) J_FAIL("ddp_load");
        take_snap(ddp, &j->at_load);
    }
    for (t = j->from; t < j->to; t++) {
        grad_args g;
        g.ddp = ddp; g.rank = j->rank; g.step = t;
        if (ddp_zero_grad(ddp) != DDP_OK || ddp_tape_record(ddp, grad_backward, &g, sizeof g, ids, 3) != DDP_OK ||
            ddp_backward(ddp) != DDP_OK || ddp_adamw_step(ddp, &opt, NULL) != DDP_OK)
            J_FAIL("a training step");
    }
    take_snap(ddp, &j->at_end);
    if (j->save && ddp_save(ddp, j->save, NULL, 0) != DDP_OK) J_FAIL("ddp_save");
    if (ddp_shutdown(ddp) != DDP_OK) { snprintf(j->err, sizeof j->err, "rank %d: ddp_shutdown", j->rank); j->failed = 1; }
    return NULL;
}

/* One run: world thread-ranks, each with the same settings; 0, or 1 with the first error in why. */
static int run(job *jobs, int world, const ddp_outer *outer, int from, int to, const char *load, const char *save,
               char *why, size_t whyn) {
    pthread_t th[MAXR];
    int r, port = test_free_port(), bad = 0;
    for (r = 0; r < world; r++) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r].world = world; jobs[r].rank = r; jobs[r].port = port;
        if (outer) jobs[r].outer = *outer;
        jobs[r].from = from; jobs[r].to = to; jobs[r].load = load; jobs[r].save = save;
        pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    for (r = 0; r < world; r++) pthread_join(th[r], NULL);
    for (r = 0; r < world; r++)
        if (jobs[r].failed && !bad) { snprintf(why, whyn, "%s", jobs[r].err); bad = 1; }
    return bad;
}

static void free_jobs(job *jobs, int world) {
    int r;
    for (r = 0; r < world; r++) { free_snap(&jobs[r].at_load); free_snap(&jobs[r].at_end); }
}

static int same_floats(const float *a, const float *b, size_t n, const char *what, char *why, size_t whyn) {
    size_t i;
    if (!a != !b) { snprintf(why, whyn, "%s: held by one side only", what); return 0; }
    if (!a) return 1;
    for (i = 0; i < n; i++)
        if (memcmp(a + i, b + i, sizeof(float)) != 0) {
            snprintf(why, whyn, "%s differs at float %zu: %.9g vs %.9g", what, i, a[i], b[i]);
            return 0;
        }
    return 1;
}

/* a and b the same training state, bit for bit: the inner state (parameters, m, v, step) and,
   with outer, the outer state (theta, momentum, the schedule). */
static int same_state(const snap *a, const snap *b, int outer, char *why, size_t whyn) {
    if (a->n != b->n) { snprintf(why, whyn, "flat buffers of %zu and %zu floats", a->n, b->n); return 0; }
    if (!same_floats(a->params, b->params, a->n, "the parameters", why, whyn) ||
        !same_floats(a->m, b->m, a->n, "AdamW m", why, whyn) || !same_floats(a->v, b->v, a->n, "AdamW v", why, whyn))
        return 0;
    if (a->step != b->step) { snprintf(why, whyn, "AdamW steps %lld and %lld", (long long)a->step, (long long)b->step); return 0; }
    if (!outer) return 1;
    if (!same_floats(a->theta, b->theta, a->n, "the outer parameters", why, whyn) ||
        !same_floats(a->mom, b->mom, a->n, "the outer momentum", why, whyn))
        return 0;
    if (a->st.inner_steps != b->st.inner_steps || a->st.syncs != b->st.syncs || a->st.in_flight != b->st.in_flight) {
        snprintf(why, whyn, "outer schedules differ: inner %lld/%lld, syncs %lld/%lld, in flight %d/%d",
                 (long long)a->st.inner_steps, (long long)b->st.inner_steps, (long long)a->st.syncs, (long long)b->st.syncs,
                 a->st.in_flight, b->st.in_flight);
        return 0;
    }
    return 1;
}

static char dir[] = "/tmp/ddp-outer-ckpt-XXXXXX";
static char path_buf[8][256];
static const char *path_of(int i, const char *name) {
    snprintf(path_buf[i], sizeof path_buf[i], "%s/%s", dir, name);
    return path_buf[i];
}

/* Straight T steps = k steps, save, a new run, load, T - k steps: bit for bit on every rank. */
static void resume_case(const char *name, int world, const ddp_outer *o, int k, int T, int want_flight, const char *file) {
    job straight[MAXR], a[MAXR], b[MAXR];
    char why[700] = "";
    int r, ok = 1;
    if (run(straight, world, o, 0, T, NULL, NULL, why, sizeof why) || run(a, world, o, 0, k, NULL, file, why, sizeof why) ||
        run(b, world, o, k, T, file, NULL, why, sizeof why))
        ok = 0;
    if (ok && (a[0].at_end.st.in_flight >= 0) != want_flight) {
        snprintf(why, sizeof why, "the save at step %d has %s in flight; the case wants %s", k,
                 a[0].at_end.st.in_flight >= 0 ? "a fragment" : "none", want_flight ? "one" : "none");
        ok = 0;
    }
    for (r = 0; ok && r < world; r++) {
        char w[600];
        if (!same_state(&a[r].at_end, &b[r].at_load, 1, w, sizeof w)) { snprintf(why, sizeof why, "rank %d after the load: %s", r, w); ok = 0; }
        else if (!same_state(&straight[r].at_end, &b[r].at_end, 1, w, sizeof w)) {
            snprintf(why, sizeof why, "rank %d at step %d against never stopping: %s", r, T, w);
            ok = 0;
        }
    }
    /* the groups really differ between syncs (else the test could not tell them apart) */
    if (ok && a[0].at_end.st.groups > 1 && a[0].at_end.st.inner_steps % o->inner_steps != 0 &&
        !memcmp(a[0].at_end.params, a[a[0].at_end.st.group_size].at_end.params, a[0].at_end.n * sizeof(float))) {
        snprintf(why, sizeof why, "groups 0 and 1 hold the same parameters at the save: the case tests nothing");
        ok = 0;
    }
    verdict(ok, name, "%s", why);
    free_jobs(straight, world); free_jobs(a, world); free_jobs(b, world);
}

static ddp_outer outer_of(ddp_outer_mode mode, int H, int F, int delay, float mix, ddp_outer_wire wire) {
    ddp_outer o;
    memset(&o, 0, sizeof o);
    o.mode = mode; o.group_size = 1; o.inner_steps = H; o.fragments = F; o.delay_steps = delay; o.mix = mix; o.wire = wire;
    return o;
}

/* Saved on `saved` groups, loaded on `loaded`: group g holds saved group g mod saved's inner
   state, every group the outer state; the schedule (a fragment in flight too) goes on. */
static void regroup_case(const char *name, const ddp_outer *o, int saved, int loaded, int k, int T, const char *file) {
    job a[MAXR], b[MAXR];
    char why[700] = "";
    int r, ok = 1;
    if (run(a, saved, o, 0, k, NULL, file, why, sizeof why) || run(b, loaded, o, k, T, file, NULL, why, sizeof why)) ok = 0;
    for (r = 0; ok && r < loaded; r++) {
        const snap *s = &a[r % saved].at_end, *l = &b[r].at_load;
        char w[600];
        if (!same_state(s, l, 0, w, sizeof w)) { snprintf(why, sizeof why, "group %d against saved group %d: %s", r, r % saved, w); ok = 0; }
        else if (!same_floats(a[0].at_end.theta, l->theta, l->n, "the outer parameters", w, sizeof w) ||
                 !same_floats(a[0].at_end.mom, l->mom, l->n, "the outer momentum", w, sizeof w)) {
            snprintf(why, sizeof why, "group %d: %s", r, w);
            ok = 0;
        } else if (l->st.groups != loaded || l->st.inner_steps != s->st.inner_steps || l->st.syncs != s->st.syncs ||
                   l->st.in_flight != s->st.in_flight || b[r].info.outer_groups != saved) {
            snprintf(why, sizeof why, "group %d: %d groups, inner %lld, syncs %lld, in flight %d, the file's groups %d; saved: "
                     "inner %lld, syncs %lld, in flight %d, %d groups", r, l->st.groups, (long long)l->st.inner_steps,
                     (long long)l->st.syncs, l->st.in_flight, b[r].info.outer_groups, (long long)s->st.inner_steps,
                     (long long)s->st.syncs, s->st.in_flight, saved);
            ok = 0;
        }
    }
    /* DiLoCo at the next outer step: every group holds the outer parameters, so all the same bits */
    for (r = 1; ok && o->mode == DDP_OUTER_DILOCO && r < loaded; r++) {
        char w[600];
        if (!same_floats(b[0].at_end.params, b[r].at_end.params, b[0].at_end.n, "the parameters after the next outer step", w, sizeof w)) {
            snprintf(why, sizeof why, "groups 0 and %d: %s", r, w);
            ok = 0;
        }
    }
    verdict(ok, name, "%s", why);
    free_jobs(a, saved); free_jobs(b, loaded);
}

/* Saved with one outer mode, loaded by a run of another (the same groups, nothing in flight):
   every group its own inner state, the outer parameters as saved, the momentum as saved, zeros
   where the file holds none, none where the loading run keeps none; training goes on. */
static void cross_case(const char *name, const ddp_outer *saved, const ddp_outer *loaded, int k, const char *file) {
    job a[2], b[2];
    char why[700] = "";
    int r, ok = !run(a, 2, saved, 0, k, NULL, file, why, sizeof why) && !run(b, 2, loaded, k, k + 3, file, NULL, why, sizeof why);
    for (r = 0; ok && r < 2; r++) {
        const snap *s = &a[r].at_end, *l = &b[r].at_load;
        char w[600];
        size_t i = 0;
        if (l->mom && !s->mom) for (i = 0; i < l->n && l->mom[i] == 0; i++) {}
        if (!same_state(s, l, 0, w, sizeof w) || !same_floats(s->theta, l->theta, l->n, "the outer parameters", w, sizeof w) ||
            (l->mom && s->mom && !same_floats(s->mom, l->mom, l->n, "the outer momentum", w, sizeof w))) {
            snprintf(why, sizeof why, "rank %d: %s", r, w);
            ok = 0;
        } else if ((l->mom && !s->mom && i != l->n) || l->st.inner_steps != k || l->st.syncs != s->st.syncs) {
            snprintf(why, sizeof why, "rank %d: momentum nonzero at float %zu, inner %lld, syncs %lld (saved %lld)", r, i,
                     (long long)l->st.inner_steps, (long long)l->st.syncs, (long long)s->st.syncs);
            ok = 0;
        }
    }
    verdict(ok, name, "%s", why);
    free_jobs(a, 2); free_jobs(b, 2);
}

int main(void) {
    ddp_outer o;
    char why[700] = "";
    job a[MAXR], b[MAXR];
    int r, ok;
#ifdef TEST_SANITIZED
    const int T = 9;
#else
    const int T = 14;
#endif
    if (!mkdtemp(dir)) { printf("FAIL outer_checkpoint: mkdtemp: %s\n", strerror(errno)); return 1; }

    o = outer_of(DDP_OUTER_DILOCO, 4, 0, 0, 0, DDP_WIRE_DEFAULT);
    resume_case("outer_ckpt_diloco_resume_between_outer_steps_bit_identical", 2, &o, 6, T, 0, path_of(0, "diloco6"));
    resume_case("outer_ckpt_diloco_resume_at_an_outer_step_bit_identical", 2, &o, 8, T, 0, path_of(0, "diloco8"));
    resume_case("outer_ckpt_one_group_resume_bit_identical", 1, &o, 5, 10, 0, path_of(0, "one"));
    o = outer_of(DDP_OUTER_AVERAGE, 3, 0, 0, 0, DDP_WIRE_DEFAULT);
    resume_case("outer_ckpt_average_resume_bit_identical", 2, &o, 4, T - 4, 0, path_of(0, "average"));
    /* fragment f is sent at the steps t with (t + 2f) % 6 == 0: fragment 2 at step 8, landing after 9 */
    o = outer_of(DDP_OUTER_STREAMING, 6, 3, 1, 0.25f, DDP_WIRE_INT8);
    resume_case("outer_ckpt_streaming_resume_fragment_in_flight_int8_bit_identical", 3, &o, 8, T, 1, path_of(1, "stream"));
    /* fragment 1 sent at step 4, landing after 7: the save at 5 has it in flight */
    o = outer_of(DDP_OUTER_STREAMING, 8, 2, 3, 0, DDP_WIRE_BF16);
    resume_case("outer_ckpt_streaming_resume_delay3_bf16_bit_identical", 2, &o, 5, T, 1, path_of(0, "stream2"));

    {
        ddp_outer avg = outer_of(DDP_OUTER_AVERAGE, 3, 0, 0, 0, DDP_WIRE_DEFAULT), dil = outer_of(DDP_OUTER_DILOCO, 3, 0, 0, 0, DDP_WIRE_DEFAULT);
        cross_case("outer_ckpt_averaging_loaded_by_diloco_momentum_starts_at_zero", &avg, &dil, 4, path_of(0, "cross"));
        cross_case("outer_ckpt_diloco_loaded_by_averaging_momentum_dropped", &dil, &avg, 4, path_of(0, "cross"));
    }
    o = outer_of(DDP_OUTER_DILOCO, 4, 0, 0, 0, DDP_WIRE_DEFAULT);
    regroup_case("outer_ckpt_2_groups_loaded_as_3_group_g_takes_saved_g_mod_2", &o, 2, 3, 6, 8, path_of(0, "two"));
    o = outer_of(DDP_OUTER_STREAMING, 6, 3, 1, 0.25f, DDP_WIRE_INT8);
    regroup_case("outer_ckpt_3_groups_loaded_as_2_fragment_stays_in_flight", &o, 3, 2, 8, 12, path_of(0, "three"));

    /* The streaming checkpoint (fragment 2 in flight) into a DiLoCo run (one fragment): it lands
       at the load. Its floats take the new outer values on every group (mix 0: the same bits
       everywhere), the rest stay each group's own. */
    {
        job s[MAXR];
        const snap *sv;
        size_t lo, hi, i;
        o = outer_of(DDP_OUTER_STREAMING, 6, 3, 1, 0.25f, DDP_WIRE_INT8);
        ok = !run(s, 3, &o, 0, 8, NULL, path_of(1, "stream"), why, sizeof why);
        o = outer_of(DDP_OUTER_DILOCO, 6, 0, 0, 0, DDP_WIRE_DEFAULT);
        ok = ok && !run(b, 3, &o, 8, 8, path_of(1, "stream"), NULL, why, sizeof why);
        sv = &s[0].at_end;
        lo = sv->frag_lo; hi = sv->frag_hi;
        if (ok && (sv->st.in_flight < 0 || hi <= lo)) { snprintf(why, sizeof why, "the save has no fragment in flight"); ok = 0; }
        for (r = 0; ok && r < 3; r++) {
            const snap *l = &b[r].at_load;
            char w[600];
            if (l->st.in_flight != -1 || l->st.syncs != sv->st.syncs + 1 || l->st.inner_steps != 8) {
                snprintf(why, sizeof why, "rank %d: in flight %d, syncs %lld (saved %lld), inner %lld", r, l->st.in_flight,
                         (long long)l->st.syncs, (long long)sv->st.syncs, (long long)l->st.inner_steps);
                ok = 0;
            } else if (!same_floats(l->theta + lo, l->params + lo, hi - lo, "the landed fragment's parameters against theta", w, sizeof w) ||
                       !same_floats(b[0].at_load.params + lo, l->params + lo, hi - lo, "the landed fragment on rank 0 and here", w, sizeof w) ||
                       !same_floats(s[r].at_end.params, l->params, lo, "the parameters before the fragment", w, sizeof w) ||
                       !same_floats(s[r].at_end.params + hi, l->params + hi, l->n - hi, "the parameters after the fragment", w, sizeof w)) {
                snprintf(why, sizeof why, "rank %d: %s", r, w);
                ok = 0;
            }
        }
        for (i = lo; ok && i < hi; i++)
            if (b[0].at_load.theta[i] != sv->theta[i]) break;
        if (ok && i == hi) { snprintf(why, sizeof why, "the landed fragment's outer parameters did not move"); ok = 0; }
        verdict(ok, "outer_ckpt_fragment_in_flight_lands_at_load_into_another_schedule", "%s", why);
        free_jobs(b, 3);

        /* The outer sync off: group 0's (rank 0's) state, on every rank. */
        why[0] = 0;
        ok = !run(b, 2, NULL, 8, 8, path_of(1, "stream"), NULL, why, sizeof why);
        for (r = 0; ok && r < 2; r++) {
            char w[600];
            if (!same_state(&s[0].at_end, &b[r].at_load, 0, w, sizeof w)) { snprintf(why, sizeof why, "rank %d: %s", r, w); ok = 0; }
            else if (b[r].info.outer_groups != 3 || b[r].info.outer_inner_steps != 8) {
                snprintf(why, sizeof why, "rank %d: ddp_checkpoint_info says %d groups, inner %lld", r, b[r].info.outer_groups,
                         (long long)b[r].info.outer_inner_steps);
                ok = 0;
            }
        }
        verdict(ok, "outer_ckpt_loaded_with_the_outer_sync_off_takes_group_0", "%s", why);
        free_jobs(b, 2);
        free_jobs(s, 3);
    }

    /* A file without outer state (saved by plain DDP) into a DiLoCo run: theta = the loaded
       parameters, momentum 0, inner step 0; the first outer step comes H steps later. */
    why[0] = 0;
    o = outer_of(DDP_OUTER_DILOCO, 4, 0, 0, 0, DDP_WIRE_DEFAULT);
    ok = !run(a, 2, NULL, 0, 3, NULL, path_of(0, "plain"), why, sizeof why);
    ok = ok && !run(b, 2, &o, 3, 7, path_of(0, "plain"), NULL, why, sizeof why);
    for (r = 0; ok && r < 2; r++) {
        const snap *l = &b[r].at_load;
        char w[600];
        size_t i;
        for (i = 0; l->mom && i < l->n && l->mom[i] == 0; i++) {}
        if (!same_state(&a[r].at_end, l, 0, w, sizeof w) || !same_floats(l->params, l->theta, l->n, "theta against the parameters", w, sizeof w)) {
            snprintf(why, sizeof why, "rank %d: %s", r, w);
            ok = 0;
        } else if (!l->mom || i != l->n || l->st.inner_steps || l->st.syncs || l->st.in_flight != -1 || b[r].info.outer_groups) {
            snprintf(why, sizeof why, "rank %d: momentum nonzero at %zu, inner %lld, syncs %lld, in flight %d, the file's groups %d",
                     r, i, (long long)l->st.inner_steps, (long long)l->st.syncs, l->st.in_flight, b[r].info.outer_groups);
            ok = 0;
        } else if (b[r].at_end.st.syncs != 1 || !same_floats(b[0].at_end.params, b[r].at_end.params, l->n, "the parameters after the outer step", w, sizeof w)) {
            snprintf(why, sizeof why, "rank %d after 4 steps: syncs %lld; %s", r, (long long)b[r].at_end.st.syncs, w);
            ok = 0;
        }
    }
    verdict(ok, "outer_ckpt_file_without_outer_state_starts_the_outer_sync_from_it", "%s", why);
    free_jobs(a, 2); free_jobs(b, 2);

    /* A damaged outer block: its group count (the first field after the parameter table) is 0. */
    {
        const char *p = path_of(1, "stream");
        size_t at = 56 + 8, i;
        FILE *f;
        unsigned char zero[4] = { 0, 0, 0, 0 };
        for (i = 0; i < 3; i++) at += 16 + strlen(names[i]);
        why[0] = 0;
        f = fopen(p, "r+b");
        ok = f && fseek(f, (long)at, SEEK_SET) == 0 && fwrite(zero, 1, 4, f) == 4;
        if (f) fclose(f);
        o = outer_of(DDP_OUTER_STREAMING, 6, 3, 1, 0.25f, DDP_WIRE_INT8);
        if (!ok) snprintf(why, sizeof why, "cannot patch %s", p);
        else if (!run(b, 3, &o, 8, 8, p, NULL, why, sizeof why)) { snprintf(why, sizeof why, "loaded"); ok = 0; }
        else if (!strstr(why, "impossible outer block: 0 groups")) ok = 0;
        verdict(ok, "outer_ckpt_damaged_outer_block_refused_by_name", "%s", why);
        free_jobs(b, 3);
    }
    {
        const char *left[] = { "diloco6", "diloco8", "one", "average", "stream", "stream2", "two", "three", "plain", "cross" };
        for (r = 0; r < 10; r++) remove(path_of(0, left[r]));
        rmdir(dir);
    }
    return test_summary("test_outer_checkpoint");
}
