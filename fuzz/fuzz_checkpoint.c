/* fuzz_checkpoint.c — libFuzzer target for ddp.h's checkpoint loader (ddp_load, >>checkpoint).
   Each input is a whole checkpoint file for a tiny model on one rank. The loader must refuse
   anything but a complete, checksummed checkpoint of this model with nothing after its checksum,
   with a message ("rank 0: ..."), leave the state untouched when it refuses and the context
   usable, and never read or write out of bounds. What it accepts must be exactly what the file
   holds: the parameters, m and v as stored floats, a step >= 0, a user blob that fits.
   Seeds: a valid checkpoint (and one of version 2, saved with the outer sync on: the outer block
   and arrays after group 0's state) and damaged ones, written by this binary when it is run with
   FUZZ_WRITE_SEEDS=DIR (fuzz/corpus/checkpoint holds them). */
#define DDP_IMPLEMENTATION
#include "../ddp.h"

#define NW 5
#define NB 3
#define USER_CAP 64
static ddp_context *fuzz_ddp;
static char fuzz_path[64];
static float base[3][NW + NB];   /* params, m, v: the state every input starts from */

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) { if (n) fwrite(data, 1, n, f); fclose(f); }
}

/* The packed state (each buffer: w then b) to or from the context. */
static void state(float s[3][NW + NB], int to_host) {
    ddp_buffer which[3] = { DDP_PARAMS, DDP_ADAM_M, DDP_ADAM_V };
    size_t off_w = (size_t)(ddp_param(fuzz_ddp, 0) - ddp_flat_params(fuzz_ddp, NULL));
    size_t off_b = (size_t)(ddp_param(fuzz_ddp, 1) - ddp_flat_params(fuzz_ddp, NULL));
    int k;
    for (k = 0; k < 3; k++) {
        ddp_result r = to_host ? ddp_copy_to_host(fuzz_ddp, which[k], off_w, s[k], NW) : ddp_copy_from_host(fuzz_ddp, which[k], off_w, s[k], NW);
        if (r == DDP_OK) r = to_host ? ddp_copy_to_host(fuzz_ddp, which[k], off_b, s[k] + NW, NB) : ddp_copy_from_host(fuzz_ddp, which[k], off_b, s[k] + NW, NB);
        if (r != DDP_OK) { fprintf(stderr, "fuzz_checkpoint: host copy failed: %s\n", ddp_last_error(fuzz_ddp)); abort(); }
    }
}

static void write_seeds(const char *dir) {
    char path[512], *buf;
    const char user[16] = "fuzz user blob";
    long n;
    FILE *f;
    snprintf(path, sizeof path, "%s/valid", dir);
    if (ddp_save(fuzz_ddp, path, user, sizeof user) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(fuzz_ddp)); exit(1); }
    if (!(f = fopen(path, "rb")) || fseek(f, 0, SEEK_END) || (n = ftell(f)) <= 0) exit(1);
    buf = (char *)malloc((size_t)n);
    rewind(f);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) exit(1);
    fclose(f);
    snprintf(path, sizeof path, "%s/truncated", dir);
    write_file(path, buf, (size_t)n / 2);
    {   /* version 2: the same state saved by a run with the outer sync on (its outer block and arrays) */
        ddp_context *outer = NULL, *plain = fuzz_ddp;
        ddp_desc desc;
        float s[3][NW + NB];
        int64_t *step;
        memset(&desc, 0, sizeof desc);
        desc.world_size = 1;
        desc.log_level = DDP_LOG_OFF;
        desc.outer.mode = DDP_OUTER_DILOCO;
        desc.outer.inner_steps = 2;
        snprintf(path, sizeof path, "%s/valid_outer", dir);
        state(s, 1);
        if (ddp_init(&outer, &desc) != DDP_OK || ddp_register_param(outer, "w", NW, 0, s[0], NULL) != DDP_OK ||
            ddp_register_param(outer, "b", NB, DDP_NO_DECAY, s[0] + NW, NULL) != DDP_OK || ddp_commit(outer) != DDP_OK ||
            ddp_adamw_state(outer, NULL, NULL, &step) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(outer)); exit(1); }
        fuzz_ddp = outer;   /* m and v as the plain context's */
        state(s, 0);
        fuzz_ddp = plain;
        *step = 7;
        if (ddp_save(outer, path, user, sizeof user) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(outer)); exit(1); }
        ddp_shutdown(outer);
    }
    snprintf(path, sizeof path, "%s/header_only", dir);
    write_file(path, buf, 56);
    buf[n / 3] ^= 0x40;
    snprintf(path, sizeof path, "%s/flipped_bit", dir);
    write_file(path, buf, (size_t)n);
    free(buf);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    ddp_desc desc;
    float init[NW + NB];
    int id, k;
    int64_t *step;
    (void)argc; (void)argv;
    memset(&desc, 0, sizeof desc);
    desc.world_size = 1;
    desc.log_level = DDP_LOG_OFF;
    for (k = 0; k < NW + NB; k++) init[k] = 0.25f * (float)(k + 1);
    if (ddp_init(&fuzz_ddp, &desc) != DDP_OK || ddp_register_param(fuzz_ddp, "w", NW, 0, init, &id) != DDP_OK ||
        ddp_register_param(fuzz_ddp, "b", NB, DDP_NO_DECAY, init + NW, &id) != DDP_OK || ddp_commit(fuzz_ddp) != DDP_OK ||
        ddp_adamw_state(fuzz_ddp, NULL, NULL, &step) != DDP_OK) {
        fprintf(stderr, "fuzz_checkpoint: setup failed: %s\n", ddp_last_error(fuzz_ddp));
        exit(1);
    }
    for (k = 0; k < NW + NB; k++) { base[0][k] = init[k]; base[1][k] = -0.5f * (float)k; base[2][k] = 0.125f * (float)k; }
    state(base, 0);
    *step = 7;
    snprintf(fuzz_path, sizeof fuzz_path, "/tmp/fuzz_checkpoint.%d", (int)getpid());
    if (getenv("FUZZ_WRITE_SEEDS")) { write_seeds(getenv("FUZZ_WRITE_SEEDS")); exit(0); }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char user[USER_CAP];
    float got[3][NW + NB];
    ddp_checkpoint_info info;
    int64_t *step;
    ddp_result r;
    write_file(fuzz_path, data, size);
    r = ddp_load(fuzz_ddp, fuzz_path, user, sizeof user, NULL, NULL, &info);
    state(got, 1);
    if (ddp_adamw_state(fuzz_ddp, NULL, NULL, &step) != DDP_OK) abort();
    if (r != DDP_OK) {
        if (strncmp(ddp_last_error(fuzz_ddp), "rank 0: ", 8) != 0 || strlen(ddp_last_error(fuzz_ddp)) < 20) {
            fprintf(stderr, "fuzz_checkpoint: a refusal without a message: '%s'\n", ddp_last_error(fuzz_ddp));
            abort();
        }
        if (memcmp(got, base, sizeof got) != 0 || *step != 7) {
            fprintf(stderr, "fuzz_checkpoint: a refused checkpoint changed the state: %s\n", ddp_last_error(fuzz_ddp));
            abort();
        }
        return 0;
    }
    {   /* accepted: the state is the file's floats, right after its header (version 1: they end 8 + user
           bytes before its end; version 2, saved with the outer sync: group 0's, before the outer arrays) */
        size_t at = 56 + 8 * (size_t)ddp__get_le(data + 48, 4), k;
        for (k = 0; k < (size_t)ddp__get_le(data + 20, 4); k++) at += 16 + (size_t)ddp__get_le(data + at, 4);
        if (ddp__get_le(data + 8, 4) == 2) at += 104 + 8 * (size_t)ddp__get_le(data + 20, 4);
        if (info.step < 0 || info.user_bytes > USER_CAP || *step != info.step || size < 8 + info.user_bytes + sizeof got ||
            at > size - 8 - info.user_bytes - sizeof got || (ddp__get_le(data + 8, 4) == 1 && at != size - 8 - info.user_bytes - sizeof got)) {
            fprintf(stderr, "fuzz_checkpoint: accepted step %lld, user blob %llu bytes, file %zu bytes\n", (long long)info.step,
                    (unsigned long long)info.user_bytes, size);
            abort();
        }
        if (memcmp(got, data + at, sizeof got) != 0 || memcmp(user, data + size - 8 - info.user_bytes, (size_t)info.user_bytes) != 0) {
            fprintf(stderr, "fuzz_checkpoint: the loaded state is not the file's\n");
            abort();
        }
    }
    state(base, 0);   /* the next input starts from the same state */
    *step = 7;
    return 0;
}
