/*
 * ddprun - start N local ranks of a data-parallel program (a tiny torchrun).
 *
 *   ddprun [-n N] [--master-port P] [--grace SECONDS] [--max-restarts N] [--restart-delay S]
 *          [--restart-delay-max S] [--] PROGRAM [ARGS...]
 *   ddprun --nnodes M --node-rank K --master-addr A --master-port P --job-token T -n N PROGRAM...
 *
 * Every rank runs PROGRAM (looked up in PATH) with RANK, WORLD_SIZE,
 * LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT and a
 * per-job random DDP_JOB_TOKEN added to the environment.
 * Several machines: the same command on each, with its own --node-rank (torchrun's
 * meaning): node K runs ranks K*N .. K*N+N-1 (node-major), WORLD_SIZE = M*N, LOCAL_RANK and
 * LOCAL_WORLD_SIZE count this node's ranks. The nodes cannot share a token ddprun makes up, so
 * the user gives the same one to every node (--job-token or $DDP_JOB_TOKEN), and the same
 * --master-addr and --master-port (node 0's address: rank 0's store); --job-id (or $DDP_JOB_ID,
 * passed on as it is) names the job alike everywhere. Each node's ddprun supervises its own
 * ranks only; a rank failing on another node reaches these through ddp.h (the group fails).  With more than one
 * rank, OMP_NUM_THREADS and OPENBLAS_NUM_THREADS default to each rank's share
 * of the CPUs ddprun may use (at least 1; a value already set is kept).  Each
 * line a rank writes is copied to ddprun's stdout/stderr prefixed with "[rank R] " (a line that
 * starts with that rank's own "rank R: ", as ddp.h's messages do, loses those words: the
 * prefix says it; "ddp rank R warning: ..." becomes "ddp warning: ...").
 * If a rank fails, or ddprun gets SIGINT/SIGTERM/SIGHUP/SIGQUIT, the other ranks get
 * SIGTERM (or the forwarded SIGINT or SIGQUIT) and, after the grace period, SIGKILL.
 * With --max-restarts N, a failed job is then started again (a new token,
 * and a new port unless --master-port), up to N times; the program resumes
 * from its own checkpoints. Each restart waits first: --restart-delay (1 s),
 * doubled after each attempt shorter than --restart-delay-max (60 s, the cap),
 * reset after one that lasted that long (a --restart-delay-max below the default delay lowers
 * the delay); Ctrl-C ends the wait and ddprun. Exit status 127 (the program could not be run)
 * is not restarted: it would fail the same way.  SIGTSTP (Ctrl-Z) stops every rank, then ddprun;
 * SIGCONT continues them all, so no rank waits for a stopped peer and times out.  SIGUSR1 and
 * SIGUSR2 are passed on to every rank's group (a preemption warning: the program may checkpoint);
 * ddprun goes on supervising.
 *
 * Exit status: 0 if every rank exited 0; else the first failing rank's exit
 * status (128+signal if it was killed), of the last attempt with restarts;
 * 130/143/129/131 after SIGINT/SIGTERM/SIGHUP/SIGQUIT; 2 for bad usage; 1 if ddprun itself could
 * not start the job.
 *
 * Each rank runs in its own process group so that stopping it also stops
 * whatever it spawned (a shell's children, data-loader workers...).  Exited
 * ranks stay unreaped zombies until ddprun ends: that keeps their pid, and so
 * their group id, from being reused, which makes signalling the group safe at
 * any time.  Before exiting, ddprun SIGKILLs what is left in every group,
 * and (it is the ranks' child subreaper) the orphans that had left their
 * group with setsid. A ddprun killed outright (SIGKILL) takes its ranks along
 * (PR_SET_PDEATHSIG), and its guard process, "ddpguard", the rest of their groups.
 * Being in a background group, a rank reading the terminal would stop on
 * SIGTTIN, so ranks get /dev/null as stdin when ddprun's stdin is a tty.
 */
#ifdef _WIN32
#include "ddprun_windows.c"   /* Win32 processes, the same job environment; that file says what differs */
#else
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

enum { MAX_RANKS = 1024, LINE_CAP = 64 * 1024, POLL_MS = 100 };

struct stream {
    int fd;     /* read end of the rank's pipe; -1 once at EOF */
    int dest;   /* STDOUT_FILENO or STDERR_FILENO */
    int rank;   /* for the "[rank R] " prefix */
    char *buf;  /* unfinished line, allocated on first read */
    size_t len;
};

struct rank {
    int index;   /* in this node's array */
    int rank;    /* in the job: the node's base + index */
    pid_t pid;   /* also its process group id */
    int running; /* has not exited yet */
    int code, sig;  /* how it ended: exit status, or the signal that killed it */
    int failed_seq; /* 0, or the order in which its failure was seen (1, 2, ...) */
    int waited_for; /* -1, or the rank its stderr said it timed out waiting for (ddp.h's words) */
    int lost_peer;  /* -1, or the rank its stderr said was gone: died, called ddp_shutdown, disconnected */
    struct stream out, err;
};

struct job {
    int nranks, port, prefix_width;
    int user_port;   /* --master-port given: every attempt uses it */
    int nnodes, node_rank, base;   /* --nnodes, --node-rank; base = node_rank * nranks */
    const char *master_addr, *user_token, *job_id;   /* NULL: 127.0.0.1, a fresh token, unset */
    int max_restarts;
    double restart_delay, restart_delay_max; /* back-off: the first wait, and its cap (also: how long a
                                                run must last to reset it) */
    double grace;
    char token[128];
    char **argv;
    struct rank *ranks;
    int stopping;    /* SIGTERM/forwarded signal already sent */
    int killed;      /* SIGKILL already sent */
    double kill_at;  /* when the grace period ends */
    int exit_status; /* -1 until the first failure decides it */
    double settle_until; /* after a first failure: when to name the cause and stop the rest */
    int failures_seen;
    int interrupted;     /* stopped by SIGINT/SIGTERM to ddprun: no restart */
    char cause[256];     /* what ended the attempt, for the restart line */
};

/* When one rank dies, its peers notice (ddp.h: within ~0.1 s) and exit with an error that names
 * it. Before stopping anyone, ddprun waits this long: the survivors get to say what happened,
 * and a rank killed by a signal, the likely cause, is named first even if a peer's error exit
 * was seen a moment earlier. */
#define SETTLE_SECONDS 0.5

static volatile sig_atomic_t first_signal, signals_received, tstp_pending, cont_pending;
static volatile sig_atomic_t usr1_pending, usr2_pending; /* to pass on to the ranks */
static sigset_t original_sigmask; /* restored in the children */
static sigset_t supervising_sigmask; /* ddprun's own: the original, less the signals it handles */
static struct job *started_job;   /* for die(): never leave ranks behind */
static struct rlimit original_nofile; /* restored in the children */

static const char usage_text[] =
    "usage: ddprun [-n N] [--master-port P] [--grace SECONDS] [--max-restarts N] [--restart-delay S]\n"
    "              [--restart-delay-max S] [--] PROGRAM [ARGS...]\n"
    "       ddprun --nnodes M --node-rank K --master-addr A --master-port P --job-token T [-n N] PROGRAM...\n"
    "  -n, --nproc, --nproc-per-node N  number of ranks (on this node), 1..1024 (default 1)\n"
    "  --master-port P                  MASTER_PORT (default: a free port, a new one per attempt;\n"
    "                                   required with --nnodes > 1)\n"
    "  --nnodes M                       machines in the job, 1..1024 (default 1); run the same\n"
    "                                   command on each, with its own --node-rank; ranks are\n"
    "                                   numbered node-major (node K: K*N .. K*N+N-1)\n"
    "  --node-rank K                    this machine's place, 0..M-1 (default 0)\n"
    "  --master-addr A                  MASTER_ADDR: node 0's address, where rank 0's store\n"
    "                                   listens (default 127.0.0.1; required with --nnodes > 1)\n"
    "  --job-token T                    DDP_JOB_TOKEN, the job's shared secret, 16..127 characters\n"
    "                                   without spaces (default: $DDP_JOB_TOKEN with --nnodes > 1,\n"
    "                                   where one is required: the same on every node, e.g. from\n"
    "                                   `openssl rand -hex 16`; else a fresh random one)\n"
    "  --job-id ID                      DDP_JOB_ID, the job's name, the same on every node\n"
    "                                   (default: $DDP_JOB_ID as it is, or none: the token names it)\n"
    "  --grace SECONDS                  wait before SIGKILL when stopping (default 5)\n"
    "  --max-restarts N                 when a rank fails, stop all and start them again, up to\n"
    "                                   N times (default 0); the program resumes from its checkpoint\n"
    "  --restart-delay S                the wait before the first restart, doubled for each\n"
    "                                   restart after a run shorter than the cap (default 1)\n"
    "  --restart-delay-max S            the cap on that wait; a run that lasted this long resets\n"
    "                                   the wait to --restart-delay (default 60, or the delay\n"
    "                                   given if larger; alone, a smaller cap lowers the delay)\n"
    "  -h, --help                       show this help\n";

/* ---- output ----
 * The ranks' lines and ddprun's own messages go into a bounded queue per destination (stdout,
 * stderr), and a thread of its own writes each queue out. Whatever a destination does (a pager
 * nobody scrolls, `| sleep 20`, a terminal held by Ctrl-S), the supervising thread never waits
 * on it: it keeps reading the ranks' pipes, so no rank blocks in a write, and it keeps noticing
 * failures and stopping the job. When a queue is full, lines are dropped and counted, and one
 * line where they were says how many. Dropping, not holding back the ranks' pipes: a rank
 * blocked on a full pipe stalls the whole job (its peers wait for it in the next collective and
 * time out), and a gap in the log costs less than the run. At exit ddprun waits for the queues
 * to drain, as any program writing into a pipe does; by then no rank is left to supervise. */
enum { QUEUE_CAP = 4 << 20, QUEUE_SLACK = 512, CHUNK = 4096 };

struct outq {
    int fd, started, closing, broken;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t more;
    char *ring;                  /* QUEUE_CAP + QUEUE_SLACK bytes (the slack: the dropped-lines notes) */
    size_t head, len;
    int dropping;                /* full: dropping until it is half empty again */
    unsigned long dropped_lines;
    unsigned long long dropped_bytes;
};
static struct outq queues[3];    /* indexed by STDOUT_FILENO, STDERR_FILENO */

static int write_all(int fd, const char *data, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, data, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

static void ring_put(struct outq *q, const char *data, size_t len)
{
    size_t size = QUEUE_CAP + QUEUE_SLACK, at = (q->head + q->len) % size, first = size - at;
    if (first > len)
        first = len;
    memcpy(q->ring + at, data, first);
    memcpy(q->ring, data + first, len - first);
    q->len += len;
}

static void note_dropped(struct outq *q)
{
    char note[QUEUE_SLACK];
    int n = snprintf(note, sizeof note, "ddprun: %lu line(s) (%llu bytes) dropped here: %s was not read fast enough\n",
                     q->dropped_lines, q->dropped_bytes, q->fd == STDOUT_FILENO ? "stdout" : "stderr");
    ring_put(q, note, (size_t)n);
    q->dropped_lines = 0;
    q->dropped_bytes = 0;
}

/* Queue one complete line (ending in '\n'); never blocks on the destination. */
static void emit(int fd, const char *data, size_t len)
{
    struct outq *q = &queues[fd];
    if (!q->started) { /* before the writers start (usage errors) */
        (void)write_all(fd, data, len);
        return;
    }
    pthread_mutex_lock(&q->lock);
    if (q->dropping && q->len <= QUEUE_CAP / 2) {
        q->dropping = 0;
        note_dropped(q);
    }
    if (q->broken) {
        /* EPIPE or worse: drop this output, keep supervising */
    } else if (q->dropping || q->len + len > QUEUE_CAP) {
        q->dropping = 1;
        q->dropped_lines++;
        q->dropped_bytes += len;
    } else {
        ring_put(q, data, len);
        pthread_cond_signal(&q->more);
    }
    pthread_mutex_unlock(&q->lock);
}

/* ddprun's own messages: "ddprun: ...\n" on stderr, through its queue. */
static void say(const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    int n = snprintf(line, sizeof line, "ddprun: ");
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof line - 2)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    emit(STDERR_FILENO, line, (size_t)n);
}

/* Whole lines, at most CHUNK bytes a write (one longer line alone): a write of up to PIPE_BUF
 * bytes to a pipe is atomic, so with stdout and stderr on one pipe (2>&1) lines do not mix. */
static void *writer_main(void *arg)
{
    struct outq *q = arg;
    static char chunks[3][LINE_CAP + 128];
    char *chunk = chunks[q->fd];
    size_t size = QUEUE_CAP + QUEUE_SLACK;
    pthread_mutex_lock(&q->lock);
    for (;;) {
        size_t n = 0, take = 0;
        while (q->len == 0 && !q->closing)
            pthread_cond_wait(&q->more, &q->lock);
        if (q->len == 0)
            break; /* closing, and all written */
        while (n < q->len && (take == 0 || n < CHUNK) && n < sizeof chunks[0]) {
            chunk[n] = q->ring[(q->head + n) % size];
            if (chunk[n++] == '\n')
                take = n;
        }
        if (take == 0)
            take = n;
        q->head = (q->head + take) % size;
        q->len -= take;
        pthread_mutex_unlock(&q->lock);
        int failed = write_all(q->fd, chunk, take) < 0;
        pthread_mutex_lock(&q->lock);
        if (failed) { /* EPIPE or worse: drop this output from now on, keep supervising */
            q->broken = 1;
            q->len = 0;
        }
    }
    pthread_mutex_unlock(&q->lock);
    return NULL;
}

static void die(const char *what);

/* The writers block every signal: INT, TERM, TSTP and CONT must reach the supervising thread
 * (and interrupt its poll). */
static void start_output(void)
{
    sigset_t all, saved;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &saved);
    for (int fd = STDOUT_FILENO; fd <= STDERR_FILENO; fd++) {
        struct outq *q = &queues[fd];
        q->fd = fd;
        if (!(q->ring = malloc(QUEUE_CAP + QUEUE_SLACK)))
            die("malloc");
        pthread_mutex_init(&q->lock, NULL);
        pthread_cond_init(&q->more, NULL);
        if (pthread_create(&q->thread, NULL, writer_main, q) != 0)
            die("pthread_create");
        q->started = 1;
    }
    pthread_sigmask(SIG_SETMASK, &saved, NULL);
}

/* Write out what is queued (this waits for a slow reader; nothing is left to supervise). */
static void finish_output(void)
{
    for (int fd = STDOUT_FILENO; fd <= STDERR_FILENO; fd++) {
        struct outq *q = &queues[fd];
        if (!q->started)
            continue;
        pthread_mutex_lock(&q->lock);
        if (q->dropping || q->dropped_lines)
            note_dropped(q); /* the slack always has room for it */
        q->closing = 1;
        pthread_cond_signal(&q->more);
        pthread_mutex_unlock(&q->lock);
        pthread_join(q->thread, NULL);
        q->started = 0;
        free(q->ring);
    }
}

static void usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("ddprun: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fputs(usage_text, stderr);
    exit(2);
}

static void signal_groups(struct job *job, int sig);
static void tell_guard(pid_t group);

static void die(const char *what)
{
    say("%s: %s", what, strerror(errno));
    if (started_job) {
        signal_groups(started_job, SIGKILL);
        tell_guard(0); /* their zombies go to init with ddprun, and the ids may be reused */
    }
    finish_output();
    exit(1);
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int parse_int(const char *s, long min, long max, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < min || v > max)
        return -1;
    *out = (int)v;
    return 0;
}

/* Seconds 0..86400 as a person writes them: digits and a point (strtod would take hex: 0x10 = 16 s). */
static int parse_seconds(const char *s, double *out)
{
    char *end;
    if (!*s || strspn(s, "0123456789.") != strlen(s))
        return -1;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || !(v >= 0 && v <= 86400))
        return -1;
    *out = v;
    return 0;
}

/* The multi-node flags must agree with each other; each error names the flags at odds. */
static void check_nodes(struct job *job)
{
    const char *env_token = getenv("DDP_JOB_TOKEN");
    if (job->node_rank >= job->nnodes)
        usage_error("--node-rank %d is not below --nnodes %d (nodes are numbered 0..%d)", job->node_rank,
                    job->nnodes, job->nnodes - 1);
    if ((long)job->nnodes * job->nranks > MAX_RANKS)
        usage_error("--nnodes %d x --nproc-per-node %d = %ld ranks, more than %d", job->nnodes, job->nranks,
                    (long)job->nnodes * job->nranks, MAX_RANKS);
    if (!job->user_token && job->nnodes > 1 && env_token && *env_token)
        job->user_token = env_token;
    if (job->user_token) {
        size_t n = strlen(job->user_token);
        if (n < 16 || n > 127 || strpbrk(job->user_token, " \t\n"))
            usage_error("the job token (--job-token or $DDP_JOB_TOKEN) must be 16..127 characters without "
                        "spaces; this one has %zu", n);
    }
    if (job->nnodes > 1) {
        if (!job->master_addr)
            usage_error("--nnodes %d needs --master-addr: node 0's address, the same on every node", job->nnodes);
        if (!job->user_port)
            usage_error("--nnodes %d needs --master-port: the same port on every node (rank 0's store)", job->nnodes);
        if (!job->user_token)
            usage_error("--nnodes %d needs a job token, the same on every node: --job-token T or $DDP_JOB_TOKEN "
                        "(e.g. `export DDP_JOB_TOKEN=$(openssl rand -hex 16)` before starting ddprun on each "
                        "node); each node's ddprun cannot make up one the others know", job->nnodes);
        if (job->max_restarts > 0)
            usage_error("--max-restarts with --nnodes %d: each node's ddprun would restart its own ranks "
                        "alone; use --max-restarts 0 (restart the whole job from outside)", job->nnodes);
    }
    job->base = job->node_rank * job->nranks;
}

static void parse_args(int argc, char **argv, struct job *job)
{
    int i = 1, delay_given = 0, delay_max_given = 0;
    while (i < argc) {
        const char *arg = argv[i], *value = NULL;
        if (strcmp(arg, "--") == 0) { i++; break; }
        if (arg[0] != '-' || arg[1] == '\0')
            break; /* PROGRAM: options end here */
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            fputs(usage_text, stdout);
            exit(0);
        }
        size_t name_len = strlen(arg);
        const char *eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
        if (eq) { name_len = (size_t)(eq - arg); value = eq + 1; }
#define IS(name) (name_len == strlen(name) && strncmp(arg, name, name_len) == 0)
        int is_nproc = IS("-n") || IS("--nproc") || IS("--nproc-per-node");
        int is_port = IS("--master-port"), is_grace = IS("--grace"), is_restarts = IS("--max-restarts");
        int is_delay = IS("--restart-delay"), is_delay_max = IS("--restart-delay-max");
        int is_nnodes = IS("--nnodes"), is_node_rank = IS("--node-rank") || IS("--node_rank");
        int is_addr = IS("--master-addr") || IS("--master_addr"), is_token = IS("--job-token"), is_id = IS("--job-id");
#undef IS
        if (!is_nproc && !is_port && !is_grace && !is_restarts && !is_nnodes && !is_node_rank && !is_addr &&
            !is_token && !is_id && !is_delay && !is_delay_max)
            usage_error("unknown option '%s'", arg);
        if (!value) {
            if (i + 1 >= argc)
                usage_error("option '%.*s' needs a value", (int)name_len, arg);
            value = argv[++i];
        }
        if (is_nproc && parse_int(value, 1, MAX_RANKS, &job->nranks) < 0)
            usage_error("number of ranks must be an integer 1..%d, not '%s'", MAX_RANKS, value);
        if (is_port && parse_int(value, 1, 65535, &job->port) < 0)
            usage_error("port must be an integer 1..65535, not '%s'", value);
        if (is_port)
            job->user_port = job->port;
        if (is_nnodes && parse_int(value, 1, MAX_RANKS, &job->nnodes) < 0)
            usage_error("--nnodes must be an integer 1..%d, not '%s'", MAX_RANKS, value);
        if (is_node_rank && parse_int(value, 0, MAX_RANKS - 1, &job->node_rank) < 0)
            usage_error("--node-rank must be an integer 0..%d, not '%s'", MAX_RANKS - 1, value);
        if (is_addr && (!*value || strlen(value) > 255 || strpbrk(value, " \t\n")))
            usage_error("--master-addr must be a host name or address, not '%s'", value);
        if (is_addr)
            job->master_addr = value;
        if (is_token)
            job->user_token = value;
        if (is_id && (!*value || strlen(value) > 255)) /* ddp.h's DDP_JOB_ID limit */
            usage_error("--job-id must be 1..255 characters, not '%s'", value);
        if (is_id)
            job->job_id = value;
        if (is_restarts && parse_int(value, 0, 1000000, &job->max_restarts) < 0)
            usage_error("--max-restarts must be an integer 0..1000000, not '%s'", value);
        if (is_grace && parse_seconds(value, &job->grace) < 0)
            usage_error("grace must be 0..86400 seconds (plain decimal), not '%s'", value);
        if (is_delay || is_delay_max) {
            if (parse_seconds(value, is_delay ? &job->restart_delay : &job->restart_delay_max) < 0)
                usage_error("%s must be 0..86400 seconds (plain decimal), not '%s'",
                            is_delay ? "--restart-delay" : "--restart-delay-max", value);
            if (is_delay) delay_given = 1; else delay_max_given = 1;
        }
        i++;
    }
    /* Only two explicit values can be at odds: a default gives way to the value given. */
    if (job->restart_delay > job->restart_delay_max) {
        if (delay_given && delay_max_given)
            usage_error("--restart-delay %g is above --restart-delay-max %g", job->restart_delay, job->restart_delay_max);
        if (delay_max_given)
            job->restart_delay = job->restart_delay_max;
        else
            job->restart_delay_max = job->restart_delay;
    }
    if (i >= argc)
        usage_error("missing PROGRAM");
    job->argv = argv + i;
    check_nodes(job);
}

/* Two pipes per rank can exceed the usual soft limit of 1024 fds. */
static void raise_fd_limit(void)
{
    struct rlimit raised;
    if (getrlimit(RLIMIT_NOFILE, &original_nofile) < 0)
        return;
    raised = original_nofile;
    raised.rlim_cur = raised.rlim_max;
    setrlimit(RLIMIT_NOFILE, &raised);
}

/* Children's pipes must never land on fds 0-2, or dup2 would clobber them. */
static void ensure_std_fds_open(void)
{
    for (int fd = 0; fd <= 2; fd++)
        if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) < 0)
            die("open /dev/null");
}

static void make_job_token(char token[33])
{
    unsigned char bytes[16];
    size_t got = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        die("open /dev/urandom");
    while (got < sizeof bytes) {
        ssize_t n = read(fd, bytes + got, sizeof bytes - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            die("read /dev/urandom");
        got += (size_t)n;
    }
    close(fd);
    for (size_t i = 0; i < sizeof bytes; i++)
        snprintf(token + 2 * i, 3, "%02x", bytes[i]);
}

/* Let the kernel pick a port that is free right now (another process could
 * still take it before rank 0 binds it; torchrun has the same window). */
static int pick_free_port(void)
{
    struct sockaddr_in addr;
    socklen_t len = sizeof addr;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        die("socket");
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0 ||
        getsockname(fd, (struct sockaddr *)&addr, &len) < 0)
        die("finding a free port");
    close(fd);
    return ntohs(addr.sin_port);
}

/* The guard: a ddprun that dies of a signal it cannot catch (SIGKILL: an OOM kill, `kill -9`, a
 * scheduler's hard stop) cleans nothing up. Its ranks die with it (PR_SET_PDEATHSIG), but what they
 * started in their groups would run on. So ddprun starts a small process first, "ddpguard", that
 * learns each rank's group id through a pipe as the rank starts (and 0: "the groups are gone", just
 * before they are reaped). When the pipe closes, ddprun has exited; the groups still listed then
 * are SIGKILLed. After a normal end none is listed. The ranks' zombies hold their ids until that
 * clear, so a listed id was never reused. The guard is not ddprun's child (it is forked twice,
 * before ddprun becomes a subreaper) and has a session of its own: `pgrep -P` finds the ranks
 * alone, and neither Ctrl-C nor a kill of ddprun's process group reaches it. Linux only (it relies
 * on the ranks' PR_SET_PDEATHSIG). */
static int guard_fd = -1; /* the pipe's write end, ddprun's alone (close-on-exec) */

#ifdef __linux__
static void guard_main(int rfd, int argc, char **argv)
{
    static pid_t groups[MAX_RANKS];
    int n = 0, fd = open("/dev/null", O_RDWR);
    sigset_t none;
    int32_t rec;
    /* `pgrep -f ddprun` and `pkill ddprun` must not take it for ddprun: its name and command line */
    prctl(PR_SET_NAME, "ddpguard");
    if (argc > 0) { /* the strings as the kernel laid them out, one after another; else each alone */
        int in_a_row = 1;
        size_t room;
        for (int i = 0; i + 1 < argc; i++)
            in_a_row &= argv[i + 1] == argv[i] + strlen(argv[i]) + 1;
        room = in_a_row ? (size_t)(argv[argc - 1] + strlen(argv[argc - 1]) - argv[0]) : strlen(argv[0]);
        for (int i = in_a_row ? 0 : 1; i < argc; i++)
            memset(argv[i], 0, strlen(argv[i]));
        memset(argv[0], 0, room);
        memcpy(argv[0], "ddpguard", room < 8 ? room : 8);
    }
    setsid();
    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP && sig != SIGCHLD)
            signal(sig, SIG_IGN); /* stopping the job is ddprun's */
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int i = 0; fd >= 0 && i < 3; i++) /* a reader of ddprun's output sees its end when ddprun ends */
        dup2(fd, i);
    for (int i = 3; i < 1024; i++)
        if (i != rfd)
            close(i);
    for (;;) {
        ssize_t got = read(rfd, &rec, sizeof rec);
        if (got < 0 && errno == EINTR)
            continue;
        if (got != (ssize_t)sizeof rec)
            break; /* ddprun exited */
        if (rec == 0)
            n = 0;
        else if (n < MAX_RANKS)
            groups[n++] = (pid_t)rec;
    }
    for (int pass = 0; pass < 2 && n > 0; pass++) { /* twice: a rank may have forked as it died */
        for (int i = 0; i < n; i++)
            kill(-groups[i], SIGKILL);
        poll(NULL, 0, 50);
    }
    _exit(0);
}
#endif

/* In main, before any thread or rank. Without a guard (pipe or fork failed) ddprun runs as before. */
static void start_guard(int argc, char **argv)
{
#ifdef __linux__
    int p[2], status;
    pid_t mid;
    if (pipe2(p, O_CLOEXEC) < 0)
        return;
    if ((mid = fork()) == 0) {
        pid_t g = fork();
        if (g != 0)
            _exit(g < 0);
        close(p[1]);
        guard_main(p[0], argc, argv);
    }
    close(p[0]);
    while (mid > 0 && waitpid(mid, &status, 0) < 0 && errno == EINTR)
        ;
    if (mid < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        close(p[1]);
        return;
    }
    fcntl(p[1], F_SETFL, O_NONBLOCK); /* never blocks ddprun: 1024 ids fill 4 KB of a 64 KB pipe */
    guard_fd = p[1];
#else
    (void)argc;
    (void)argv;
#endif
}

/* A rank's group id, or 0: the groups listed are gone */
static void tell_guard(pid_t group)
{
    int32_t rec = (int32_t)group;
    ssize_t wrote = guard_fd >= 0 ? write(guard_fd, &rec, sizeof rec) : 0;
    (void)wrote; /* a guard that is gone: ddprun goes on without it */
}

static int hup_ignored; /* ddprun started with SIGHUP ignored (nohup) */

static void on_stop_signal(int sig)
{
    if (!first_signal)
        first_signal = sig;
    signals_received++;
}

/* What a stop signal to ddprun did, in its messages. */
static const char *stopped_by(int sig)
{
    return sig == SIGINT ? "interrupted" : sig == SIGHUP ? "hung up" : sig == SIGQUIT ? "quit" : "terminated";
}

static void on_job_control(int sig)
{
    if (sig == SIGTSTP)
        tstp_pending = 1;
    else
        cont_pending = 1;
}

/* SIGUSR1/SIGUSR2: for the ranks (a scheduler's "checkpoint now, preemption is near", Slurm's
 * --signal=USR1@T, say), not for ddprun. Left to their default they killed ddprun alone and left
 * the ranks' children running; now they are passed on, as mpirun and srun do, and ddprun goes on
 * supervising. A rank that does not handle the signal dies of it, as it would if signalled itself. */
static void on_pass_signal(int sig)
{
    if (sig == SIGUSR1)
        usr1_pending = 1;
    else
        usr2_pending = 1;
}

static void install_signal_handlers(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    hup_ignored = sigaction(SIGHUP, NULL, &sa) == 0 && sa.sa_handler == SIG_IGN;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal; /* no SA_RESTART: poll returns early */
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT);
    sigaddset(&sa.sa_mask, SIGTERM);
    sigaddset(&sa.sa_mask, SIGHUP);
    sigaddset(&sa.sa_mask, SIGQUIT);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    /* Ctrl-\ reaches ddprun alone (the ranks are in groups of their own): left to its default,
     * ddprun would die and leave the ranks' children running. Passed on, as Ctrl-C is. */
    sigaction(SIGQUIT, &sa, NULL);
    /* A closed terminal or ssh session: the ranks (own groups) get no SIGHUP of their own, so
     * ddprun must stop them and its setsid strays, as for SIGTERM. */
    if (!hup_ignored) /* under nohup, hang-ups stay ignored */
        sigaction(SIGHUP, &sa, NULL);
    /* Ctrl-Z must stop the job as a whole: a rank running on while ddprun is stopped fills its
     * output pipe and blocks, or waits for a stopped peer and times out. */
    sa.sa_handler = on_job_control;
    sigaction(SIGTSTP, &sa, NULL);
    sigaction(SIGCONT, &sa, NULL);
    sa.sa_handler = on_pass_signal;
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGUSR2, &sa, NULL);
    signal(SIGPIPE, SIG_IGN); /* a closed stdout must not kill the supervisor */
}

static void set_env_int(const char *name, int value)
{
    char text[16];
    snprintf(text, sizeof text, "%d", value);
    setenv(name, text, 1);
}

/* Thread pools sized for the whole machine, one per rank, would put N threads on
 * every core: N ranks share the CPUs, so each pool gets its share. (OpenBLAS's
 * pthread build also starts its idle workers at load time, before the program
 * can ask for one thread; only the environment stops that.) A user's choice wins. */
static void set_thread_share(const struct job *job)
{
    int cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
    char text[16];
    if (job->nranks < 2)
        return;
#ifdef __linux__
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
        cpus = CPU_COUNT(&allowed);
#endif
    snprintf(text, sizeof text, "%d", cpus > job->nranks ? cpus / job->nranks : 1);
    setenv("OMP_NUM_THREADS", text, 0);
    setenv("OPENBLAS_NUM_THREADS", text, 0);
}

/* Runs in the forked child; never returns. */
static void exec_rank(const struct job *job, int index, int out_fd, int err_fd, pid_t parent)
{
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    if (!hup_ignored)
        signal(SIGHUP, SIG_DFL);
    signal(SIGQUIT, SIG_DFL);
    signal(SIGTSTP, SIG_DFL);
    signal(SIGCONT, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    sigprocmask(SIG_SETMASK, &original_sigmask, NULL);
    setrlimit(RLIMIT_NOFILE, &original_nofile);
    setpgid(0, 0);
#ifdef __linux__
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* ddprun SIGKILLed: take the rank along */
    if (getppid() != parent)          /* ddprun died before prctl took effect */
        _exit(1);
#else
    (void)parent;
#endif
    /* The pipes are O_CLOEXEC, so only these dup2'd copies survive exec. */
    if (dup2(out_fd, STDOUT_FILENO) < 0 || dup2(err_fd, STDERR_FILENO) < 0)
        _exit(127);
    if (isatty(STDIN_FILENO)) { /* see the top */
        int null_fd = open("/dev/null", O_RDONLY);
        if (null_fd > STDIN_FILENO) {
            dup2(null_fd, STDIN_FILENO);
            close(null_fd);
        }
    }
    set_env_int("RANK", job->base + index);
    set_env_int("WORLD_SIZE", job->nnodes * job->nranks);
    set_env_int("LOCAL_RANK", index);
    set_env_int("LOCAL_WORLD_SIZE", job->nranks);
    set_env_int("MASTER_PORT", job->port);
    setenv("MASTER_ADDR", job->master_addr ? job->master_addr : "127.0.0.1", 1);
    setenv("DDP_JOB_TOKEN", job->token, 1);
    if (job->job_id)
        setenv("DDP_JOB_ID", job->job_id, 1);
    set_thread_share(job);
    execvp(job->argv[0], job->argv);
    fprintf(stderr, "ddprun: cannot run '%s': %s\n", job->argv[0], strerror(errno));
    _exit(127);
}

static int spawn_rank(const struct job *job, struct rank *r)
{
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) < 0)
        return -1;
    if (pipe2(err, O_CLOEXEC) < 0) {
        close(out[0]); close(out[1]);
        return -1;
    }
    pid_t parent = getpid(), pid = fork();
    if (pid == 0)
        exec_rank(job, r->index, out[1], err[1], parent);
    close(out[1]);
    close(err[1]);
    if (pid < 0) {
        close(out[0]); close(err[0]);
        return -1;
    }
    setpgid(pid, pid); /* also here, so the group exists before we signal it */
    tell_guard(pid);
    r->pid = pid;
    r->running = 1;
    r->out = (struct stream){ out[0], STDOUT_FILENO, job->base + r->index, NULL, 0 };
    r->err = (struct stream){ err[0], STDERR_FILENO, job->base + r->index, NULL, 0 };
    return 0;
}

/* ddp.h's timeout errors name the ranks a survivor waited for: "... waiting for rank(s) 1, 2" (a
 * collective), "rank(s) 1 never arrived at the rendezvous" (ddp_init), "rank 1 did not reach
 * ddp_commit". The first one named is kept, to name a stalled rank that is not stopped (busy,
 * blocked, deadlocked) or one that left early. */
static int digits_at(const char *at, const char *end, int *value)
{
    int n = 0, v = 0;
    for (; at < end && *at >= '0' && *at <= '9' && n < 7; at++, n++)
        v = v * 10 + (*at - '0');
    *value = v;
    return n;
}

static void note_waited_for(struct job *job, int rank, const char *line, size_t len)
{
    int index = rank - job->base;   /* this node's ranks only; a peer elsewhere is not ours to name */
    static const char wait_key[] = "waiting for rank(s) ", never_key[] = " never arrived at the rendezvous",
                      list_key[] = "rank(s) ", commit_key[] = " did not reach ddp_commit";
    const char *end = line + len, *at;
    int peer = 0, digits = 0;
    if (job->ranks[index].waited_for >= 0)
        return;
    if ((at = memmem(line, len, wait_key, sizeof wait_key - 1)) != NULL)
        digits = digits_at(at + sizeof wait_key - 1, end, &peer);
    else if (memmem(line, len, never_key, sizeof never_key - 1) && (at = memmem(line, len, list_key, sizeof list_key - 1)))
        digits = digits_at(at + sizeof list_key - 1, end, &peer);
    else if ((at = memmem(line, len, commit_key, sizeof commit_key - 1)) != NULL) {
        const char *first = at;
        while (first > line && first[-1] >= '0' && first[-1] <= '9')
            first--;
        if (first - line >= 5 && !memcmp(first - 5, "rank ", 5))
            digits = digits_at(first, at, &peer);
    }
    peer -= job->base;
    if (digits > 0 && peer >= 0 && peer < job->nranks && peer != index)
        job->ranks[index].waited_for = peer;
}

/* ddp.h's words for a peer gone in the middle of a collective: "rank 1 (pid 42) died; ...", "rank 1
 * called ddp_shutdown while this rank is in ...", "rank 1 disconnected from the rendezvous store".
 * The first one named is kept: if that rank exited 0, it left early. */
static void note_lost_peer(struct job *job, int rank, const char *line, size_t len)
{
    static const char *const after[] = { " called ddp_shutdown while", " disconnected from the rendezvous store", " (pid " };
    const char *end = line + len, *at = line;
    int index = rank - job->base, peer;
    if (job->ranks[index].lost_peer >= 0)
        return;
    while ((at = memmem(at, (size_t)(end - at), "rank ", 5)) != NULL) {
        int digits = digits_at(at += 5, end, &peer);
        const char *rest = at + digits, *paren;
        for (size_t k = 0; digits > 0 && k < sizeof after / sizeof after[0]; k++) {
            size_t n = strlen(after[k]);
            if ((size_t)(end - rest) < n || memcmp(rest, after[k], n))
                continue;
            /* "(pid N)" must be followed by " died" */
            if (k == 2 && (!(paren = memchr(rest, ')', (size_t)(end - rest))) || end - paren < 6 || memcmp(paren + 1, " died", 5)))
                continue;
            peer -= job->base;
            if (peer >= 0 && peer < job->nranks && peer != index)
                job->ranks[index].lost_peer = peer;
            return;
        }
    }
}

/* Length of "rank R: " (or of "rank R", in "ddp rank R level: ", ddp.h's default logger) at the
   start of a line when R is the rank that wrote it: ddp.h's messages (ddp_last_error) start
   with their rank, which the "[rank R] " prefix already says. 0 otherwise. */
static size_t own_rank_words(const char *line, size_t len, int rank, int colon)
{
    char word[32];
    int n = snprintf(word, sizeof word, colon ? "rank %d: " : "rank %d ", rank);
    return n > 0 && (size_t)n <= len && !memcmp(line, word, (size_t)n) ? (size_t)n : 0;
}

/* Each line is queued whole, so lines of different ranks never mix. The rank's own "rank R: "
   at the start of a line is dropped ("[rank 0] rank 0: ..." said it twice). */
static void emit_line(struct job *job, const struct stream *s, const char *line, size_t len)
{
    static char out[LINE_CAP + 64];
    int n = snprintf(out, 64, "[rank %*d] ", job->prefix_width, s->rank);
    const char *whole = line;
    size_t whole_len = len, skip = own_rank_words(line, len, s->rank, 1);
    if (skip) {
        line += skip;
        len -= skip;
    } else if (len > 4 && !memcmp(line, "ddp ", 4) && (skip = own_rank_words(line + 4, len - 4, s->rank, 0)) != 0) {
        memcpy(out + n, "ddp ", 4);   /* "ddp rank R warning: ..." -> "ddp warning: ..." */
        n += 4;
        line += 4 + skip;
        len -= 4 + skip;
    }
    memcpy(out + n, line, len);
    out[(size_t)n + len] = '\n';
    if (s->dest == STDERR_FILENO) {
        note_waited_for(job, s->rank, whole, whole_len);
        note_lost_peer(job, s->rank, whole, whole_len);
    }
    emit(s->dest, out, (size_t)n + len + 1);
}

static void close_stream(struct job *job, struct stream *s)
{
    if (s->len > 0) /* last line without newline */
        emit_line(job, s, s->buf, s->len);
    free(s->buf);
    close(s->fd);
    s->fd = -1;
    s->buf = NULL;
    s->len = 0;
}

static void read_stream(struct job *job, struct stream *s)
{
    if (!s->buf && !(s->buf = malloc(LINE_CAP)))
        die("malloc");
    ssize_t n = read(s->fd, s->buf + s->len, LINE_CAP - s->len);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n <= 0) {
        close_stream(job, s);
        return;
    }
    s->len += (size_t)n;
    size_t start = 0;
    char *nl;
    while ((nl = memchr(s->buf + start, '\n', s->len - start)) != NULL) {
        size_t end = (size_t)(nl - s->buf);
        emit_line(job, s, s->buf + start, end - start);
        start = end + 1;
    }
    if (start == 0 && s->len == LINE_CAP) { /* no newline in 64 KiB: flush a piece */
        emit_line(job, s, s->buf, s->len);
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
}

/* Poll every open pipe once and read what is there; returns the number of
 * pipes that were ready (0 on timeout). */
static int drain_output(struct job *job, struct pollfd *fds, struct stream **owners, int timeout_ms)
{
    int count = 0;
    for (int i = 0; i < job->nranks; i++) {
        struct stream *pair[2] = { &job->ranks[i].out, &job->ranks[i].err };
        for (int k = 0; k < 2; k++)
            if (pair[k]->fd >= 0) {
                fds[count] = (struct pollfd){ .fd = pair[k]->fd, .events = POLLIN };
                owners[count++] = pair[k];
            }
    }
    int ready = poll(fds, (nfds_t)count, timeout_ms);
    for (int i = 0; i < count && ready > 0; i++)
        if (fds[i].revents)
            read_stream(job, owners[i]);
    return ready;
}

static int open_streams(const struct job *job)
{
    int count = 0;
    for (int i = 0; i < job->nranks; i++)
        count += (job->ranks[i].out.fd >= 0) + (job->ranks[i].err.fd >= 0);
    return count;
}

static int running_ranks(const struct job *job)
{
    int count = 0;
    for (int i = 0; i < job->nranks; i++)
        count += job->ranks[i].running;
    return count;
}

/* Every rank's group, exited ranks too: their children may still run. */
static void signal_groups(struct job *job, int sig)
{
    for (int i = 0; i < job->nranks; i++)
        if (job->ranks[i].pid > 0 && kill(-job->ranks[i].pid, sig) < 0 && job->ranks[i].running)
            kill(job->ranks[i].pid, sig); /* group not set up yet */
}

static void begin_stop(struct job *job, int sig, const char *message)
{
    if (running_ranks(job) > 0)
        say("%s", message);
    job->stopping = 1;
    job->kill_at = now_seconds() + job->grace;
    signal_groups(job, sig);
    signal_groups(job, SIGCONT); /* a stopped rank acts on the signal only once it runs */
}

static void kill_now(struct job *job)
{
    if (!job->killed && running_ranks(job) > 0)
        say("killing the remaining ranks");
    job->stopping = job->killed = 1;
    signal_groups(job, SIGKILL);
}

/* The first failure is the cause and gets the full story; ranks that die
 * because we stopped them get a short note. */
static void print_stopped(const struct rank *r)
{
    if (r->sig)
        say("rank %d stopped by signal %d (%s)", r->rank, r->sig, strsignal(r->sig));
    else
        say("rank %d stopped with status %d", r->rank, r->code);
}

static void report_exit(struct job *job, struct rank *r, int code, int sig)
{
    r->running = 0;
    r->code = code;
    r->sig = sig;
    if (!sig && code == 0)
        return;
    if (job->exit_status >= 0) { /* the cause is known: later ones get a short note */
        print_stopped(r);
        return;
    }
    r->failed_seq = ++job->failures_seen;
    if (job->settle_until == 0)
        job->settle_until = now_seconds() + SETTLE_SECONDS;
}

/* The signal that stopped a rank still running, or 0 if it is not stopped. WNOWAIT leaves the
 * state to be seen again; a stop ends with SIGCONT, and then this says 0. */
static int stop_signal(const struct rank *r)
{
    siginfo_t info;
    memset(&info, 0, sizeof info);
    if (!r->running || waitid(P_PID, (id_t)r->pid, &info, WSTOPPED | WNOHANG | WNOWAIT) < 0 || info.si_pid == 0 ||
        info.si_code != CLD_STOPPED)
        return 0;
    return info.si_status;
}

/* When every failure so far is an error exit, the ranks that exited may be the ones that gave up
 * waiting (ddp.h's timeout) for a rank that stalled: that rank is the cause. It is found by what
 * the kernel says first (a rank still running but stopped: SIGSTOP, SIGTSTP, SIGTTIN...), which
 * needs nothing from the program; else by the survivors' own words, ddp.h's "waiting for
 * rank(s) N" on the stderr of the first that failed, if that rank N is still running (busy,
 * blocked or deadlocked; ptrace-stopped ranks are found this way too). */
static struct rank *find_stalled(struct job *job, const struct rank *first, int *stop_sig)
{
    *stop_sig = 0;
    for (int i = 0; i < job->nranks; i++)
        if ((*stop_sig = stop_signal(&job->ranks[i])) != 0)
            return &job->ranks[i];
    if (first->waited_for >= 0 && job->ranks[first->waited_for].running)
        return &job->ranks[first->waited_for];
    return NULL;
}

/* The rank the failed one waited for (or saw go: died, called ddp_shutdown), when it had already
 * exited with status 0: it left early (before the rendezvous, or before a collective its peers
 * made), which is the cause. */
static struct rank *find_left_early(struct job *job, const struct rank *first)
{
    int peer = first->waited_for >= 0 ? first->waited_for : first->lost_peer;
    struct rank *w = peer >= 0 ? &job->ranks[peer] : NULL;
    return w && !w->running && !w->failed_seq && w->code == 0 && w->sig == 0 ? w : NULL;
}

/* The settle time is over (or nobody is left): the first rank killed by a signal is the cause,
 * else a stalled rank the failed ones waited for, else one they waited for that had exited 0
 * (it left early), else the first that failed; it gets the full
 * story, the others a short note. */
static void name_the_cause(struct job *job)
{
    struct rank *cause = NULL, *first = NULL, *stalled = NULL, *left = NULL;
    int stop_sig = 0;
    for (int pass = 0; pass < 2 && !cause; pass++)
        for (int seq = 1; seq <= job->failures_seen && !cause; seq++)
            for (int i = 0; i < job->nranks; i++)
                if (job->ranks[i].failed_seq == seq && (pass == 1 || job->ranks[i].sig))
                    cause = &job->ranks[i];
    if (!cause->sig) {
        first = cause;
        stalled = find_stalled(job, first, &stop_sig);
        if (!stalled)
            left = find_left_early(job, first);
    }
    if (stalled && stop_sig)
        snprintf(job->cause, sizeof job->cause, "rank %d (pid %ld) is stopped by signal %d (%s)", stalled->rank,
                 (long)stalled->pid, stop_sig, strsignal(stop_sig));
    else if (stalled)
        snprintf(job->cause, sizeof job->cause, "rank %d (pid %ld) stalled", stalled->rank, (long)stalled->pid);
    else if (left)
        snprintf(job->cause, sizeof job->cause, "rank %d (pid %ld) exited with status 0 before its peers were done",
                 left->rank, (long)left->pid);
    else if (cause->sig)
        snprintf(job->cause, sizeof job->cause, "rank %d (pid %ld) was killed by signal %d (%s)", cause->rank,
                 (long)cause->pid, cause->sig, strsignal(cause->sig));
    else
        snprintf(job->cause, sizeof job->cause, "rank %d (pid %ld) exited with status %d", cause->rank,
                 (long)cause->pid, cause->code);
    if (stalled)
        say("%s: rank %d exited with status %d after waiting for it%s", job->cause, first->rank, first->code,
            stop_sig ? " (what stopped it: a debugger? a kill -STOP?)"
                     : ", and it is still running, not stopped: busy, blocked or deadlocked?");
    else if (left)
        say("%s: rank %d exited with status %d after waiting for it (a rank must not return before the "
            "others: same steps, same collectives, then ddp_shutdown)", job->cause, first->rank, first->code);
    else
        say("%s", job->cause);
    job->exit_status = cause->sig ? 128 + cause->sig : cause->code;
    for (int i = 0; i < job->nranks; i++)
        if (job->ranks[i].failed_seq && &job->ranks[i] != cause)
            print_stopped(&job->ranks[i]);
    if (!job->stopping && running_ranks(job) > 0)
        begin_stop(job, SIGTERM, "stopping the other ranks");
}

/* Notice exited ranks without reaping them (WNOWAIT; see the top). Ranks
 * killed by a signal are reported before ranks that exited in the same
 * round: when one rank dies, its peers notice and exit with an error almost
 * at once, and the death is the cause worth naming. */
static void check_ranks(struct job *job)
{
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < job->nranks; i++) {
            siginfo_t info;
            memset(&info, 0, sizeof info); /* si_pid stays 0 if nothing happened */
            if (!job->ranks[i].running ||
                waitid(P_PID, (id_t)job->ranks[i].pid, &info, WEXITED | WNOHANG | WNOWAIT) < 0 ||
                info.si_pid == 0)
                continue;
            int killed = info.si_code != CLD_EXITED;
            if (pass == 0 && killed)
                report_exit(job, &job->ranks[i], 0, info.si_status);
            else if (pass == 1 && !killed)
                report_exit(job, &job->ranks[i], info.si_status, 0);
        }
}

/* Strays: processes a rank started that left its process group (setsid, setpgid) and whose
 * parent has exited. ddprun is their child subreaper (PR_SET_CHILD_SUBREAPER, in main), so they
 * become its children instead of init's. Scans /proc for children of ddprun that are not ranks;
 * with `kill_them` each gets SIGKILL; zombies among them are reaped (the ranks' own zombies are
 * kept: they hold the group ids). Returns how many were found alive. */
static int strays(const struct job *job, int kill_them)
{
#ifdef __linux__
    DIR *proc = opendir("/proc");
    struct dirent *e;
    pid_t self = getpid();
    int found = 0;
    if (!proc)
        return 0;
    while ((e = readdir(proc)) != NULL) {
        char path[64], buf[512], state, *close_paren;
        pid_t pid = (pid_t)atoi(e->d_name), ppid;
        int is_rank = 0;
        FILE *f;
        size_t n;
        if (pid <= 0)
            continue;
        for (int i = 0; i < job->nranks && !is_rank; i++)
            is_rank = job->ranks[i].pid == pid;
        if (is_rank)
            continue;
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
        if (!(f = fopen(path, "r")))
            continue;
        n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = '\0';
        /* "pid (comm) state ppid ...": comm may hold spaces and parentheses */
        if (!(close_paren = strrchr(buf, ')')) || sscanf(close_paren + 1, " %c %d", &state, &ppid) != 2 || ppid != self)
            continue;
        if (state != 'Z') {
            found++;
            if (kill_them)
                kill(pid, SIGKILL);
        }
        waitpid(pid, NULL, WNOHANG);
    }
    closedir(proc);
    return found;
#else
    (void)job;
    (void)kill_them;
    return 0;
#endif
}

/* ddprun must not leave anything behind: kill the rest of every group,
 * then reap the zombie leaders, then kill and reap the strays (whose own
 * children come to ddprun in turn, so until none is left; 2 s at most). */
static void finish_job(struct job *job)
{
    signal_groups(job, SIGKILL);
    tell_guard(0); /* before the reaping frees the ids */
    for (int i = 0; i < job->nranks; i++)
        while (job->ranks[i].pid > 0 && waitpid(job->ranks[i].pid, NULL, 0) < 0 && errno == EINTR)
            ;
    for (int tries = 0; tries < 200 && strays(job, 1) > 0; tries++)
        poll(NULL, 0, 10);
    strays(job, 0); /* the last ones killed: reaped */
}

/* Ctrl-Z: stop every rank's group, then ddprun itself; on SIGCONT (fg, bg, kill -CONT), continue
 * them all. If ddprun's process group is orphaned, the kernel discards the SIGTSTP raised here
 * and ddprun continues the ranks at once: the job stops as a whole or not at all. */
static void handle_job_control(struct job *job)
{
    if (tstp_pending) {
        struct sigaction dfl, saved;
        sigset_t tstp, old;
        tstp_pending = 0;
        signal_groups(job, SIGSTOP);
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        sigaction(SIGTSTP, &dfl, &saved);
        sigemptyset(&tstp);
        sigaddset(&tstp, SIGTSTP);
        pthread_sigmask(SIG_UNBLOCK, &tstp, &old);
        raise(SIGTSTP); /* stops here until SIGCONT */
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        sigaction(SIGTSTP, &saved, NULL);
        cont_pending = 1;
    }
    if (cont_pending) {
        cont_pending = 0;
        signal_groups(job, SIGCONT);
    }
    if (usr1_pending) {
        usr1_pending = 0;
        signal_groups(job, SIGUSR1);
    }
    if (usr2_pending) {
        usr2_pending = 0;
        signal_groups(job, SIGUSR2);
    }
}

static void handle_signals(struct job *job, int *signals_handled)
{
    handle_job_control(job);
    if (signals_received == *signals_handled)
        return;
    *signals_handled = signals_received;
    if (job->stopping) { /* second Ctrl-C, or impatience during the grace period */
        kill_now(job);
        return;
    }
    int sig = first_signal;
    job->interrupted = 1;
    if (job->exit_status < 0)
        job->exit_status = 128 + sig;
    char message[64];
    snprintf(message, sizeof message, "%s, stopping all ranks", stopped_by(sig));
    /* SIGHUP is passed on as SIGTERM: a rank may take SIGHUP as "reload", not "stop". */
    begin_stop(job, sig == SIGHUP ? SIGTERM : sig, message);
}

static int strays(const struct job *job, int kill_them);

/* Supervise until every rank has exited and its output is drained. */
static void supervise(struct job *job)
{
    struct pollfd *fds = calloc(2 * (size_t)job->nranks, sizeof *fds);
    struct stream **owners = calloc(2 * (size_t)job->nranks, sizeof *owners);
    static int signals_handled = 0; /* across attempts: a signal stops the job only once */
    double strays_reaped_at = now_seconds();
    if (!fds || !owners)
        die("calloc");
    while (running_ranks(job) > 0 || open_streams(job) > 0) {
        handle_signals(job, &signals_handled);
        if (now_seconds() > strays_reaped_at + 5) { /* strays that exited: no zombies pile up */
            strays(job, 0);
            strays_reaped_at = now_seconds();
        }
        int all_exited = running_ranks(job) == 0;
        int ready = open_streams(job) > 0 ? drain_output(job, fds, owners, POLL_MS)
                                          : poll(NULL, 0, POLL_MS);
        /* All ranks gone and their pipes quiet: whatever still holds a pipe
         * open is a stray descendant; don't wait for it. */
        if (all_exited && ready == 0)
            for (int i = 0; i < job->nranks; i++) {
                if (job->ranks[i].out.fd >= 0) close_stream(job, &job->ranks[i].out);
                if (job->ranks[i].err.fd >= 0) close_stream(job, &job->ranks[i].err);
            }
        check_ranks(job);
        /* Every rank gone: the cause is named once their pipes are drained too (a rank's last
         * words, ddp.h's "waiting for rank(s) N", may still be in its pipe when its exit is
         * seen), or at the settle time, whichever comes first. */
        if (job->exit_status < 0 && job->failures_seen &&
            (now_seconds() >= job->settle_until || (running_ranks(job) == 0 && open_streams(job) == 0)))
            name_the_cause(job);
        if (job->stopping && !job->killed && now_seconds() >= job->kill_at)
            kill_now(job);
    }
    free(fds);
    free(owners);
}

/* Could not start every rank: take down the ones that did start. */
static void abort_start(struct job *job, int started)
{
    int saved = errno;
    job->nranks = started;
    finish_job(job);
    errno = saved;
    die("starting ranks");
}

/* One attempt: a fresh token (and port, unless the user chose one), every rank started, supervised
 * to the end, and reaped. */
static void run_attempt(struct job *job)
{
    sigset_t held;
    job->stopping = job->killed = job->failures_seen = job->interrupted = 0;
    job->kill_at = job->settle_until = 0;
    job->exit_status = -1;
    job->cause[0] = '\0';
    memset(job->ranks, 0, (size_t)job->nranks * sizeof *job->ranks);
    if (job->user_token)
        snprintf(job->token, sizeof job->token, "%s", job->user_token);
    else
        make_job_token(job->token);
    /* A new port for each attempt: the last one's store may linger in TIME_WAIT. (A port the user
     * gave is used again: ddp.h's store binds with SO_REUSEADDR.) */
    job->port = job->user_port ? job->user_port : pick_free_port();
    /* Hold INT/TERM/TSTP/CONT while forking: a child must not run our handlers. */
    sigemptyset(&held);
    sigaddset(&held, SIGINT);
    sigaddset(&held, SIGTERM);
    sigaddset(&held, SIGHUP);
    sigaddset(&held, SIGQUIT);
    sigaddset(&held, SIGTSTP);
    sigaddset(&held, SIGCONT);
    pthread_sigmask(SIG_BLOCK, &held, NULL);
    for (int i = 0; i < job->nranks; i++) {
        job->ranks[i].index = i;
        job->ranks[i].rank = job->base + i;
        job->ranks[i].waited_for = -1;
        job->ranks[i].lost_peer = -1;
        if (spawn_rank(job, &job->ranks[i]) < 0)
            abort_start(job, i);
    }
    pthread_sigmask(SIG_SETMASK, &supervising_sigmask, NULL);
    started_job = job;
    supervise(job);
    finish_job(job);
    started_job = NULL;
}

/* The back-off before a restart: Ctrl-C or SIGTERM ends it (and ddprun) at once; Ctrl-Z stops
 * ddprun (no rank is running). 1: go on and restart; 0: stopped by a signal. */
static int restart_wait(struct job *job, double seconds)
{
    struct job idle = *job;
    double until = now_seconds() + seconds;
    idle.nranks = 0; /* the last attempt's ranks are reaped: their group ids may be reused */
    for (;;) {
        double left = until - now_seconds();
        if (signals_received) {
            job->interrupted = 1;
            job->exit_status = 128 + first_signal;
            say("%s while waiting to restart; not restarting", stopped_by(first_signal));
            return 0;
        }
        handle_job_control(&idle);
        if (left <= 0)
            return 1;
        poll(NULL, 0, left < 0.05 ? (int)(left * 1000) + 1 : 50); /* a signal cuts it short */
    }
}

int main(int argc, char **argv)
{
    struct job job;
    memset(&job, 0, sizeof job);
    job.nranks = 1;
    job.nnodes = 1;
    job.grace = 5.0;
    job.restart_delay = 1.0;
    job.restart_delay_max = 60.0;
    job.exit_status = -1;
    parse_args(argc, argv, &job);
    ensure_std_fds_open();
    raise_fd_limit();
    job.prefix_width = snprintf(NULL, 0, "%d", job.nnodes * job.nranks - 1); /* columns line up */
    if (!(job.ranks = calloc((size_t)job.nranks, sizeof *job.ranks)))
        die("calloc");
    pthread_sigmask(SIG_SETMASK, NULL, &original_sigmask);
    /* A blocked mask survives exec too (a parent that blocked SIGTERM or SIGINT): ddprun's handlers
     * would never run, and Ctrl-C or a scheduler's SIGTERM would not stop the job. The ranks get the
     * original mask back (exec_rank). */
    supervising_sigmask = original_sigmask;
    {
        static const int handled[] = { SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP, SIGCONT, SIGUSR1, SIGUSR2, SIGCHLD };
        for (size_t k = 0; k < sizeof handled / sizeof handled[0]; k++)
            sigdelset(&supervising_sigmask, handled[k]);
    }
    pthread_sigmask(SIG_SETMASK, &supervising_sigmask, NULL);
    /* An ignored SIGCHLD survives exec (a parent's signal(SIGCHLD, SIG_IGN)): the kernel would reap
     * the ranks at once, ddprun would never see them exit, and would wait forever. */
    signal(SIGCHLD, SIG_DFL);
    start_guard(argc, argv); /* before the subreaper: the guard is not ddprun's child */
#ifdef __linux__
    /* A process a rank starts with setsid escapes the rank's group and its clean-up; orphaned,
     * it comes to ddprun instead of init, and finish_job kills it (strays). */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
#endif
    install_signal_handlers();
    start_output();

    double wait = job.restart_delay;
    for (int restarts = 0;; restarts++) {
        double began = now_seconds(), lasted;
        run_attempt(&job);
        lasted = now_seconds() - began;
        if (job.exit_status < 0 || job.interrupted || signals_received)
            break;
        if (job.exit_status == 127 && job.max_restarts > 0) { /* the shell's and exec_rank's "cannot run" */
            say("not restarting: exit status 127 means the program could not be run (not found, not executable, "
                "or a library missing); %s", job.cause);
            break;
        }
        if (restarts == job.max_restarts) {
            if (job.max_restarts > 0)
                say("giving up: the job failed %d times (--max-restarts %d); the last failure: %s",
                    restarts + 1, job.max_restarts, job.cause);
            break;
        }
        /* A job that fails at once must not be restarted many times a second: each quick failure
         * doubles the wait (up to the cap); a run that lasted as long as the cap was no crash loop. */
        if (lasted >= job.restart_delay_max)
            wait = job.restart_delay;
        say("restart %d of %d: %s; starting all %d rank(s) again in %.1f s", restarts + 1, job.max_restarts, job.cause,
            job.nranks, wait);
        if (!restart_wait(&job, wait))
            break;
        wait = wait * 2 < job.restart_delay_max ? wait * 2 : job.restart_delay_max;
    }
    free(job.ranks);
    finish_output();
    return job.exit_status < 0 ? 0 : job.exit_status;
}
#endif /* !_WIN32 */
