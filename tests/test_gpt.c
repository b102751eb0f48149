/* test_gpt.c — the tiny GPT of examples/gpt against PyTorch, and N ranks against 1 rank.

   1. Against tests/gpt_reference.bin (tests/support/gpt_reference.py: the same architecture in PyTorch,
      float64, from the initial parameters our init makes): our init reproduces the file's
      parameters bit for bit; then one fixed batch through our float32 CPU model must match the
      reference's logits, loss and every parameter gradient, and 10 AdamW steps (clipping and
      weight decay on) must match its 10 losses and its final parameters. Tolerances (float32
      against float64; stated once here, printed with the worst error found):
          logits, loss, step losses  |err| <= 1e-5 * max|ref| + 1e-5 * |ref|
          each gradient tensor       |err| <= 1e-4 * max|ref of that tensor| + 1e-4 * |ref|
          final parameters           |err| <= 2e-5 + 1e-4 * |ref|
      Checked on rank 0 only, in a single-rank context of its own.
   2. N ranks at batch B each train the model 1 rank trains at batch N*B (each rank also trains
      that reference itself), with and without 2-step gradient accumulation, 6 AdamW steps, to
      the tolerance of tests/test_equivalence.c (|err| <= 2e-6 + 2e-5 |ref|); and every rank
      holds the same bits. lr is 1e-3 (the trainer's): AdamW divides each gradient by its own
      running RMS, so a gradient that is pure rounding noise (the attention key bias's gradient
      is exactly zero in exact arithmetic: softmax ignores a constant added to every score) moves
      by up to ~lr per step, differently for each summation order; at 3e-3 those few parameters
      reach 1.1x the tolerance, at 1e-3 the worst of all parameters is ~0.6x.
   Run: build/test_gpt  or  build/ddprun -n 2 build/test_gpt    (run from the repository root) */
#include "testlib.h"
#include "../examples/gpt/gpt.h"
#include "../examples/gpt/gpt_data.h"   /* the trainer's windows: the sampler's epochs */
#include "support/gpt_reference.h"   /* the reference file's reader, worst_ratio */

static void test_reference(void) {
    reference ref;
    char why[512];
    ddp_context *ddp;
    ddp_desc solo;
    gpt m;
    gpt_config cfg;
    int *tok, *tgt, i, s;
    size_t P, BT;
    double w;
    if (!read_reference(&ref, why, sizeof why)) { verdict(0, "gpt_reference_file", "%s", why); return; }
    memset(&solo, 0, sizeof solo);
    solo.world_size = 1;
    if (ddp_init(&ddp, &solo) != DDP_OK) { verdict(0, "gpt_reference_init", "%s", ddp_last_error(ddp)); return; }
    cfg.layers = ref.layers; cfg.heads = ref.heads; cfg.dim = ref.dim; cfg.seq = ref.seq; cfg.batch = ref.batch;
    if (gpt_create(&m, ddp, &cfg, ref.seed) != DDP_OK) { verdict(0, "gpt_reference_init", "%s", ddp_last_error(ddp)); return; }
    P = m.num_floats;
    BT = (size_t)ref.batch * ref.seq;
    if ((int64_t)P != ref.num_floats) {
        verdict(0, "gpt_reference_shapes", "%zu parameters here, %lld in the reference", P, (long long)ref.num_floats);
        return;
    }
    verdict(memcmp(ddp_flat_params(ddp, NULL), ref.init, P * sizeof(float)) == 0, "gpt_init_matches_reference_bitwise",
            "our seeded init differs from the parameters the reference was made from (regenerate the file?)");
    memcpy(ddp_flat_params(ddp, NULL), ref.init, P * sizeof(float));   /* compare the math regardless */

    reference_batch(&ref, &tok, &tgt);
    {
        float loss;
        ddp_zero_grad(ddp);
        loss = gpt_forward(&m, tok, tgt, ref.batch, ref.seq, 1.0f, 1);
        w = worst_ratio(m.logits, ref.logits, BT * GPT_VOCAB, 0, 1e-5, 1e-5);
        verdict(w <= 1, "gpt_logits_match_pytorch", "worst error %.3g of the tolerance", w);
        printf("  (logits: worst error %.3f of |err| <= 1e-5*max|ref| + 1e-5*|ref|)\n", w);
        w = worst_ratio(&loss, &ref.loss, 1, 0, 1e-5, 1e-5);
        verdict(w <= 1, "gpt_loss_matches_pytorch", "loss %.7f, reference %.7f", loss, ref.loss);
        printf("  (loss %.7f vs %.7f)\n", loss, ref.loss);
        if (ddp_backward(ddp) != DDP_OK) { verdict(0, "gpt_backward", "%s", ddp_last_error(ddp)); return; }
    }
    {
        char bad[1024];
        size_t len = 0, off = 0;
        double worst = 0;
        int nbad = 0, worst_id = 0;
        bad[0] = 0;
        for (i = 0; i < ddp_num_params(ddp); i++) {
            size_t n = ddp_param_count(ddp, i);
            /* the flat gradient buffer pads tensors; the reference is packed */
            w = worst_ratio(ddp_grad(ddp, i), ref.grads + off, n, 0, 1e-4, 1e-4);
            if (w > worst) { worst = w; worst_id = i; }
            if (!(w <= 1) && len + 80 < sizeof bad)
                len += (size_t)snprintf(bad + len, sizeof bad - len, "%s%s (%.3g)", nbad++ ? ", " : "", ddp_param_name(ddp, i), w);
            off += n;
        }
        verdict(nbad == 0, "gpt_every_gradient_matches_pytorch", "%d tensor(s) beyond tolerance: %s", nbad, bad);
        printf("  (%d gradient tensors: worst error %.3f of |err| <= 1e-4*max|ref| + 1e-4*|ref|, in %s)\n",
               ddp_num_params(ddp), worst, ddp_param_name(ddp, worst_id));
    }
    {
        ddp_adamw opt = reference_adamw(&ref);
        float losses[64];
        double wl = 0;
        for (s = 0; s < ref.steps && s < 64; s++) {
            ddp_zero_grad(ddp);
            losses[s] = gpt_forward(&m, tok, tgt, ref.batch, ref.seq, 1.0f, 1);
            if (ddp_backward(ddp) != DDP_OK || ddp_adamw_step(ddp, &opt, NULL) != DDP_OK) {
                verdict(0, "gpt_adamw_steps", "%s", ddp_last_error(ddp));
                return;
            }
            w = worst_ratio(&losses[s], &ref.step_losses[s], 1, 0, 1e-5, 1e-5);
            wl = w > wl ? w : wl;
        }
        verdict(wl <= 1, "gpt_10_adamw_step_losses_match_pytorch", "worst %.3g of the tolerance; last loss %.6f vs %.6f",
                wl, losses[ref.steps - 1], ref.step_losses[ref.steps - 1]);
        printf("  (step losses %.5f .. %.5f: worst error %.3f of the tolerance)\n", losses[0], losses[ref.steps - 1], wl);
        {
            size_t off = 0;
            double worst = 0;
            for (i = 0; i < ddp_num_params(ddp); i++) {
                size_t n = ddp_param_count(ddp, i);
                w = worst_ratio(ddp_param(ddp, i), ref.final + off, n, 2e-5, 0, 1e-4);
                worst = w > worst ? w : worst;
                off += n;
            }
            verdict(worst <= 1, "gpt_params_after_10_adamw_steps_match_pytorch", "worst %.3g of |err| <= 2e-5 + 1e-4*|ref|", worst);
            printf("  (parameters after %d steps: worst error %.3f of |err| <= 2e-5 + 1e-4*|ref|)\n", ref.steps, worst);
        }
    }
    free(tok); free(tgt);
    free(ref.data); free(ref.init); free(ref.logits); free(ref.grads); free(ref.step_losses); free(ref.final);
    gpt_destroy(&m);
    ddp_shutdown(ddp);
}

/* ---- N ranks == 1 rank at N x batch ---- */
/* 21 windows of 17 bytes: an epoch holds 2 steps of 8 windows on 1, 2 and 4 ranks (each rank
   floor(21/world), the rest of each epoch dropped), so 6 steps cross 2 epoch boundaries. */
enum { EQ_GLOBAL = 8, EQ_STEPS = 6, EQ_DATA = 4096, EQ_SEED = 7 };
static unsigned char eq_data[EQ_DATA];

/* One optimizer step of `world` ranks' global batch `step`, this rank's share: `count` windows
   in `micro` micro-steps, drawn as train_gpt draws them (gpt_data.h's sampler over the windows;
   loss scaled by 1/micro, sync on the last micro-step). */
static ddp_result eq_step(gpt *m, int step, int rank, int world, int count, int micro, int *tok, int *tgt) {
    ddp_adamw opt;
    ddp_result r;
    int u, n = count / micro, T = m->cfg.seq;
    ddp_sampler s = gpt_window_sampler(EQ_DATA, T, world, rank, EQ_SEED);
    memset(&opt, 0, sizeof opt);
    opt.lr = 1e-3f; opt.beta2 = 0.99f; opt.weight_decay = 0.1f; opt.max_grad_norm = 1.0f;
    if ((r = ddp_zero_grad(m->ddp)) != DDP_OK) return r;
    for (u = 0; u < micro; u++) {
        uint64_t epoch = 0, first = 0;
        if (gpt_batch_position(&s, n, micro, (uint64_t)step, u, &epoch, &first) != DDP_OK ||
            gpt_sampled_batch(eq_data, &s, epoch, first, n, T, tok, tgt) != DDP_OK) {
            printf("FAIL gpt_equivalence_batch: rank %d step %d: %s\n", rank, step, ddp_last_error(NULL));
            return DDP_ERR_INVALID_ARGUMENT;
        }
        gpt_set_rows(m, (uint64_t)step, first * (uint64_t)world + (uint64_t)rank, (uint64_t)world);   /* dropout's masks */
        ddp_set_sync(m->ddp, u == micro - 1);
        gpt_forward(m, tok, tgt, n, T, 1.0f / (float)micro, 1);
        if ((r = ddp_backward(m->ddp)) != DDP_OK) return r;
    }
    return ddp_adamw_step(m->ddp, &opt, NULL);
}

/* The loader's property behind the equivalence, exactly and across epochs: every step's windows
   are the same set on 1, 2, 4 and 8 ranks (1 or 2 micro-steps), steps of an epoch share no
   window, and an epoch's steps hold floor(n / 8) x 8 distinct windows. 21 and 45 windows: epochs
   of 2 and 5 steps, tails of 5 dropped; 8 steps cross epochs. */
static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}
static void test_batches_across_epochs(void) {
    static const int windows[] = { 21, 45 }, worlds[] = { 1, 2, 4, 8 };
    int a, bad = 0, overlap = 0;
    char first[256] = "";
    for (a = 0; a < 2; a++) {
        int T = 16, steps_per_epoch = windows[a] / EQ_GLOBAL, step;
        uint64_t ref[EQ_GLOBAL], epoch_seen[64];
        int seen = 0;
        for (step = 0; step < 8; step++) {
            int wi, micro, k;
            if (step % steps_per_epoch == 0) seen = 0;
            for (wi = 0; wi < 4; wi++)
                for (micro = 1; micro <= 2; micro++) {
                    int w = worlds[wi], n = EQ_GLOBAL / w / micro, r, u, b, m = 0;
                    uint64_t got[EQ_GLOBAL];
                    if (n < 1) continue;
                    for (r = 0; r < w; r++) {
                        ddp_sampler s = gpt_window_sampler((size_t)windows[a] + (size_t)T, T, w, r, EQ_SEED);
                        for (u = 0; u < micro; u++) {
                            uint64_t epoch = 0, pos = 0;
                            if (gpt_batch_position(&s, n, micro, (uint64_t)step, u, &epoch, &pos) != DDP_OK) { bad++; continue; }
                            for (b = 0; b < n; b++) if (ddp_sample(&s, epoch, pos + (uint64_t)b, &got[m++]) != DDP_OK) bad++;
                        }
                    }
                    qsort(got, (size_t)m, sizeof got[0], cmp_u64);
                    if (w == 1 && micro == 1) {
                        memcpy(ref, got, sizeof ref);
                        for (k = 0; k < EQ_GLOBAL; k++) {
                            int j;
                            for (j = 0; j < seen; j++) overlap += epoch_seen[j] == got[k];
                            overlap += k > 0 && got[k] == got[k - 1];
                        }
                        memcpy(epoch_seen + seen, got, sizeof got);
                        seen += EQ_GLOBAL;
                    } else if (m != EQ_GLOBAL || memcmp(got, ref, sizeof ref) != 0) {
                        if (!bad++) snprintf(first, sizeof first, "%d windows, step %d: %d ranks x %d micro-steps take other windows than 1 rank",
                                             windows[a], step, w, micro);
                    }
                }
        }
    }
    verdict(bad == 0 && overlap == 0, "gpt_batches_same_windows_any_world_across_epochs",
            "%d mismatch(es), %d window(s) twice in an epoch; first: %s", bad, overlap, first);
}

static int test_equivalence_ranks(void) {
    ddp_context *ddp, *solo;
    ddp_desc solo_desc;
    gpt model, ref;
    gpt_config cfg;
    int rank, world, micro, round, step, i, tok[EQ_GLOBAL * 16], tgt[EQ_GLOBAL * 16];
    float dropout;
    char name[128];
    for (i = 0; i < EQ_DATA; i++)   /* text-like bytes: letters and spaces */
        eq_data[i] = (unsigned char)(test_value(3, (uint64_t)i) > 0.6f ? ' ' : 'a' + (int)(13.0f * (1.0f + test_value(4, (uint64_t)i))));
    memset(&solo_desc, 0, sizeof solo_desc);
    solo_desc.world_size = 1;
    if (ddp_init(&ddp, NULL) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(ddp)); return 0; }
    rank = ddp_rank(ddp);
    world = ddp_world_size(ddp);
    test_quiet_others(rank);
    if (rank == 0) test_reference();
    if (rank == 0) test_batches_across_epochs();
    if (EQ_GLOBAL % (2 * world)) { printf("FAIL gpt_equivalence: world %d must divide %d\n", world, EQ_GLOBAL / 2); return 0; }
    cfg.layers = 2; cfg.heads = 2; cfg.dim = 32; cfg.seq = 16;
    for (round = 0; round < 3; round++) {   /* 1 micro-step; 2; 2 with dropout */
        ddp_context *d = ddp;
        /* 5e-6: AdamW's first step moves a parameter by lr * g / (|g| + eps), and a gradient that
           nearly cancels magnifies its float rounding: h0.mlp.fc.w[3002]'s first gradient is
           -4.6e-8 (3.5e-6 of its tensor's largest), 5e-10 apart between batch 8 and two micro-
           batches of 4 (the same windows, in the same order), which moves it 1.7e-6, 2.5e-6 after
           6 steps (the bar was 2e-6: worst 1.17 of it; sampler seeds 1-6: 0.77). One wrong window
           in one micro-step of one rank gives 1000x that. */
        double worst = 0, tol_abs = 5e-6, tol_rel = 2e-5;
        size_t count, k;
        float fails = 0;
        uint64_t mine, rank0;
        micro = round ? 2 : 1;
        dropout = round == 2 ? 0.25f : 0.0f;
        if (round) {   /* a fresh process group: parameters can be registered only once */
            ddp_shutdown(ddp);
            if (ddp_init(&d, NULL) != DDP_OK) { printf("FAIL gpt_reinit: %s\n", ddp_last_error(d)); return 0; }
        }
        if (ddp_init(&solo, &solo_desc) != DDP_OK) { printf("FAIL gpt_solo: %s\n", ddp_last_error(solo)); return 0; }
        cfg.batch = EQ_GLOBAL / world / micro;
        if (gpt_create(&model, d, &cfg, 42) != DDP_OK) { printf("FAIL gpt_create: %s\n", ddp_last_error(d)); return 0; }
        cfg.batch = EQ_GLOBAL;
        if (gpt_create(&ref, solo, &cfg, 42) != DDP_OK) { printf("FAIL gpt_create: %s\n", ddp_last_error(solo)); return 0; }
        gpt_set_dropout(&model, dropout, 99);
        gpt_set_dropout(&ref, dropout, 99);
        for (step = 0; step < EQ_STEPS; step++) {
            if (eq_step(&model, step, rank, world, EQ_GLOBAL / world, micro, tok, tgt) != DDP_OK) {
                printf("FAIL gpt_equivalence_ranks%d: step %d: %s\n", world, step, ddp_last_error(d));
                return 0;
            }
            if (eq_step(&ref, step, 0, 1, EQ_GLOBAL, 1, tok, tgt) != DDP_OK) { printf("FAIL gpt_reference_run: %s\n", ddp_last_error(solo)); return 0; }
        }
        {
            const float *got = ddp_flat_params(d, &count), *want = ddp_flat_params(solo, NULL);
            int bad = 0;
            for (k = 0; k < count; k++) {
                double err = fabs((double)got[k] - want[k]), tol = tol_abs + tol_rel * fabs(want[k]);
                if (!(err <= tol)) bad++;
                if (err / tol > worst) worst = err / tol;
                if (getenv("GPT_DEBUG") && err > tol) {
                    int p;
                    for (p = 0; p < ddp_num_params(d); p++)
                        if (got + k >= ddp_param(d, p) && got + k < ddp_param(d, p) + ddp_param_count(d, p))
                            fprintf(stderr, "%s[%ld] got %g want %g\n", ddp_param_name(d, p), (long)(got + k - ddp_param(d, p)), got[k], want[k]);
                }
            }
            fails = (float)bad;
            ddp_allreduce(d, &fails, 1, DDP_SUM);
            snprintf(name, sizeof name, "gpt_ranks%d_batch%d_accum%d%s_equals_1rank_batch%d", world, EQ_GLOBAL / world / micro, micro,
                     dropout > 0 ? "_dropout" : "", EQ_GLOBAL);
            verdict(fails == 0, name, "%g parameter(s) beyond |err| <= %g + %g*|ref| (worst %.2f of tolerance)", fails, tol_abs, tol_rel, worst);
            printf("  (%s: %d steps, worst error %.3f of |err| <= %g + %g*|ref|)\n", name, EQ_STEPS, worst, tol_abs, tol_rel);
            mine = rank0 = gpt_fnv1a(got, count * sizeof(float), GPT_FNV_INIT);
            ddp_broadcast(d, &rank0, sizeof rank0, 0);
            fails = (float)(mine != rank0);
            ddp_allreduce(d, &fails, 1, DDP_SUM);
            snprintf(name, sizeof name, "gpt_ranks%d_accum%d%s_bitwise_identical_across_ranks", world, micro, dropout > 0 ? "_dropout" : "");
            verdict(fails == 0, name, "%g rank(s) differ from rank 0", fails);
        }
        gpt_destroy(&model);
        gpt_destroy(&ref);
        ddp_shutdown(solo);
        ddp = d;
    }
    return ddp_shutdown(ddp) == DDP_OK;
}

/* ---- dropout: the masks, and the backward as the derivative of the forward with them ---- */
static void test_dropout_masks(void) {
    gpt m;
    uint64_t key = gpt__drop_key(5, 3, 17, GPT_DROP_ATT(1)), i, n = 1u << 20, dropped = 0, same = 0;
    int ok;
    memset(&m, 0, sizeof m);
    ok = gpt_set_dropout(&m, 0.2f, 5) && m.drop_scale == 1.0f / 0.8f;
    for (i = 0; i < n; i++) {
        float f = gpt__drop_factor(key, i, m.drop_threshold, m.drop_scale);
        ok &= f == 0.0f || f == m.drop_scale;
        dropped += f == 0.0f;
    }
    verdict(ok && fabs((double)dropped / n - 0.2) < 0.003, "gpt_dropout_drops_p_and_scales_the_rest",
            "dropped %.4f of 2^20 units (want 0.2 +- 0.003), scale %g", (double)dropped / n, m.drop_scale);
    for (i = 0; i < 4096; i++)   /* another step, row or site: another mask */
        same += (gpt__drop_factor(key, i, m.drop_threshold, 1.0f) == 0) == (gpt__drop_factor(gpt__drop_key(5, 4, 17, GPT_DROP_ATT(1)), i, m.drop_threshold, 1.0f) == 0);
    verdict(same < 4096 * 0.75, "gpt_dropout_masks_change_with_the_step", "%llu of 4096 units agree", (unsigned long long)same);
    ok = gpt_set_dropout(&m, 0.0f, 5) && gpt__drop_factor(key, 7, m.drop_threshold, m.drop_scale) == 1.0f;
    ok &= !gpt_set_dropout(&m, 1.0f, 5) && !gpt_set_dropout(&m, -0.1f, 5) && !gpt_set_dropout(&m, NAN, 5);
    verdict(ok, "gpt_dropout_p0_keeps_all_and_bad_p_refused", "p = 0 dropped a unit, or p = 1, -0.1 or NaN was taken");
}

/* Loss of a training forward (dropout on) with nothing kept on the tape. */
static float dropout_loss(gpt *m, const int *tok, const int *tgt, int B, int T) {
    float loss = gpt_forward(m, tok, tgt, B, T, 1.0f, 1);
    ddp_tape_reset(m->ddp);
    return loss;
}

static void test_dropout_gradient(void) {
    enum { B = 2, T = 8, PER_PARAM = 8 };
    ddp_context *ddp;
    ddp_desc desc;
    gpt m;
    gpt_config cfg;
    int tok[B * T], tgt[B * T], i, bad = 0, probe, probes;
    double worst = 0;
    memset(&desc, 0, sizeof desc);
    desc.world_size = 1;
    cfg.layers = 2; cfg.heads = 2; cfg.dim = 8; cfg.seq = T; cfg.batch = B;
    if (ddp_init(&ddp, &desc) != DDP_OK || gpt_create(&m, ddp, &cfg, 11) != DDP_OK) {
        verdict(0, "gpt_dropout_gradient_setup", "%s", ddp_last_error(ddp));
        return;
    }
    gpt_set_rows(&m, 4, 6, 3);
    for (i = 0; i < B * T; i++) { tok[i] = 'a' + (int)(13 * (1 + test_value(21, (uint64_t)i))); tgt[i] = 'a' + (int)(13 * (1 + test_value(22, (uint64_t)i))); }
    {   /* dropout changes a training forward, and only a training forward */
        float plain = dropout_loss(&m, tok, tgt, B, T), dropped, eval;
        gpt_set_dropout(&m, 0.3f, 77);
        dropped = dropout_loss(&m, tok, tgt, B, T);
        eval = gpt_forward(&m, tok, tgt, B, T, 1.0f, 0);
        verdict(dropped != plain && eval == plain, "gpt_dropout_only_while_training", "loss %.9g without dropout, %.9g with, %.9g evaluating",
                plain, dropped, eval);
    }
    {   /* train a little first: at init attention is near uniform and its q, k gradients tiny */
        ddp_adamw opt;
        memset(&opt, 0, sizeof opt);
        opt.lr = 3e-2f;
        for (i = 0; i < 30; i++) {
            ddp_zero_grad(ddp);
            gpt_forward(&m, tok, tgt, B, T, 1.0f, 1);
            ddp_backward(ddp);
            ddp_adamw_step(ddp, &opt, NULL);
        }
    }
    ddp_zero_grad(ddp);
    gpt_forward(&m, tok, tgt, B, T, 1.0f, 1);
    ddp_backward(ddp);
    probes = PER_PARAM * ddp_num_params(ddp);
    for (probe = 0; probe < probes; probe++) {   /* central differences at h and h/2, Richardson-extrapolated */
        int id = probe / PER_PARAM;
        size_t k = (size_t)(probe * 7919) % ddp_param_count(ddp, id);
        float *w = ddp_param(ddp, id) + k, keep = *w, h = 4e-3f, d[4];
        double g = ddp_grad(ddp, id)[k], fd, err, tol;
        *w = keep + h; d[0] = dropout_loss(&m, tok, tgt, B, T);
        *w = keep - h; d[1] = dropout_loss(&m, tok, tgt, B, T);
        *w = keep + h / 2; d[2] = dropout_loss(&m, tok, tgt, B, T);
        *w = keep - h / 2; d[3] = dropout_loss(&m, tok, tgt, B, T);
        *w = keep;
        fd = (4.0 * ((double)d[2] - d[3]) / h - ((double)d[0] - d[1]) / (2.0 * h)) / 3.0;
        err = fabs(fd - g);
        tol = 2e-4 + 1e-2 * fabs(g);
        bad += !(err <= tol);
        if (err / tol > worst) worst = err / tol;
        if (getenv("GPT_DEBUG") && !(err <= tol)) fprintf(stderr, "%s[%zu]: grad %g, central difference %g\n", ddp_param_name(ddp, id), k, g, fd);
    }
    verdict(bad == 0, "gpt_dropout_backward_is_the_forwards_derivative", "%d of %d probes beyond |fd - grad| <= 2e-4 + 1e-2|grad| (worst %.2f)",
            bad, probes, worst);
    printf("  (dropout 0.3: %d elements of every parameter, worst %.3f of the tolerance)\n", PER_PARAM, worst);
    gpt_destroy(&m);
    ddp_shutdown(ddp);
}

int main(void) {
    const char *world = getenv("WORLD_SIZE");
    test_blas_threads();
    gpt_blas_init(world ? atoi(world) : 1);
    if (!getenv("RANK") || !strcmp(getenv("RANK"), "0")) { test_dropout_masks(); test_dropout_gradient(); }
    if (!test_equivalence_ranks()) test_failures++;
    return test_summary("test_gpt");
}
