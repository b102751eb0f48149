/* mpi_steps.c — steps until told to stop, for tests/test_mpi_hosts.sh's lost-host checks: each
   rank writes its gradients (a known function of rank and step), averages them, checks the
   average against the float64 value, and prints one line a second. A failure prints
   "rank R: failed after S s at step K: <ddp_last_error>" and exits 1.
   With MPI_STEPS_LOG=DIR each rank writes stdout and stderr (ddp.h's log lines) to DIR/rankR.log
   itself: a host cut off cannot send mpirun its output. Lines carry the wall clock (epoch s).
   With MPI_STEPS_CVARS=1 rank 0 also prints, after ddp_init, the Open MPI TCP settings that
   ddp.h chooses when it starts MPI ("cvar NAME = VALUE", read back through MPI_T).
   Usage: mpi_steps SECONDS [FLOATS]   (run under mpirun; ranks on several hosts) */
#include "testlib.h"

/* What MPI itself took: each control variable read back through the MPI tool interface. */
static void print_cvars(void) {
    static const char *const names[] = { "btl_tcp_eager_limit", "btl_tcp_max_send_size", "btl_tcp_links" };
    int provided, k;
    if (MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) { printf("cvar MPI_T unavailable\n"); return; }
    for (k = 0; k < 3; k++) {
        int index, count, verbosity, bind, scope, name_len = 128, desc_len = 256;
        char name[128], desc[256];
        unsigned char value[16] = { 0 };
        MPI_Datatype type;
        MPI_T_enum enumtype;
        MPI_T_cvar_handle h;
        long long v = -1;
        if (MPI_T_cvar_get_index(names[k], &index) != MPI_SUCCESS) { printf("cvar %s = missing\n", names[k]); continue; }
        MPI_T_cvar_get_info(index, name, &name_len, &verbosity, &type, &enumtype, desc, &desc_len, &bind, &scope);
        MPI_T_cvar_handle_alloc(index, NULL, &h, &count);
        MPI_T_cvar_read(h, value);
        MPI_T_cvar_handle_free(&h);
        if (type == MPI_INT) v = *(int *)(void *)value;
        else if (type == MPI_UNSIGNED) v = *(unsigned *)(void *)value;
        else if (type == MPI_UNSIGNED_LONG || type == MPI_LONG) v = *(long *)(void *)value;
        else if (type == MPI_UNSIGNED_LONG_LONG || type == MPI_LONG_LONG) v = *(long long *)(void *)value;
        printf("cvar %s = %lld\n", names[k], v);
    }
    MPI_T_finalize();
}

static double wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double test_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 10, t0 = test_now(), last = 0;
    size_t n = argc > 2 ? (size_t)atol(argv[2]) : 1u << 20, i;
    ddp_context *ddp;
    ddp_result r = DDP_OK;
    int id, rank, world;
    long step = 0;
    const char *dir = getenv("MPI_STEPS_LOG"), *env_rank = getenv("OMPI_COMM_WORLD_RANK");
    if (dir && env_rank) {
        char path[512];
        snprintf(path, sizeof path, "%s/rank%s.log", dir, env_rank);
        if (!freopen(path, "w", stdout) || dup2(fileno(stdout), 2) < 0) return 2;
        setvbuf(stdout, NULL, _IOLBF, 0);
    }
    printf("pid %d\n", (int)getpid());
    if (ddp_init(&ddp, NULL) != DDP_OK) { printf("%s\n", ddp_last_error(ddp)); ddp_shutdown(ddp); return 1; }
    rank = ddp_rank(ddp);
    world = ddp_world_size(ddp);
    if (rank == 0 && getenv("MPI_STEPS_CVARS")) print_cvars();
    if ((r = ddp_register_param(ddp, "w", n, 0, NULL, &id)) != DDP_OK || (r = ddp_commit(ddp)) != DDP_OK) goto out;
    t0 = test_now();
    for (step = 0; test_now() - t0 < seconds; step++) {
        float *g = ddp_grad(ddp, id);
        double want = 0;
        int s;
        if ((r = ddp_zero_grad(ddp)) != DDP_OK) break;
        for (i = 0; i < n; i++) g[i] = (float)(rank + 1) * (float)(step % 7 + 1);
        if ((r = ddp_grad_ready(ddp, id)) != DDP_OK || (r = ddp_finish(ddp)) != DDP_OK) break;
        for (s = 0; s < world; s++) want += (double)(s + 1) * (double)(step % 7 + 1);
        want /= world;
        for (i = 0; i < n; i++)
            if (fabs((double)g[i] - want) > 1e-6 * want) { printf("rank %d: FAIL step %ld: %g != %g\n", rank, step, g[i], want); return 1; }
        if (test_now() - last > 1) { printf("rank %d: step %ld ok\n", rank, step); fflush(stdout); last = test_now(); }
    }
out:
    if (r != DDP_OK) {
        printf("rank %d: failed at %.3f, step %ld: %s\n", rank, wall(), step, ddp_last_error(ddp));
        fflush(stdout);
        ddp_shutdown(ddp);
        return 1;
    }
    r = ddp_shutdown(ddp);
    printf("rank %d: done, %ld steps\n", rank, step);
    return r == DDP_OK ? 0 : 1;
}
