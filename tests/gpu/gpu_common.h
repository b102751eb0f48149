/* gpu_common.h — what the GPU tests and benchmarks share: the skip line when no device is
   usable, and a check that turns a failed CUDA call into a FAIL line. */
#ifndef DDP_GPU_COMMON_H
#define DDP_GPU_COMMON_H
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

static inline void gpu_require_device(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("SKIP gpu: no CUDA device (cudaGetDeviceCount: %s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        exit(0);
    }
}

static inline const char *gpu_name(void) {
    static struct cudaDeviceProp prop;
    int dev = 0;
    cudaGetDevice(&dev);
    return cudaGetDeviceProperties(&prop, dev) == cudaSuccess ? prop.name : "unknown GPU";
}

#define CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    printf("FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); exit(1); } } while (0)
#endif
