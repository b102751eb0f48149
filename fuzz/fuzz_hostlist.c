/* fuzz_hostlist.c — libFuzzer target for ddp.h's reading of Slurm's hostlist syntax
   (SLURM_STEP_NODELIST, >>env: ddp__hostlist_nth). Each input is one list. The parser must give
   a count (or -1 with a reason) that is the same whichever host is asked for, names of at least
   one character with no comma or bracket that fit the buffer, and never read or write out of
   bounds or take long (at most 10 million hosts: every call is linear in the list). */
#define DDP_IMPLEMENTATION
#include "../ddp.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    char list[4096], host[64], why[160];
    long n, want[4], i;
    size_t len = size < sizeof list - 1 ? size : sizeof list - 1;
    memcpy(list, data, len);
    list[len] = 0;   /* the environment gives a C string: anything after a NUL is not part of it */
    why[0] = 0;
    n = ddp__hostlist_nth(list, -1, host, sizeof host, why, sizeof why);
    if (n < -1 || n > DDP__HOSTLIST_MAX || host[0]) abort();
    if (n == -1 && !why[0]) abort();   /* a refusal says why */
    want[0] = 0; want[1] = n - 1; want[2] = n / 2; want[3] = n > 0 ? (long)(len * 7919u % (size_t)n) : 0;
    for (i = 0; i < 4 && n > 0; i++) {
        long m = ddp__hostlist_nth(list, want[i], host, sizeof host, why, sizeof why);
        if (m == -1) {   /* only a name too long for the buffer may fail now */
            if (!strstr(why, "is longer than")) abort();
            continue;
        }
        if (m != n || !host[0] || strlen(host) >= sizeof host || strpbrk(host, ",[]")) abort();
    }
    return 0;
}
