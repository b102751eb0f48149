/* fakegpu.h — the knobs of the fake CUDA runtime and NCCL (tests/fakegpu): what a test turns to
   exercise ddp.h's NCCL backend on a machine without a GPU.

   What the fake is: CUDA's runtime API and NCCL's, emulated in host memory, with ranks as
   threads of one process. Every enqueued operation runs at once on the calling thread (its
   data is final when the call returns); completion *times* are modelled per stream (a kernel
   that spins, ddp_k_spin, makes the stream busy that long; an event completes when its
   stream's earlier work would have), so ddp.h's polling paths see events that are not ready
   yet. Collectives: every rank posts its part; the last to arrive computes the result into
   every rank's buffer, in rank order. A non-blocking communicator answers ncclInProgress until
   then (ddp.h polls ncclCommGetAsyncError); a blocking one waits, bounded by
   fakegpu_set_nccl_timeout. The fake checks what a GPU and NCCL would refuse or crash on:
   device pointers and ranges, copy directions, streams and events of another device, two
   ranks on one GPU, mismatched collectives, use of a destroyed communicator, event or stream;
   each such misuse is counted (fakegpu_misuse_count) and printed.
   What it is not: it proves ddp.h's host logic, not the CUDA kernels (their element arithmetic
   is reused on the host, fake_kernels.cpp) and not NCCL's algorithms, protocols or transport;
   streams never run concurrently, so no data race between streams can show. */
#ifndef FAKEGPU_H
#define FAKEGPU_H
#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Back to the defaults below (between tests; no communicator, stream or event may be live). */
void fakegpu_reset(void);

/* Devices cudaGetDeviceCount reports (default 4; 0: no device). */
void fakegpu_set_device_count(int count);

/* A stuck GPU: events recorded on `device` while held never complete (cudaEventQuery says
   cudaErrorNotReady) until released; work enqueued before the hold completes as usual. */
void fakegpu_hold_device(int device, int hold);

/* Every event recorded on `device` completes `seconds` after its stream's work (default 0). */
void fakegpu_set_event_delay(int device, double seconds);

/* ncclAvg's arithmetic: 0 (default) sums in float in rank order and divides by the rank count,
   rounding once, as ddp.h's CPU backend and NCCL's SumPostDiv paths do; 1 multiplies every
   rank's input by 1/nranks first (rounded to the type) and sums the products in rank order, as
   NCCL's ring and tree kernels do for floating types (ncclDevPreMulSum). bf16 data is summed
   in float and rounded to bf16 once (mode 0) or after every addition (mode 1, as NCCL's hops). */
void fakegpu_set_avg_premul(int premul);

/* Non-blocking communicators: a completed collective still answers ncclInProgress to this many
   ncclCommGetAsyncError polls (default 0); set-up completes no sooner than `init_delay_s` after
   the last rank called ncclCommInitRankConfig (default 0). */
void fakegpu_set_inprogress_polls(int polls);
void fakegpu_set_init_delay(double seconds);

/* Rank `rank`'s ncclCommInitRankConfig starts and never finishes (non-blocking: ncclInProgress
   for ever; it never joins, so its peers never finish either). -1: none. */
void fakegpu_stall_init(int rank);
/* The same for the communicator set-up number `nth` (0: the first) made on `device`: a second
   communicator of a rank (replica groups) whose set-up never finishes. -1: none. */
void fakegpu_stall_init_on(int device, int nth);

/* Rank `rank`'s communicator reports `error` as its asynchronous error once it has enqueued
   `after` collectives; its collective number `after` (counting from 0) is never delivered to
   its peers, as when that rank's GPU or network failed. rank -1: none. after < 0: at once, on
   that rank's live communicators (nothing enqueued: only a poll of the error finds it). */
void fakegpu_inject_async_error(int rank, int after, ncclResult_t error);
/* The same at once on one communicator (a rank's second or third one: a replica or shard group's,
   hybrid sharding's cross-group one), which fakegpu_inject_async_error's rank numbers cannot
   single out (they are the communicator's own). */
void fakegpu_inject_comm_error(ncclComm_t comm, ncclResult_t error);

/* What a communicator carried so far: the collectives this rank posted on it and the sum of their
   counts times the element's size, count as NCCL takes it (an allreduce's or reduce's elements,
   a reduce-scatter's result a rank, an all-gather's contribution a rank, a broadcast's elements).
   0 for NULL or a destroyed communicator. */
unsigned long long fakegpu_comm_bytes(ncclComm_t comm, int *ops);

/* How long a blocking NCCL call or a synchronizing CUDA call waits for peers or a held device
   before it fails (default 60 s): the fake itself never hangs. */
void fakegpu_set_timeout(double seconds);

/* The last ncclUniqueId this process made (ncclGetUniqueId) and the last one a communicator
   was set up with (ncclCommInitRankConfig), as text ("" if none): a test sees which id a rank
   got through ddp.h's store (the id names the process that made it). */
const char *fakegpu_last_made_id(void);
const char *fakegpu_last_joined_id(void);

/* Misuse seen so far (see above) and the first message. */
int fakegpu_misuse_count(void);
const char *fakegpu_misuse_first(void);

/* Communicators, device allocations and events live now (leak checks). */
int fakegpu_live_comms(void);
size_t fakegpu_live_device_bytes(void);
/* What one device holds now (cudaMalloc'd, not freed, and cuMemCreate'd, not released): a
   rank's memory, from its allocations. */
size_t fakegpu_device_bytes(int device);
/* A device of `bytes` (0, the default: no limit): cudaMalloc and cuMemCreate beyond it fail
   with out of memory, as a full GPU's. */
void fakegpu_set_device_memory(int device, size_t bytes);

/* CUDA's virtual memory management (tests/fakegpu/cuda.h's eight driver functions, reached as
   ddp.h reaches them, through cudaGetDriverEntryPointByVersion): a reservation is an mmap
   PROT_NONE; cuMemCreate is physical memory (counted in fakegpu_device_bytes, within
   fakegpu_set_device_memory); cuMemMap + cuMemSetAccess make a granule read-write (filled with
   0xff bytes, NaN floats, as cudaMalloc's: undefined contents show) and device memory to the
   pointer checks; cuMemUnmap drops its pages (madvise DONTNEED) and makes it PROT_NONE again, so
   a host touch of an unmapped granule faults. Misuse counted: a map over a mapped range or of a
   range outside a reservation, an unmap of what is not mapped (or of part of a mapping), a
   release of a handle twice, freeing a reservation that still has mappings, cudaFree of a
   mapped range. The allocation granularity (default 64 KiB, a multiple of the page size, so
   tests with small models see partial release); 0: back to the default. */
void fakegpu_set_vm_granularity(size_t bytes);
/* 1: the driver lacks the virtual memory functions (cudaGetDriverEntryPointByVersion finds
   none of them), as an old driver. */
void fakegpu_set_vm_missing(int missing);
/* Reservations live now, and cuMemCreate handles not released (leak checks). */
int fakegpu_vm_live_reservations(void);
int fakegpu_vm_live_handles(void);
int fakegpu_live_events(void);

#ifdef __cplusplus
}
#endif
#endif
