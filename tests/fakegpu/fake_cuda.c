/* fake_cuda.c — the fake CUDA runtime (see fakegpu.h): device memory is host memory, every
   operation runs at once on the calling thread, and completion times are modelled per stream
   so that events can be "not ready" (a stream kept busy by a spin kernel, a delay, a held
   device). It checks what a GPU would refuse: pointers outside device allocations, copies in
   the wrong direction, work or events on another device's stream. */
#define _GNU_SOURCE
#include "fake_internal.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define STREAM_MAGIC 0x5eea3u
#define EVENT_MAGIC 0xe7e47u
#define DEAD_MAGIC 0xdeadu

struct CUevent_st {
    unsigned magic;
    int device;
    unsigned flags;
    int recorded;
    double recorded_at;            /* host clock at cudaEventRecord */
    double ready_at;               /* when the work before it completes */
};

typedef struct alloc {
    char *base;
    size_t size;
    int device;                    /* -1: pinned host memory (cudaMallocHost) */
    int live;
    int vm;                        /* a mapped, accessible range of a reservation (fake_vm.c): not cudaFree's */
} alloc;

pthread_mutex_t fakegpu_lock = PTHREAD_MUTEX_INITIALIZER;
static alloc *allocs;
static int nallocs, cap_allocs;
static int device_count = 4;
static size_t device_cap[FAKEGPU_MAX_DEVICES];   /* fakegpu_set_device_memory; 0: no limit */
static int held[FAKEGPU_MAX_DEVICES];
static double held_since[FAKEGPU_MAX_DEVICES], event_delay[FAKEGPU_MAX_DEVICES];
static double sync_timeout_s = 60;
static struct CUstream_st legacy[FAKEGPU_MAX_DEVICES];
static int live_events;
static int misuse_count;
static char misuse_first[512];
static __thread int current_device;
static __thread cudaError_t last_error;

double fakegpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void fakegpu_misuse(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "FAKEGPU MISUSE: %s\n", msg);
    __atomic_fetch_add(&misuse_count, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&fakegpu_lock);
    if (!misuse_first[0]) snprintf(misuse_first, sizeof misuse_first, "%s", msg);
    pthread_mutex_unlock(&fakegpu_lock);
}

int fakegpu_misuse_count(void) { return __atomic_load_n(&misuse_count, __ATOMIC_RELAXED); }
const char *fakegpu_misuse_first(void) { return misuse_first; }
int fakegpu_current_device(void) { return current_device; }
void fakegpu_set_last_error(cudaError_t e) { last_error = e; }

/* Every failing call leaves its error as the thread's last error, as the runtime does. */
static cudaError_t fail(cudaError_t e) {
    if (e != cudaSuccess) last_error = e;
    return e;
}

void fakegpu_set_device_count(int count) { device_count = count < 0 ? 0 : count > FAKEGPU_MAX_DEVICES ? FAKEGPU_MAX_DEVICES : count; }
void fakegpu_hold_device(int device, int hold) {
    pthread_mutex_lock(&fakegpu_lock);
    if (device >= 0 && device < FAKEGPU_MAX_DEVICES) {
        if (hold && !held[device]) held_since[device] = fakegpu_now();
        held[device] = hold;
    }
    pthread_mutex_unlock(&fakegpu_lock);
}
void fakegpu_set_event_delay(int device, double seconds) {
    pthread_mutex_lock(&fakegpu_lock);
    if (device >= 0 && device < FAKEGPU_MAX_DEVICES) event_delay[device] = seconds;
    pthread_mutex_unlock(&fakegpu_lock);
}
void fakegpu_nccl_set_timeout(double seconds);   /* fake_nccl.c */
void fakegpu_set_timeout(double seconds) { sync_timeout_s = seconds; fakegpu_nccl_set_timeout(seconds); }

void fakegpu_nccl_reset(void);   /* fake_nccl.c */
void fakegpu_reset(void) {
    int d;
    pthread_mutex_lock(&fakegpu_lock);
    device_count = 4;
    for (d = 0; d < FAKEGPU_MAX_DEVICES; d++) device_cap[d] = 0;
    fakegpu_vm_reset_locked();
    sync_timeout_s = 60;
    for (d = 0; d < FAKEGPU_MAX_DEVICES; d++) { held[d] = 0; event_delay[d] = 0; legacy[d].busy_until = 0; }
    misuse_count = 0;
    misuse_first[0] = 0;
    pthread_mutex_unlock(&fakegpu_lock);
    fakegpu_nccl_reset();
}

/* cudaMalloc'd bytes live on `device` (-1: every device), and the physical memory of
   cuMemCreate (fake_vm.c): what the device holds. */
static size_t device_bytes_locked(int device) {
    size_t total = 0;
    int i;
    for (i = 0; i < nallocs; i++)
        if (allocs[i].live && !allocs[i].vm && allocs[i].device >= 0 && (device < 0 || allocs[i].device == device))
            total += allocs[i].size;
    return total + fakegpu_vm_phys_bytes_locked(device);
}
size_t fakegpu_live_device_bytes(void) {
    size_t total;
    pthread_mutex_lock(&fakegpu_lock);
    total = device_bytes_locked(-1);
    pthread_mutex_unlock(&fakegpu_lock);
    return total;
}
size_t fakegpu_device_bytes(int device) {
    size_t total;
    pthread_mutex_lock(&fakegpu_lock);
    total = device_bytes_locked(device);
    pthread_mutex_unlock(&fakegpu_lock);
    return total;
}
void fakegpu_set_device_memory(int device, size_t bytes) {
    pthread_mutex_lock(&fakegpu_lock);
    if (device >= 0 && device < FAKEGPU_MAX_DEVICES) device_cap[device] = bytes;
    pthread_mutex_unlock(&fakegpu_lock);
}
int fakegpu_device_fits_locked(int device, size_t bytes) {
    size_t cap = device >= 0 && device < FAKEGPU_MAX_DEVICES ? device_cap[device] : 0;
    return !cap || (bytes <= cap && device_bytes_locked(device) <= cap - bytes);
}
int fakegpu_live_events(void) {
    int n;
    pthread_mutex_lock(&fakegpu_lock);
    n = live_events;
    pthread_mutex_unlock(&fakegpu_lock);
    return n;
}

/* ---- errors ---- */
const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorTimeout: return "cudaErrorTimeout";
    default: return "cudaErrorUnknown";
    }
}
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorTimeout: return "fake GPU: timed out waiting for a held device";
    default: return "unknown error";
    }
}
cudaError_t cudaGetLastError(void) { cudaError_t e = last_error; last_error = cudaSuccess; return e; }
cudaError_t cudaPeekAtLastError(void) { return last_error; }

/* ---- devices ---- */
cudaError_t cudaGetDeviceCount(int *count) {
    if (!count) return fail(cudaErrorInvalidValue);
    *count = device_count;
    return device_count > 0 ? cudaSuccess : fail(cudaErrorNoDevice);
}
cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= device_count) return fail(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *device) {
    if (!device) return fail(cudaErrorInvalidValue);
    *device = current_device;
    return cudaSuccess;
}

/* ---- memory ---- */
static alloc *find_alloc_locked(const void *p) {
    int i;
    for (i = 0; i < nallocs; i++)
        if (allocs[i].live && (const char *)p >= allocs[i].base && (const char *)p < allocs[i].base + (allocs[i].size ? allocs[i].size : 1))
            return &allocs[i];
    return NULL;
}

/* A range may cross from one mapped range of a reservation into the next adjacent one (the
   granules of a virtual range, fake_vm.c): that is one piece of device memory to a kernel. */
int fakegpu_is_device_range(const void *p, size_t bytes, int device) {
    alloc *a;
    int ok;
    pthread_mutex_lock(&fakegpu_lock);
    a = find_alloc_locked(p);
    ok = a && a->device >= 0 && (device < 0 || a->device == device);
    while (ok && (size_t)((const char *)p - a->base) + bytes > a->size) {
        const char *end = a->base + a->size;
        alloc *next;
        if (!a->vm) { ok = 0; break; }
        next = find_alloc_locked(end);
        ok = next && next->vm && next->base == end && next->device == a->device;
        if (ok) { bytes -= (size_t)(end - (const char *)p); p = end; a = next; }
    }
    pthread_mutex_unlock(&fakegpu_lock);
    return ok;
}

/* fake_vm.c: a range mapped and made accessible becomes device memory to the checks, and stops
   being it at its unmap. Lock held. */
int fakegpu_vm_register_locked(char *base, size_t size, int device) {
    alloc *a = NULL;
    int i;
    for (i = 0; i < nallocs; i++) if (!allocs[i].live) { a = &allocs[i]; break; }
    if (!a) {
        if (nallocs == cap_allocs) {
            int cap = cap_allocs ? 2 * cap_allocs : 64;
            alloc *grown = (alloc *)realloc(allocs, sizeof(alloc) * (size_t)cap);
            if (!grown) return 0;
            allocs = grown;
            cap_allocs = cap;
        }
        a = &allocs[nallocs++];
    }
    a->base = base; a->size = size; a->device = device; a->live = 1; a->vm = 1;
    return 1;
}
void fakegpu_vm_unregister_locked(char *base) {
    int i;
    for (i = 0; i < nallocs; i++) if (allocs[i].live && allocs[i].vm && allocs[i].base == base) allocs[i].live = 0;
}

static cudaError_t add_alloc(void **ptr, size_t size, int device) {
    char *p;
    alloc *a = NULL;
    int i;
    if (!ptr) return fail(cudaErrorInvalidValue);
    /* 256-byte aligned as cudaMalloc's; device memory starts as NaN bytes so that what ddp.h
       reads before it was written shows */
    pthread_mutex_lock(&fakegpu_lock);
    i = device < 0 || fakegpu_device_fits_locked(device, size);
    pthread_mutex_unlock(&fakegpu_lock);
    if (!i) return fail(cudaErrorMemoryAllocation);
    if (posix_memalign((void **)&p, 256, size ? size : 1)) return fail(cudaErrorMemoryAllocation);
    memset(p, device >= 0 ? 0xff : 0, size);
    pthread_mutex_lock(&fakegpu_lock);
    for (i = 0; i < nallocs; i++) if (!allocs[i].live) { a = &allocs[i]; break; }
    if (!a) {
        if (nallocs == cap_allocs) {
            int cap = cap_allocs ? 2 * cap_allocs : 64;
            alloc *grown = (alloc *)realloc(allocs, sizeof(alloc) * (size_t)cap);
            if (!grown) { pthread_mutex_unlock(&fakegpu_lock); free(p); return fail(cudaErrorMemoryAllocation); }
            allocs = grown;
            cap_allocs = cap;
        }
        a = &allocs[nallocs++];
    }
    a->base = p; a->size = size; a->device = device; a->live = 1; a->vm = 0;
    pthread_mutex_unlock(&fakegpu_lock);
    *ptr = p;
    return cudaSuccess;
}

static cudaError_t free_alloc(void *ptr, int host, const char *call) {
    alloc *a;
    if (!ptr) return cudaSuccess;
    pthread_mutex_lock(&fakegpu_lock);
    a = find_alloc_locked(ptr);
    if (!a || a->vm || a->base != (char *)ptr || (a->device < 0) != host) {
        pthread_mutex_unlock(&fakegpu_lock);
        fakegpu_misuse("%s(%p): not a live %s allocation", call, ptr, host ? "cudaMallocHost" : "cudaMalloc");
        return fail(cudaErrorInvalidValue);
    }
    a->live = 0;
    pthread_mutex_unlock(&fakegpu_lock);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t size) { return add_alloc(ptr, size, current_device); }
cudaError_t cudaFree(void *ptr) { return free_alloc(ptr, 0, "cudaFree"); }
cudaError_t cudaMallocHost(void **ptr, size_t size) { return add_alloc(ptr, size, -1); }
cudaError_t cudaFreeHost(void *ptr) { return free_alloc(ptr, 1, "cudaFreeHost"); }

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *at, const void *ptr) {
    alloc *a;
    if (!at) return fail(cudaErrorInvalidValue);
    memset(at, 0, sizeof *at);
    pthread_mutex_lock(&fakegpu_lock);
    a = find_alloc_locked(ptr);
    if (a && a->device >= 0) { at->type = cudaMemoryTypeDevice; at->device = a->device; at->devicePointer = (void *)ptr; }
    else if (a) { at->type = cudaMemoryTypeHost; at->device = -1; at->hostPointer = at->devicePointer = (void *)ptr; }
    else { at->type = cudaMemoryTypeUnregistered; at->device = -1; at->hostPointer = (void *)ptr; }   /* CUDA >= 11 */
    pthread_mutex_unlock(&fakegpu_lock);
    return cudaSuccess;
}

/* ---- streams and events ---- */
struct CUstream_st *fakegpu_stream_locked(cudaStream_t stream, const char *call) {
    if (!stream) { legacy[current_device].device = current_device; return &legacy[current_device]; }
    if (stream->magic != STREAM_MAGIC) {
        pthread_mutex_unlock(&fakegpu_lock);
        fakegpu_misuse("%s: stream %p is not a live stream", call, (void *)stream);
        pthread_mutex_lock(&fakegpu_lock);
        return NULL;
    }
    return stream;
}

/* Work on a stream of another device than the current one: the runtime refuses it. */
static struct CUstream_st *stream_here_locked(cudaStream_t stream, const char *call, cudaError_t *e) {
    struct CUstream_st *s = fakegpu_stream_locked(stream, call);
    *e = cudaSuccess;
    if (!s) { *e = cudaErrorInvalidResourceHandle; return NULL; }
    if (s->device != current_device) {
        int dev = s->device, cur = current_device;
        pthread_mutex_unlock(&fakegpu_lock);
        fakegpu_misuse("%s: the stream belongs to device %d, the calling thread's current device is %d", call, dev, cur);
        pthread_mutex_lock(&fakegpu_lock);
        *e = cudaErrorInvalidResourceHandle;
        return NULL;
    }
    return s;
}

/* An operation of `ms` device time on s, starting when s's earlier work is done. */
static void stream_add_work_locked(struct CUstream_st *s, double ms) {
    double now = fakegpu_now();
    if (s->busy_until < now) s->busy_until = now;
    s->busy_until += ms * 1e-3;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
    struct CUstream_st *s;
    if (!stream) return fail(cudaErrorInvalidValue);
    if (!(s = (struct CUstream_st *)calloc(1, sizeof *s))) return fail(cudaErrorMemoryAllocation);
    s->magic = STREAM_MAGIC; s->device = current_device; s->flags = flags;
    *stream = s;
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    if (!stream || stream->magic != STREAM_MAGIC) {
        fakegpu_misuse("cudaStreamDestroy(%p): not a live stream", (void *)stream);
        return fail(cudaErrorInvalidResourceHandle);
    }
    stream->magic = DEAD_MAGIC;
    free(stream);
    return cudaSuccess;
}

/* Work enqueued on a held device never completes while it is held. */
static int done_locked(int device, double recorded_at, double ready_at, double now) {
    if (held[device] && recorded_at >= held_since[device]) return 0;
    return now >= ready_at;
}

static cudaError_t wait_until(int device, double recorded_at, double ready_at) {
    double give_up = fakegpu_now() + sync_timeout_s;
    for (;;) {
        int done;
        double now = fakegpu_now();
        pthread_mutex_lock(&fakegpu_lock);
        done = done_locked(device, recorded_at, ready_at, now);
        pthread_mutex_unlock(&fakegpu_lock);
        if (done) return cudaSuccess;
        if (now > give_up) return fail(cudaErrorTimeout);
        usleep(200);
    }
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    struct CUstream_st *s;
    double until, now = fakegpu_now();
    int dev;
    pthread_mutex_lock(&fakegpu_lock);
    s = fakegpu_stream_locked(stream, "cudaStreamSynchronize");
    if (!s) { pthread_mutex_unlock(&fakegpu_lock); return fail(cudaErrorInvalidResourceHandle); }
    until = s->busy_until; dev = s->device;
    pthread_mutex_unlock(&fakegpu_lock);
    return wait_until(dev, now, until);
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
    struct CUstream_st *s;
    cudaError_t e;
    pthread_mutex_lock(&fakegpu_lock);
    s = fakegpu_stream_locked(stream, "cudaStreamQuery");
    e = !s ? cudaErrorInvalidResourceHandle : done_locked(s->device, 0, s->busy_until, fakegpu_now()) ? cudaSuccess : cudaErrorNotReady;
    pthread_mutex_unlock(&fakegpu_lock);
    return fail(e);
}
cudaError_t cudaDeviceSynchronize(void) {
    /* the legacy stream of the device: the fake keeps no list of the others, whose work is
       done when enqueued (only spins and delays extend it, which ddp.h never syncs on here) */
    return cudaStreamSynchronize(NULL);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    struct CUevent_st *ev;
    if (!event) return fail(cudaErrorInvalidValue);
    if (!(ev = (struct CUevent_st *)calloc(1, sizeof *ev))) return fail(cudaErrorMemoryAllocation);
    ev->magic = EVENT_MAGIC; ev->device = current_device; ev->flags = flags;
    pthread_mutex_lock(&fakegpu_lock);
    live_events++;
    pthread_mutex_unlock(&fakegpu_lock);
    *event = ev;
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }
static int event_ok(cudaEvent_t ev, const char *call) {
    if (ev && ev->magic == EVENT_MAGIC) return 1;
    fakegpu_misuse("%s(%p): not a live event", call, (void *)ev);
    return 0;
}
cudaError_t cudaEventDestroy(cudaEvent_t ev) {
    if (!event_ok(ev, "cudaEventDestroy")) return fail(cudaErrorInvalidResourceHandle);
    ev->magic = DEAD_MAGIC;
    free(ev);
    pthread_mutex_lock(&fakegpu_lock);
    live_events--;
    pthread_mutex_unlock(&fakegpu_lock);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t stream) {
    struct CUstream_st *s;
    cudaError_t e = cudaSuccess;
    double now = fakegpu_now();
    if (!event_ok(ev, "cudaEventRecord")) return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&fakegpu_lock);
    s = fakegpu_stream_locked(stream, "cudaEventRecord");
    if (!s) e = cudaErrorInvalidResourceHandle;
    else if (s->device != ev->device) {   /* the runtime refuses an event and a stream of two devices */
        int sd = s->device, ed = ev->device;
        pthread_mutex_unlock(&fakegpu_lock);
        fakegpu_misuse("cudaEventRecord: the event belongs to device %d, the stream to device %d", ed, sd);
        pthread_mutex_lock(&fakegpu_lock);
        e = cudaErrorInvalidResourceHandle;
    } else {
        ev->recorded = 1;
        ev->recorded_at = now;
        ev->ready_at = (s->busy_until > now ? s->busy_until : now) + event_delay[s->device];
    }
    pthread_mutex_unlock(&fakegpu_lock);
    return fail(e);
}
cudaError_t cudaEventQuery(cudaEvent_t ev) {
    int done;
    if (!event_ok(ev, "cudaEventQuery")) return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&fakegpu_lock);
    done = !ev->recorded || done_locked(ev->device, ev->recorded_at, ev->ready_at, fakegpu_now());
    pthread_mutex_unlock(&fakegpu_lock);
    return done ? cudaSuccess : fail(cudaErrorNotReady);
}
cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
    double rec, ready;
    int dev;
    if (!event_ok(ev, "cudaEventSynchronize")) return fail(cudaErrorInvalidResourceHandle);
    if (!ev->recorded) return cudaSuccess;
    pthread_mutex_lock(&fakegpu_lock);
    rec = ev->recorded_at; ready = ev->ready_at; dev = ev->device;
    pthread_mutex_unlock(&fakegpu_lock);
    return wait_until(dev, rec, ready);
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    cudaError_t e = cudaSuccess;
    if (!ms) return fail(cudaErrorInvalidValue);
    if (!event_ok(start, "cudaEventElapsedTime") || !event_ok(end, "cudaEventElapsedTime")) return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&fakegpu_lock);
    if ((start->flags | end->flags) & cudaEventDisableTiming) e = cudaErrorInvalidResourceHandle;
    else if (!start->recorded || !end->recorded) e = cudaErrorInvalidResourceHandle;
    else if (!done_locked(start->device, start->recorded_at, start->ready_at, fakegpu_now()) ||
             !done_locked(end->device, end->recorded_at, end->ready_at, fakegpu_now()))
        e = cudaErrorNotReady;
    else *ms = (float)(1e3 * (end->ready_at - start->ready_at));
    pthread_mutex_unlock(&fakegpu_lock);
    return fail(e);
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t ev, unsigned int flags) {
    struct CUstream_st *s;
    cudaError_t e = cudaSuccess;
    if (flags) return fail(cudaErrorInvalidValue);
    if (!event_ok(ev, "cudaStreamWaitEvent")) return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&fakegpu_lock);
    if (!(s = stream_here_locked(stream, "cudaStreamWaitEvent", &e))) { pthread_mutex_unlock(&fakegpu_lock); return fail(e); }
    if (ev->recorded && ev->ready_at > s->busy_until) s->busy_until = ev->ready_at;
    pthread_mutex_unlock(&fakegpu_lock);
    return cudaSuccess;
}

/* ---- copies ---- */
static int host_side(const void *p) {
    struct cudaPointerAttributes at;
    cudaPointerGetAttributes(&at, p);
    return at.type != cudaMemoryTypeDevice;
}

static cudaError_t check_copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, const char *call) {
    int dev = current_device;
    if (!n) return cudaSuccess;
    switch (kind) {
    case cudaMemcpyHostToDevice:
        if (fakegpu_is_device_range(dst, n, -1) && host_side(src)) return cudaSuccess;
        break;
    case cudaMemcpyDeviceToHost:
        if (fakegpu_is_device_range(src, n, -1) && host_side(dst)) return cudaSuccess;
        break;
    case cudaMemcpyDeviceToDevice:
        if (fakegpu_is_device_range(src, n, -1) && fakegpu_is_device_range(dst, n, -1)) return cudaSuccess;
        break;
    case cudaMemcpyHostToHost:
        if (host_side(src) && host_side(dst)) return cudaSuccess;
        break;
    case cudaMemcpyDefault:
        return cudaSuccess;
    }
    fakegpu_misuse("%s(%p <- %p, %zu bytes, kind %d) on device %d: a pointer is not where the kind says, or the range "
                   "leaves its allocation", call, dst, src, n, (int)kind, dev);
    return cudaErrorInvalidValue;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t stream) {
    struct CUstream_st *s;
    cudaError_t e;
    if ((e = check_copy(dst, src, n, kind, "cudaMemcpyAsync")) != cudaSuccess) return fail(e);
    pthread_mutex_lock(&fakegpu_lock);
    s = stream_here_locked(stream, "cudaMemcpyAsync", &e);
    if (s) stream_add_work_locked(s, 0);
    pthread_mutex_unlock(&fakegpu_lock);
    if (!s) return fail(e);
    if (n) memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, NULL);
    return e != cudaSuccess ? e : cudaStreamSynchronize(NULL);
}
cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t stream) {
    struct CUstream_st *s;
    cudaError_t e;
    if (n && !fakegpu_is_device_range(p, n, -1)) {
        fakegpu_misuse("cudaMemsetAsync(%p, %zu bytes): not device memory, or the range leaves its allocation", p, n);
        return fail(cudaErrorInvalidValue);
    }
    pthread_mutex_lock(&fakegpu_lock);
    s = stream_here_locked(stream, "cudaMemsetAsync", &e);
    if (s) stream_add_work_locked(s, 0);
    pthread_mutex_unlock(&fakegpu_lock);
    if (!s) return fail(e);
    if (n) memset(p, value, n);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int value, size_t n) { return cudaMemsetAsync(p, value, n, NULL); }

/* ---- kernels (fake_kernels.cpp) ---- */
cudaError_t fakegpu_launch(cudaStream_t stream, const char *kernel, double ms, int nptr, const void **ptrs, const size_t *bytes) {
    struct CUstream_st *s;
    cudaError_t e;
    int i, dev;
    pthread_mutex_lock(&fakegpu_lock);
    s = stream_here_locked(stream, kernel, &e);
    dev = s ? s->device : -1;
    if (s) stream_add_work_locked(s, ms);
    pthread_mutex_unlock(&fakegpu_lock);
    if (!s) return fail(e);
    for (i = 0; i < nptr; i++)
        if (bytes[i] && !fakegpu_is_device_range(ptrs[i], bytes[i], dev)) {
            fakegpu_misuse("%s: argument %d (%p, %zu bytes) is not device memory of device %d (or the range leaves its "
                           "allocation)", kernel, i, ptrs[i], bytes[i], dev);
            return fail(cudaErrorIllegalAddress);
        }
    return cudaSuccess;
}
