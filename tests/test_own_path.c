/* test_own_path.c — a program with its own autograd (ddp_grad_ready + ddp_finish, no tape):
   its errors speak of ddp_grad_ready, not of tape ops (and the tape's still speak of ops);
   ddp_consume_grads keeps the averaged-gradients guard for the program's own optimizer; the
   bucket plan at DDP_LOG=info; the warning when no bucket was complete before the backward's
   last moment, and its silence when ready calls come in reverse registration order.
   Run: build/ddprun -n 2 build/test_own_path */
#include "testlib.h"

enum { NP = 4, COUNT = 2048 };   /* 4 parameters of 8 KiB, buckets of 8 KiB: 4 buckets */

static char logged[16384];
static void capture(void *user, ddp_log_level level, int rank, const char *msg) {
    size_t len = strlen(logged);
    (void)user; (void)level; (void)rank;
    snprintf(logged + len, sizeof logged - len, "%s\n", msg);
}

static ddp_context *open_ctx(int world_one, ddp_log_level level, int check_ready, int shard, int ids[NP]) {
    static float init[COUNT];
    ddp_context *c = NULL;
    ddp_desc d;
    int i;
    memset(&d, 0, sizeof d);
    d.bucket_cap_mb = d.first_bucket_mb = COUNT * sizeof(float) / 1048576.0;
    d.log = capture;
    d.log_level = level;
    d.check_ready = check_ready;
    d.shard_optimizer = shard;
    if (world_one) d.world_size = 1;
    logged[0] = 0;
    for (i = 0; i < COUNT; i++) init[i] = test_value(5, (uint64_t)i);
    if (ddp_init(&c, &d) != DDP_OK) { printf("FAIL own_path_init: %s\n", ddp_last_error(c)); ddp_shutdown(c); return NULL; }
    for (i = 0; i < NP; i++) {
        char name[32];
        snprintf(name, sizeof name, "layer%d", i);
        if (ddp_register_param(c, name, COUNT, 0, init, &ids[i]) != DDP_OK) break;
    }
    if (i < NP || ddp_commit(c) != DDP_OK) { printf("FAIL own_path_commit: %s\n", ddp_last_error(c)); ddp_shutdown(c); return NULL; }
    return c;
}

static void fill(ddp_context *c, int id, float v) {
    float *g = ddp_grad(c, id);
    int k;
    for (k = 0; k < COUNT; k++) g[k] += v;
}

typedef struct { ddp_context *c; int id; float v; } add_args;
static void add_backward(void *p) { add_args *a = (add_args *)p; fill(a->c, a->id, a->v); }

int main(void) {
    int ids[NP], i, world;
    ddp_context *c;
    ddp_result r;
    const char *e;

    /* 1-4 fail the group: each on a context of its own rank alone (world_size = 1 by hand), so
       the job's group stays usable for 5 and 6 */
    /* 1. a parameter never marked ready: the own-autograd words */
    if (!(c = open_ctx(1, DDP_LOG_WARN, 0, 0, ids))) return 1;
    ddp_zero_grad(c);
    for (i = NP - 1; i >= 1; i--) { fill(c, ids[i], 1); ddp_grad_ready(c, ids[i]); }
    r = ddp_finish(c);
    e = ddp_last_error(c);
    verdict(r == DDP_ERR_UNUSED_PARAMETER && strstr(e, "never marked ready (ddp_grad_ready)") && strstr(e, "'layer0'") &&
            !strstr(e, "tape"), "own_path_missing_ready_names_ddp_grad_ready", "%s: %s", ddp_result_string(r), e);
    ddp_shutdown(c);

    /* 2. the same with a tape: the tape's words */
    if (!(c = open_ctx(1, DDP_LOG_WARN, 0, 0, ids))) return 1;
    {
        add_args a = { c, ids[1], 1.0f };
        ddp_zero_grad(c);
        ddp_tape_record(c, add_backward, &a, sizeof a, &ids[1], 1);
        a.id = ids[2]; ddp_tape_record(c, add_backward, &a, sizeof a, &ids[2], 1);
        a.id = ids[3]; ddp_tape_record(c, add_backward, &a, sizeof a, &ids[3], 1);
        r = ddp_backward(c);
        e = ddp_last_error(c);
        verdict(r == DDP_ERR_UNUSED_PARAMETER && strstr(e, "no op recorded on the tape listed them") && strstr(e, "'layer0'"),
                "own_path_tape_missing_param_names_the_tape", "%s: %s", ddp_result_string(r), e);
    }
    ddp_shutdown(c);

    /* 3. ready twice, own autograd */
    if (!(c = open_ctx(1, DDP_LOG_WARN, 0, 0, ids))) return 1;
    ddp_grad_ready(c, ids[3]);
    r = ddp_grad_ready(c, ids[3]);
    e = ddp_last_error(c);
    verdict(r == DDP_ERR_DOUBLE_READY && strstr(e, "ddp_grad_ready('layer3') was called twice") && !strstr(e, "op"),
            "own_path_double_ready_names_ddp_grad_ready", "%s: %s", ddp_result_string(r), e);
    ddp_shutdown(c);

    /* 4. check_ready (one rank): a gradient written after its ready call */
    if (!(c = open_ctx(1, DDP_LOG_WARN, 1, 0, ids))) return 1;
    ddp_zero_grad(c);
    for (i = NP - 1; i >= 0; i--) { fill(c, ids[i], 1); ddp_grad_ready(c, ids[i]); }
    fill(c, ids[3], 1);   /* too late */
    r = ddp_finish(c);
    e = ddp_last_error(c);
    verdict(r == DDP_ERR_INVALID_STATE && strstr(e, "'layer3' changed after ddp_grad_ready marked it ready") &&
            !strstr(e, "FIRST op"), "own_path_check_ready_speaks_of_ddp_grad_ready", "%s: %s", ddp_result_string(r), e);
    ddp_shutdown(c);

    /* 5. ddp_consume_grads: the guard of the program's own optimizer */
    if (!(c = open_ctx(0, DDP_LOG_WARN, 0, 0, ids))) return 1;
    world = ddp_world_size(c);
    {
        ddp_result before, first, second, micro, synced;
        before = ddp_consume_grads(c);                       /* nothing averaged yet */
        ddp_zero_grad(c);
        for (i = NP - 1; i >= 0; i--) { fill(c, ids[i], 1); ddp_grad_ready(c, ids[i]); }
        ddp_finish(c);
        first = ddp_consume_grads(c);                        /* averaged: ok */
        second = ddp_consume_grads(c);                       /* the same average twice: refused */
        ddp_set_sync(c, 0);
        for (i = NP - 1; i >= 0; i--) { fill(c, ids[i], 1); ddp_grad_ready(c, ids[i]); }
        ddp_finish(c);
        micro = ddp_consume_grads(c);                        /* sync off: this rank's own */
        e = ddp_last_error(c);
        verdict(before == DDP_ERR_INVALID_STATE && first == DDP_OK && second == DDP_ERR_INVALID_STATE &&
                micro == DDP_ERR_INVALID_STATE && strstr(e, "ddp_consume_grads after a backward with gradient sync off"),
                "own_path_consume_grads_guards_the_own_optimizer", "before %s, first %s, second %s, micro-step %s: %s",
                ddp_result_string(before), ddp_result_string(first), ddp_result_string(second), ddp_result_string(micro), e);
        ddp_set_sync(c, 1);
        for (i = NP - 1; i >= 0; i--) { fill(c, ids[i], 1); ddp_grad_ready(c, ids[i]); }
        ddp_finish(c);
        synced = ddp_consume_grads(c);
        verdict(synced == DDP_OK && ddp_adamw_step(c, &(ddp_adamw){ .lr = 1e-3f }, NULL) == DDP_ERR_INVALID_STATE,
                "own_path_consume_grads_and_adamw_share_one_average", "%s", ddp_last_error(c));
    }
    ddp_shutdown(c);
    {   /* refused at every world size, so a program tried on one rank meets it too */
        if (!(c = open_ctx(0, DDP_LOG_WARN, 0, 1, ids))) return 1;
        for (i = NP - 1; i >= 0; i--) ddp_grad_ready(c, ids[i]);
        ddp_finish(c);
        r = ddp_consume_grads(c);
        verdict(r == DDP_ERR_INVALID_STATE && strstr(ddp_last_error(c), "shard_optimizer"),
                "own_path_consume_grads_refused_sharded", "%s: %s", ddp_result_string(r), ddp_last_error(c));
        ddp_shutdown(c);
    }
    /* bf16 parameters set by the operator's DDP_PARAM_DTYPE: an fp32 accessor is NULL and the log
       says why (a program that does not check would crash with no word); the own optimizer's
       guard refuses (the master and the working copies move together only in ddp_adamw_step) */
    setenv("DDP_PARAM_DTYPE", "bf16", 1);
    if (!(c = open_ctx(0, DDP_LOG_WARN, 0, 0, ids))) return 1;
    {
        float *p = ddp_param(c, ids[0]);
        int told = strstr(logged, "unset DDP_PARAM_DTYPE") != NULL;
        ddp_param(c, ids[1]);   /* once: the second NULL adds no line */
        told = told && strstr(strstr(logged, "unset DDP_PARAM_DTYPE") + 1, "unset DDP_PARAM_DTYPE") == NULL;
        verdict(!p && told, "own_path_fp32_accessor_under_env_bf16_is_logged_once", "param %p, logged:\n%s", (void *)p, logged);
        ddp_zero_grad(c);
        for (i = NP - 1; i >= 0; i--) ddp_grad_ready(c, ids[i]);
        ddp_finish(c);
        r = ddp_consume_grads(c);
        verdict(r == DDP_ERR_INVALID_STATE && strstr(ddp_last_error(c), "bf16 parameters (from DDP_PARAM_DTYPE"),
                "own_path_consume_grads_refused_bf16", "%s: %s", ddp_result_string(r), ddp_last_error(c));
    }
    ddp_shutdown(c);
    unsetenv("DDP_PARAM_DTYPE");

    /* 6. the bucket plan at info; the overlap warning (2+ ranks) */
    if (!(c = open_ctx(0, DDP_LOG_INFO, 0, 0, ids))) return 1;
    if (ddp_rank(c) == 0)
        verdict(strstr(logged, "bucket plan: 4 parameter(s)") && strstr(logged, "in 4 bucket(s)") &&
                strstr(logged, "bucket 0: 8.0 KiB, floats [6144, 8192), 1 parameter(s): 'layer3'") &&
                strstr(logged, "bucket 3: 8.0 KiB, floats [0, 2048), 1 parameter(s): 'layer0'"),
                "own_path_bucket_plan_at_info", "logged:\n%s", logged);
    ddp_shutdown(c);
    if (world > 1) {
        int warned_wrong, warned_right, twice;
        if (!(c = open_ctx(0, DDP_LOG_WARN, 0, 0, ids))) return 1;
        for (i = 0; i < NP; i++) ddp_grad_ready(c, ids[i]);   /* registration order: bucket 0 completes last */
        ddp_finish(c);
        warned_wrong = strstr(logged, "no gradient bucket was complete before the backward's last ddp_grad_ready call") != NULL;
        logged[0] = 0;
        for (i = 0; i < NP; i++) ddp_grad_ready(c, ids[i]);
        ddp_finish(c);
        twice = strstr(logged, "no gradient bucket") != NULL;
        ddp_shutdown(c);
        if (!(c = open_ctx(0, DDP_LOG_WARN, 0, 0, ids))) return 1;
        for (i = NP - 1; i >= 0; i--) ddp_grad_ready(c, ids[i]);   /* reverse registration order: overlap */
        ddp_finish(c);
        warned_right = strstr(logged, "no gradient bucket") != NULL;
        if (ddp_rank(c) == 0)
            verdict(warned_wrong && !twice && !warned_right, "own_path_no_overlap_warned_once_and_only_then",
                    "registration order warned %d (again: %d), reverse order warned %d", warned_wrong, twice, warned_right);
        ddp_shutdown(c);
        /* ready calls back to back after the whole "backward" (30 ms of sleep), in reverse order: the
           moments look fine, the measured window (microseconds of a 30 ms step) does not */
        if (!(c = open_ctx(0, DDP_LOG_WARN, 0, 0, ids))) return 1;
        for (int s2 = 0; s2 < 2; s2++) {
            usleep(30000);
            for (i = NP - 1; i >= 0; i--) ddp_grad_ready(c, ids[i]);
            ddp_finish(c);
        }
        warned_wrong = strstr(logged, "almost no communication overlapped the backward. Were the ddp_grad_ready calls "
                                      "made back to back") != NULL;
        ddp_shutdown(c);
        /* the same with each ready call as the backward leaves that layer (10 ms of sleep each) */
        if (!(c = open_ctx(0, DDP_LOG_WARN, 0, 0, ids))) return 1;
        for (int s2 = 0; s2 < 2; s2++) {
            for (i = NP - 1; i >= 0; i--) { usleep(10000); ddp_grad_ready(c, ids[i]); }
            ddp_finish(c);
        }
        warned_right = strstr(logged, "overlap") != NULL;
        if (ddp_rank(c) == 0)
            verdict(warned_wrong && !warned_right, "own_path_back_to_back_ready_calls_warned_by_time",
                    "back to back warned %d, interleaved warned %d: %s", warned_wrong, warned_right, logged);
        ddp_shutdown(c);
    } else {
        printf("SKIP own_path_no_overlap_warned_once_and_only_then: one rank (run under ddprun -n 2)\n");
    }
    return test_failures ? 1 : 0;
}
