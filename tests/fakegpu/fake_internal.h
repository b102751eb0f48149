/* fake_internal.h — what fake_cuda.c shares with fake_nccl.c and fake_kernels.cpp. */
#ifndef FAKEGPU_INTERNAL_H
#define FAKEGPU_INTERNAL_H
#include "fakegpu.h"
#include <pthread.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FAKEGPU_MAX_DEVICES 16

struct CUstream_st {
    unsigned magic;
    int device;
    unsigned flags;
    double busy_until;             /* host clock when the work enqueued so far would be done */
};

double fakegpu_now(void);
void fakegpu_misuse(const char *fmt, ...);
extern pthread_mutex_t fakegpu_lock;   /* streams, events, allocations, the knobs */
int fakegpu_current_device(void);
/* The stream a call names (NULL: the current device's legacy stream); NULL when it is not a
   live stream (misuse recorded). Lock held. */
struct CUstream_st *fakegpu_stream_locked(cudaStream_t stream, const char *call);
/* 1 when [p, p + bytes) lies in one live device allocation on `device` (-1: any device). */
int fakegpu_is_device_range(const void *p, size_t bytes, int device);
/* A kernel launch: stream and pointers checked like a GPU would (misuse: cudaErrorInvalidValue
   or cudaErrorIllegalAddress recorded as the launch's error); ms of device time added. */
cudaError_t fakegpu_launch(cudaStream_t stream, const char *kernel, double ms, int nptr, const void **ptrs,
                           const size_t *bytes);
/* Virtual memory (fake_vm.c): a mapped, accessible range becomes device memory to the checks
   above (register) until its unmap (unregister); 0 when out of host memory. Lock held. */
int fakegpu_vm_register_locked(char *base, size_t size, int device);
void fakegpu_vm_unregister_locked(char *base);
/* cuMemCreate'd bytes not released on `device` (-1: all); back to defaults (fakegpu_reset). Lock held. */
size_t fakegpu_vm_phys_bytes_locked(int device);
void fakegpu_vm_reset_locked(void);
/* `bytes` more on `device` stay within fakegpu_set_device_memory's limit. Lock held. */
int fakegpu_device_fits_locked(int device, size_t bytes);
/* The thread's last error (what cudaGetLastError returns). */
void fakegpu_set_last_error(cudaError_t e);

#ifdef __cplusplus
}
#endif
#endif
