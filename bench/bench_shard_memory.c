/* bench_shard_memory.c — bytes per parameter per rank, sharded (ddp_desc.shard_optimizer) and
   not, measured from what ddp.h allocates: every DDP_MALLOC still live after a first optimizer
   step (a counting allocator), plus this rank's share of the CPU backend's shared segment (its
   own gradient buffer, and sharded its own parameter buffer: the flat buffers live there), minus
   what was live before ddp_commit. The formula it is checked against: unsharded 4 (parameters)
   + 4 (gradients) + 8 (m, v) = 16 bytes; sharded 8 + 8 x (this rank's part) / (all parameters),
   about 8 + 8 / world.
   Run: build/ddprun -n N build/bench_shard_memory [PARAMS_MILLIONS (8)] */
#define _GNU_SOURCE   /* the counting allocator's includes come before ddp.h's */
#include <stdlib.h>
#include <stddef.h>
static size_t bench_live;
static void *bench_malloc(size_t n) {
    size_t *p = (size_t *)malloc(n + 16);
    if (!p) return NULL;
    p[0] = n;
    bench_live += n;
    return (char *)p + 16;
}
static void bench_free(void *q) {
    size_t *p;
    if (!q) return;
    p = (size_t *)(void *)((char *)q - 16);
    bench_live -= p[0];
    free(p);
}
#define DDP_MALLOC(n) bench_malloc(n)
#define DDP_FREE(p) bench_free(p)
#define DDP_IMPLEMENTATION
#include "../ddp.h"

static double measure(int shard, size_t params, int *world_out, double *formula) {
    ddp_context *ddp;
    ddp_desc d;
    ddp_adamw opt;
    size_t before, total = 0, flat, seg = 0;
    int k, ids[8];
    double bytes;
    memset(&d, 0, sizeof d);
    d.shard_optimizer = shard;
    memset(&opt, 0, sizeof opt);
    opt.lr = 1e-3f;
    if (ddp_init(&ddp, &d) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(ddp)); exit(1); }
    for (k = 0; k < 8; k++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", k);
        if (ddp_register_param(ddp, name, params / 8, 0, NULL, &ids[k]) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(ddp)); exit(1); }
        total += params / 8;
    }
    before = bench_live;
    if (ddp_commit(ddp) != DDP_OK || ddp_zero_grad(ddp) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(ddp)); exit(1); }
    for (k = 7; k >= 0; k--) ddp_grad_ready(ddp, ids[k]);
    if (ddp_finish(ddp) != DDP_OK || ddp_adamw_step(ddp, &opt, NULL) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(ddp)); exit(1); }
    ddp_flat_params(ddp, &flat);
    if (ddp->be->id == DDP_BACKEND_CPU && ddp->impl.cpu->grads_shm) seg = ddp->impl.cpu->grads_shm_bytes / (size_t)ddp_world_size(ddp);
    bytes = (double)(bench_live - before + seg) / (double)total;
    *formula = (double)(4 * flat + 4 * flat + 8 * ddp->shard.count) / (double)total;
    *world_out = ddp_world_size(ddp);
    ddp_shutdown(ddp);
    return bytes;
}

int main(int argc, char **argv) {
    size_t params = (size_t)((argc > 1 ? atof(argv[1]) : 8.0) * 1e6);
    double f0, f1, b0, b1;
    int world, rank = -1;
    const char *r = getenv("RANK");
    if (r) rank = atoi(r);
    b0 = measure(0, params, &world, &f0);
    b1 = measure(1, params, &world, &f1);
    if (rank <= 0) {
        printf("| %d | %.3f (formula 16: %.3f) | %.3f (formula 8 + 8/%d = %.3f; this rank's part: %.3f) | %.2fx |\n", world, b0, f0, b1,
               world, 8.0 + 8.0 / world, f1, b0 / b1);
        fflush(stdout);
    }
    return 0;
}
