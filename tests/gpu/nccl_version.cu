/* Prints the NCCL version the binaries load (e.g. 22809 for 2.28.9): tests/gpu/run.sh decides
   from it whether several ranks may share one GPU (NCCL >= 2.30.3). */
#include <nccl.h>
#include <stdio.h>
int main(void) {
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess) return 1;
    printf("%d\n", v);
    return 0;
}
