/* bench_sizes.h — the size list every allreduce benchmark takes (bench_allreduce.c,
   mpi_allreduce.c, copy_bw.c; gloo_allreduce.py parses the same syntax): comma-separated byte
   counts with optional K/M/G (powers of 1024, "KiB"/"MB" spellings accepted), each a multiple of
   4 (float32 elements). */
#ifndef BENCH_SIZES_H
#define BENCH_SIZES_H
#include <stdlib.h>

#define BENCH_MAX_SIZES 64
static const char *default_sizes = "64K,256K,1M,4M,16M,25M,64M,256M";

/* Fills out[0..n) and returns n, or -1 for a malformed list (or more than max sizes). */
static int parse_sizes(const char *spec, size_t *out, int max) {
    int n = 0;
    const char *p = spec;
    while (*p) {
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p) return -1;
        switch (*end) {
        case 'k': case 'K': v <<= 10; end++; break;
        case 'm': case 'M': v <<= 20; end++; break;
        case 'g': case 'G': v <<= 30; end++; break;
        default: break;
        }
        if (*end == 'i' || *end == 'I') end++;
        if (*end == 'b' || *end == 'B') end++;
        if ((*end != ',' && *end != 0) || v == 0 || v % 4 != 0 || n >= max) return -1;
        out[n++] = (size_t)v;
        p = *end == ',' ? end + 1 : end;
    }
    return n;
}
#endif
