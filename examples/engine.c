/* engine.c — ddp.h embedded in a host program (an editor, a build tool): the "engine" starts N
   training threads, one rank each (ranks as threads: ddp_desc.world_size by hand, no launcher),
   shows their progress from its own thread without ever blocking them, cancels them on a
   condition (after --cancel-after steps, or Ctrl-C), lets them shut down cleanly and goes on:
   it exits 0. Rank 2 of 3 has less data than the others: it joins (ddp_join) and answers their
   steps with zero gradients until they run out too.

       cc -O2 -pthread examples/engine.c -o engine -lm && ./engine --ranks 3 --cancel-after 2000
       x86_64-w64-mingw32-gcc -O2 examples/engine.c -o engine.exe -lws2_32 -lbcrypt     (Windows;
       MSVC: cl /O2 examples\engine.c)

   The model: linear regression, y = w.x + b, its gradients by hand. */
#define DDP_IMPLEMENTATION
#include "../ddp.h"
#include <errno.h>
#include <signal.h>
#include <stdio.h>

/* The engine's own threads, lock, clock and sleep: POSIX, or Win32 on Windows (ddp.h needs
   neither from the program; on Windows it brings windows.h and Winsock with it). */
#ifdef _WIN32
typedef HANDLE engine_thread;
typedef SRWLOCK engine_lock;
#define ENGINE_LOCK_INIT SRWLOCK_INIT
static void take(engine_lock *l) { AcquireSRWLockExclusive(l); }
static void release(engine_lock *l) { ReleaseSRWLockExclusive(l); }
static void *train(void *arg);
static unsigned __stdcall train_thread(void *arg) { train(arg); return 0; }
static void start_thread(engine_thread *t, void *arg) { *t = (HANDLE)_beginthreadex(NULL, 0, train_thread, arg, 0, NULL); }
static void join_thread(engine_thread t) { WaitForSingleObject(t, INFINITE); CloseHandle(t); }
static double now(void) {
    LARGE_INTEGER f, t;
    QueryPerformanceFrequency(&f);
    QueryPerformanceCounter(&t);
    return (double)t.QuadPart / (double)f.QuadPart;
}
static void sleep_ms(int ms) { Sleep((DWORD)ms); }
#define close_socket(fd) closesocket(fd)
typedef int socklen_t;
#else
typedef pthread_t engine_thread;
typedef pthread_mutex_t engine_lock;
#define ENGINE_LOCK_INIT PTHREAD_MUTEX_INITIALIZER
static void take(engine_lock *l) { pthread_mutex_lock(l); }
static void release(engine_lock *l) { pthread_mutex_unlock(l); }
static void *train(void *arg);
static void start_thread(engine_thread *t, void *arg) { pthread_create(t, NULL, train, arg); }
static void join_thread(engine_thread t) { pthread_join(t, NULL); }
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static void sleep_ms(int ms) { usleep((useconds_t)ms * 1000); }
#define close_socket(fd) close(fd)
#endif

#define FEATURES 256
#define BATCH 32
#define MAX_RANKS 8

typedef struct worker {
    int rank, world, port, batches;
    ddp_cancel_token *cancel;      /* the engine's: outlives every context */
    ddp_context *ctx;              /* published for progress reads, under the engine's lock */
    engine_lock *lock;
    ddp_result result;
    char error[1024];
    int64_t steps;
    int done;                      /* shut down (under the lock) */
} worker;

/* Deterministic data: a target w* plus noise, different on every rank. */
static float value(unsigned seed, unsigned i) {
    unsigned z = seed * 2654435761u ^ (i + 0x9e3779b9u) * 2246822519u;
    z ^= z >> 15; z *= 2654435761u; z ^= z >> 13;
    return (float)(z & 0xffffff) / 8388608.0f - 1.0f;
}

static void *train(void *arg) {
    worker *me = (worker *)arg;
    ddp_context *ctx = NULL;
    ddp_desc d;
    ddp_adamw opt;
    int w, b, t, e, k;
    float x[FEATURES];
    memset(&d, 0, sizeof d);
    memset(&opt, 0, sizeof opt);
    d.world_size = me->world;
    d.rank = me->rank;
    d.master_port = me->port;
    d.cancel_token = me->cancel;               /* one token cancels every rank */
    d.uneven_inputs = DDP_JOIN_DIVIDE_BY_WORLD;
    d.log_level = DDP_LOG_ERROR;
    opt.lr = 0.01f;
    if ((me->result = ddp_init(&ctx, &d)) != DDP_OK) goto out;
    ddp_register_param(ctx, "w", FEATURES, 0, NULL, &w);
    ddp_register_param(ctx, "b", 1, DDP_NO_DECAY, NULL, &b);
    if ((me->result = ddp_commit(ctx)) != DDP_OK) goto out;
    take(me->lock);
    me->ctx = ctx;                             /* the engine may read its progress from now on */
    release(me->lock);
    for (t = 0; t < me->batches && me->result == DDP_OK; t++) {
        float *pw = ddp_param(ctx, w), *gw = ddp_grad(ctx, w), pb = ddp_param(ctx, b)[0];
        double loss = 0, gb = 0;
        ddp_zero_grad(ctx);
        for (e = 0; e < BATCH; e++) {
            float pred = pb, y = 0.5f * value(77, 0), err;
            for (k = 0; k < FEATURES; k++) {
                x[k] = value(1000u * (unsigned)me->rank + (unsigned)t, (unsigned)(e * FEATURES + k));
                pred += pw[k] * x[k];
                y += value(77, (unsigned)k + 1) * x[k];
            }
            err = (pred - y) / BATCH;
            loss += 0.5 * (double)(pred - y) * (pred - y) / BATCH;
            for (k = 0; k < FEATURES; k++) gw[k] += err * x[k];
            gb += err;
        }
        ddp_grad(ctx, b)[0] = (float)gb;
        if ((me->result = ddp_grad_ready(ctx, b)) != DDP_OK) break;
        if ((me->result = ddp_grad_ready(ctx, w)) != DDP_OK) break;
        if ((me->result = ddp_finish(ctx)) != DDP_OK) break;
        if ((me->result = ddp_adamw_step(ctx, &opt, NULL)) != DDP_OK) break;
        ddp_report_loss(ctx, (float)loss);    /* for the engine's display: no communication */
        me->steps++;
    }
    if (me->result == DDP_OK) me->result = ddp_join(ctx);   /* out of data: wait for the others */
out:
    snprintf(me->error, sizeof me->error, "%s", ddp_last_error(ctx));
    take(me->lock);
    me->ctx = NULL;                            /* no more progress reads: it is about to go */
    release(me->lock);
    ddp_shutdown(ctx);                         /* the thread that stepped a rank shuts it down */
    take(me->lock);
    me->done = 1;
    release(me->lock);
    return NULL;
}

static ddp_cancel_token cancel_token;
static void on_sigint(int sig) { (void)sig; ddp_cancel_token_set(&cancel_token); }   /* async-signal-safe */

/* A port for the ranks' rendezvous store (rank 0 serves it on 127.0.0.1). */
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
    worker workers[MAX_RANKS];
    engine_thread threads[MAX_RANKS];
    engine_lock lock = ENGINE_LOCK_INIT;
    int ranks = 3, cancel_after = 2000, batches = 100000, i, port = free_port(), ok = 1, cancelled = 0;
    double t0 = now();
    for (i = 1; i + 1 < argc; i += 2) {   /* every flag takes a whole number; anything else is a usage error */
        char *end;
        long v;
        errno = 0;
        v = strtol(argv[i + 1], &end, 10);
        if (errno || end == argv[i + 1] || *end || v < 0 || v > 1000000000L) { ranks = 0; break; }
        if (!strcmp(argv[i], "--ranks")) ranks = (int)v;
        else if (!strcmp(argv[i], "--cancel-after")) cancel_after = (int)v;   /* 0: never */
        else if (!strcmp(argv[i], "--batches")) batches = (int)v;
        else { ranks = 0; break; }
    }
    if (ranks < 1 || ranks > MAX_RANKS || argc % 2 == 0) {
        fprintf(stderr, "usage: %s [--ranks 1..%d] [--cancel-after STEPS] [--batches N]\n", argv[0], MAX_RANKS);
        return 2;
    }
    signal(SIGINT, on_sigint);
    for (i = 0; i < ranks; i++) {
        memset(&workers[i], 0, sizeof workers[i]);
        workers[i].rank = i; workers[i].world = ranks; workers[i].port = port;
        workers[i].batches = i == 2 ? batches / 2 : batches;   /* rank 2 runs out of data first */
        workers[i].cancel = &cancel_token;
        workers[i].lock = &lock;
        start_thread(&threads[i], &workers[i]);
    }
    /* The engine's UI loop: never waits for the training threads. */
    for (;;) {
        ddp_progress p;
        int done = 0;
        memset(&p, 0, sizeof p);
        take(&lock);             /* only keeps a context from going while it is read */
        for (i = 0; i < ranks; i++) done += workers[i].done;
        if (workers[0].ctx) ddp_progress_read(workers[0].ctx, &p);
        release(&lock);
        if (p.step > 0)
            printf("[engine %5.2f s] step %4lld  loss %.4f  step %.2f ms  comm %.3f ms  ranks with data %d\n",
                   now() - t0, (long long)p.step, p.loss, p.step_ms, p.comm_ms, p.active_ranks);
        if (!cancelled && cancel_after > 0 && p.step >= cancel_after) {
            printf("[engine] %lld steps: cancelling the training\n", (long long)p.step);
            ddp_cancel_token_set(&cancel_token);
            cancelled = 1;
        }
        if (done == ranks) break;              /* every rank has shut down */
        sleep_ms(20);                          /* a frame */
    }
    for (i = 0; i < ranks; i++) {
        join_thread(threads[i]);
        printf("[engine] rank %d: %lld steps, %s%s%s\n", i, (long long)workers[i].steps, ddp_result_string(workers[i].result),
               workers[i].result != DDP_OK ? ": " : "", workers[i].result != DDP_OK ? workers[i].error : "");
        /* cancelled (by us or Ctrl-C) or finished: anything else is a failure */
        if (workers[i].result != DDP_OK && workers[i].result != DDP_ERR_CANCELLED) ok = 0;
    }
    printf("[engine] training %s; the engine goes on (%.2f s)\n",
           ddp_cancel_token_is_set(&cancel_token) ? "cancelled" : "finished", now() - t0);
    return ok ? 0 : 1;
}
