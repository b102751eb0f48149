/* hosts_nccl.c — one rank of ddp.h's NCCL backend, for the multi-host tests (tests/test_hosts.sh:
   one process per rank, ranks on different namespace hosts, the environment from ddprun or set
   by hand). It sets the backend up (rendezvous through rank 0's store on MASTER_ADDR, rank 0's
   ncclUniqueId through the store, the communicator) and, if that works, averages one vector.
   Built two ways: with tests/fakegpu (-DHOSTS_FAKEGPU, no GPU; the fake forms communicators only
   among threads of one process, so across processes the set-up runs up to its deadline and
   fails by name) and by nvcc against the real CUDA runtime and NCCL (build/gpu/hosts_nccl, -x cu:
   without a GPU it must fail by name; with GPUs it is a real multi-node allreduce).
   Prints one "hosts_nccl: ..." line per event; exit 0 when the allreduce gave the right average,
   1 on a ddp.h error, 2 on a wrong value. $HOSTS_TIMEOUT: ddp.h's timeout_s (default 10). */
#define DDP_IMPLEMENTATION
#include "../ddp.h"
#ifdef HOSTS_FAKEGPU
#include "fakegpu/fakegpu.h"
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(void) {
    ddp_desc d;
    ddp_context *ddp = NULL;
    ddp_result r;
    const char *tmo = getenv("HOSTS_TIMEOUT"), *rank_s = getenv("RANK");
    double t0 = now_s();
    int code = 0;
    memset(&d, 0, sizeof d);
    d.backend = DDP_BACKEND_NCCL;
    d.timeout_s = tmo ? atof(tmo) : 10.0;
    r = ddp_init(&ddp, &d);
#ifdef HOSTS_FAKEGPU
    printf("hosts_nccl: rank %s: made id '%s', set up with id '%s'\n", rank_s ? rank_s : "?", fakegpu_last_made_id(),
           fakegpu_last_joined_id());
#endif
    if (r != DDP_OK) {
        printf("hosts_nccl: rank %s: ddp_init failed after %.2f s: %s: %s\n", rank_s ? rank_s : "?", now_s() - t0,
               ddp_result_string(r), ddp_last_error(ddp));
        ddp_shutdown(ddp);
        return 1;
    } else {
        /* Each rank contributes rank+1; the average is (world+1)/2 exactly (small integers). */
        enum { N = 1024 };
        static float host[N];
        int i, w = ddp_world_size(ddp), bad = 0;
        float want = (float)(w + 1) / 2.0f;
        for (i = 0; i < N; i++) host[i] = (float)(ddp_rank(ddp) + 1);
        r = ddp_allreduce(ddp, host, N, DDP_AVG);
        for (i = 0; r == DDP_OK && i < N; i++) bad += host[i] != want;
        printf("hosts_nccl: rank %d of %d: allreduce %s, %d of %d values wrong (want %g)\n", ddp_rank(ddp), w,
               ddp_result_string(r), bad, N, (double)want);
        code = r != DDP_OK ? 1 : bad ? 2 : 0;
    }
    r = ddp_shutdown(ddp);
    return code ? code : r != DDP_OK;
}
