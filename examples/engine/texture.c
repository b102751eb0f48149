/* texture.c — a neural texture trained inside a host program (issue 16): the program stands for
   an editor tool. Its main thread is the UI; N training threads are N ranks of one process
   (ddp_desc.world_size by hand, no launcher). A coordinate MLP learns an image: (x, y) ->
   sin/cos positional encoding -> 2 hidden ReLU layers -> RGB. The UI polls progress without
   blocking the ranks, writes a preview PNG every few hundred steps, and cancels the training
   after --seconds or on Ctrl-C (a cancel token set from the signal handler). ddp.h allocates
   through this program's counting allocator and logs through its logger callback. At the end:
   the learned texture beside the target (result.png) and the PSNR.

       make build/texture && build/texture --ranks 2 --seconds 10 --out /tmp/tex

   Data-parallel equivalence: the global batch of step s is drawn from a generator seeded by s
   alone and rank r takes its slice, so 1 rank at batch B and 4 ranks at B/4 each see the same
   pixels and (gradients averaged) take the same steps, to float rounding (bench/RESULTS.md). */

/* The allocator hook must be defined before the implementation, and ddp.h's implementation
   wants POSIX declarations before any system header: _GNU_SOURCE first, as -D_GNU_SOURCE would. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE   /* g++ predefines it */
#endif
#include <stddef.h>
static void *tex_malloc(size_t bytes);
static void tex_free(void *ptr);
#define DDP_MALLOC(size) tex_malloc(size)
#define DDP_FREE(ptr) tex_free(ptr)
#define DDP_IMPLEMENTATION
#include "../../ddp.h"
#include <math.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* The program's own threads, lock, clock, sleep and mkdir: POSIX, or Win32 on Windows (ddp.h
   needs neither from the program; there it brings windows.h and Winsock with it). */
#ifdef _WIN32
#include <direct.h>
typedef HANDLE tex_thread;
typedef SRWLOCK tex_lock;
static void tex_lock_init(tex_lock *l) { InitializeSRWLock(l); }
static void take(tex_lock *l) { AcquireSRWLockExclusive(l); }
static void release(tex_lock *l) { ReleaseSRWLockExclusive(l); }
static void *train(void *arg);
static unsigned __stdcall train_thread(void *arg) { train(arg); return 0; }
static void start_thread(tex_thread *t, void *arg) { *t = (HANDLE)_beginthreadex(NULL, 0, train_thread, arg, 0, NULL); }
static void join_thread(tex_thread t) { WaitForSingleObject(t, INFINITE); CloseHandle(t); }
static double now(void) {
    LARGE_INTEGER f, t;
    QueryPerformanceFrequency(&f);
    QueryPerformanceCounter(&t);
    return (double)t.QuadPart / (double)f.QuadPart;
}
static void sleep_ms(int ms) { Sleep((DWORD)ms); }
static int make_dir(const char *path) { return _mkdir(path); }
#define close_socket(fd) closesocket(fd)
typedef int socklen_t;
#else
typedef pthread_t tex_thread;
typedef pthread_mutex_t tex_lock;
static void tex_lock_init(tex_lock *l) { pthread_mutex_init(l, NULL); }
static void take(tex_lock *l) { pthread_mutex_lock(l); }
static void release(tex_lock *l) { pthread_mutex_unlock(l); }
static void *train(void *arg);
static void start_thread(tex_thread *t, void *arg) { pthread_create(t, NULL, train, arg); }
static void join_thread(tex_thread t) { pthread_join(t, NULL); }
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static void sleep_ms(int ms) { usleep((useconds_t)ms * 1000); }
static int make_dir(const char *path) { return mkdir(path, 0777); }
#define close_socket(fd) close(fd)
#endif

/* ---- the counting allocator: a 16-byte header keeps the size (DDP_FREE gets no size) and the
   alignment malloc gives. Ranks allocate from their own threads: the counters are atomic. ---- */
static size_t mem_live, mem_peak, mem_total, mem_calls;
static void *tex_malloc(size_t bytes) {
    unsigned char *p = (unsigned char *)malloc(bytes + 16);
    size_t live, peak;
    if (!p) return NULL;
    memcpy(p, &bytes, sizeof bytes);
    live = __atomic_add_fetch(&mem_live, bytes, __ATOMIC_RELAXED);
    __atomic_add_fetch(&mem_total, bytes, __ATOMIC_RELAXED);
    __atomic_add_fetch(&mem_calls, 1, __ATOMIC_RELAXED);
    peak = __atomic_load_n(&mem_peak, __ATOMIC_RELAXED);
    while (live > peak && !__atomic_compare_exchange_n(&mem_peak, &peak, live, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    return p + 16;
}
static void tex_free(void *ptr) {
    size_t bytes;
    if (!ptr) return;
    memcpy(&bytes, (unsigned char *)ptr - 16, sizeof bytes);
    __atomic_sub_fetch(&mem_live, bytes, __ATOMIC_RELAXED);
    free((unsigned char *)ptr - 16);
}

/* ---- PNG: stored (uncompressed) deflate blocks, CRC-32 and Adler-32 by hand. No dependency:
   stb_image_write would be a vendored file or an install CI must do (Debian's libstb-dev), and
   zlib another; a stored PNG is valid everywhere and these images are a few tens of KB. ---- */
static unsigned long crc32_update(unsigned long c, const unsigned char *p, size_t n) {
    size_t i; int k;
    for (i = 0; i < n; i++) {
        c ^= p[i];
        for (k = 0; k < 8; k++) c = (c >> 1) ^ (0xedb88320ul & (0ul - (c & 1)));
    }
    return c;
}
static void put32(unsigned char *b, unsigned long v) {
    b[0] = (unsigned char)(v >> 24); b[1] = (unsigned char)(v >> 16); b[2] = (unsigned char)(v >> 8); b[3] = (unsigned char)v;
}
static void png_chunk(FILE *f, const char *type, const unsigned char *data, size_t n) {
    unsigned char b[4];
    unsigned long crc = crc32_update(0xfffffffful, (const unsigned char *)type, 4);
    crc = crc32_update(crc, data, n) ^ 0xfffffffful;
    put32(b, (unsigned long)n); fwrite(b, 1, 4, f);
    fwrite(type, 1, 4, f);
    if (n) fwrite(data, 1, n, f);
    put32(b, crc); fwrite(b, 1, 4, f);
}
/* rgb: w*h*3 floats in [0, 1] (clamped). Returns 0 on success. */
static int png_write(const char *path, const float *rgb, int w, int h) {
    size_t row = (size_t)w * 3 + 1, raw_n = row * (size_t)h, blocks = (raw_n + 65534) / 65535, i, o = 0;
    unsigned char *raw = (unsigned char *)malloc(raw_n), *z = (unsigned char *)malloc(2 + raw_n + 5 * blocks + 4);
    unsigned char ihdr[13] = { 0 };
    unsigned long a = 1, b = 0;   /* Adler-32 of the uncompressed stream */
    FILE *f = fopen(path, "wb");
    int x, y, c, ok;
    if (!raw || !z || !f) { free(raw); free(z); if (f) fclose(f); return -1; }
    for (y = 0; y < h; y++) {
        raw[(size_t)y * row] = 0;   /* filter: none */
        for (x = 0; x < w; x++)
            for (c = 0; c < 3; c++) {
                float v = rgb[((size_t)y * w + x) * 3 + c];
                v = v < 0 ? 0 : v > 1 ? 1 : v;
                raw[(size_t)y * row + 1 + (size_t)x * 3 + c] = (unsigned char)(v * 255.0f + 0.5f);
            }
    }
    for (i = 0; i < raw_n; i++) { a = (a + raw[i]) % 65521; b = (b + a) % 65521; }
    z[o++] = 0x78; z[o++] = 0x01;   /* zlib header: deflate, 32K window, check bits */
    for (i = 0; i < raw_n; i += 65535) {
        size_t n = raw_n - i < 65535 ? raw_n - i : 65535;
        z[o++] = i + n == raw_n;    /* BFINAL on the last block; BTYPE 00: stored */
        z[o++] = (unsigned char)n; z[o++] = (unsigned char)(n >> 8);
        z[o++] = (unsigned char)~n; z[o++] = (unsigned char)(~n >> 8);
        memcpy(z + o, raw + i, n); o += n;
    }
    put32(z + o, (b << 16) | a); o += 4;
    put32(ihdr, (unsigned long)w); put32(ihdr + 4, (unsigned long)h);
    ihdr[8] = 8; ihdr[9] = 2;       /* 8 bits, truecolour; compression, filter, interlace 0 */
    fwrite("\x89PNG\r\n\x1a\n", 1, 8, f);
    png_chunk(f, "IHDR", ihdr, 13);
    png_chunk(f, "IDAT", z, o);
    png_chunk(f, "IEND", NULL, 0);
    ok = !ferror(f);
    ok &= fclose(f) == 0;
    free(raw); free(z);
    return ok ? 0 : -1;
}

/* ---- the target: a procedural image with hard edges and smooth gradients ---- */
static void make_target(float *img, int s) {
    int x, y;
    for (y = 0; y < s; y++)
        for (x = 0; x < s; x++) {
            float u = (x + 0.5f) / s, v = (y + 0.5f) / s, *p = img + ((size_t)y * s + x) * 3;
            float dx = u - 0.38f, dy = v - 0.42f, r = sqrtf(dx * dx + dy * dy);
            p[0] = 0.15f + 0.7f * u; p[1] = 0.2f + 0.6f * v; p[2] = 0.9f - 0.6f * u * v;   /* gradient sky */
            if (v > 0.72f + 0.06f * sinf(9.0f * u)) {                                   /* wavy ground, stripes */
                int stripe = (int)floorf(u * 8.0f) & 1;
                p[0] = stripe ? 0.95f : 0.35f; p[1] = stripe ? 0.75f : 0.25f; p[2] = 0.1f;
            }
            if (r < 0.22f) {                                                            /* shaded disc */
                float l = 1.0f - 0.9f * r / 0.22f;
                p[0] = 0.95f * l + 0.05f; p[1] = 0.3f * l; p[2] = 0.35f * l + 0.1f;
            }
            if (u > 0.66f && u < 0.9f && v > 0.12f && v < 0.36f)                        /* checker square */
                p[0] = p[1] = p[2] = (((int)(u * 24.0f) + (int)(v * 24.0f)) & 1) ? 0.95f : 0.05f;
        }
}

/* ---- the model: encode (x, y), then 3 dense layers ---- */
enum { FREQS = 6, IN = 2 + 4 * FREQS, HID = 64, OUT = 3, NLAYERS = 3, MAX_RANKS = 8, SNAP_SLOTS = 256 };
static const int layer_in[NLAYERS] = { IN, HID, HID }, layer_out[NLAYERS] = { HID, HID, OUT };

static void encode(float u, float v, float *e) {   /* u, v in [-1, 1] */
    int k;
    e[0] = u; e[1] = v;
    for (k = 0; k < FREQS; k++) {
        float f = (float)M_PI * (float)(1 << k);
        e[2 + 4 * k] = sinf(f * u); e[3 + 4 * k] = cosf(f * u);
        e[4 + 4 * k] = sinf(f * v); e[5 + 4 * k] = cosf(f * v);
    }
}

/* One dense layer (y = act(W x + b)) as a tape op: the forward records its backward, which
   finishes the gradients of W and b (so their bucket can go) and hands dx down. */
typedef struct dense_args {
    ddp_context *ddp;
    int w, b, n, in, out, relu;
    const float *x, *y;        /* input, output (after the activation) */
    float *dy, *dx;            /* dy: overwritten with the pre-activation gradient; dx may be NULL */
} dense_args;

static void dense_backward(void *p) {
    const dense_args *a = (const dense_args *)p;
    const float *W = ddp_param(a->ddp, a->w);
    float *gW = ddp_grad(a->ddp, a->w), *gb = ddp_grad(a->ddp, a->b);
    int i, o, k;
    for (i = 0; i < a->n; i++) {
        float *dy = a->dy + (size_t)i * a->out;
        const float *x = a->x + (size_t)i * a->in;
        if (a->relu) for (o = 0; o < a->out; o++) if (a->y[(size_t)i * a->out + o] <= 0) dy[o] = 0;
        for (o = 0; o < a->out; o++) {
            gb[o] += dy[o];
            for (k = 0; k < a->in; k++) gW[o * a->in + k] += dy[o] * x[k];
        }
        if (a->dx) {
            float *dx = a->dx + (size_t)i * a->in;
            for (k = 0; k < a->in; k++) dx[k] = 0;
            for (o = 0; o < a->out; o++) for (k = 0; k < a->in; k++) dx[k] += dy[o] * W[o * a->in + k];
        }
    }
}

/* The forward arithmetic alone (the UI's evaluation uses it on a snapshot of the parameters). */
static void dense_forward(const float *W, const float *B, const float *x, float *y, int n, int in, int out, int relu) {
    int i, o, k;
    for (i = 0; i < n; i++)
        for (o = 0; o < out; o++) {
            float s = B[o];
            for (k = 0; k < in; k++) s += W[o * in + k] * x[(size_t)i * in + k];
            y[(size_t)i * out + o] = relu && s < 0 ? 0 : s;
        }
}

/* Deterministic numbers: hash of (a, b). */
static unsigned hash2(unsigned a, unsigned b) {
    unsigned z = a * 2654435761u ^ (b + 0x9e3779b9u) * 2246822519u;
    z ^= z >> 15; z *= 2654435761u; z ^= z >> 13; z *= 3266489917u; z ^= z >> 16;
    return z;
}

/* ---- what the ranks and the UI share ---- */
typedef struct snapshot { int64_t step; float *params; } snapshot;
typedef struct shared {
    tex_lock lock;             /* held only to copy: never while computing or writing files */
    ddp_cancel_token cancel;
    int size, ranks, global_batch, port, preview_every;
    int64_t steps;             /* 0: until cancelled */
    float lr;
    const float *target;
    size_t nparams, offset[NLAYERS][2];   /* each weight's and bias's place in the flat buffer */
    snapshot snaps[SNAP_SLOTS];/* rank 0's parameters at preview steps, for the UI to evaluate */
    int snap_head, snap_tail, snaps_dropped;
    float *final_params;       /* rank 0's, after the last step */
    int64_t final_step;
    int log_messages;
} shared;

typedef struct worker {
    shared *sh;
    int rank;
    ddp_context *ctx;          /* published for progress reads, under sh->lock */
    ddp_result result;
    char error[1024];
    int done;
} worker;

/* ddp.h's log, routed into the host's: from any rank's thread (and the library's own). */
static void on_log(void *user, ddp_log_level level, int rank, const char *message) {
    static const char *names[] = { "", "debug", "info", "warn", "error", "" };
    shared *sh = (shared *)user;
    take(&sh->lock);
    sh->log_messages++;
    fprintf(stderr, "[texture: ddp %s, rank %d] %s\n", names[level <= DDP_LOG_OFF ? level : 0], rank, message);
    release(&sh->lock);
}

#define TRY(call) do { if ((me->result = (call)) != DDP_OK) goto out; } while (0)

static void *train(void *arg) {
    worker *me = (worker *)arg;
    shared *sh = me->sh;
    ddp_context *ctx = NULL;
    ddp_desc d;
    ddp_adamw opt;
    int ids[NLAYERS][2], l, i, j, n = sh->global_batch / sh->ranks, npix = sh->size * sh->size;
    float *act[NLAYERS + 1], *grad[NLAYERS + 1], *winit[NLAYERS] = { NULL, NULL, NULL }, *flat = NULL;
    char name[32];
    int64_t step = 0;
    memset(&d, 0, sizeof d);
    memset(&opt, 0, sizeof opt);
    for (l = 0; l <= NLAYERS; l++) {   /* activations and their gradients, this rank's slice */
        int width = l == 0 ? IN : layer_out[l - 1];
        act[l] = (float *)malloc(sizeof(float) * (size_t)n * width);
        grad[l] = (float *)malloc(sizeof(float) * (size_t)n * width);
    }
    d.world_size = sh->ranks;
    d.rank = me->rank;
    d.master_port = sh->port;
    d.job_id = "texture";      /* ranks started by hand: name the job, so rank 0 need not warn */
    d.cancel_token = &sh->cancel;
    d.log = on_log;
    d.log_user = sh;
    d.log_level = DDP_LOG_WARN;
    opt.lr = sh->lr;
    TRY(ddp_init(&ctx, &d));
    for (l = 0; l < NLAYERS; l++) {    /* He-uniform weights, the same on every rank (and rank 0's win) */
        size_t count = (size_t)layer_in[l] * layer_out[l], k;
        float scale = sqrtf(6.0f / (float)layer_in[l]);
        winit[l] = (float *)malloc(sizeof(float) * count);   /* read at commit: freed after it */
        for (k = 0; k < count; k++) winit[l][k] = scale * ((float)(hash2(17u + (unsigned)l, (unsigned)k) >> 8) / 8388608.0f - 1.0f);
        snprintf(name, sizeof name, "layer%d.weight", l);
        TRY(ddp_register_param(ctx, name, count, 0, winit[l], &ids[l][0]));
        snprintf(name, sizeof name, "layer%d.bias", l);
        TRY(ddp_register_param(ctx, name, (size_t)layer_out[l], DDP_NO_DECAY, NULL, &ids[l][1]));
    }
    TRY(ddp_commit(ctx));
    flat = ddp_flat_params(ctx, NULL);
    take(&sh->lock);
    me->ctx = ctx;                     /* the UI may read its progress from now on */
    if (me->rank == 0)
        for (l = 0; l < NLAYERS; l++) {
            sh->offset[l][0] = (size_t)(ddp_param(ctx, ids[l][0]) - flat);
            sh->offset[l][1] = (size_t)(ddp_param(ctx, ids[l][1]) - flat);
        }
    release(&sh->lock);
    for (step = 0; sh->steps == 0 || step < sh->steps; step++) {
        float loss = 0;
        /* This rank's slice of global batch `step`: the same pixels whatever the rank count. */
        for (i = 0; i < n; i++) {
            unsigned pix = hash2((unsigned)step + 1u, (unsigned)(me->rank * n + i)) % (unsigned)npix;
            int x = (int)pix % sh->size, y = (int)pix / sh->size;
            encode(2.0f * (x + 0.5f) / sh->size - 1.0f, 2.0f * (y + 0.5f) / sh->size - 1.0f, act[0] + (size_t)i * IN);
        }
        TRY(ddp_zero_grad(ctx));
        for (l = 0; l < NLAYERS; l++) {
            dense_args a;
            dense_forward(ddp_param(ctx, ids[l][0]), ddp_param(ctx, ids[l][1]), act[l], act[l + 1], n,
                          layer_in[l], layer_out[l], l < NLAYERS - 1);
            a.ddp = ctx; a.w = ids[l][0]; a.b = ids[l][1]; a.n = n; a.in = layer_in[l]; a.out = layer_out[l];
            a.relu = l < NLAYERS - 1; a.x = act[l]; a.y = act[l + 1]; a.dy = grad[l + 1]; a.dx = l ? grad[l] : NULL;
            TRY(ddp_tape_record(ctx, dense_backward, &a, sizeof a, ids[l], 2));
        }
        for (i = 0; i < n; i++) {          /* MSE over this rank's slice; ddp.h averages the ranks */
            unsigned pix = hash2((unsigned)step + 1u, (unsigned)(me->rank * n + i)) % (unsigned)npix;
            for (j = 0; j < OUT; j++) {
                float e = act[NLAYERS][(size_t)i * OUT + j] - sh->target[(size_t)pix * 3 + j];
                loss += e * e / (float)(n * OUT);
                grad[NLAYERS][(size_t)i * OUT + j] = 2.0f * e / (float)(n * OUT);
            }
        }
        TRY(ddp_backward(ctx));
        TRY(ddp_adamw_step(ctx, &opt, NULL));
        ddp_report_loss(ctx, loss);        /* for the UI's display: nothing is sent */
        if (me->rank == 0 && (step + 1) % sh->preview_every == 0) {
            /* Hand the UI a copy (a memcpy under a lock it holds only to copy out). */
            take(&sh->lock);
            if (sh->snap_head - sh->snap_tail < SNAP_SLOTS) {
                snapshot *s = &sh->snaps[sh->snap_head % SNAP_SLOTS];
                s->step = step + 1;
                memcpy(s->params, flat, sizeof(float) * sh->nparams);
                sh->snap_head++;
            } else sh->snaps_dropped++;
            release(&sh->lock);
        }
    }
out:
    snprintf(me->error, sizeof me->error, "%s", ddp_last_error(ctx));
    take(&sh->lock);
    if (me->rank == 0 && ctx && me->ctx) {   /* the last completed step's parameters */
        memcpy(sh->final_params, ddp_flat_params(ctx, NULL), sizeof(float) * sh->nparams);
        sh->final_step = step;
    }
    me->ctx = NULL;                    /* no more progress reads: it is about to go */
    release(&sh->lock);
    ddp_shutdown(ctx);                 /* the thread that stepped a rank shuts it down */
    for (l = 0; l <= NLAYERS; l++) { free(act[l]); free(grad[l]); }
    for (l = 0; l < NLAYERS; l++) free(winit[l]);
    take(&sh->lock);
    me->done = 1;
    release(&sh->lock);
    return NULL;
}

/* Render the texture from a parameter snapshot; returns the PSNR against the target (dB). */
static double render(const shared *sh, const float *params, float *img) {
    int s = sh->size, y, x, l;
    double se = 0;
    float *a = (float *)malloc(sizeof(float) * (size_t)s * IN), *b = (float *)malloc(sizeof(float) * (size_t)s * HID);
    float *c = (float *)malloc(sizeof(float) * (size_t)s * HID);
    for (y = 0; y < s; y++) {             /* a row at a time */
        float *in = a, *out = b;
        for (x = 0; x < s; x++) encode(2.0f * (x + 0.5f) / s - 1.0f, 2.0f * (y + 0.5f) / s - 1.0f, a + (size_t)x * IN);
        for (l = 0; l < NLAYERS; l++) {
            out = l == NLAYERS - 1 ? img + (size_t)y * s * 3 : (l & 1 ? c : b);
            dense_forward(params + sh->offset[l][0], params + sh->offset[l][1], in, out, s, layer_in[l], layer_out[l], l < NLAYERS - 1);
            in = out;
        }
    }
    for (x = 0; x < s * s * 3; x++) {   /* PSNR of the image as shown: clamped to [0, 1] */
        float v = img[x] < 0 ? 0 : img[x] > 1 ? 1 : img[x];
        img[x] = v;
        se += (double)(v - sh->target[x]) * (v - sh->target[x]);
    }
    free(a); free(b); free(c);
    se /= (double)s * s * 3;
    return se > 0 ? 10.0 * log10(1.0 / se) : 99.0;
}

static ddp_cancel_token *sigint_token;
static void on_sigint(int sig) { (void)sig; ddp_cancel_token_set(sigint_token); }   /* async-signal-safe */

/* A port for the ranks' rendezvous store: bind port 0, read what the kernel gave, close.
   (Another program could take it in between; then ddp_init fails and says so.) */
static int free_port(void) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int fd, port = 0;
#ifdef _WIN32
    WSADATA wsa;
    WSAStartup(MAKEWORD(2, 2), &wsa);   /* Winsock up for this socket (ddp.h starts its own) */
#endif
    fd = (int)socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close_socket(fd);
    return port;
}

int main(int argc, char **argv) {
    static shared sh;
    worker workers[MAX_RANKS];
    tex_thread threads[MAX_RANKS];
    const char *out_dir = ".";
    char path[1024];
    double seconds = 10, t0 = now(), last_print = -1, psnr;
    int i, l, done = 0, ok = 1, timed_out = 0, status = 0;
    float *img, *side;
    int64_t last_step = 0;
    memset(&sh, 0, sizeof sh);
    tex_lock_init(&sh.lock);
    sh.size = 64; sh.ranks = 2; sh.global_batch = 256; sh.preview_every = 200; sh.lr = 1e-2f;
    for (i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--ranks")) sh.ranks = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--size")) sh.size = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch")) sh.global_batch = atoi(argv[i + 1]);   /* global: split across ranks */
        else if (!strcmp(argv[i], "--steps")) sh.steps = atoll(argv[i + 1]);         /* 0: until --seconds */
        else if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);         /* 0: no limit */
        else if (!strcmp(argv[i], "--preview-every")) sh.preview_every = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--lr")) sh.lr = (float)atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--out")) out_dir = argv[i + 1];
        else break;
    }
    if (i < argc || sh.ranks < 1 || sh.ranks > MAX_RANKS || sh.size < 4 || sh.size > 1024 || sh.global_batch < sh.ranks ||
        sh.global_batch % sh.ranks || sh.preview_every < 1 || (sh.steps == 0 && seconds <= 0)) {
        fprintf(stderr, "usage: %s [--ranks 1..%d] [--size PIXELS] [--batch GLOBAL (a multiple of ranks)] [--steps N]\n"
                        "       [--seconds S] [--preview-every STEPS] [--lr LR] [--out DIR]\n", argv[0], MAX_RANKS);
        return 2;
    }
    sh.nparams = 0;
    for (l = 0; l < NLAYERS; l++) sh.nparams += (size_t)layer_in[l] * layer_out[l] + (size_t)layer_out[l];
    img = (float *)malloc(sizeof(float) * (size_t)sh.size * sh.size * 3);
    side = (float *)malloc(sizeof(float) * (size_t)sh.size * sh.size * 6);
    {
        float *target = (float *)malloc(sizeof(float) * (size_t)sh.size * sh.size * 3);
        make_target(target, sh.size);
        sh.target = target;
    }
    for (i = 0; i < SNAP_SLOTS; i++) sh.snaps[i].params = (float *)malloc(sizeof(float) * sh.nparams);
    sh.final_params = (float *)calloc(sh.nparams, sizeof(float));
    sh.port = free_port();
    if (make_dir(out_dir) != 0 && errno != EEXIST) {   /* the output directory, as a tool makes it */
        fprintf(stderr, "cannot create the output directory %s: %s\n", out_dir, strerror(errno));
        return 1;
    }
    snprintf(path, sizeof path, "%s/target.png", out_dir);
    if (png_write(path, sh.target, sh.size, sh.size)) { fprintf(stderr, "cannot write %s: %s\n", path, strerror(errno)); return 1; }
    printf("[ui] %dx%d target written to %s; %d rank(s) as threads, global batch %d (%d per rank), %zu parameters\n",
           sh.size, sh.size, path, sh.ranks, sh.global_batch, sh.global_batch / sh.ranks, sh.nparams);
    sigint_token = &sh.cancel;
    signal(SIGINT, on_sigint);
    for (i = 0; i < sh.ranks; i++) {
        memset(&workers[i], 0, sizeof workers[i]);
        workers[i].sh = &sh;
        workers[i].rank = i;
        start_thread(&threads[i], &workers[i]);
    }
    /* The UI loop: a frame every 20 ms; it never waits for the training threads. */
    while (done < sh.ranks) {
        ddp_progress p;
        snapshot snap;
        int have_snap = 0;
        memset(&p, 0, sizeof p);
        memset(&snap, 0, sizeof snap);
        take(&sh.lock);         /* keeps a context from going while it is read */
        for (done = 0, i = 0; i < sh.ranks; i++) done += workers[i].done;
        if (workers[0].ctx) ddp_progress_read(workers[0].ctx, &p);
        if (sh.snap_tail < sh.snap_head) {    /* take the oldest snapshot: swap buffers, no copy */
            snapshot *s = &sh.snaps[sh.snap_tail % SNAP_SLOTS];
            snap.step = s->step;
            snap.params = (float *)malloc(sizeof(float) * sh.nparams);
            memcpy(snap.params, s->params, sizeof(float) * sh.nparams);
            sh.snap_tail++;
            have_snap = 1;
        }
        release(&sh.lock);
        if (p.step > last_step && now() - t0 - last_print >= 0.5) {
            printf("[ui %5.2f s] step %5lld  loss %.5f  step %.2f ms  comm %.3f ms\n",
                   now() - t0, (long long)p.step, p.loss, p.step_ms, p.comm_ms);
            last_print = now() - t0;
            last_step = p.step;
        }
        if (have_snap) {
            psnr = render(&sh, snap.params, img);
            snprintf(path, sizeof path, "%s/preview.png", out_dir);
            if (png_write(path, img, sh.size, sh.size)) { fprintf(stderr, "cannot write %s\n", path); ok = 0; }
            printf("[ui] step %5lld  PSNR %.2f dB  (preview written to %s)\n", (long long)snap.step, psnr, path);
            free(snap.params);
            continue;                         /* more snapshots may be waiting: no frame sleep */
        }
        if (!timed_out && seconds > 0 && now() - t0 >= seconds) {
            printf("[ui] %.1f s: cancelling the training\n", seconds);
            ddp_cancel_token_set(&sh.cancel);
            timed_out = 1;
        }
        if (done < sh.ranks) sleep_ms(20);
    }
    for (i = 0; i < sh.ranks; i++) {
        join_thread(threads[i]);
        if (workers[i].result != DDP_OK && workers[i].result != DDP_ERR_CANCELLED) {
            fprintf(stderr, "[ui] rank %d: %s: %s\n", i, ddp_result_string(workers[i].result), workers[i].error);
            ok = 0;
        }
    }
    /* The result: the learned texture beside the target. */
    psnr = render(&sh, sh.final_params, img);
    for (i = 0; i < sh.size; i++) {
        memcpy(side + (size_t)i * sh.size * 6, img + (size_t)i * sh.size * 3, sizeof(float) * (size_t)sh.size * 3);
        memcpy(side + (size_t)i * sh.size * 6 + (size_t)sh.size * 3, sh.target + (size_t)i * sh.size * 3, sizeof(float) * (size_t)sh.size * 3);
    }
    snprintf(path, sizeof path, "%s/result.png", out_dir);
    if (png_write(path, side, sh.size * 2, sh.size)) { fprintf(stderr, "cannot write %s\n", path); ok = 0; }
    printf("[ui] training %s after %lld steps (%.2f s); learned | target written to %s\n",
           ddp_cancel_token_is_set(&sh.cancel) ? "cancelled" : "finished", (long long)sh.final_step, now() - t0, path);
    printf("[ui] ddp.h through the program's allocator: %zu allocations, %zu bytes in all, peak %zu bytes live, %zu live at the end\n",
           mem_calls, mem_total, mem_peak, mem_live);
    if (sh.log_messages) printf("[ui] %d ddp.h log message(s) came through the logger\n", sh.log_messages);
    if (sh.snaps_dropped) printf("[ui] %d preview(s) skipped: the UI fell behind\n", sh.snaps_dropped);
    printf("PSNR %.2f dB\n", psnr);
    if (mem_live != 0) { fprintf(stderr, "[ui] ddp.h left %zu bytes allocated\n", mem_live); ok = 0; }
    for (i = 0; i < SNAP_SLOTS; i++) free(sh.snaps[i].params);
    free(sh.final_params); free((void *)sh.target); free(img); free(side);
    status = ok ? 0 : 1;
    return status;
}
