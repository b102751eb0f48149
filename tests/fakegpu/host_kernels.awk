# The host-callable part of ddp_kernels.cuh's definitions, for fake_kernels.cpp: the element
# functions (__host__ __device__) and the DDP_KERNELS_HOST_REFERENCE drivers, without the
# __global__ and __device__-only functions and the launchers (CUDA syntax a host compiler
# cannot read). What it keeps is ddp_kernels.cuh's own text, so the fake kernels compute with
# the device's element arithmetic; a change of shape there fails the build here, loudly.
/^#define DDP_KERNELS__IMPLEMENTED/                          { on = 1; next }
/^#endif \/\* DDP_KERNELS_IMPLEMENTATION && __CUDACC__ \*\// { on = 0 }
!on                                                        { next }
/^\/\* ---- launchers ---- \*\//                            { launchers = 1 }
/^#ifdef DDP_KERNELS_HOST_REFERENCE/                       { launchers = 0 }
launchers                                                  { next }
/^(template <[^>]*> )?static __global__|^static __device__/ { skip = 1 }
skip                                                       { if ($0 ~ /^}/) skip = 0; next }
                                                           { print }
