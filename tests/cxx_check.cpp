// The header, implementation included, compiles as C++ (nvcc compiles the CUDA part as C++).
#define DDP_IMPLEMENTATION
#include "../ddp.h"

int ddp_cxx_check(void) {
    ddp_context *ctx = nullptr;
    ddp_desc desc = ddp_desc();
    desc.world_size = 1;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1;
    return ddp_shutdown(ctx) == DDP_OK ? 0 : 1;
}
