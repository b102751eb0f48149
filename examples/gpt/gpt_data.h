/* gpt_data.h — the tiny GPT's training data: which windows of the text each rank trains on at
   each step (ddp.h's distributed sampler), and the training file itself, read whole (bytes are
   the tokens) and split 90% training / 10% validation after checking that it is a regular file
   large enough for one optimizer step of every rank; every refusal is one message naming the
   rank, the file, its size and what it needs. Include after ddp.h; nothing of gpt.h's model is
   needed. Used by examples/gpt/train_gpt.c, tests/test_gpt.c and fuzz/fuzz_data.c. */
#ifndef GPT_DATA_H
#define GPT_DATA_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define GPT_DEFAULT_DATA "build/fortunes.txt"

/* ---------------------------------------------------------------------------------------------
   Training data: epochs through ddp.h's distributed sampler. A sample is a window of T+1 bytes,
   named by its start: data[0, len) holds len - T of them. Every epoch is a permutation of them
   (seeded, the same on every rank; drop_last: each rank floor(n/world) of it). Optimizer steps
   take whole global batches of G = world x batch x accum windows, an epoch floor(n/G) of them
   (the tail that fills no step is dropped), step j of an epoch the epoch's positions
   [j*G, (j+1)*G): rank r's i-th sample is position i*world + r, and the permutation does not
   depend on world. So N ranks at batch B train, step by step, the very windows 1 rank trains at
   batch N*B (in another order inside a step: the same gradient to float rounding), and the
   position of step s is a function of s alone: a checkpoint's step is where to resume.
   --------------------------------------------------------------------------------------------- */
static ddp_sampler gpt_window_sampler(size_t len, int T, int world, int rank, uint64_t seed) {
    ddp_sampler s;
    memset(&s, 0, sizeof s);
    s.n = len > (size_t)T ? (uint64_t)(len - (size_t)T) : 0;   /* n = 0: ddp_sample names it */
    s.world = world;
    s.rank = rank;
    s.seed = seed;
    s.shuffle = 1;
    s.drop_last = 1;
    return s;
}

/* Where micro-step u (of accum, batch B each) of optimizer step `step` starts: the epoch and this
   rank's first position in it. DDP_ERR_INVALID_ARGUMENT (ddp_last_error(NULL) says why, or the
   data hold less than one step a rank) when an epoch has no whole step. */
static ddp_result gpt_batch_position(const ddp_sampler *s, int B, int accum, uint64_t step, int u, uint64_t *epoch, uint64_t *first) {
    uint64_t count = 0, per_step = (uint64_t)B * (uint64_t)accum, steps;
    ddp_result r = ddp_sampler_count(s, &count);
    if (r != DDP_OK) return r;
    if ((steps = count / per_step) == 0) return DDP_ERR_INVALID_ARGUMENT;
    *epoch = step / steps;
    *first = (step % steps) * per_step + (uint64_t)u * (uint64_t)B;
    return DDP_OK;
}

/* Fills tokens/targets [B, T] with this rank's samples first..first+B-1 of `epoch`. */
static ddp_result gpt_sampled_batch(const unsigned char *data, const ddp_sampler *s, uint64_t epoch, uint64_t first, int B, int T,
                                    int *tokens, int *targets) {
    int b, t;
    for (b = 0; b < B; b++) {
        uint64_t start;
        ddp_result r = ddp_sample(s, epoch, first + (uint64_t)b, &start);
        if (r != DDP_OK) return r;
        for (t = 0; t < T; t++) {
            tokens[b * T + t] = data[start + (uint64_t)t];
            targets[b * T + t] = data[start + (uint64_t)t + 1];
        }
    }
    return DDP_OK;
}

static const char *gpt_file_kind(mode_t mode) {
    return S_ISFIFO(mode) ? "a FIFO (named pipe)" : S_ISDIR(mode) ? "a directory" : S_ISCHR(mode) ? "a character device"
         : S_ISBLK(mode) ? "a block device" : S_ISSOCK(mode) ? "a socket" : "not a regular file";
}

/* Opens PATH for reading if it is a regular file; else NULL, errno set, and *kind says what it is
   (NULL when the open itself failed). A FIFO with no writer would block fopen forever, before any
   timeout applies: O_NONBLOCK makes the open return at once, and fstat on the opened descriptor
   checks the very file that was opened (stat, then open, leaves a window to swap the path). */
static FILE *gpt_open_regular(const char *path, const char **kind) {
    struct stat st;
    FILE *f = NULL;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC), e;
    *kind = NULL;
    if (fd < 0) return NULL;
    if (fstat(fd, &st) != 0) goto fail;
    if (!S_ISREG(st.st_mode)) { *kind = gpt_file_kind(st.st_mode); errno = EINVAL; goto fail; }
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0 || !(f = fdopen(fd, "rb"))) goto fail;
    return f;
fail:
    e = errno;
    close(fd);
    errno = e;
    return NULL;
}

typedef struct gpt_dataset { unsigned char *bytes; size_t len, train_len, val_len; } gpt_dataset;

/* What a run asks of the file: its path and the shape of one optimizer step. */
typedef struct gpt_data_spec {
    const char *path;              /* NULL: GPT_DEFAULT_DATA */
    int seq, batch, accum;         /* context, windows a rank per micro-step, micro-steps (<= 0: 1) */
    uint64_t seed;                 /* the sampler's */
} gpt_data_spec;

/* Reads the whole file; every failure is one clear message naming rank, file, size and need.
   (Not every file that includes gpt_data.h reads one: the tests take their windows from memory.) */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((unused))
#endif
static int gpt_load_data(const gpt_data_spec *o, int rank, int world, gpt_dataset *d, char *err, size_t errn) {
    const char *path = o->path ? o->path : GPT_DEFAULT_DATA;
    size_t need = (size_t)world * o->batch * (o->seq + 1) + 1, min_split;
    FILE *f;
    long size;
    char what[256];
    const char *kind;
    /* The 90% training split must hold one window of seq+1 bytes too. */
    min_split = ((size_t)o->seq + 1) * 10 / 9 + 2;
    if (need < min_split) need = min_split;
    snprintf(what, sizeof what, "at least %zu bytes (world %d x batch %d x (seq %d + 1) + 1%s)", need, world,
             o->batch, o->seq, need == min_split ? ", and a 90% split that holds one window" : "");
    memset(d, 0, sizeof *d);
    f = gpt_open_regular(path, &kind);
    if (!f && kind) {
        snprintf(err, errn, "rank %d: the training data '%s' is %s, not a regular file; train_gpt reads the whole file "
                 "to pick its windows: save the text to a file and pass that to --data", rank, path, kind);
        return 0;
    }
    if (!f) {
        snprintf(err, errn, "rank %d: cannot open the training data '%s': %s; it needs %s%s", rank, path, strerror(errno), what,
                 o->path ? "" : " (the default corpus: run `make build/fortunes.txt`, or pass --data PATH)");
        return 0;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        snprintf(err, errn, "rank %d: cannot read the size of '%s': %s", rank, path, strerror(errno));
        fclose(f);
        return 0;
    }
    if (size == 0 || (size_t)size < need) {
        snprintf(err, errn, "rank %d: the training data '%s' is %s (%ld bytes); it needs %s", rank, path,
                 size == 0 ? "empty" : "too small", size, what);
        fclose(f);
        return 0;
    }
    d->len = (size_t)size;
    d->bytes = (unsigned char *)malloc(d->len);
    if (!d->bytes) {
        snprintf(err, errn, "rank %d: out of memory reading the training data '%s' (%zu bytes); use a smaller file", rank, path, d->len);
        fclose(f);
        return 0;
    }
    if (fread(d->bytes, 1, d->len, f) != d->len) {
        snprintf(err, errn, "rank %d: cannot read %zu bytes of '%s': %s", rank, d->len, path,
                 ferror(f) ? strerror(errno) : "the file got shorter while it was read");
        free(d->bytes);
        d->bytes = NULL;
        fclose(f);
        return 0;
    }
    fclose(f);
    d->train_len = d->len * 9 / 10;
    d->val_len = d->len - d->train_len;
    {   /* an epoch must hold one optimizer step: each rank's share of the windows, batch x grad-accum */
        ddp_sampler s = gpt_window_sampler(d->train_len, o->seq, world, rank, o->seed);
        uint64_t count = 0, need_windows = (uint64_t)o->batch * (uint64_t)(o->accum > 0 ? o->accum : 1);
        ddp_sampler_count(&s, &count);
        if (count < need_windows) {
            snprintf(err, errn, "rank %d: the training data '%s' (%zu bytes) is too small for one optimizer step: its first 90%% "
                     "holds %llu windows of seq %d + 1 bytes (one a byte offset), %llu a rank; a step takes batch %d x "
                     "grad-accum %d = %llu a rank (world %d): use a larger file, or a smaller --batch, --grad-accum or --seq",
                     rank, path, d->len, (unsigned long long)s.n, o->seq, (unsigned long long)count, o->batch,
                     o->accum > 0 ? o->accum : 1, (unsigned long long)need_windows, world);
            free(d->bytes);
            d->bytes = NULL;
            return 0;
        }
    }
    return 1;
}

#endif /* GPT_DATA_H */
