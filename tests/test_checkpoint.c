/* test_checkpoint.c — ddp.h's checkpoints (ddp_save / ddp_load / ddp_save_check), as real ranks
   under ddprun; tests/run.sh runs the phases in order on one directory:

     ddprun -n 2 test_checkpoint save DIR     train S steps, save DIR/ck, keep the state in memory
                                              (DIR/state), train K more (DIR/straight)
     ddprun -n M test_checkpoint resume DIR   M = 3, 1, 2: load DIR/ck, continue K steps
     ddprun -n 3 test_checkpoint errors DIR   every refusal, named on every rank
     ddprun -n 2 test_checkpoint other DIR    a model with another parameter size: refused by name

   "Identical across world sizes" means here: after ddp_load on M ranks every rank holds, bit for
   bit, the parameters, AdamW m and v and step that the 2-rank run saved; and continuing K steps
   on M ranks ends, bit for bit, where an M-rank run ends that was handed the same state from
   memory (ddp_copy_from_host) instead of a file. At M = 2 (the saving world size) it also ends
   where the run that never stopped ends. (Training itself is not world-size independent: the
   averaged gradient's float rounding depends on how the batch is split.)
   The chunk of the library's streaming is made small here (DDP__CKPT_CHUNK) so that parameters
   cross chunk boundaries. Sharded optimizer state: see the note at TEST_SHARDED. */
#define DDP__CKPT_CHUNK ((size_t)1000)
#define DDP_HAS_SHARD_OPTIMIZER   /* ddp_desc.shard_optimizer is here: the *-sharded phases run */
#include "testlib.h"
#ifndef _WIN32
#include <sys/wait.h>
#else
#include <dirent.h>   /* MinGW-w64's */
#endif

#define S 5   /* steps before the checkpoint */
#define K 4   /* steps after it */
static size_t sizes[3] = { 3001, 17, 2500 };
static const char *const names[3] = { "embed", "bias", "proj" };
static size_t total;   /* floats in the three parameters */

/* ZeRO-1 (ddp_desc.shard_optimizer): the phases "save-sharded" and "resume-sharded" run with it
   on (tests/run.sh): save on 2 ranks sharded, load on 3 unsharded and on 1, and the reverse. The
   state is read and written through the collective gather/scatter, which reach m and v wherever
   they live. */
static int want_sharded;

static ddp_context *ddp;
static int rank, world;

/* One verdict for all ranks: PASS only if every rank passed; each failing rank says why. */
static void check_all(int ok, const char *name, const char *fmt, ...) {
    float bad = ok ? 0.0f : 1.0f;
    char why[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (!ok) fprintf(stderr, "rank %d: %s: %s\n", rank, name, why);
    if (ddp_allreduce(ddp, &bad, 1, DDP_SUM) != DDP_OK) { printf("FAIL %s: allreduce: %s\n", name, ddp_last_error(ddp)); exit(1); }
    if (rank == 0) verdict(bad == 0, name, "%g rank(s) failed (their lines on stderr); rank 0: %s", bad, ok ? "ok" : why);
}

static void die(const char *what) {
    printf("FAIL %s: %s\n", what, ddp_last_error(ddp));
    exit(1);
}

static int setup(const size_t *sz) {
    ddp_desc desc;
    float *init[3];
    int i, id;
    memset(&desc, 0, sizeof desc);
    desc.log_level = DDP_LOG_OFF;
#ifdef DDP_HAS_SHARD_OPTIMIZER
    desc.shard_optimizer = want_sharded;
#endif
    if (ddp_init(&ddp, &desc) != DDP_OK) { printf("FAIL init: %s\n", ddp_last_error(ddp)); exit(1); }
    rank = ddp_rank(ddp);
    world = ddp_world_size(ddp);
    for (i = 0, total = 0; i < 3; i++) {   /* the initial values are read at commit: kept until then */
        size_t k;
        init[i] = (float *)malloc(sz[i] * sizeof(float));
        for (k = 0; k < sz[i]; k++) init[i][k] = 0.5f * test_value(100 + i, k);
        if (ddp_register_param(ddp, names[i], sz[i], i == 1 ? DDP_NO_DECAY : 0, init[i], &id) != DDP_OK) die("register");
        total += sz[i];
    }
    if (ddp_commit(ddp) != DDP_OK) die("commit");
    for (i = 0; i < 3; i++) free(init[i]);
    return 0;
}

/* The state, packed: parameters, m, v of each parameter in registration order, then the step. */
static float *state_now(int64_t *step) {
    float *s = (float *)malloc(3 * total * sizeof(float));
    float *p0 = ddp_flat_params(ddp, NULL);
    int64_t *st;
    size_t at = 0;
    ddp_buffer bufs[3] = { DDP_PARAMS, DDP_ADAM_M, DDP_ADAM_V };
    int b, i;
    for (b = 0; b < 3; b++)
        for (i = 0; i < 3; i++) {
            /* collective: with shard_optimizer m and v live on their owners */
            if (ddp_gather_to_host(ddp, bufs[b], (size_t)(ddp_param(ddp, i) - p0), s + at, sizes[i], 0) != DDP_OK) die("gather_to_host");
            if (ddp_broadcast(ddp, s + at, sizes[i] * sizeof(float), 0) != DDP_OK) die("broadcast");
            at += sizes[i];
        }
    if (ddp_adamw_state(ddp, NULL, NULL, &st) != DDP_OK) die("adamw_state");
    *step = *st;
    return s;
}

static void state_set(const float *s, int64_t step) {
    float *p0 = ddp_flat_params(ddp, NULL);
    int64_t *st;
    size_t at = 0;
    ddp_buffer bufs[3] = { DDP_PARAMS, DDP_ADAM_M, DDP_ADAM_V };
    int b, i;
    for (b = 0; b < 3; b++)
        for (i = 0; i < 3; i++) {
            if (ddp_scatter_from_host(ddp, bufs[b], (size_t)(ddp_param(ddp, i) - p0), s + at, sizes[i], 0) != DDP_OK) die("scatter_from_host");
            at += sizes[i];
        }
    if (ddp_adamw_state(ddp, NULL, NULL, &st) != DDP_OK) die("adamw_state");
    *st = step;
}

/* One step: each rank's gradient depends on the parameters, its rank and the step, so the
   average (and the trajectory) depends on the world size, and on every bit of the state. */
static void train(int steps) {
    ddp_adamw opt;
    int s, i;
    memset(&opt, 0, sizeof opt);
    opt.lr = 1e-2f; opt.weight_decay = 0.1f; opt.max_grad_norm = 5.0f; opt.beta2 = 0.99f;
    for (s = 0; s < steps; s++) {
        int64_t *step;
        if (ddp_adamw_state(ddp, NULL, NULL, &step) != DDP_OK) die("adamw_state");
        if (ddp_zero_grad(ddp) != DDP_OK) die("zero_grad");
        for (i = 0; i < 3; i++) {
            float *p0 = ddp_flat_params(ddp, NULL), *p = (float *)malloc(sizes[i] * sizeof(float));
            size_t off = (size_t)(ddp_param(ddp, i) - p0), k;
            if (ddp_copy_to_host(ddp, DDP_PARAMS, off, p, sizes[i]) != DDP_OK) die("copy params");
            for (k = 0; k < sizes[i]; k++)
                p[k] = sinf(3.0f * p[k] + 0.01f * (float)k) + 0.3f * test_value(1000 * (uint64_t)*step + rank, k);
            if (ddp_copy_from_host(ddp, DDP_GRADS, off, p, sizes[i]) != DDP_OK) die("copy grads");
            free(p);
        }
        for (i = 0; i < 3; i++)   /* the first ready gradient begins the backward: no host copies after it */
            if (ddp_grad_ready(ddp, i) != DDP_OK) die("grad_ready");
        if (ddp_finish(ddp) != DDP_OK) die("finish");
        if (ddp_adamw_step(ddp, &opt, NULL) != DDP_OK) die("adamw_step");
    }
}

static void path_in(char *out, size_t n, const char *dir, const char *name) { snprintf(out, n, "%s/%s", dir, name); }

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) { printf("FAIL write %s\n", path); exit(1); }
}

static void *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    long len;
    char *b;
    if (!f || fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) { printf("FAIL read %s\n", path); exit(1); }
    b = (char *)malloc((size_t)len + 1);
    if (fread(b, 1, (size_t)len, f) != (size_t)len) { printf("FAIL read %s\n", path); exit(1); }
    fclose(f);
    *n = (size_t)len;
    return b;
}

/* The user blob: what a program keeps with the state (here: a tag and its step). */
typedef struct blob { char tag[16]; int64_t step; } blob;

typedef struct seen { ddp_checkpoint_info info; int calls; const char *refuse; } seen;
static int check_blob(void *arg, const ddp_checkpoint_info *info, const void *user, size_t n, char *err, size_t errn) {
    seen *s = (seen *)arg;
    s->info = *info;
    s->calls++;
    if (s->refuse) { snprintf(err, errn, "%s", s->refuse); return 0; }
    if (n != sizeof(blob) || memcmp(user, "test-checkpoint", 16) != 0) { snprintf(err, errn, "not this test's blob (%zu bytes)", n); return 0; }
    return 1;
}

static void phase_save(const char *dir) {
    char path[4096];
    float *mem;
    int64_t step;
    blob b;
    int holds = -1;
    train(S);
    mem = state_now(&step);
    if (rank == 0) {
        path_in(path, sizeof path, dir, "state");
        write_file(path, mem, 3 * total * sizeof(float));
        path_in(path, sizeof path, dir, "saved_sharded");
        write_file(path, want_sharded ? "1" : "0", 1);
    }
    path_in(path, sizeof path, dir, "ck");
    check_all(ddp_save_check(ddp, path, &holds) == DDP_OK && holds == 0, "ckpt_save_check_new_path", "%s, holds %d",
              ddp_last_error(ddp), holds);
    memset(&b, 0, sizeof b);
    memcpy(b.tag, "test-checkpoint", 16);
    b.step = step;
    check_all(ddp_save(ddp, path, &b, sizeof b) == DDP_OK, "ckpt_save_2ranks", "%s", ddp_last_error(ddp));
    check_all(ddp_save_check(ddp, path, &holds) == DDP_OK && holds == 1, "ckpt_save_check_existing_file", "%s, holds %d",
              ddp_last_error(ddp), holds);
    {   /* nothing but the checkpoint in the directory: the temporary was renamed */
        DIR *d = opendir(dir);
        struct dirent *e;
        int temps = 0;
        while (d && (e = readdir(d)) != NULL) temps += strstr(e->d_name, ".tmp.") != NULL;
        if (d) closedir(d);
        check_all(temps == 0, "ckpt_save_leaves_no_temporary", "%d temporary file(s) left", temps);
    }
    {   /* the state is untouched by the save */
        int64_t st2;
        float *again = state_now(&st2);
        check_all(st2 == step && !memcmp(again, mem, 3 * total * sizeof(float)), "ckpt_save_leaves_state_alone", "differs");
        free(again);
    }
    train(K);
    free(mem);
    mem = state_now(&step);
    if (rank == 0) {
        path_in(path, sizeof path, dir, "straight");
        write_file(path, mem, 3 * total * sizeof(float));
    }
    free(mem);
}

static void phase_resume(const char *dir) {
    char path[4096], name[128];
    float *want, *got, *a, *b2;
    size_t n;
    int64_t step, sa, sb;
    blob b;
    seen sn;
    ddp_checkpoint_info info;
    ddp_result r;
    char *sharded;
    memset(&sn, 0, sizeof sn);
    memset(&b, 0, sizeof b);
    memset(&info, 0, sizeof info);
    path_in(path, sizeof path, dir, "saved_sharded");
    sharded = (char *)read_file(path, &n);
    path_in(path, sizeof path, dir, "state");
    want = (float *)read_file(path, &n);
    path_in(path, sizeof path, dir, "ck");
    r = ddp_load(ddp, path, &b, sizeof b, check_blob, &sn, &info);
    snprintf(name, sizeof name, "ckpt_load_2rank_checkpoint_on_%dranks", world);
    check_all(r == DDP_OK && info.world_size == 2 && info.sharded == sharded[0] - '0' && info.step == S && info.user_bytes == sizeof b &&
              !memcmp(b.tag, "test-checkpoint", 16) && b.step == S && (rank != 0 || sn.calls == 1) && (rank == 0 || sn.calls == 0),
              name, "r=%d %s; info: world %d sharded %d step %lld user %llu; blob step %lld; check called %d time(s)", (int)r,
              ddp_last_error(ddp), info.world_size, info.sharded, (long long)info.step, (unsigned long long)info.user_bytes,
              (long long)b.step, sn.calls);
    got = state_now(&step);
    snprintf(name, sizeof name, "ckpt_loaded_state_bitwise_on_every_rank_%dranks", world);
    check_all(n == 3 * total * sizeof(float) && step == S && !memcmp(got, want, n), name, "step %lld, first difference at float %zu",
              (long long)step, (size_t)0);
    train(K);
    a = state_now(&sa);
    state_set(want, S);   /* the same state handed over in memory, then the same steps */
    train(K);
    b2 = state_now(&sb);
    snprintf(name, sizeof name, "ckpt_resumed_equals_in_memory_state_%dranks", world);
    check_all(sa == S + K && sb == S + K && !memcmp(a, b2, n), name, "steps %lld / %lld, or the bits differ", (long long)sa, (long long)sb);
    {   /* every rank ends with rank 0's bits */
        uint64_t h = test_hash(a, n), h0 = h;
        if (ddp_broadcast(ddp, &h0, sizeof h0, 0) != DDP_OK) die("broadcast");
        snprintf(name, sizeof name, "ckpt_resumed_ranks_identical_%dranks", world);
        check_all(h == h0, name, "hash %016llx, rank 0's %016llx", (unsigned long long)h, (unsigned long long)h0);
    }
    if (world == 2) {   /* the saving world size: = the run that never stopped */
        float *straight;
        size_t m;
        path_in(path, sizeof path, dir, "straight");
        straight = (float *)read_file(path, &m);
        check_all(m == n && !memcmp(a, straight, n), "ckpt_resumed_equals_uninterrupted_run_2ranks", "the bits differ");
        free(straight);
    } else {   /* another world size trains another trajectory: the check above has teeth */
        float *straight;
        size_t m;
        path_in(path, sizeof path, dir, "straight");
        straight = (float *)read_file(path, &m);
        snprintf(name, sizeof name, "ckpt_world_size_changes_training_%dranks", world);
        check_all(m == n && memcmp(a, straight, n) != 0, name, "a %d-rank continuation equals the 2-rank one", world);
        free(straight);
    }
    free(want); free(got); free(a); free(b2); free(sharded);
}

/* A copy of `src` with `len` bytes at `at` replaced and (reseal) the checksum made valid again. */
static void patch(const char *src, const char *dst, size_t at, const void *bytes, size_t len, int reseal) {
    size_t n;
    unsigned char *b = (unsigned char *)read_file(src, &n);
    memcpy(b + at, bytes, len);
    if (reseal) {   /* the library's own checksum (tests/test_gpt.sh computes it independently, in Python) */
        ddp__ckpt_sum sum;
        uint64_t h;
        int i;
        ddp__sum_init(&sum);
        ddp__sum_add(&sum, b, n - 8);
        h = ddp__sum_value(&sum);
        for (i = 0; i < 8; i++) b[n - 8 + i] = (unsigned char)(h >> (8 * i));
    }
    write_file(dst, b, n);
    free(b);
}

/* ddp_load of `path` must fail on every rank: rank 0's message holds `want`, the others' say
   rank 0 could not load it and why; the state stays what it was; the ranks stay in step. */
static void refused(const char *name, const char *path, const char *want, seen *sn) {
    int64_t s0, s1;
    float *before = state_now(&s0), *after;
    blob b;
    ddp_result r = ddp_load(ddp, path, &b, sizeof b, check_blob, sn, NULL);
    const char *e = ddp_last_error(ddp);
    int ok = r != DDP_OK && strstr(e, want) != NULL && (rank == 0 ? !strncmp(e, "rank 0: ", 8) : strstr(e, "rank 0 could not load the checkpoint") != NULL);
    after = state_now(&s1);
    ok = ok && s0 == s1 && !memcmp(before, after, 3 * total * sizeof(float)) && ddp_barrier(ddp) == DDP_OK;
    check_all(ok, name, "r=%d, message '%s' (want '%s'), state %s", (int)r, e, want, s0 == s1 && !memcmp(before, after, 3 * total * sizeof(float)) ? "unchanged" : "CHANGED");
    if (rank == 0 && ok) printf("  (rank 0: %.160s)\n", e + 8);
    free(before); free(after);
}

static void phase_errors(const char *dir) {
    char ck[4096], p[4096];
    size_t n;
    unsigned char *file;
    seen sn;
    ddp_result r;
    int holds;
    memset(&sn, 0, sizeof sn);
    path_in(ck, sizeof ck, dir, "ck");
    file = (unsigned char *)read_file(ck, &n);
#ifndef _WIN32
    path_in(p, sizeof p, dir, "fifo");
    if (rank == 0) { unlink(p); if (mkfifo(p, 0600) != 0) die("mkfifo"); }
    if (ddp_barrier(ddp) != DDP_OK) die("barrier");
    refused("ckpt_fifo_refused_not_waited_on", p, "is a FIFO (named pipe), not a regular file", &sn);
#else
    if (rank == 0) printf("SKIP ckpt_fifo_refused_not_waited_on: Windows has no FIFOs in the file system\n");
#endif
    path_in(p, sizeof p, dir, "nothing-here");
    refused("ckpt_missing_file_refused", p, "No such file or directory", &sn);
    refused("ckpt_directory_refused", dir, "is a directory, not a regular file", &sn);
    path_in(p, sizeof p, dir, "truncated");
    if (rank == 0) write_file(p, file, n - 1);
    refused("ckpt_truncated_refused", p, "is truncated", &sn);
    if (rank == 0) write_file(p, file, 40);
    refused("ckpt_header_only_refused", p, "is truncated (40 bytes: not even its header)", &sn);
    path_in(p, sizeof p, dir, "long");
    if (rank == 0) { unsigned char *l = (unsigned char *)malloc(n + 1); memcpy(l, file, n); l[n] = 0; write_file(p, l, n + 1); free(l); }
    refused("ckpt_bytes_after_checksum_refused", p, "goes on after its checksum", &sn);
    path_in(p, sizeof p, dir, "flipped");
    if (rank == 0) { unsigned char x = file[n / 2] ^ 0x10; patch(ck, p, n / 2, &x, 1, 0); }
    refused("ckpt_flipped_data_bit_refused", p, "is corrupt (checksum mismatch)", &sn);
    if (rank == 0) { unsigned char x = (unsigned char)('e' ^ 0x01); patch(ck, p, DDP__CKPT_FIXED + 8 + 4, &x, 1, 0); }
    refused("ckpt_flipped_name_byte_refused", p, "is corrupt (checksum mismatch)", &sn);
    if (rank == 0) { unsigned char x = 3; patch(ck, p, 8, &x, 1, 0); }
    refused("ckpt_other_version_refused", p, "has format version 3; this ddp.h reads versions 1 and 2", &sn);
    if (rank == 0) patch(ck, p, 0, "NOTACKPT", 8, 0);
    refused("ckpt_no_magic_refused", p, "is not a ddp.h checkpoint", &sn);
    {   /* integers at their stored width: a step of 2^32 + 5 arrives whole (an int32 read would say 5) */
        unsigned char w[8];
        int64_t big = ((int64_t)1 << 32) + 5;
        int i;
        for (i = 0; i < 8; i++) w[i] = (unsigned char)((uint64_t)big >> (8 * i));
        if (rank == 0) patch(ck, p, 24, w, 8, 1);
        sn.refuse = "this test looked and refuses it";
        sn.info.step = 0;
        refused("ckpt_check_refusal_reaches_every_rank", p, "this test looked and refuses it", &sn);
        sn.refuse = NULL;
        if (rank == 0) verdict(sn.info.step == big, "ckpt_step_read_at_its_width", "the check saw step %lld", (long long)sn.info.step);
        for (i = 0; i < 8; i++) w[i] = 0xff;   /* -1 */
        if (rank == 0) patch(ck, p, 24, w, 8, 1);
        refused("ckpt_negative_step_refused", p, "AdamW step -1", &sn);
        if (rank == 0) { unsigned char x = 'E'; patch(ck, p, DDP__CKPT_FIXED + 8 + 4, &x, 1, 1); }   /* "Embed": resealed */
        refused("ckpt_other_parameter_name_refused_by_name", p, "its parameter 0 is 'Embed' of 3001 floats (flags 0); this model's is 'embed'", &sn);
    }
    {   /* a user blob larger than the caller's buffer */
        blob small;
        ddp_result rr = ddp_load(ddp, ck, &small, 8, NULL, NULL, NULL);
        check_all(rr != DDP_OK && strstr(ddp_last_error(ddp), "holds a user blob of 24 bytes; the caller's buffer takes 8") != NULL,
                  "ckpt_user_blob_larger_than_buffer_refused", "%s", ddp_last_error(ddp));
    }
    {   /* bad arguments: named, on the calling rank, nothing collective started */
        int h = 7;
        int ok = ddp_save(NULL, ck, NULL, 0) == DDP_ERR_INVALID_ARGUMENT && strstr(ddp_last_error(NULL), "ddp_save: the context is NULL") &&
                 ddp_load(NULL, ck, NULL, 0, NULL, NULL, NULL) == DDP_ERR_INVALID_ARGUMENT &&
                 ddp_save_check(NULL, ck, &h) == DDP_ERR_INVALID_ARGUMENT && h == 0 &&
                 ddp_save(ddp, NULL, NULL, 0) == DDP_ERR_INVALID_ARGUMENT && strstr(ddp_last_error(ddp), "ddp_save: no path") &&
                 ddp_save(ddp, ck, NULL, 5) == DDP_ERR_INVALID_ARGUMENT && strstr(ddp_last_error(ddp), "NULL user blob of 5 bytes") &&
                 ddp_load(ddp, "", NULL, 0, NULL, NULL, NULL) == DDP_ERR_INVALID_ARGUMENT &&
                 ddp_load(ddp, ck, NULL, 4, NULL, NULL, NULL) == DDP_ERR_INVALID_ARGUMENT && strstr(ddp_last_error(ddp), "NULL user buffer");
        check_all(ok, "ckpt_bad_arguments_named", "last: %s", ddp_last_error(ddp));
    }
    /* saving: a destination that cannot be written fails on every rank, by name */
    path_in(p, sizeof p, dir, "no-such-dir/ck");
    r = ddp_save_check(ddp, p, &holds);
    check_all(r != DDP_OK && strstr(ddp_last_error(ddp), "no file can be created in the directory") != NULL &&
              (rank == 0 || strstr(ddp_last_error(ddp), "rank 0 could not write the checkpoint") != NULL),
              "ckpt_save_check_missing_directory_named", "%s", ddp_last_error(ddp));
    r = ddp_save(ddp, p, NULL, 0);
    check_all(r != DDP_OK && strstr(ddp_last_error(ddp), "cannot create a temporary file next to the checkpoint") != NULL &&
              (rank == 0 || strstr(ddp_last_error(ddp), "rank 0 could not save the checkpoint") != NULL),
              "ckpt_save_unwritable_fails_every_rank", "%s", ddp_last_error(ddp));
#ifndef _WIN32
    path_in(p, sizeof p, dir, "fifo");
    r = ddp_save_check(ddp, p, &holds);
    check_all(r != DDP_OK && strstr(ddp_last_error(ddp), "is a FIFO (named pipe), not a regular file") != NULL,
              "ckpt_save_check_fifo_named", "%s", ddp_last_error(ddp));
#endif
    r = ddp_save_check(ddp, dir, &holds);
    check_all(r != DDP_OK && strstr(ddp_last_error(ddp), "is a directory, not a regular file") != NULL,
              "ckpt_save_check_directory_named", "%s", ddp_last_error(ddp));
    {   /* ddp_save itself: an existing FIFO or directory at the path is refused on every rank, left as it was */
#ifndef _WIN32   /* (no FIFOs on Windows) */
        const char *e;
        struct stat st;
        path_in(p, sizeof p, dir, "fifo");
        r = ddp_save(ddp, p, NULL, 0);
        e = ddp_last_error(ddp);
        check_all(r == DDP_ERR_INVALID_ARGUMENT && strstr(e, "is a FIFO (named pipe), not a regular file; nothing written") != NULL &&
                  (rank == 0 || strstr(e, "rank 0 could not save the checkpoint") != NULL) && stat(p, &st) == 0 && S_ISFIFO(st.st_mode),
                  "ckpt_save_fifo_refused_left_alone", "r=%d %s", (int)r, e);
#endif
        r = ddp_save(ddp, dir, NULL, 0);
        check_all(r == DDP_ERR_INVALID_ARGUMENT && strstr(ddp_last_error(ddp), "is a directory, not a regular file") != NULL,
                  "ckpt_save_directory_refused", "r=%d %s", (int)r, ddp_last_error(ddp));
    }
#ifdef _WIN32
    if (rank == 0) printf("SKIP ckpt_save_replaces_symlink_not_its_target: symlinks need a privilege on Windows; "
                          "ckpt_stale_temporaries_of_dead_writers_swept: it forks a writer that dies (POSIX)\n");
    path_in(p, sizeof p, dir, "plain");
    r = ddp_save(ddp, p, NULL, 0);   /* a fresh name, then over an existing file (MoveFileExW's replace) */
    if (r == DDP_OK) r = ddp_save(ddp, p, NULL, 0);
    if (r == DDP_OK) r = ddp_load(ddp, p, NULL, 0, NULL, NULL, NULL);
    check_all(r == DDP_OK, "ckpt_no_user_blob_round_trip", "%s", ddp_last_error(ddp));
#else
    {   /* a symlink at the destination is replaced, its target left alone; stale temporaries of
           dead writers are swept, a live writer's and foreign names are not */
        char target[4096], dead[8192], live[8192], odd[8192];
        size_t tn;
        char *t;
        struct stat st;
        pid_t child;
        int ok;
        path_in(target, sizeof target, dir, "target");
        path_in(p, sizeof p, dir, "link");
        if (rank == 0) {
            write_file(target, "keep", 4);
            unlink(p);
            if (symlink(target, p) != 0) die("symlink");
            child = fork();
            if (child == 0) _exit(0);
            waitpid(child, NULL, 0);   /* a pid that is gone */
            snprintf(dead, sizeof dead, "%s.tmp.%ld.0123456789abcdef", p, (long)child);
            snprintf(live, sizeof live, "%s.tmp.%ld.fedcba9876543210", p, (long)getppid());
            snprintf(odd, sizeof odd, "%s.tmp.%ld.not-ours", p, (long)child);
            write_file(dead, "x", 1); write_file(live, "x", 1); write_file(odd, "x", 1);
        }
        r = ddp_save(ddp, p, NULL, 0);
        ok = r == DDP_OK;
        if (rank == 0) {
            t = (char *)read_file(target, &tn);
            ok = ok && lstat(p, &st) == 0 && S_ISREG(st.st_mode) && tn == 4 && !memcmp(t, "keep", 4);
            free(t);
            verdict(ok, "ckpt_save_replaces_symlink_not_its_target", "r=%d %s", (int)r, ddp_last_error(ddp));
            verdict(access(dead, F_OK) != 0 && access(live, F_OK) == 0 && access(odd, F_OK) == 0,
                    "ckpt_stale_temporaries_of_dead_writers_swept", "dead %s, live %s, odd %s", access(dead, F_OK) ? "gone" : "LEFT",
                    access(live, F_OK) ? "REMOVED" : "kept", access(odd, F_OK) ? "REMOVED" : "kept");
            unlink(live); unlink(odd);
        }
        r = ddp_load(ddp, p, NULL, 0, NULL, NULL, NULL);
        check_all(r == DDP_OK, "ckpt_no_user_blob_round_trip", "%s", ddp_last_error(ddp));
    }
#endif
    free(file);
}

static void phase_other(const char *dir) {
    char ck[4096];
    seen sn;
    memset(&sn, 0, sizeof sn);
    path_in(ck, sizeof ck, dir, "ck");
    refused("ckpt_other_model_refused_by_name", ck, "its parameter 1 is 'bias' of 17 floats (flags 1); this model's is 'bias' of 18 floats", &sn);
}

int main(int argc, char **argv) {
    size_t other[3] = { 3001, 18, 2500 };
    const char *phase = argc > 2 ? argv[1] : "", *dir = argc > 2 ? argv[2] : "";
    if (!strcmp(phase, "save-sharded") || !strcmp(phase, "resume-sharded")) {
#ifndef DDP_HAS_SHARD_OPTIMIZER
        const char *r = getenv("RANK");
        if (!r || !strcmp(r, "0")) printf("SKIP ckpt_%s: this ddp.h has no ddp_desc.shard_optimizer yet\n", phase);
        return 0;
#else
        want_sharded = 1;
        phase = phase[0] == 's' ? "save" : "resume";
#endif
    }
    if (strcmp(phase, "save") && strcmp(phase, "resume") && strcmp(phase, "errors") && strcmp(phase, "other")) {
        fprintf(stderr, "usage: ddprun -n N test_checkpoint save|resume|errors|other|save-sharded|resume-sharded DIR\n");
        return 2;
    }
    setup(!strcmp(phase, "other") ? other : sizes);
    if (!strcmp(phase, "other")) memcpy(sizes, other, sizeof other);   /* state_now's view of this model */
    if (!strcmp(phase, "save")) phase_save(dir);
    else if (!strcmp(phase, "resume")) phase_resume(dir);
    else if (!strcmp(phase, "errors")) phase_errors(dir);
    else phase_other(dir);
    ddp_shutdown(ddp);
    return test_failures ? 1 : 0;
}
