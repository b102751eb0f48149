/* The kernels for a program whose ddp.h implementation is compiled by a C compiler with
   -DDDP_CUDA (see build/gpu/minimal_c_cuda): exactly one CUDA file defines them. */
#define DDP_KERNELS_IMPLEMENTATION
#include "../../ddp_kernels.cuh"
