/* The ddp.h implementation compiled by a C compiler with -DDDP_CUDA, the kernels from
   tests/gpu/kernels_impl.cu: it must link, and on a GPU machine AUTO must pick NCCL. */
#define DDP_IMPLEMENTATION
#include "../../ddp.h"
#include <stdio.h>

int main(void) {
    ddp_context *ctx;
    ddp_desc d;
    int id;
    memset(&d, 0, sizeof d);
    d.world_size = 1;
    if (ddp_init(&ctx, &d) != DDP_OK) { printf("FAIL c_compiled_cuda_build: %s\n", ddp_last_error(ctx)); return 1; }
    if (ddp_register_param(ctx, "w", 1000, 0, NULL, &id) != DDP_OK || ddp_commit(ctx) != DDP_OK ||
        ddp_zero_grad(ctx) != DDP_OK || ddp_grad_ready(ctx, id) != DDP_OK || ddp_finish(ctx) != DDP_OK) {
        printf("FAIL c_compiled_cuda_build: %s\n", ddp_last_error(ctx));
        return 1;
    }
    printf("%s c_compiled_cuda_build_runs_a_step (backend %s)\n", ddp__gpu_visible() == !strcmp(ddp_backend_name(ctx), "nccl") ? "PASS" : "FAIL",
           ddp_backend_name(ctx));
    return ddp_shutdown(ctx) == DDP_OK ? 0 : 1;
}
