/*
 * ddprun on Windows (tools/ddprun.c includes this file when _WIN32 is defined): N local ranks
 * of a data-parallel program as Win32 processes, with the environment ddprun gives on POSIX
 * (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT, a fresh
 * DDP_JOB_TOKEN, DDP_JOB_ID if given, OMP_NUM_THREADS / OPENBLAS_NUM_THREADS = the rank's share of
 * the CPUs unless set), each rank's lines prefixed "[rank R] " (its own "rank R: " dropped, as on
 * POSIX), the same exit status: 0 if every rank exited 0, else the first failing rank's status (of
 * the last attempt); 130 after Ctrl-C; 2 for bad usage; 1 if the job could not start; and the same
 * restarts: --max-restarts N starts a failed job again (a new token unless --job-token, a new port
 * unless --master-port) up to N times, after --restart-delay seconds (1), doubled after each
 * attempt shorter than --restart-delay-max (60, the cap), reset after one that lasted that long.
 *
 * Stopping: Windows has no SIGTERM. When a rank fails the others normally end by themselves
 * within about 0.1 s (ddp.h poisons the group); what is still running after --grace seconds is
 * terminated. Ctrl-C reaches every rank itself (they share ddprun's console), and ddprun gives
 * them the same grace. Every rank is in one job object that is killed when ddprun ends, however
 * it ends, so no rank (nor what it started) outlives it.
 *
 * Not on Windows yet, each refused by name: --nnodes > 1 (several machines; it needs only the
 * flags' plumbing, ddp.h's store already works over Winsock, but nothing here could test it),
 * Ctrl-Z job control (Windows has none), more than 64 ranks (one WaitForMultipleObjects).
 */
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <winsock2.h>
#include <ws2tcpip.h>
#include <windows.h>
#include <bcrypt.h>
#include <process.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _MSC_VER
#pragma comment(lib, "ws2_32.lib")
#pragma comment(lib, "bcrypt.lib")
#endif

enum { W_MAX_RANKS = MAXIMUM_WAIT_OBJECTS, W_LINE_CAP = 64 * 1024 };

static const char w_usage[] =
    "usage: ddprun [-n N] [--master-port P] [--grace SECONDS] [--job-token T] [--job-id ID] [--max-restarts N]\n"
    "              [--restart-delay S] [--restart-delay-max S] [--] PROGRAM [ARGS...]\n"
    "  -n, --nproc, --nproc-per-node N  number of ranks, 1..64 on Windows (default 1)\n"
    "  --master-port P                  MASTER_PORT (default: a free port)\n"
    "  --job-token T                    DDP_JOB_TOKEN, 16..127 characters without spaces (default: a fresh random one)\n"
    "  --job-id ID                      DDP_JOB_ID, the job's name (default: $DDP_JOB_ID as it is, or none)\n"
    "  --grace SECONDS                  how long the other ranks may take to end after a failure or Ctrl-C\n"
    "                                   before they are terminated (default 5)\n"
    "  --max-restarts N                 when a rank fails, start the job again, up to N times (default 0);\n"
    "                                   the program resumes from its checkpoint\n"
    "  --restart-delay S                wait before a restart (default 1), doubled after a short attempt\n"
    "  --restart-delay-max S            the cap, and how long an attempt must last to reset it (default 60)\n"
    "  -h, --help                       show this help\n"
    "  (Windows: --nnodes > 1 is not supported yet)\n";

static CRITICAL_SECTION w_out_lock;   /* one rank's line at a time on our stdout/stderr */
static volatile LONG w_interrupted;

static void w_say(const char *fmt, ...) {
    va_list ap;
    EnterCriticalSection(&w_out_lock);
    fputs("ddprun: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    LeaveCriticalSection(&w_out_lock);
}

static void w_usage_error(const char *fmt, ...) {
    va_list ap;
    fputs("ddprun: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\n", stderr);
    fputs(w_usage, stderr);
    exit(2);
}

static int w_parse_int(const char *s, long lo, long hi, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

/* One pipe of one rank: its lines, prefixed, onto ours. */
typedef struct w_stream { HANDLE pipe; FILE *dest; int rank, width; } w_stream;

/* "[rank R] line", the rank's own "rank R: " dropped ("[rank 0] rank 0: ..." said it twice) and
   "ddp rank R warning: ..." written "ddp warning: ...", as ddprun does on POSIX. */
static void w_emit(const w_stream *s, const char *line, size_t len) {
    char own[32];
    int n = snprintf(own, sizeof own, "rank %d: ", s->rank);
    const char *ddp = "";
    if (n > 0 && (size_t)n <= len && !memcmp(line, own, (size_t)n)) { line += n; len -= (size_t)n; }
    else if (len > 4 && !memcmp(line, "ddp ", 4) && (n = snprintf(own, sizeof own, "rank %d ", s->rank)) > 0 &&
             (size_t)n + 4 <= len && !memcmp(line + 4, own, (size_t)n)) {
        ddp = "ddp ";
        line += 4 + n;
        len -= 4 + (size_t)n;
    }
    EnterCriticalSection(&w_out_lock);
    fprintf(s->dest, "[rank %*d] %s%.*s\n", s->width, s->rank, ddp, (int)len, line);
    fflush(s->dest);
    LeaveCriticalSection(&w_out_lock);
}
static unsigned __stdcall w_pump(void *arg) {
    w_stream *s = (w_stream *)arg;
    char *line = (char *)malloc(W_LINE_CAP), chunk[4096];
    size_t len = 0;
    DWORD got, i;
    if (!line) return 1;
    for (;;) {
        int eof = !ReadFile(s->pipe, chunk, sizeof chunk, &got, NULL) || got == 0;
        for (i = 0; !eof && i < got; i++) {
            if (chunk[i] != '\n' && chunk[i] != '\r') line[len++] = chunk[i];
            if (chunk[i] == '\n' || len == W_LINE_CAP - 1) {   /* a whole line (or a very long one's piece) */
                w_emit(s, line, len);
                len = 0;
            }
        }
        if (eof) break;
    }
    if (len) w_emit(s, line, len);   /* a last line without its newline */
    free(line);
    CloseHandle(s->pipe);
    return 0;
}

/* The command line CommandLineToArgvW / the C runtime split back into these arguments. */
static int w_quote(char *out, size_t cap, size_t *at, const char *arg) {
    size_t n = *at;
    const char *p;
    int quote = !*arg || strpbrk(arg, " \t\n\v\"") != NULL;
    if (n + 1 >= cap) return -1;
    if (n) out[n++] = ' ';
    if (quote) out[n++] = '"';
    for (p = arg;; p++) {
        size_t slashes = 0;
        while (*p == '\\') { p++; slashes++; }
        if (n + 2 * slashes + 3 >= cap) return -1;
        if (!*p) {   /* before the closing quote, backslashes are doubled */
            while (slashes--) { out[n++] = '\\'; if (quote) out[n++] = '\\'; }
            break;
        }
        if (*p == '"') { while (slashes--) { out[n++] = '\\'; out[n++] = '\\'; } out[n++] = '\\'; out[n++] = '"'; }
        else { while (slashes--) out[n++] = '\\'; out[n++] = *p; }
    }
    if (quote) out[n++] = '"';
    out[n] = 0;
    *at = n;
    return 0;
}

static BOOL WINAPI w_on_console(DWORD event) {
    if (event == CTRL_C_EVENT || event == CTRL_BREAK_EVENT || event == CTRL_CLOSE_EVENT) {
        InterlockedExchange(&w_interrupted, 1);   /* the ranks got it too: give them the grace */
        return TRUE;
    }
    return FALSE;
}

static void w_set_env_int(const char *name, int v) {
    char text[16];
    snprintf(text, sizeof text, "%d", v);
    SetEnvironmentVariableA(name, text);
}

/* The job as the options give it. */
typedef struct w_job {
    int nranks, port, user_port, max_restarts, width;
    double grace, delay, delay_max;
    const char *token, *job_id, *program;
    char *cmdline;
} w_job;

static int w_free_port(void) {   /* free right now (another process could take it first; torchrun has the same window) */
    WSADATA wsa;
    struct sockaddr_in a;
    int len = sizeof a, port;
    SOCKET s;
    if (WSAStartup(MAKEWORD(2, 2), &wsa)) return -1;
    s = socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (s == INVALID_SOCKET || bind(s, (struct sockaddr *)&a, sizeof a) || getsockname(s, (struct sockaddr *)&a, &len)) return -1;
    port = ntohs(a.sin_port);
    closesocket(s);
    return port;
}

/* One attempt: a token and port of its own, every rank started in a job object, supervised.
   Returns the exit status (-1: the job could not start); *failed: a rank failed (a restart may
   follow); cause: what ended it. */
static int w_attempt(const w_job *jb, int *failed, char *cause, size_t cause_cap) {
    char token_buf[33];
    HANDLE job, procs[W_MAX_RANKS], threads[2 * W_MAX_RANKS];
    static w_stream streams[2 * W_MAX_RANKS];
    int alive[W_MAX_RANKS], nthreads = 0, r, running, first_failed = -1, status = 0, port = jb->port;
    ULONGLONG stop_at = 0;
    JOBOBJECT_EXTENDED_LIMIT_INFORMATION limits;
    *failed = 0;
    snprintf(cause, cause_cap, "nothing");
    if (jb->token) SetEnvironmentVariableA("DDP_JOB_TOKEN", jb->token);
    else {   /* a fresh token for every attempt */
        unsigned char bytes[16];
        int k;
        if (BCryptGenRandom(NULL, bytes, sizeof bytes, BCRYPT_USE_SYSTEM_PREFERRED_RNG) != 0) { w_say("no random bytes for the job token"); return -1; }
        for (k = 0; k < 16; k++) snprintf(token_buf + 2 * k, 3, "%02x", bytes[k]);
        SetEnvironmentVariableA("DDP_JOB_TOKEN", token_buf);
    }
    if (!jb->user_port && (port = w_free_port()) < 0) { w_say("cannot find a free port (error %d)", WSAGetLastError()); return -1; }
    w_set_env_int("MASTER_PORT", port);

    /* every rank (and what it starts) in one job object, killed when it is closed */
    job = CreateJobObjectA(NULL, NULL);
    memset(&limits, 0, sizeof limits);
    limits.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE;
    if (!job || !SetInformationJobObject(job, JobObjectExtendedLimitInformation, &limits, sizeof limits)) {
        w_say("cannot create a job object (error %lu)", GetLastError());
        return -1;
    }
    for (r = 0; r < jb->nranks; r++) {
        SECURITY_ATTRIBUTES inherit;
        STARTUPINFOA sa;
        PROCESS_INFORMATION pi;
        HANDLE out_r, out_w, err_r, err_w;
        char *line = _strdup(jb->cmdline);   /* CreateProcess may write into it */
        int k;
        inherit.nLength = sizeof inherit;
        inherit.lpSecurityDescriptor = NULL;
        inherit.bInheritHandle = TRUE;
        /* Only this rank's write ends are inheritable while it starts (ours are closed after). */
        if (!line || !CreatePipe(&out_r, &out_w, &inherit, 0) || !CreatePipe(&err_r, &err_w, &inherit, 0)) {
            w_say("cannot create the pipes of rank %d", r);
            TerminateJobObject(job, 1);
            CloseHandle(job);
            return -1;
        }
        SetHandleInformation(out_r, HANDLE_FLAG_INHERIT, 0);
        SetHandleInformation(err_r, HANDLE_FLAG_INHERIT, 0);
        w_set_env_int("RANK", r);
        w_set_env_int("LOCAL_RANK", r);
        memset(&sa, 0, sizeof sa);
        sa.cb = sizeof sa;
        sa.dwFlags = STARTF_USESTDHANDLES;
        sa.hStdInput = GetStdHandle(STD_INPUT_HANDLE);
        sa.hStdOutput = out_w;
        sa.hStdError = err_w;
        if (!CreateProcessA(NULL, line, NULL, NULL, TRUE, CREATE_SUSPENDED, NULL, NULL, &sa, &pi)) {
            DWORD e = GetLastError();
            int missing = e == ERROR_FILE_NOT_FOUND || e == ERROR_PATH_NOT_FOUND;
            w_say("cannot start rank %d: '%s': %s", r, jb->program,
                  missing ? "no such program (looked up as Windows does, PATH included)" : "CreateProcess failed");
            TerminateJobObject(job, 1);
            CloseHandle(job);
            return missing ? 127 : -1;
        }
        free(line);
        AssignProcessToJobObject(job, pi.hProcess);   /* before it runs: what it starts is in the job too */
        ResumeThread(pi.hThread);
        CloseHandle(pi.hThread);
        CloseHandle(out_w);
        CloseHandle(err_w);
        procs[r] = pi.hProcess;
        alive[r] = 1;
        for (k = 0; k < 2; k++) {
            w_stream *st = &streams[nthreads];
            st->pipe = k ? err_r : out_r;
            st->dest = k ? stderr : stdout;
            st->rank = r;
            st->width = jb->width;
            threads[nthreads++] = (HANDLE)_beginthreadex(NULL, 0, w_pump, st, 0, NULL);
        }
    }

    /* supervise: the first failure (or Ctrl-C) starts the grace; then what is left is terminated */
    for (running = jb->nranks; running > 0;) {
        DWORD w;
        HANDLE live[W_MAX_RANKS];
        int idx[W_MAX_RANKS], n = 0;
        for (r = 0; r < jb->nranks; r++) if (alive[r]) { idx[n] = r; live[n++] = procs[r]; }
        w = WaitForMultipleObjects((DWORD)n, live, FALSE, 100);
        if (w - WAIT_OBJECT_0 < (DWORD)n) {   /* (WAIT_OBJECT_0 is 0) */
            DWORD code = 1;
            r = idx[w - WAIT_OBJECT_0];
            GetExitCodeProcess(procs[r], &code);
            alive[r] = 0;
            running--;
            if (code != 0 && first_failed < 0 && !w_interrupted) {
                first_failed = r;
                status = (int)code;   /* Windows' exit codes are 32-bit: passed on whole */
                *failed = 1;
                snprintf(cause, cause_cap, "rank %d exited with status %lu", r, (unsigned long)code);
                w_say("%s; stopping the other ranks", cause);
                stop_at = GetTickCount64() + (ULONGLONG)(jb->grace * 1e3);
            }
        }
        if (w_interrupted && !stop_at) stop_at = GetTickCount64() + (ULONGLONG)(jb->grace * 1e3);
        if (stop_at && running > 0 && GetTickCount64() >= stop_at) {
            w_say("%d rank(s) still running %g s after %s: terminating them", running, jb->grace,
                  w_interrupted ? "Ctrl-C" : "the failure");
            TerminateJobObject(job, 1);
            stop_at = GetTickCount64() + 60000;   /* (terminated: they go at once) */
        }
    }
    CloseHandle(job);   /* what the ranks left running dies with it (as POSIX ddprun kills what is left) */
    for (r = 0; r < nthreads; r++) {   /* the last lines: the pipes end once their writers are gone */
        WaitForSingleObject(threads[r], 5000);
        CloseHandle(threads[r]);
    }
    for (r = 0; r < jb->nranks; r++) CloseHandle(procs[r]);
    return status;
}

int main(int argc, char **argv) {
    int i = 1, r, restarts, status, failed;
    w_job jb;
    size_t at = 0, cap = 32768;
    double delay;
    char cause[128];
    SYSTEM_INFO si;

    memset(&jb, 0, sizeof jb);
    jb.nranks = 1;
    jb.grace = 5;
    jb.delay = 1;
    jb.delay_max = 60;
    InitializeCriticalSection(&w_out_lock);
    while (i < argc) {
        const char *arg = argv[i], *value = NULL, *eq;
        size_t name_len;
        if (!strcmp(arg, "--")) { i++; break; }
        if (arg[0] != '-' || !arg[1]) break;
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) { fputs(w_usage, stdout); return 0; }
        eq = !strncmp(arg, "--", 2) ? strchr(arg, '=') : NULL;
        name_len = eq ? (size_t)(eq - arg) : strlen(arg);
        if (eq) value = eq + 1;
        else if (i + 1 < argc) value = argv[++i];
        else w_usage_error("option '%s' needs a value", arg);
#define W_IS(name) (name_len == strlen(name) && !strncmp(arg, name, name_len))
        if (W_IS("-n") || W_IS("--nproc") || W_IS("--nproc-per-node")) {
            if (w_parse_int(value, 1, W_MAX_RANKS, &jb.nranks))
                w_usage_error("number of ranks must be an integer 1..%d on Windows, not '%s'", W_MAX_RANKS, value);
        } else if (W_IS("--master-port")) {
            if (w_parse_int(value, 1, 65535, &jb.port)) w_usage_error("port must be an integer 1..65535, not '%s'", value);
            jb.user_port = 1;
        } else if (W_IS("--grace") || W_IS("--restart-delay") || W_IS("--restart-delay-max")) {
            char *end;
            double v = strtod(value, &end);
            /* plain decimal only, as on POSIX (strtod would take 0x10 as 16) */
            if (end == value || *end || strspn(value, "0123456789.") != strlen(value) || !(v >= 0 && v <= 86400))
                w_usage_error("%.*s must be 0..86400 seconds in plain decimal, not '%s'", (int)name_len, arg, value);
            if (W_IS("--grace")) jb.grace = v;
            else if (W_IS("--restart-delay")) jb.delay = v;
            else jb.delay_max = v;
        } else if (W_IS("--max-restarts")) {
            if (w_parse_int(value, 0, 1000000, &jb.max_restarts)) w_usage_error("--max-restarts must be an integer 0..1000000, not '%s'", value);
        } else if (W_IS("--job-token")) {
            if (strlen(value) < 16 || strlen(value) > 127 || strpbrk(value, " \t\n"))
                w_usage_error("--job-token must be 16..127 characters without spaces");
            jb.token = value;
        } else if (W_IS("--job-id")) {
            if (!*value || strlen(value) > 255) w_usage_error("--job-id must be 1..255 characters, not '%s'", value);
            jb.job_id = value;
        } else if (W_IS("--nnodes") || W_IS("--node-rank") || W_IS("--node_rank") || W_IS("--master-addr") ||
                   W_IS("--master_addr")) {
            int nodes = 1;
            if (!W_IS("--nnodes") || w_parse_int(value, 1, 1024, &nodes) || nodes > 1)
                w_usage_error("'%.*s': several machines are not supported by ddprun on Windows yet (one machine: -n N); "
                              "start each rank with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set instead", (int)name_len, arg);
        } else {
            w_usage_error("unknown option '%s'", arg);
        }
#undef W_IS
        i++;
    }
    if (i >= argc) w_usage_error("missing PROGRAM");
    jb.program = argv[i];
    jb.width = snprintf(NULL, 0, "%d", jb.nranks - 1);   /* columns line up */

    /* what every attempt shares, inherited by every rank */
    SetEnvironmentVariableA("MASTER_ADDR", "127.0.0.1");
    w_set_env_int("WORLD_SIZE", jb.nranks);
    w_set_env_int("LOCAL_WORLD_SIZE", jb.nranks);
    if (jb.job_id) SetEnvironmentVariableA("DDP_JOB_ID", jb.job_id);
    GetSystemInfo(&si);
    if (jb.nranks > 1) {
        char text[16];
        int share = (int)si.dwNumberOfProcessors > jb.nranks ? (int)si.dwNumberOfProcessors / jb.nranks : 1;
        snprintf(text, sizeof text, "%d", share);
        if (!GetEnvironmentVariableA("OMP_NUM_THREADS", NULL, 0)) SetEnvironmentVariableA("OMP_NUM_THREADS", text);
        if (!GetEnvironmentVariableA("OPENBLAS_NUM_THREADS", NULL, 0)) SetEnvironmentVariableA("OPENBLAS_NUM_THREADS", text);
    }
    if (!(jb.cmdline = (char *)malloc(cap))) { w_say("out of memory"); return 1; }
    jb.cmdline[0] = 0;
    for (r = i; r < argc; r++)
        if (w_quote(jb.cmdline, cap, &at, argv[r])) { w_say("the command line is longer than Windows allows (32767)"); return 1; }
    SetConsoleCtrlHandler(w_on_console, TRUE);

    for (restarts = 0, delay = jb.delay;; restarts++) {
        ULONGLONG started = GetTickCount64(), until;
        status = w_attempt(&jb, &failed, cause, sizeof cause);
        if (status < 0) { status = 1; break; }
        if (!failed || w_interrupted || restarts >= jb.max_restarts) break;
        if ((double)(GetTickCount64() - started) >= jb.delay_max * 1e3) delay = jb.delay;   /* a long run: back to the first delay */
        w_say("restart %d of %d: %s; starting all %d rank(s) again in %.1f s", restarts + 1, jb.max_restarts, cause, jb.nranks, delay);
        for (until = GetTickCount64() + (ULONGLONG)(delay * 1e3); GetTickCount64() < until && !w_interrupted;) Sleep(50);
        if (w_interrupted) { w_say("interrupted while waiting to restart; not restarting"); break; }
        delay = delay * 2 < jb.delay_max ? delay * 2 : jb.delay_max;
    }
    free(jb.cmdline);
    if (w_interrupted) return 130;
    return status;
}
