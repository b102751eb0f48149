/* fake_vm.c — CUDA's virtual memory management, faked in host memory (see fakegpu.h): an
   address reservation is an mmap PROT_NONE, physical memory a counted handle, a map an
   mprotect read-write (at cuMemSetAccess, as a GPU's range is usable only then), an unmap a
   madvise DONTNEED + PROT_NONE. The checks are those a driver makes (or a GPU faults on). */
#define _GNU_SOURCE
#include "fake_internal.h"
#include "cuda.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PHYS_MAGIC 0x9e75u
#define DEFAULT_GRAN ((size_t)64 << 10)

typedef struct phys {              /* a cuMemCreate handle */
    unsigned magic;
    size_t size;
    int device;
    int released;                  /* cuMemRelease'd: freed once no mapping uses it */
    int maps;
} phys;

typedef struct reservation {
    char *base;                    /* gran-aligned */
    size_t size;
    char *raw;                     /* what mmap returned (alignment trimmed off) */
    size_t raw_size;
    int live;
} reservation;

typedef struct mapping {
    char *base;
    size_t size;
    phys *ph;
    int accessible;                /* cuMemSetAccess'd: registered as device memory */
    int live;
} mapping;

static size_t gran = DEFAULT_GRAN;
static int vm_missing;
static reservation *res;
static int nres, cap_res;
static mapping *maps;
static int nmaps, cap_maps;
static size_t phys_bytes[FAKEGPU_MAX_DEVICES];
static int live_handles;

void fakegpu_vm_reset_locked(void) { gran = DEFAULT_GRAN; vm_missing = 0; }
size_t fakegpu_vm_phys_bytes_locked(int device) {
    size_t total = 0;
    int d;
    for (d = 0; d < FAKEGPU_MAX_DEVICES; d++) if (device < 0 || d == device) total += phys_bytes[d];
    return total;
}
void fakegpu_set_vm_granularity(size_t bytes) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    pthread_mutex_lock(&fakegpu_lock);
    gran = bytes ? (bytes + page - 1) / page * page : DEFAULT_GRAN;
    pthread_mutex_unlock(&fakegpu_lock);
}
void fakegpu_set_vm_missing(int missing) { vm_missing = missing; }
int fakegpu_vm_live_reservations(void) {
    int i, n = 0;
    pthread_mutex_lock(&fakegpu_lock);
    for (i = 0; i < nres; i++) n += res[i].live;
    pthread_mutex_unlock(&fakegpu_lock);
    return n;
}
int fakegpu_vm_live_handles(void) {
    int n;
    pthread_mutex_lock(&fakegpu_lock);
    n = live_handles;
    pthread_mutex_unlock(&fakegpu_lock);
    return n;
}

static reservation *find_res_locked(const char *p, size_t size) {
    int i;
    for (i = 0; i < nres; i++)
        if (res[i].live && p >= res[i].base && p < res[i].base + res[i].size && size <= (size_t)(res[i].base + res[i].size - p))
            return &res[i];
    return NULL;
}

static int prop_ok(const CUmemAllocationProp *prop) {
    return prop && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
           prop->location.id >= 0 && prop->location.id < FAKEGPU_MAX_DEVICES;
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option) {
    (void)option;
    if (!granularity || !prop_ok(prop)) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fakegpu_lock);
    *granularity = gran;
    pthread_mutex_unlock(&fakegpu_lock);
    return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags) {
    size_t align, raw_size;
    char *raw, *base;
    reservation *r = NULL;
    int i;
    (void)addr;
    if (!ptr || !size || flags) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fakegpu_lock);
    align = alignment > gran ? alignment : gran;
    if (size % gran) {
        size_t g = gran;
        pthread_mutex_unlock(&fakegpu_lock);
        fakegpu_misuse("cuMemAddressReserve(%zu bytes): not a multiple of the granularity %zu", size, g);
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&fakegpu_lock);
    raw_size = size + align;
    raw = (char *)mmap(NULL, raw_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == (char *)MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    base = (char *)(((uintptr_t)raw + align - 1) / align * align);
    pthread_mutex_lock(&fakegpu_lock);
    for (i = 0; i < nres; i++) if (!res[i].live) { r = &res[i]; break; }
    if (!r) {
        if (nres == cap_res) {
            int cap = cap_res ? 2 * cap_res : 16;
            reservation *grown = (reservation *)realloc(res, sizeof *res * (size_t)cap);
            if (!grown) { pthread_mutex_unlock(&fakegpu_lock); munmap(raw, raw_size); return CUDA_ERROR_OUT_OF_MEMORY; }
            res = grown;
            cap_res = cap;
        }
        r = &res[nres++];
    }
    r->base = base; r->size = size; r->raw = raw; r->raw_size = raw_size; r->live = 1;
    pthread_mutex_unlock(&fakegpu_lock);
    *ptr = (CUdeviceptr)(uintptr_t)base;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    char *p = (char *)(uintptr_t)ptr;
    reservation *r;
    char *raw;
    size_t raw_size;
    int i;
    pthread_mutex_lock(&fakegpu_lock);
    r = find_res_locked(p, size);
    if (!r || r->base != p || r->size != size) {
        pthread_mutex_unlock(&fakegpu_lock);
        fakegpu_misuse("cuMemAddressFree(%p, %zu bytes): not a live reservation", (void *)p, size);
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (i = 0; i < nmaps; i++)
        if (maps[i].live && maps[i].base >= r->base && maps[i].base < r->base + r->size) {
            pthread_mutex_unlock(&fakegpu_lock);
            fakegpu_misuse("cuMemAddressFree(%p, %zu bytes): the range still has mappings (at %p)", (void *)p, size,
                           (void *)maps[i].base);
            return CUDA_ERROR_INVALID_VALUE;
        }
    r->live = 0;
    raw = r->raw; raw_size = r->raw_size;
    pthread_mutex_unlock(&fakegpu_lock);
    munmap(raw, raw_size);
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags) {
    phys *ph;
    int dev;
    if (!handle || !prop_ok(prop) || flags || !size) return CUDA_ERROR_INVALID_VALUE;
    dev = prop->location.id;
    pthread_mutex_lock(&fakegpu_lock);
    if (size % gran) {
        pthread_mutex_unlock(&fakegpu_lock);
        fakegpu_misuse("cuMemCreate(%zu bytes): not a multiple of the granularity", size);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!fakegpu_device_fits_locked(dev, size)) { pthread_mutex_unlock(&fakegpu_lock); return CUDA_ERROR_OUT_OF_MEMORY; }
    if (!(ph = (phys *)calloc(1, sizeof *ph))) { pthread_mutex_unlock(&fakegpu_lock); return CUDA_ERROR_OUT_OF_MEMORY; }
    ph->magic = PHYS_MAGIC; ph->size = size; ph->device = dev;
    phys_bytes[dev] += size;
    live_handles++;
    pthread_mutex_unlock(&fakegpu_lock);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)ph;
    return CUDA_SUCCESS;
}

static void phys_free_locked(phys *ph) {
    phys_bytes[ph->device] -= ph->size;
    live_handles--;
    ph->magic = 0;
    free(ph);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    phys *ph = (phys *)(uintptr_t)handle;
    pthread_mutex_lock(&fakegpu_lock);
    if (!ph || ph->magic != PHYS_MAGIC || ph->released) {
        pthread_mutex_unlock(&fakegpu_lock);
        fakegpu_misuse("cuMemRelease(%#llx): not a live allocation handle", handle);
        return CUDA_ERROR_INVALID_VALUE;
    }
    ph->released = 1;
    if (!ph->maps) phys_free_locked(ph);   /* else at its last unmap, as the driver defers it */
    pthread_mutex_unlock(&fakegpu_lock);
    return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags) {
    char *p = (char *)(uintptr_t)ptr;
    phys *ph = (phys *)(uintptr_t)handle;
    mapping *m = NULL;
    int i;
    if (flags || !size) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fakegpu_lock);
    if (!ph || ph->magic != PHYS_MAGIC || ph->released || offset > ph->size || size > ph->size - offset) {
        pthread_mutex_unlock(&fakegpu_lock);
        fakegpu_misuse("cuMemMap(%p, %zu bytes): not a live handle, or the handle is smaller than offset + size", (void *)p, size);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!find_res_locked(p, size) || (uintptr_t)p % gran || size % gran || offset % gran) {
        pthread_mutex_unlock(&fakegpu_lock);
        fakegpu_misuse("cuMemMap(%p, %zu bytes): outside a reservation or not aligned to the granularity", (void *)p, size);
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (i = 0; i < nmaps; i++)
        if (maps[i].live && maps[i].base < p + size && p < maps[i].base + maps[i].size) {
            pthread_mutex_unlock(&fakegpu_lock);
            fakegpu_misuse("cuMemMap(%p, %zu bytes): over a mapped range (%p)", (void *)p, size, (void *)maps[i].base);
            return CUDA_ERROR_INVALID_VALUE;
        }
    for (i = 0; i < nmaps; i++) if (!maps[i].live) { m = &maps[i]; break; }
    if (!m) {
        if (nmaps == cap_maps) {
            int cap = cap_maps ? 2 * cap_maps : 64;
            mapping *grown = (mapping *)realloc(maps, sizeof *maps * (size_t)cap);
            if (!grown) { pthread_mutex_unlock(&fakegpu_lock); return CUDA_ERROR_OUT_OF_MEMORY; }
            maps = grown;
            cap_maps = cap;
        }
        m = &maps[nmaps++];
    }
    m->base = p; m->size = size; m->ph = ph; m->accessible = 0; m->live = 1;
    ph->maps++;
    pthread_mutex_unlock(&fakegpu_lock);
    return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    char *p = (char *)(uintptr_t)ptr, *at = p;
    int i;
    if (!desc || count != 1 || desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        return CUDA_ERROR_INVALID_VALUE;   /* ddp.h asks for read-write on one device: anything else is not modelled */
    pthread_mutex_lock(&fakegpu_lock);
    /* every byte of the range must be mapped: walk the mappings in address order */
    while (at < p + size) {
        mapping *m = NULL;
        for (i = 0; i < nmaps; i++) if (maps[i].live && maps[i].base == at) { m = &maps[i]; break; }
        if (!m || m->base + m->size > p + size || m->ph->device != desc->location.id) {
            pthread_mutex_unlock(&fakegpu_lock);
            fakegpu_misuse("cuMemSetAccess(%p, %zu bytes): at %p no mapping (of device %d) begins that lies in the range",
                           (void *)p, size, (void *)at, desc->location.id);
            return CUDA_ERROR_INVALID_VALUE;
        }
        at += m->size;
    }
    for (at = p; at < p + size;) {
        mapping *m = NULL;
        for (i = 0; i < nmaps; i++) if (maps[i].live && maps[i].base == at) { m = &maps[i]; break; }
        if (!m->accessible) {
            if (mprotect(m->base, m->size, PROT_READ | PROT_WRITE) != 0 || !fakegpu_vm_register_locked(m->base, m->size, m->ph->device)) {
                pthread_mutex_unlock(&fakegpu_lock);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            memset(m->base, 0xff, m->size);   /* undefined contents read as NaN, like cudaMalloc's */
            m->accessible = 1;
        }
        at += m->size;
    }
    pthread_mutex_unlock(&fakegpu_lock);
    return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    char *p = (char *)(uintptr_t)ptr, *at = p;
    int i;
    pthread_mutex_lock(&fakegpu_lock);
    while (at < p + size) {   /* the range must be whole mappings, end to end */
        mapping *m = NULL;
        for (i = 0; i < nmaps; i++) if (maps[i].live && maps[i].base == at) { m = &maps[i]; break; }
        if (!m || m->base + m->size > p + size) {
            pthread_mutex_unlock(&fakegpu_lock);
            fakegpu_misuse("cuMemUnmap(%p, %zu bytes): at %p nothing is mapped, or a mapping leaves the range", (void *)p,
                           size, (void *)at);
            return CUDA_ERROR_INVALID_VALUE;
        }
        at += m->size;
    }
    if (!size) {
        pthread_mutex_unlock(&fakegpu_lock);
        fakegpu_misuse("cuMemUnmap(%p, 0 bytes)", (void *)p);
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (at = p; at < p + size;) {
        mapping *m = NULL;
        for (i = 0; i < nmaps; i++) if (maps[i].live && maps[i].base == at) { m = &maps[i]; break; }
        if (m->accessible) fakegpu_vm_unregister_locked(m->base);
        madvise(m->base, m->size, MADV_DONTNEED);
        mprotect(m->base, m->size, PROT_NONE);
        m->live = 0;
        if (--m->ph->maps == 0 && m->ph->released) phys_free_locked(m->ph);
        at += m->size;
    }
    pthread_mutex_unlock(&fakegpu_lock);
    return CUDA_SUCCESS;
}

/* ---- the runtime's way to the driver (fake_cuda.c has the rest of the runtime) ---- */
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                                             unsigned long long flags, enum cudaDriverEntryPointQueryResult *driverStatus) {
    static const struct { const char *name; void (*fn)(void); } table[] = {
        { "cuMemAddressReserve", (void (*)(void))cuMemAddressReserve },
        { "cuMemAddressFree", (void (*)(void))cuMemAddressFree },
        { "cuMemCreate", (void (*)(void))cuMemCreate },
        { "cuMemRelease", (void (*)(void))cuMemRelease },
        { "cuMemMap", (void (*)(void))cuMemMap },
        { "cuMemUnmap", (void (*)(void))cuMemUnmap },
        { "cuMemSetAccess", (void (*)(void))cuMemSetAccess },
        { "cuMemGetAllocationGranularity", (void (*)(void))cuMemGetAllocationGranularity },
    };
    size_t i;
    if (!symbol || !funcPtr || flags > cudaEnablePerThreadDefaultStream) return cudaErrorInvalidValue;
    *funcPtr = NULL;
    if (driverStatus) *driverStatus = cudaDriverEntryPointSymbolNotFound;
    if (vm_missing) return cudaSuccess;
    for (i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(symbol, table[i].name)) {
            if (cudaVersion < 10020) {   /* the virtual memory functions are CUDA 10.2's */
                if (driverStatus) *driverStatus = cudaDriverEntryPointVersionNotSufficent;
                return cudaSuccess;
            }
            memcpy(funcPtr, &table[i].fn, sizeof *funcPtr);
            if (driverStatus) *driverStatus = cudaDriverEntryPointSuccess;
            return cudaSuccess;
        }
    return cudaSuccess;
}
