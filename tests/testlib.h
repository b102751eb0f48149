/* testlib.h — what the tests share: verdict lines, deterministic data, ranks as threads.
   A test prints one line per check, "PASS name" or "FAIL name: why"; tests/run.sh counts them. */
#ifndef DDP_TESTLIB_H
#define DDP_TESTLIB_H
#define DDP_IMPLEMENTATION
#define DDP_TEST_KILL_POINTS   /* DDP_TEST_KILL_AT=POINT:RANK (ddp.h): SIGKILL a rank inside the library */
#include "../ddp.h"
#include <stdio.h>
#ifdef _WIN32
/* Windows (MinGW-w64, tests/test_windows.sh): the tests' own threads are winpthreads' (ddp.h
   itself uses none); the POSIX calls the tests make on sockets and the environment, mapped. */
#include <pthread.h>
#define setenv(name, value, overwrite) _putenv_s((name), (value))
#define unsetenv(name) _putenv_s((name), "")
#define poll(p, n, ms) WSAPoll((p), (n), (ms))
#define test_sock_close(fd) closesocket(fd)
#define usleep(us) Sleep(((us) + 999) / 1000)
#include <direct.h>
#include <io.h>
static inline char *test_mkdtemp(char *t) { return _mktemp_s(t, strlen(t) + 1) == 0 && _mkdir(t) == 0 ? t : NULL; }
#define mkdtemp(t) test_mkdtemp(t)
#define rmdir(d) _rmdir(d)
#else
#define test_sock_close(fd) close(fd)
#endif

static int test_failures;

/* Sanitized builds run many times slower: timing properties are skipped there and heavy tests
   shrink their work (what they check stays the same). */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define TEST_SANITIZED 1
#endif
#endif

static inline void verdict(int ok, const char *name, const char *fmt, ...) {
    va_list ap;
    if (ok) { printf("PASS %s\n", name); fflush(stdout); return; }
    test_failures++;
    printf("FAIL %s: ", name);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

/* Deterministic value in [-1, 1) for (stream, index): any rank can make any rank's data. */
static inline float test_value(uint64_t stream, uint64_t index) {
    uint64_t z = stream * 0x9e3779b97f4a7c15ull + index * 0xbf58476d1ce4e5b9ull + 0x94d049bb133111ebull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) / 8388608.0f - 1.0f;
}

/* FNV-1a of a buffer: ranks compare bits by comparing hashes. */
static inline uint64_t test_hash(const void *data, size_t bytes) {
    const unsigned char *p = (const unsigned char *)data;
    uint64_t h = 1469598103934665603ull;
    size_t i;
    for (i = 0; i < bytes; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* A TCP port nobody listens on right now. */
static inline int test_free_port(void) {
    struct sockaddr_in a;
    ddp__socklen len = sizeof a;
    int fd, port = 0;
    static uint32_t seed;
    int tries;
    (void)ddp__net_init();   /* Windows: Winsock up */
    /* below the kernel's ephemeral range (32768 up): a port from that range can be taken as the
       local port of some client socket before rank 0 binds it (tests/lib.sh's free_port too) */
    if (!seed) seed = (uint32_t)ddp__getpid() * 2654435761u ^ (uint32_t)(ddp__now() * 1e6);
    for (tries = 0; tries < 200 && !port; tries++) {
        seed = seed * 1664525u + 1013904223u;
        fd = (int)socket(AF_INET, SOCK_STREAM, 0);
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons((uint16_t)(20000 + (seed >> 8) % 12000));
        if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
            port = ntohs(a.sin_port);
        if (fd >= 0) test_sock_close(fd);
    }
    return port;
}

/* Run fn on `world` threads, each its own rank of one process group. */
typedef struct test_rank {
    int rank, world, port;
    void *shared;
    ddp_result result;        /* what fn reports */
    char error[1024];
} test_rank;

typedef void (*test_rank_fn)(test_rank *self);

static inline void *test__rank_main(void *arg) {
    test_rank *self = (test_rank *)arg;
    ((test_rank_fn)((void **)self->shared)[0])(self);
    return NULL;
}

/* shared[0] must be the function; the rest is the test's. */
static inline void test_run_ranks(int world, void **shared, test_rank *ranks) {
    pthread_t threads[16];
    int r, port = test_free_port();
    for (r = 0; r < world; r++) {
        memset(&ranks[r], 0, sizeof ranks[r]);
        ranks[r].rank = r; ranks[r].world = world; ranks[r].port = port; ranks[r].shared = shared;
        pthread_create(&threads[r], NULL, test__rank_main, &ranks[r]);
    }
    for (r = 0; r < world; r++) pthread_join(threads[r], NULL);
}

/* A descriptor for thread-rank tests: the process group by hand, not from the environment. */
static inline ddp_desc test_desc(const test_rank *self) {
    ddp_desc d;
    memset(&d, 0, sizeof d);
    d.world_size = self->world;
    d.rank = self->rank;
    d.master_port = self->port;
    d.timeout_s = 20;
    d.log_level = DDP_LOG_OFF;
    return d;
}

/* stdout quiet on every rank but 0: rank 0 speaks for all (the verdicts are the same everywhere). */
static inline void test_quiet_others(int rank) {
    if (rank != 0) { FILE *quiet = freopen("/dev/null", "w", stdout); (void)quiet; }
}

/* The launcher's rank and world, from a context opened and shut down at once (for a test that
   opens its own contexts later), then test_quiet_others. 0, or -1 with the error on stderr. */
static inline int test_probe(int *rank, int *world) {
    ddp_context *probe;
    if (ddp_init(&probe, NULL) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(probe)); ddp_shutdown(probe); return -1; }
    *rank = ddp_rank(probe);
    *world = ddp_world_size(probe);
    ddp_shutdown(probe);
    test_quiet_others(*rank);
    return 0;
}

static inline int test_summary(const char *program) {
    fprintf(stderr, "%s: %d failure(s)\n", program, test_failures);
    return test_failures ? 1 : 0;
}
#endif
