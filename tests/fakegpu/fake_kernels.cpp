/* fake_kernels.cpp — ddp_kernels.cuh's launchers (ddp_k_*) on the host, for the fake GPU. The
   arithmetic is ddp_kernels.cuh's own: its __host__ __device__ element functions and its
   DDP_KERNELS_HOST_REFERENCE drivers (the launchers' float4/scalar split, the sum of squares in
   the kernels' fixed order), extracted at build time by host_kernels.awk. Built with
   -ffp-contract=off: host float operations then round like the device's _rn intrinsics
   (tests/gpu/test_kernel_math_host.cu proves that arithmetic equals ddp.h's CPU AdamW bit for
   bit). Each launcher checks its stream and pointers as a GPU would (fakegpu_launch) and, like
   the real ones, first takes back a cudaErrorNotReady left by the caller's polling and returns
   cudaGetLastError(). */
#include <cmath>
#include <cstring>
#include <cstdint>
#include <pthread.h>
#include <time.h>
#include "../../ddp_kernels.cuh"   /* the declarations (no __CUDACC__: no definitions) */
#include "fake_internal.h"

#define __host__
#define __device__
#define __forceinline__ inline
using std::isfinite;
struct alignas(16) float4 { float x, y, z, w; };
#define DDP_KERNELS_HOST_REFERENCE
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"   /* the grid helpers the launchers used */
#include "ddp_kernels_host.inc"   /* generated: host_kernels.awk over ddp_kernels.cuh */
#pragma GCC diagnostic pop

static void forget_not_ready() {
    if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
}

/* Launch checks; the error a real launch would leave for cudaGetLastError. */
static cudaError_t launch(cudaStream_t stream, const char *kernel, double ms, int n, const void **p, const size_t *bytes) {
    cudaError_t e;
    forget_not_ready();
    e = fakegpu_launch(stream, kernel, ms, n, p, bytes);
    if (e != cudaSuccess) fakegpu_set_last_error(e);
    return e;
}

/* ddp_k__sum_squares_host keeps its per-block sums in static arrays: one caller at a time. */
static pthread_mutex_t sum_squares_lock = PTHREAD_MUTEX_INITIALIZER;

extern "C" cudaError_t ddp_k_sum_squares(const float *x, size_t n, double *partials, double *out, cudaStream_t stream) {
    const void *p[3] = { x, partials, out };
    size_t b[3] = { n * sizeof(float), DDP_K_NORM_BLOCKS * sizeof(double), sizeof(double) };
    cudaError_t e = launch(stream, "ddp_k_sum_squares", 0, 3, p, b);
    if (e != cudaSuccess) return e;
    pthread_mutex_lock(&sum_squares_lock);
    *out = ddp_k__sum_squares_host(x, n);
    pthread_mutex_unlock(&sum_squares_lock);
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_norm_blocks(const float *x, size_t n, size_t grain, double *out, cudaStream_t stream) {
    size_t blocks = grain ? (n + grain - 1) / grain : 0, k;
    const void *p[2] = { x, out };
    size_t b[2] = { n * sizeof(float), blocks * sizeof(double) };
    cudaError_t e;
    if (blocks == 0) { forget_not_ready(); return cudaSuccess; }
    if ((e = launch(stream, "ddp_k_norm_blocks", 0, 2, p, b)) != cudaSuccess) return e;
    for (k = 0; k < blocks; k++) out[k] = ddp_k__block_squares(x + k * grain, n - k * grain < grain ? n - k * grain : grain);
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_norm_blocks_bf16(const uint16_t *x, size_t n, size_t grain, double *out, cudaStream_t stream) {
    size_t blocks = grain ? (n + grain - 1) / grain : 0, k;
    const void *p[2] = { x, out };
    size_t b[2] = { n * sizeof(uint16_t), blocks * sizeof(double) };
    cudaError_t e;
    if (blocks == 0) { forget_not_ready(); return cudaSuccess; }
    if ((e = launch(stream, "ddp_k_norm_blocks_bf16", 0, 2, p, b)) != cudaSuccess) return e;
    for (k = 0; k < blocks; k++) out[k] = ddp_k__block_squares(x + k * grain, n - k * grain < grain ? n - k * grain : grain);
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_sum_doubles(const double *x, size_t n, double *out, cudaStream_t stream) {
    const void *p[2] = { x, out };
    size_t b[2] = { n * sizeof(double), sizeof(double) }, i;
    double lane[256] = { 0 }, total = 0;   /* the kernel's order: 256 running sums, then in order */
    cudaError_t e = launch(stream, "ddp_k_sum_doubles", 0, 2, p, b);
    if (e != cudaSuccess) return e;
    for (i = 0; i < n; i++) lane[i % 256] += x[i];
    for (i = 0; i < 256; i++) total += lane[i];
    *out = total;
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_adamw_prepare(ddp_k_adamw_state *state, const double *norm_sq, float max_grad_norm,
                                           float lr, float beta1, float beta2, cudaStream_t stream) {
    const void *p[2] = { state, norm_sq };
    size_t b[2] = { sizeof *state, norm_sq ? sizeof(double) : 0 };
    cudaError_t e = launch(stream, "ddp_k_adamw_prepare", 0, 2, p, b);
    if (e != cudaSuccess) return e;
    ddp_k__adamw_prepare_host(state, norm_sq, max_grad_norm, lr, beta1, beta2);
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_adamw(float *p, const float *g, float *m, float *v, size_t n, const unsigned char *no_decay,
                                   float lr, float beta1, float beta2, float eps, float weight_decay,
                                   const ddp_k_adamw_state *state, cudaStream_t stream) {
    size_t fb = n * sizeof(float);
    const void *ptr[6] = { p, g, m, v, state, no_decay };
    size_t b[6] = { fb, fb, fb, fb, sizeof *state, no_decay ? (n + DDP_K_MASK_GROUP - 1) / DDP_K_MASK_GROUP : 0 };
    cudaError_t e;
    if (n == 0) { forget_not_ready(); return cudaSuccess; }
    if ((e = launch(stream, "ddp_k_adamw", 0, 6, ptr, b)) != cudaSuccess) return e;
    ddp_k__adamw_host(p, g, m, v, n, no_decay, lr, beta1, beta2, eps, weight_decay, state);
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_adamw_bf16(float *p, uint16_t *w, const uint16_t *g, float *m, float *v, size_t n,
                                        const unsigned char *no_decay, float lr, float beta1, float beta2, float eps,
                                        float weight_decay, ddp_k_adamw_state *state, cudaStream_t stream) {
    size_t fb = n * sizeof(float);
    const void *ptr[7] = { p, g, m, v, state, no_decay, w };
    size_t b[7] = { fb, n * sizeof(uint16_t), fb, fb, sizeof *state, no_decay ? (n + DDP_K_MASK_GROUP - 1) / DDP_K_MASK_GROUP : 0,
                    n * sizeof(uint16_t) };
    cudaError_t e;
    if (n == 0) { forget_not_ready(); return cudaSuccess; }
    if ((e = launch(stream, "ddp_k_adamw_bf16", 0, 7, ptr, b)) != cudaSuccess) return e;
    ddp_k__adamw_bf16_host(p, w, g, m, v, n, no_decay, lr, beta1, beta2, eps, weight_decay, state);   /* the kernel's element function */
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_bf16_round(float *x, uint16_t *out, size_t n, cudaStream_t stream) {
    const void *p[2] = { x, out };
    size_t b[2] = { n * sizeof(float), n * sizeof(uint16_t) }, i;
    cudaError_t e;
    if (n == 0) { forget_not_ready(); return cudaSuccess; }
    if ((e = launch(stream, "ddp_k_bf16_round", 0, 2, p, b)) != cudaSuccess) return e;
    for (i = 0; i < n; i++) { out[i] = ddp_k__to_bf16(x[i]); x[i] = ddp_k__from_bf16(out[i]); }
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_scale(float *x, size_t n, float factor, cudaStream_t stream) {
    const void *p[1] = { x };
    size_t b[1] = { n * sizeof(float) }, i;
    cudaError_t e;
    if (n == 0) { forget_not_ready(); return cudaSuccess; }
    if ((e = launch(stream, "ddp_k_scale", 0, 1, p, b)) != cudaSuccess) return e;
    for (i = 0; i < n; i++) x[i] *= factor;
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_scale_bf16(uint16_t *x, size_t n, float factor, cudaStream_t stream) {
    const void *p[1] = { x };
    size_t b[1] = { n * sizeof(uint16_t) };
    cudaError_t e;
    if (n == 0) { forget_not_ready(); return cudaSuccess; }
    if ((e = launch(stream, "ddp_k_scale_bf16", 0, 1, p, b)) != cudaSuccess) return e;
    ddp_k__scale_bf16_host(x, n, factor);
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_fill(float *x, size_t n, float value, cudaStream_t stream) {
    const void *p[1] = { x };
    size_t b[1] = { n * sizeof(float) }, i;
    cudaError_t e;
    if (n == 0) { forget_not_ready(); return cudaSuccess; }
    if ((e = launch(stream, "ddp_k_fill", 0, 1, p, b)) != cudaSuccess) return e;
    for (i = 0; i < n; i++) x[i] = value;
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_f32_to_bf16(const float *in, uint16_t *out, size_t n, cudaStream_t stream) {
    const void *p[2] = { in, out };
    size_t b[2] = { n * sizeof(float), n * sizeof(uint16_t) }, i;
    cudaError_t e;
    if (n == 0) { forget_not_ready(); return cudaSuccess; }
    if ((e = launch(stream, "ddp_k_f32_to_bf16", 0, 2, p, b)) != cudaSuccess) return e;
    for (i = 0; i < n; i++) out[i] = ddp_k__to_bf16(in[i]);
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_bf16_to_f32(const uint16_t *in, float *out, size_t n, cudaStream_t stream) {
    const void *p[2] = { in, out };
    size_t b[2] = { n * sizeof(uint16_t), n * sizeof(float) }, i;
    cudaError_t e;
    if (n == 0) { forget_not_ready(); return cudaSuccess; }
    if ((e = launch(stream, "ddp_k_bf16_to_f32", 0, 2, p, b)) != cudaSuccess) return e;
    for (i = 0; i < n; i++) out[i] = ddp_k__from_bf16(in[i]);
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_accumulate(float *acc, float *g, size_t n, int mode, cudaStream_t stream) {
    const void *p[2] = { acc, g };
    size_t b[2] = { n * sizeof(float), n * sizeof(float) };
    cudaError_t e;
    if (n == 0) { forget_not_ready(); return cudaSuccess; }
    if ((e = launch(stream, "ddp_k_accumulate", 0, 2, p, b)) != cudaSuccess) return e;
    ddp_k__accumulate_host(acc, g, n, mode);
    return cudaGetLastError();
}

extern "C" cudaError_t ddp_k_accumulate_bf16(float *acc, uint16_t *g, size_t n, int mode, cudaStream_t stream) {
    const void *p[2] = { acc, g };
    size_t b[2] = { n * sizeof(float), n * sizeof(uint16_t) };
    cudaError_t e;
    if (n == 0) { forget_not_ready(); return cudaSuccess; }
    if ((e = launch(stream, "ddp_k_accumulate_bf16", 0, 2, p, b)) != cudaSuccess) return e;
    ddp_k__accumulate_bf16_host(acc, g, n, mode);
    return cudaGetLastError();
}

/* The stream is busy `ms` longer: later events on it complete that much later. */
extern "C" cudaError_t ddp_k_spin(double ms, cudaStream_t stream) {
    cudaError_t e;
    if (!(ms > 0)) { forget_not_ready(); return cudaSuccess; }
    if ((e = launch(stream, "ddp_k_spin", ms, 0, NULL, NULL)) != cudaSuccess) return e;
    return cudaGetLastError();
}
