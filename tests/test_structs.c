/* test_structs.c — public structs filled field by field, with garbage where a field was left
   out (a program written before the field existed): every flag field must be 0 or 1, every enum
   in range, every number not NaN, else DDP_ERR_INVALID_ARGUMENT with a message that names the
   field and says "zero-initialize the struct". One rank, no launcher.
   Run: build/test_structs */
#include "testlib.h"

static const int garbage[] = { 2, -1, 0x5a5a5a5a, 7 };

static int says_zero_init(const char *msg, const char *field) {
    return msg && strstr(msg, field) && strstr(msg, "zero-initialize the struct") && strstr(msg, "= {0}");
}

/* one field of a descriptor set to v, the rest zero: ddp_init must refuse it by name */
#define DESC_CASE(field, type, v)                                                                      \
    do {                                                                                               \
        ddp_desc d;                                                                                    \
        ddp_context *c = NULL;                                                                         \
        ddp_result r;                                                                                  \
        memset(&d, 0, sizeof d);                                                                       \
        d.world_size = 1;                                                                              \
        d.field = (type)(v);                                                                           \
        r = ddp_init(&c, &d);                                                                          \
        if (r != DDP_ERR_INVALID_ARGUMENT || !says_zero_init(ddp_last_error(c), "ddp_desc: " #field " ")) { \
            printf("FAIL struct_desc_%s: value %d gave %s: %s\n", #field, (int)(v), ddp_result_string(r),  \
                   ddp_last_error(c));                                                                 \
            bad++;                                                                                     \
        }                                                                                              \
        ddp_shutdown(c);                                                                               \
        cases++;                                                                                       \
    } while (0)

int main(void) {
    int cases = 0, bad = 0;
    size_t i;
    volatile double zero = 0.0;
    double nan_ = zero / zero;
    for (i = 0; i < sizeof garbage / sizeof garbage[0]; i++) {
        int g = garbage[i];
        DESC_CASE(find_unused, int, g);
        DESC_CASE(skip_nonfinite, int, g);
        DESC_CASE(shard_optimizer, int, g);
        DESC_CASE(check_ready, int, g);
        DESC_CASE(backend, ddp_backend, g == 2 ? 9 : g);
        DESC_CASE(log_level, ddp_log_level, g == 2 ? 6 : g);
        DESC_CASE(reduce_dtype, ddp_dtype, g == 2 ? 3 : g);
        DESC_CASE(param_dtype, ddp_dtype, g == 2 ? 3 : g);
        DESC_CASE(uneven_inputs, ddp_join_mode, g == 2 ? 3 : g);
    }
    verdict(bad == 0, "struct_desc_flags_and_enums_refused_with_zero_init_hint", "%d of %d cases", bad, cases);
    bad = cases = 0;
    DESC_CASE(timeout_s, double, nan_);
    DESC_CASE(bucket_cap_mb, double, nan_);
    DESC_CASE(first_bucket_mb, double, nan_);
    DESC_CASE(inject_comm_latency_ms, double, nan_);
    DESC_CASE(inject_comm_gbps, double, nan_);
    DESC_CASE(shutdown_timeout_s, double, nan_);
    verdict(bad == 0, "struct_desc_nan_numbers_refused", "%d of %d cases", bad, cases);
    {   /* a cancel token that was never zeroed */
        ddp_desc d;
        ddp_context *c = NULL;
        ddp_cancel_token tok;
        ddp_result r;
        memset(&d, 0, sizeof d);
        d.world_size = 1;
        tok.cancelled = 0x5a5a5a5a;
        d.cancel_token = &tok;
        r = ddp_init(&c, &d);
        verdict(r == DDP_ERR_INVALID_ARGUMENT && says_zero_init(ddp_last_error(c), "ddp_desc: cancel_token"),
                "struct_cancel_token_garbage_refused", "%s: %s", ddp_result_string(r), ddp_last_error(c));
        ddp_shutdown(c);
    }
    {   /* ddp_adamw filled field by field, as_given left as stack garbage */
        ddp_context *c = NULL;
        ddp_desc d;
        float init[64] = { 0 }, before[64], after[64];
        int id, ok = 1;
        memset(&d, 0, sizeof d);
        d.world_size = 1;
        for (i = 0; i < 64; i++) init[i] = test_value(3, i);
        ok = ddp_init(&c, &d) == DDP_OK && ddp_register_param(c, "w", 64, 0, init, &id) == DDP_OK && ddp_commit(c) == DDP_OK;
        for (i = 0; ok && i < sizeof garbage / sizeof garbage[0]; i++) {
            ddp_adamw opt;
            ddp_result r;
            float *g = ddp_grad(c, id);
            size_t k;
            memset(&opt, 0xa5, sizeof opt);   /* what the stack held */
            opt.lr = 1e-3f; opt.beta1 = 0; opt.beta2 = 0; opt.eps = 0; opt.weight_decay = 0; opt.max_grad_norm = 0;
            opt.as_given = garbage[i];
            for (k = 0; k < 64; k++) g[k] = 1.0f;
            memcpy(before, ddp_param(c, id), sizeof before);
            if (ddp_grad_ready(c, id) != DDP_OK || ddp_finish(c) != DDP_OK) { ok = 0; break; }
            r = ddp_adamw_step(c, &opt, NULL);
            memcpy(after, ddp_param(c, id), sizeof after);
            if (r != DDP_ERR_INVALID_ARGUMENT || !says_zero_init(ddp_last_error(c), "ddp_adamw.as_given") ||
                memcmp(before, after, sizeof before)) {
                printf("FAIL struct_adamw_as_given_garbage_refused: as_given %d gave %s: %s\n", garbage[i],
                       ddp_result_string(r), ddp_last_error(c));
                ok = 0;
            }
            ddp_zero_grad(c);
        }
        if (ok) printf("PASS struct_adamw_as_given_garbage_refused\n");
        else test_failures++;
        ddp_shutdown(c);
    }
    {   /* the sampler's flags */
        int okc = 1;
        for (i = 0; i < sizeof garbage / sizeof garbage[0]; i++) {
            ddp_sampler s;
            uint64_t n;
            memset(&s, 0, sizeof s);
            s.n = 10; s.world = 1; s.shuffle = garbage[i];
            okc &= ddp_sampler_count(&s, &n) == DDP_ERR_INVALID_ARGUMENT && says_zero_init(ddp_last_error(NULL), "ddp_sampler.shuffle");
            s.shuffle = 1; s.drop_last = garbage[i];
            okc &= ddp_sampler_count(&s, &n) == DDP_ERR_INVALID_ARGUMENT && says_zero_init(ddp_last_error(NULL), "ddp_sampler.drop_last");
        }
        verdict(okc, "struct_sampler_flags_garbage_refused", "last: %s", ddp_last_error(NULL));
    }
    return test_failures ? 1 : 0;
}
