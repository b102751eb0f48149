/* fake_nccl.c — the fake NCCL (see fakegpu.h): ranks are threads of one process; ranks whose
   ncclCommInitRank* got the same ncclUniqueId form a communicator. A collective is posted by
   every rank; the last to arrive computes it for all, element by element in rank order, into
   every rank's buffer, and marks it done. A blocking communicator waits for that in the call
   (bounded: fakegpu_set_timeout); a non-blocking one answers ncclInProgress and
   ncclCommGetAsyncError reports the end. An abort breaks the group: the peers' pending and
   later operations fail with ncclRemoteError, as when a peer's process goes away. */
#define _GNU_SOURCE
#include "fake_internal.h"
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define COMM_MAGIC 0xc0447u
#define DEAD_MAGIC 0xdeadu
#define MAX_RANKS 64

enum { COLL_ALLREDUCE = 1, COLL_BROADCAST = 2, COLL_REDUCE = 3, COLL_REDUCESCATTER = 4, COLL_ALLGATHER = 5 };
enum { ST_INIT, ST_STALLED, ST_READY, ST_FINALIZING, ST_FINALIZED, ST_FAILED };

typedef struct entry {
    int coll, root;
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t type;
    ncclRedOp_t op;
    struct CUstream_st *stream;
} entry;

typedef struct group {
    ncclUniqueId id;
    int nranks, joined;
    double all_joined_at;
    struct ncclComm *members[MAX_RANKS];
    unsigned long long done_seq;   /* collectives completed: 1..done_seq */
    int arrived;
    entry e[MAX_RANKS];
    ncclResult_t broken;           /* ncclSuccess, or what every later call on it reports */
    char broken_msg[400];
    struct group *next;
} group;

struct ncclComm {
    unsigned magic;
    group *g;
    int rank, nranks, device, blocking, state;
    unsigned long long next_seq, pending_seq;
    int pending, inprogress_left, ops;
    unsigned long long bytes;      /* fakegpu_comm_bytes */
    ncclResult_t async_error;
    struct ncclComm *next;
};

static pthread_mutex_t nccl_lock = PTHREAD_MUTEX_INITIALIZER;   /* taken before fakegpu_lock, never after */
static pthread_cond_t nccl_cond = PTHREAD_COND_INITIALIZER;
static group *groups;
static struct ncclComm *comms;   /* every communicator ever made: a destroyed one stays, marked, to catch its use */
static unsigned long long id_counter;
static ncclUniqueId last_made, last_joined;   /* under nccl_lock */
static int avg_premul, inprogress_polls, stall_rank = -1, inject_rank = -1, inject_after;
static int stall_device = -1, stall_nth, inits_on[FAKEGPU_MAX_DEVICES];   /* under nccl_lock */
static ncclResult_t inject_error = ncclSystemError;
static double init_delay_s, nccl_timeout_s = 60;
static __thread char last_error[600];

void fakegpu_set_avg_premul(int premul) { avg_premul = premul; }
void fakegpu_set_inprogress_polls(int polls) { inprogress_polls = polls; }
void fakegpu_set_init_delay(double seconds) { init_delay_s = seconds; }
void fakegpu_stall_init(int rank) { stall_rank = rank; }
void fakegpu_stall_init_on(int device, int nth) {
    pthread_mutex_lock(&nccl_lock);
    stall_device = device; stall_nth = nth;
    pthread_mutex_unlock(&nccl_lock);
}
void fakegpu_inject_async_error(int rank, int after, ncclResult_t error) {
    struct ncclComm *c;
    pthread_mutex_lock(&nccl_lock);
    if (after < 0) {   /* now, on that rank's live communicators */
        for (c = comms; c; c = c->next)
            if (c->magic == COMM_MAGIC && c->rank == rank) c->async_error = error;
    } else {
        inject_rank = rank; inject_after = after; inject_error = error;
    }
    pthread_mutex_unlock(&nccl_lock);
}
void fakegpu_inject_comm_error(ncclComm_t comm, ncclResult_t error) {
    pthread_mutex_lock(&nccl_lock);
    if (comm && comm->magic == COMM_MAGIC) comm->async_error = error;
    pthread_mutex_unlock(&nccl_lock);
}
unsigned long long fakegpu_comm_bytes(ncclComm_t comm, int *ops) {
    unsigned long long b = 0;
    int n = 0;
    pthread_mutex_lock(&nccl_lock);
    if (comm && comm->magic == COMM_MAGIC) { b = comm->bytes; n = comm->ops; }
    pthread_mutex_unlock(&nccl_lock);
    if (ops) *ops = n;
    return b;
}
void fakegpu_nccl_set_timeout(double seconds) { nccl_timeout_s = seconds; }

void fakegpu_nccl_reset(void) {
    pthread_mutex_lock(&nccl_lock);
    while (comms) { struct ncclComm *c = comms; comms = c->next; if (c->magic == COMM_MAGIC) fprintf(stderr, "fakegpu_reset: a communicator (rank %d) is still live\n", c->rank); free(c); }
    while (groups) { group *g = groups; groups = g->next; free(g); }
    avg_premul = 0; inprogress_polls = 0; stall_rank = -1; inject_rank = -1; init_delay_s = 0; nccl_timeout_s = 60;
    stall_device = -1; stall_nth = 0; memset(inits_on, 0, sizeof inits_on);
    pthread_mutex_unlock(&nccl_lock);
}

int fakegpu_live_comms(void) {
    int n = 0;
    struct ncclComm *c;
    pthread_mutex_lock(&nccl_lock);
    for (c = comms; c; c = c->next) n += c->magic == COMM_MAGIC;
    pthread_mutex_unlock(&nccl_lock);
    return n;
}

/* NCCL's last error is per thread. */
static ncclResult_t failmsg(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ncclResult_t failmsg(ncclResult_t r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return r;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}
const char *ncclGetLastError(ncclComm_t comm) { (void)comm; return last_error; }

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    unsigned long long n;
    if (!id) return ncclInvalidArgument;
    memset(id, 0, sizeof *id);
    pthread_mutex_lock(&nccl_lock);
    n = ++id_counter;
    pthread_mutex_unlock(&nccl_lock);
    snprintf(id->internal, sizeof id->internal, "fakenccl pid %d id %llu", (int)getpid(), n);
    pthread_mutex_lock(&nccl_lock);
    last_made = *id;
    pthread_mutex_unlock(&nccl_lock);
    return ncclSuccess;
}

/* Copies that stay valid while another thread makes or joins an id (one slot per call site). */
const char *fakegpu_last_made_id(void) {
    static char text[NCCL_UNIQUE_ID_BYTES + 1];
    pthread_mutex_lock(&nccl_lock);
    memcpy(text, last_made.internal, NCCL_UNIQUE_ID_BYTES);
    pthread_mutex_unlock(&nccl_lock);
    return text;
}

const char *fakegpu_last_joined_id(void) {
    static char text[NCCL_UNIQUE_ID_BYTES + 1];
    pthread_mutex_lock(&nccl_lock);
    memcpy(text, last_joined.internal, NCCL_UNIQUE_ID_BYTES);
    pthread_mutex_unlock(&nccl_lock);
    return text;
}

/* A communicator handle as NCCL would see it: a destroyed or aborted one is misuse. Lock held. */
static int comm_ok_locked(ncclComm_t comm, const char *call) {
    if (comm && comm->magic == COMM_MAGIC) return 1;
    pthread_mutex_unlock(&nccl_lock);
    fakegpu_misuse("%s: communicator %p is %s", call, (void *)comm, comm && comm->magic == DEAD_MAGIC ? "destroyed or aborted" : "not a communicator");
    pthread_mutex_lock(&nccl_lock);
    return 0;
}

static void break_group_locked(group *g, ncclResult_t why, const char *msg) {
    if (!g || g->broken != ncclSuccess) return;
    g->broken = why;
    snprintf(g->broken_msg, sizeof g->broken_msg, "%s", msg);
    pthread_cond_broadcast(&nccl_cond);
}

static int init_complete_locked(const group *g) {
    return g->joined == g->nranks && fakegpu_now() >= g->all_joined_at + init_delay_s;
}

/* Wait (blocking communicators) with the fake's own deadline: it never hangs. Lock held. */
static int wait_locked(double give_up) {
    struct timespec ts;
    double t = give_up < fakegpu_now() + 0.05 ? give_up : fakegpu_now() + 0.05;   /* wake for delays too */
    clock_gettime(CLOCK_REALTIME, &ts);
    t -= fakegpu_now();
    if (t < 0) t = 0;
    ts.tv_sec += (time_t)t;
    ts.tv_nsec += (long)((t - (double)(time_t)t) * 1e9);
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_cond_timedwait(&nccl_cond, &nccl_lock, &ts);
    return fakegpu_now() < give_up;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config) {
    struct ncclComm *c;
    group *g;
    int blocking = 1, s, nth;
    if (!out) return failmsg(ncclInvalidArgument, "fake NCCL: comm is NULL");
    *out = NULL;
    if (config) {
        if (config->size != sizeof(ncclConfig_t) || config->magic != 0xcafebeef)
            return failmsg(ncclInvalidArgument, "fake NCCL: the config was not made from NCCL_CONFIG_INITIALIZER");
        if (config->blocking != NCCL_CONFIG_UNDEF_INT) blocking = config->blocking;
    }
    if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
        return failmsg(ncclInvalidArgument, "fake NCCL: rank %d of %d is out of range", rank, nranks);
    if (!(c = (struct ncclComm *)calloc(1, sizeof *c))) return failmsg(ncclSystemError, "fake NCCL: out of memory");
    c->magic = COMM_MAGIC; c->rank = rank; c->nranks = nranks; c->device = fakegpu_current_device(); c->blocking = blocking;
    pthread_mutex_lock(&nccl_lock);
    c->next = comms; comms = c;
    *out = c;
    last_joined = id;
    nth = c->device >= 0 && c->device < FAKEGPU_MAX_DEVICES ? inits_on[c->device]++ : -1;
    if (rank == stall_rank || (c->device == stall_device && nth == stall_nth)) {   /* started, never joins */
        c->state = ST_STALLED;
        if (!blocking) { pthread_mutex_unlock(&nccl_lock); return ncclInProgress; }
        pthread_mutex_unlock(&nccl_lock);
        usleep((useconds_t)(nccl_timeout_s * 1e6));
        return failmsg(ncclSystemError, "fake NCCL: set-up stalled (fakegpu_stall_init)");
    }
    for (g = groups; g; g = g->next) if (!memcmp(&g->id, &id, sizeof id) && g->joined < g->nranks) break;
    if (!g) {
        if (!(g = (group *)calloc(1, sizeof *g))) { pthread_mutex_unlock(&nccl_lock); return failmsg(ncclSystemError, "fake NCCL: out of memory"); }
        g->id = id; g->nranks = nranks; g->next = groups; groups = g;
    }
    c->g = g;
    c->state = ST_INIT;
    if (g->nranks != nranks) {
        break_group_locked(g, ncclInvalidUsage, "fake NCCL: ranks disagree on the number of ranks");
    } else if (g->members[rank]) {
        break_group_locked(g, ncclInvalidUsage, "fake NCCL: two communicators were made as the same rank");
    } else {
        g->members[rank] = c;
        if (++g->joined == g->nranks) {
            g->all_joined_at = fakegpu_now();
            for (s = 0; s < nranks; s++) {   /* NCCL refuses two ranks of one communicator on one GPU */
                int t;
                for (t = s + 1; t < nranks; t++)
                    if (g->members[s]->device == g->members[t]->device) {
                        char msg[160];
                        snprintf(msg, sizeof msg, "Duplicate GPU detected : rank %d and rank %d both on CUDA device %d", s, t, g->members[s]->device);
                        break_group_locked(g, ncclInvalidUsage, msg);
                    }
            }
            pthread_cond_broadcast(&nccl_cond);
        }
    }
    if (!blocking) { pthread_mutex_unlock(&nccl_lock); return ncclInProgress; }
    {
        double give_up = fakegpu_now() + nccl_timeout_s;
        while (g->broken == ncclSuccess && !init_complete_locked(g) && wait_locked(give_up)) {}
        if (g->broken != ncclSuccess) { c->state = ST_FAILED; pthread_mutex_unlock(&nccl_lock); return failmsg(g->broken, "%s", g->broken_msg); }
        if (!init_complete_locked(g)) {
            c->state = ST_FAILED;
            pthread_mutex_unlock(&nccl_lock);
            return failmsg(ncclSystemError, "fake NCCL: timed out after %.0f s waiting for the other ranks' set-up", nccl_timeout_s);
        }
    }
    c->state = ST_READY;
    pthread_mutex_unlock(&nccl_lock);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}

/* The state a non-blocking communicator reports, advanced as far as it can be. Lock held. */
static ncclResult_t poll_locked(struct ncclComm *c) {
    group *g = c->g;
    if (c->async_error != ncclSuccess) return c->async_error;
    if (c->state == ST_STALLED) return ncclInProgress;
    if (g && g->broken != ncclSuccess) { failmsg(g->broken, "%s", g->broken_msg); return g->broken; }
    if (c->state == ST_INIT) {
        if (!init_complete_locked(g)) return ncclInProgress;
        c->state = ST_READY;
    }
    if (c->pending) {
        if (g->done_seq < c->pending_seq) return ncclInProgress;
        if (c->inprogress_left > 0) { c->inprogress_left--; return ncclInProgress; }
        c->pending = 0;
    }
    if (c->state == ST_FINALIZING) c->state = ST_FINALIZED;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err) {
    if (!err) return ncclInvalidArgument;
    pthread_mutex_lock(&nccl_lock);
    if (!comm_ok_locked(comm, "ncclCommGetAsyncError")) { pthread_mutex_unlock(&nccl_lock); return ncclInvalidArgument; }
    *err = poll_locked(comm);
    pthread_mutex_unlock(&nccl_lock);
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    if (!comm || !count) return ncclInvalidArgument;
    *count = comm->nranks;
    return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    if (!comm || !rank) return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

/* ---- the arithmetic ---- */
static float from_bf16(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t to_bf16(float f) {   /* round to nearest even; NaN stays NaN (as __float2bfloat16_rn) */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
    }
}

/* Where element j of a reduction's result goes on rank r: every rank (allreduce), the root only
   (reduce), or the rank whose block of `count` holds j, at j - r * count (reduce-scatter: the
   send buffers hold nranks * count elements, rank r receives block r). NULL: nowhere. */
static void *result_at(const group *g, int r, size_t j, size_t sz) {
    const entry *e = &g->e[r];
    if (e->coll == COLL_REDUCE && r != e->root) return NULL;
    if (e->coll == COLL_REDUCESCATTER) {
        if (j / e->count != (size_t)r) return NULL;
        j -= (size_t)r * e->count;
    }
    return (char *)e->recv + j * sz;
}

/* Element j of every rank's result, from every rank's input, in rank order. */
static void compute_locked(group *g) {
    const entry *e0 = &g->e[0];
    int n = g->nranks, r;
    size_t j, sz = type_size(e0->type), total = e0->coll == COLL_REDUCESCATTER ? e0->count * (size_t)n : e0->count;
    if (e0->coll == COLL_BROADCAST) {
        const entry *root = &g->e[e0->root];
        for (r = 0; r < n; r++)
            if (g->e[r].recv != root->send) memmove(g->e[r].recv, root->send, e0->count * sz);
        return;
    }
    if (e0->coll == COLL_ALLGATHER) {   /* rank q's send into block q of every recv (in place: already there) */
        int q;
        for (r = 0; r < n; r++)
            for (q = 0; q < n; q++) {
                char *to = (char *)g->e[r].recv + (size_t)q * e0->count * sz;
                if (to != (const char *)g->e[q].send) memmove(to, g->e[q].send, e0->count * sz);
            }
        return;
    }
    if (e0->coll != COLL_ALLREDUCE) {   /* reduce, reduce-scatter: each element read before its one write */
        for (j = 0; j < total; j++) {
            if (e0->type == ncclFloat64) {
                double s = ((const double *)e0->send)[j];
                for (r = 1; r < n; r++) s += ((const double *)g->e[r].send)[j];
                if (e0->op == ncclAvg) s = s / (double)n;
                for (r = 0; r < n; r++) { double *at = (double *)result_at(g, r, j, sz); if (at) *at = s; }
            } else if (e0->type == ncclFloat) {
                float s, scale = (float)(1.0 / n);
                if (e0->op == ncclAvg && avg_premul) {
                    s = ((const float *)e0->send)[j] * scale;
                    for (r = 1; r < n; r++) s += ((const float *)g->e[r].send)[j] * scale;
                } else {
                    s = ((const float *)e0->send)[j];
                    for (r = 1; r < n; r++) s += ((const float *)g->e[r].send)[j];
                    if (e0->op == ncclAvg) s = s / (float)n;
                }
                for (r = 0; r < n; r++) { float *at = (float *)result_at(g, r, j, sz); if (at) *at = s; }
            } else {   /* bfloat16 (uint8 is refused for these at the post) */
                uint16_t out;
                float scale = (float)(1.0 / n);
                if (e0->op == ncclAvg && avg_premul) {
                    out = to_bf16(from_bf16(((const uint16_t *)e0->send)[j]) * scale);
                    for (r = 1; r < n; r++)
                        out = to_bf16(from_bf16(out) + from_bf16(to_bf16(from_bf16(((const uint16_t *)g->e[r].send)[j]) * scale)));
                } else {
                    float s = from_bf16(((const uint16_t *)e0->send)[j]);
                    for (r = 1; r < n; r++) s += from_bf16(((const uint16_t *)g->e[r].send)[j]);
                    out = to_bf16(e0->op == ncclAvg ? s / (float)n : s);
                }
                for (r = 0; r < n; r++) { uint16_t *at = (uint16_t *)result_at(g, r, j, sz); if (at) *at = out; }
            }
        }
        return;
    }
    for (j = 0; j < e0->count; j++) {
        if (e0->type == ncclFloat64) {   /* sums of doubles (ddp.h's norm blocks) */
            double s = ((const double *)e0->send)[j];
            for (r = 1; r < n; r++) s += ((const double *)g->e[r].send)[j];
            if (e0->op == ncclAvg) s = s / (double)n;
            for (r = 0; r < n; r++) ((double *)g->e[r].recv)[j] = s;
            continue;
        }
        if (e0->type == ncclFloat) {
            float s, scale = (float)(1.0 / n);
            if (e0->op == ncclAvg && avg_premul) {
                s = ((const float *)e0->send)[j] * scale;
                for (r = 1; r < n; r++) s += ((const float *)g->e[r].send)[j] * scale;
            } else {
                s = ((const float *)e0->send)[j];
                for (r = 1; r < n; r++) s += ((const float *)g->e[r].send)[j];
                if (e0->op == ncclAvg) s = s / (float)n;
            }
            for (r = 0; r < n; r++) ((float *)g->e[r].recv)[j] = s;
        } else if (e0->type == ncclBfloat16) {
            uint16_t out;
            float scale = (float)(1.0 / n);
            if (e0->op == ncclAvg && avg_premul) {
                out = to_bf16(from_bf16(((const uint16_t *)e0->send)[j]) * scale);
                for (r = 1; r < n; r++)
                    out = to_bf16(from_bf16(out) + from_bf16(to_bf16(from_bf16(((const uint16_t *)g->e[r].send)[j]) * scale)));
            } else {
                float s = from_bf16(((const uint16_t *)e0->send)[j]);
                for (r = 1; r < n; r++) s += from_bf16(((const uint16_t *)g->e[r].send)[j]);
                out = to_bf16(e0->op == ncclAvg ? s / (float)n : s);
            }
            for (r = 0; r < n; r++) ((uint16_t *)g->e[r].recv)[j] = out;
        } else {   /* ncclUint8 sum (ncclAvg is refused for it at the post) */
            unsigned s = 0;
            for (r = 0; r < n; r++) s += ((const uint8_t *)g->e[r].send)[j];
            for (r = 0; r < n; r++) ((uint8_t *)g->e[r].recv)[j] = (uint8_t)s;
        }
    }
}

static const char *coll_name(const entry *e, char *buf, size_t cap) {
    static const char *types[] = { "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16" };
    static const char *ops[] = { "sum", "prod", "max", "min", "avg" };
    if (e->coll == COLL_BROADCAST) snprintf(buf, cap, "broadcast of %zu %s from rank %d", e->count, types[e->type], e->root);
    else if (e->coll == COLL_REDUCE) snprintf(buf, cap, "reduce(%s) of %zu %s to rank %d", ops[e->op], e->count, types[e->type], e->root);
    else if (e->coll == COLL_REDUCESCATTER) snprintf(buf, cap, "reduce-scatter(%s) of %zu %s a rank", ops[e->op], e->count, types[e->type]);
    else if (e->coll == COLL_ALLGATHER) snprintf(buf, cap, "all-gather of %zu %s a rank", e->count, types[e->type]);
    else snprintf(buf, cap, "allreduce(%s) of %zu %s", ops[e->op], e->count, types[e->type]);
    return buf;
}

static ncclResult_t post(const entry *in, ncclComm_t comm, cudaStream_t stream, const char *call) {
    struct ncclComm *c = comm;
    group *g;
    entry e = *in;
    unsigned long long seq;
    size_t bytes = in->count * type_size(in->type), send_bytes = bytes, recv_bytes = bytes;
    int r, complete = 0, reduces = in->coll == COLL_ALLREDUCE || in->coll == COLL_REDUCE || in->coll == COLL_REDUCESCATTER;
    if (in->type != ncclFloat && in->type != ncclBfloat16 && in->type != ncclUint8 && in->type != ncclFloat64)
        return failmsg(ncclInvalidArgument, "fake NCCL: %s: only float, double, bfloat16 and uint8 are emulated", call);
    if (reduces && (in->op != ncclSum && in->op != ncclAvg))
        return failmsg(ncclInvalidArgument, "fake NCCL: %s: only ncclSum and ncclAvg are emulated", call);
    if (reduces && in->op == ncclAvg && in->type == ncclUint8)
        return failmsg(ncclInvalidArgument, "fake NCCL: %s: ncclAvg on uint8 is not emulated", call);
    if (in->coll != COLL_ALLREDUCE && in->coll != COLL_BROADCAST && in->type == ncclUint8)
        return failmsg(ncclInvalidArgument, "fake NCCL: %s: uint8 is emulated for allreduce and broadcast only", call);
    if (comm && comm->magic == COMM_MAGIC) {
        /* NCCL's buffer sizes and in-place rules: reduce-scatter sends nranks * count and receives
           count (in place: recv = send + rank * count); all-gather the reverse (in place: send =
           recv + rank * count). Another overlap is undefined in NCCL: refused here. */
        size_t whole = bytes * (size_t)comm->nranks;
        if (in->coll == COLL_REDUCESCATTER) send_bytes = whole;
        if (in->coll == COLL_ALLGATHER) recv_bytes = whole;
        if (bytes && in->coll == COLL_REDUCESCATTER && (const char *)in->recv != (const char *)in->send + comm->rank * bytes &&
            (const char *)in->recv < (const char *)in->send + whole && (const char *)in->recv + bytes > (const char *)in->send) {
            fakegpu_misuse("%s on rank %d: recvbuff overlaps sendbuff but is not sendbuff + rank * count", call, comm->rank);
            return failmsg(ncclInvalidArgument, "fake NCCL: %s: bad in-place buffers", call);
        }
        if (bytes && in->coll == COLL_ALLGATHER && (const char *)in->send != (const char *)in->recv + comm->rank * bytes &&
            (const char *)in->send < (const char *)in->recv + whole && (const char *)in->send + bytes > (const char *)in->recv) {
            fakegpu_misuse("%s on rank %d: sendbuff overlaps recvbuff but is not recvbuff + rank * count", call, comm->rank);
            return failmsg(ncclInvalidArgument, "fake NCCL: %s: bad in-place buffers", call);
        }
    }
    pthread_mutex_lock(&nccl_lock);
    if (!comm_ok_locked(c, call)) { pthread_mutex_unlock(&nccl_lock); return ncclInvalidArgument; }
    g = c->g;
    if (c->state != ST_READY || c->pending) {   /* NCCL: nothing else before the last call has completed */
        int st = c->state, pend = c->pending;
        pthread_mutex_unlock(&nccl_lock);
        fakegpu_misuse("%s on rank %d: the communicator %s", call, c->rank,
                       pend ? "still has the previous operation in progress (ncclInProgress not settled)" :
                       st == ST_INIT || st == ST_STALLED ? "has not finished its set-up" : "is finalized or failed");
        return failmsg(ncclInvalidUsage, "fake NCCL: %s called while the communicator is busy or not set up", call);
    }
    pthread_mutex_unlock(&nccl_lock);
    /* the stream must be on the communicator's GPU, and so must the buffers */
    pthread_mutex_lock(&fakegpu_lock);
    e.stream = fakegpu_stream_locked(stream, call);
    r = e.stream ? e.stream->device : -1;
    pthread_mutex_unlock(&fakegpu_lock);
    if (!e.stream) return failmsg(ncclInvalidArgument, "fake NCCL: %s: not a stream", call);
    if (r != c->device || fakegpu_current_device() != c->device) {
        fakegpu_misuse("%s on rank %d: stream on device %d, communicator on device %d, current device %d", call, c->rank, r,
                       c->device, fakegpu_current_device());
        return failmsg(ncclInvalidUsage, "fake NCCL: %s: wrong device", call);
    }
    if (bytes && ((e.send && !fakegpu_is_device_range(e.send, send_bytes, c->device)) ||
                  (e.recv && !fakegpu_is_device_range(e.recv, recv_bytes, c->device)))) {
        fakegpu_misuse("%s on rank %d: a buffer (%p, %zu bytes; %p, %zu bytes) is not device memory of device %d", call,
                       c->rank, e.send, send_bytes, e.recv, recv_bytes, c->device);
        return failmsg(ncclInvalidArgument, "fake NCCL: %s: buffer not in device memory", call);
    }
    pthread_mutex_lock(&nccl_lock);
    if (c->async_error != ncclSuccess) { r = c->async_error; pthread_mutex_unlock(&nccl_lock); return (ncclResult_t)r; }
    if (g->broken != ncclSuccess) { r = g->broken; pthread_mutex_unlock(&nccl_lock); return failmsg((ncclResult_t)r, "%s", g->broken_msg); }
    if (c->rank == inject_rank && c->ops == inject_after) {   /* this rank's GPU fails: its part never arrives */
        c->ops++;
        c->async_error = inject_error;
        snprintf(last_error, sizeof last_error, "fake NCCL: injected asynchronous error on rank %d", c->rank);
        pthread_mutex_unlock(&nccl_lock);
        return ncclSuccess;   /* the enqueue worked; the failure shows asynchronously */
    }
    c->ops++;
    c->bytes += bytes;
    seq = ++c->next_seq;
    if (seq != g->done_seq + 1) {   /* cannot happen while ranks settle each call before the next */
        pthread_mutex_unlock(&nccl_lock);
        fakegpu_misuse("%s on rank %d: collective #%llu posted while #%llu is not complete", call, c->rank, seq, g->done_seq + 1);
        return ncclInternalError;
    }
    g->e[c->rank] = e;
    if (++g->arrived == g->nranks) {
        char a[128], b[128];
        for (r = 1; r < g->nranks; r++) {
            const entry *x = &g->e[0], *y = &g->e[r];
            if (x->coll != y->coll || x->count != y->count || x->type != y->type ||
                (x->coll != COLL_BROADCAST && x->coll != COLL_ALLGATHER && x->op != y->op) ||
                ((x->coll == COLL_BROADCAST || x->coll == COLL_REDUCE) && x->root != y->root)) {
                char msg[400];
                snprintf(msg, sizeof msg, "fake NCCL: ranks called different collectives (#%llu): rank 0 a %s, rank %d a %s",
                         seq, coll_name(x, a, sizeof a), r, coll_name(y, b, sizeof b));
                break_group_locked(g, ncclInvalidUsage, msg);
                pthread_mutex_unlock(&nccl_lock);
                fakegpu_misuse("%s", msg);
                return failmsg(ncclInvalidUsage, "%s", msg);
            }
        }
        compute_locked(g);
        pthread_mutex_lock(&fakegpu_lock);   /* every rank's stream is busy until now */
        for (r = 0; r < g->nranks; r++) {
            double now = fakegpu_now();
            if (g->e[r].stream->busy_until < now) g->e[r].stream->busy_until = now;
        }
        pthread_mutex_unlock(&fakegpu_lock);
        g->arrived = 0;
        g->done_seq = seq;
        complete = 1;
        pthread_cond_broadcast(&nccl_cond);
    }
    c->pending_seq = seq;
    c->pending = 1;
    c->inprogress_left = inprogress_polls;
    if (c->blocking) {
        double give_up = fakegpu_now() + nccl_timeout_s;
        while (g->done_seq < seq && g->broken == ncclSuccess && wait_locked(give_up)) {}
        c->pending = 0;
        if (g->broken != ncclSuccess) { r = g->broken; pthread_mutex_unlock(&nccl_lock); return failmsg((ncclResult_t)r, "%s", g->broken_msg); }
        if (g->done_seq < seq) {
            pthread_mutex_unlock(&nccl_lock);
            return failmsg(ncclSystemError, "fake NCCL: %s timed out after %.0f s waiting for the other ranks", call, nccl_timeout_s);
        }
        pthread_mutex_unlock(&nccl_lock);
        return ncclSuccess;
    }
    if (complete && !c->inprogress_left) c->pending = 0;
    r = c->pending ? ncclInProgress : ncclSuccess;
    pthread_mutex_unlock(&nccl_lock);
    return (ncclResult_t)r;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
    entry e;
    memset(&e, 0, sizeof e);
    e.coll = COLL_ALLREDUCE; e.send = send; e.recv = recv; e.count = count; e.type = type; e.op = op;
    return post(&e, comm, stream, "ncclAllReduce");
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
    entry e;
    memset(&e, 0, sizeof e);
    if (comm && comm->magic == COMM_MAGIC && (root < 0 || root >= comm->nranks))
        return failmsg(ncclInvalidArgument, "fake NCCL: broadcast root %d out of range", root);
    e.coll = COLL_BROADCAST; e.send = comm && comm->magic == COMM_MAGIC && comm->rank == root ? send : NULL;
    e.recv = recv; e.count = count; e.type = type; e.root = root;
    return post(&e, comm, stream, "ncclBroadcast");
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream) {
    entry e;
    memset(&e, 0, sizeof e);
    if (comm && comm->magic == COMM_MAGIC && (root < 0 || root >= comm->nranks))
        return failmsg(ncclInvalidArgument, "fake NCCL: reduce root %d out of range", root);
    e.coll = COLL_REDUCE; e.send = send; e.count = count; e.type = type; e.op = op; e.root = root;
    e.recv = comm && comm->magic == COMM_MAGIC && comm->rank == root ? recv : NULL;   /* NCCL reads recvbuff on the root only */
    return post(&e, comm, stream, "ncclReduce");
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
    entry e;
    memset(&e, 0, sizeof e);
    e.coll = COLL_REDUCESCATTER; e.send = send; e.recv = recv; e.count = recvcount; e.type = type; e.op = op;
    return post(&e, comm, stream, "ncclReduceScatter");
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
    entry e;
    memset(&e, 0, sizeof e);
    e.coll = COLL_ALLGATHER; e.send = send; e.recv = recv; e.count = sendcount; e.type = type;
    return post(&e, comm, stream, "ncclAllGather");
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    struct ncclComm *c = comm;
    ncclResult_t r;
    pthread_mutex_lock(&nccl_lock);
    if (!comm_ok_locked(c, "ncclCommFinalize")) { pthread_mutex_unlock(&nccl_lock); return ncclInvalidArgument; }
    r = c->state == ST_READY ? poll_locked(c) : ncclInvalidUsage;
    if (c->state != ST_READY || (r == ncclInProgress && c->pending)) {
        int st = c->state;
        pthread_mutex_unlock(&nccl_lock);
        fakegpu_misuse("ncclCommFinalize on rank %d: the communicator is %s", c->rank,
                       st == ST_READY ? "busy (an operation not settled)" : "not set up, finalized or failed");
        return ncclInvalidUsage;
    }
    if (r != ncclSuccess && r != ncclInProgress) { pthread_mutex_unlock(&nccl_lock); return r; }
    c->state = ST_FINALIZING;
    if (!c->blocking) { pthread_mutex_unlock(&nccl_lock); return ncclInProgress; }
    c->state = ST_FINALIZED;
    pthread_mutex_unlock(&nccl_lock);
    return ncclSuccess;
}

/* Destroy after a completed finalize; anything else would wait in NCCL for work that may never
   finish (a peer gone): ddp.h must abort instead. */
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    struct ncclComm *c = comm;
    pthread_mutex_lock(&nccl_lock);
    if (!comm_ok_locked(c, "ncclCommDestroy")) { pthread_mutex_unlock(&nccl_lock); return ncclInvalidArgument; }
    if (c->state != ST_FINALIZED) {
        int st = c->state;
        pthread_mutex_unlock(&nccl_lock);
        fakegpu_misuse("ncclCommDestroy on rank %d without a completed ncclCommFinalize (state %d): it could wait for ever", c->rank, st);
        pthread_mutex_lock(&nccl_lock);
    }
    c->magic = DEAD_MAGIC;
    if (c->g) c->g->members[c->rank] = c->g->members[c->rank] == c ? NULL : c->g->members[c->rank];
    pthread_mutex_unlock(&nccl_lock);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    struct ncclComm *c = comm;
    char msg[128];
    pthread_mutex_lock(&nccl_lock);
    if (!comm_ok_locked(c, "ncclCommAbort")) { pthread_mutex_unlock(&nccl_lock); return ncclInvalidArgument; }
    c->magic = DEAD_MAGIC;
    if (c->g && c->state != ST_FINALIZED) {   /* its connections close: the peers' communication fails */
        snprintf(msg, sizeof msg, "fake NCCL: rank %d aborted its communicator", c->rank);
        break_group_locked(c->g, ncclRemoteError, msg);
    }
    if (c->g) c->g->members[c->rank] = c->g->members[c->rank] == c ? NULL : c->g->members[c->rank];
    pthread_mutex_unlock(&nccl_lock);
    return ncclSuccess;
}
