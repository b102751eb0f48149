/* gpu_count.cu — prints how many CUDA devices this process sees (0 when there is no driver or
   no device): examples/gpt/train_gpt_run.sh picks the GPU or CPU trainer from it. */
#include <cuda_runtime_api.h>
#include <stdio.h>
int main(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    printf("%d\n", n);
    return 0;
}
