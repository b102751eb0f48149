/* test_gpu_overlap.cu — overlap on CUDA streams shown, not assumed. One rank on the NCCL
   backend; a synthetic backward of LAYERS ops, each a 2 ms spin kernel on the compute stream
   that then finishes one parameter's gradient; every bucket's allreduce is slowed by an
   injected 1.5 ms spin on the comm stream (inject_comm_latency_ms, tests only). With one bucket
   per layer, the comm stream works while the compute stream computes: the step, timed with
   events, must cost well under compute + all comm, and the step stats (from events) must say
   the same. Prints "SKIP gpu: ..." without a device. */
#include "../testlib.h"
#include "gpu_common.h"

enum { LAYERS = 8, WARMUP = 3, MEASURED = 5 };
static const size_t LAYER_FLOATS = (size_t)1 << 20;   /* 4 MiB: one bucket each */
static const double COMPUTE_MS = 2.0, COMM_MS = 1.5;

int main(void) {
    cudaStream_t stream;
    cudaEvent_t t0, t1;
    ddp_context *ddp;
    ddp_desc d;
    int ids[LAYERS], l, step;
    float step_ms = 0, ms;
    double serial_ms = LAYERS * (COMPUTE_MS + COMM_MS), compute_ms = LAYERS * COMPUTE_MS;
    ddp_step_stats st;
    char name[64];
    gpu_require_device();
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    memset(&d, 0, sizeof d);
    d.world_size = 1;
    d.backend = DDP_BACKEND_NCCL;
    d.cuda_stream = stream;
    d.bucket_cap_mb = 4;
    d.first_bucket_mb = 4;
    d.inject_comm_latency_ms = COMM_MS;
    if (ddp_init(&ddp, &d) != DDP_OK) { printf("FAIL gpu_overlap_init: %s\n", ddp_last_error(ddp)); return 1; }
    for (l = 0; l < LAYERS; l++) {
        snprintf(name, sizeof name, "layer%d", l);
        ddp_register_param(ddp, name, LAYER_FLOATS, 0, NULL, &ids[l]);
    }
    if (ddp_commit(ddp) != DDP_OK) { printf("FAIL gpu_overlap_commit: %s\n", ddp_last_error(ddp)); return 1; }
    for (step = 0; step < WARMUP + MEASURED; step++) {
        if (step == WARMUP) CK(cudaEventRecord(t0, stream));
        ddp_zero_grad(ddp);
        for (l = LAYERS - 1; l >= 0; l--) {     /* backward: last layer first */
            CK(ddp_k_spin(COMPUTE_MS, stream));
            CK(ddp_k_fill(ddp_grad(ddp, ids[l]), LAYER_FLOATS, 1e-3f * (float)(l + 1), stream));
            if (ddp_grad_ready(ddp, ids[l]) != DDP_OK) { printf("FAIL gpu_overlap_ready: %s\n", ddp_last_error(ddp)); return 1; }
        }
        if (ddp_finish(ddp) != DDP_OK) { printf("FAIL gpu_overlap_finish: %s\n", ddp_last_error(ddp)); return 1; }
    }
    {   /* the GPU is steps behind: the stats' event queries find them unfinished (NotReady),
           and must not leave that behind for the program's next cudaGetLastError */
        cudaError_t stale;
        (void)ddp_last_step_stats(ddp);
        stale = cudaGetLastError();
        verdict(stale == cudaSuccess, "gpu_event_queries_leave_no_stale_error", "cudaGetLastError after ddp_last_step_stats: %s",
                cudaGetErrorName(stale));
    }
    CK(cudaEventRecord(t1, stream));
    CK(cudaEventSynchronize(t1));
    CK(cudaEventElapsedTime(&ms, t0, t1));
    step_ms = ms / MEASURED;
    st = ddp_last_step_stats(ddp);
    printf("  (device %s: step %.2f ms; compute %.1f ms, compute + all comm %.1f ms; stats: backward %.2f, "
           "comm %.2f, exposed %.2f, last bucket %.2f ms, overlap %.0f%%, %d buckets)\n", gpu_name(), step_ms,
           compute_ms, serial_ms, st.backward_ms, st.comm_ms, st.exposed_ms, st.last_bucket_comm_ms, st.overlap_pct,
           st.buckets_launched);
    verdict(st.buckets_launched == LAYERS, "gpu_overlap_one_bucket_per_layer", "%d buckets", st.buckets_launched);
    /* hidden: all comm but the last bucket's, give or take launch gaps */
    verdict(step_ms < compute_ms + 0.5 * LAYERS * COMM_MS, "gpu_overlap_step_time_hides_comm",
            "step %.2f ms is not below compute + half the comm (%.2f ms)", step_ms, compute_ms + 0.5 * LAYERS * COMM_MS);
    verdict(st.comm_ms >= 0.9 * LAYERS * COMM_MS && st.exposed_ms < 0.5 * st.comm_ms && st.overlap_pct > 50,
            "gpu_overlap_stats_from_events", "comm %.2f ms, exposed %.2f ms, overlap %.0f%%", st.comm_ms, st.exposed_ms, st.overlap_pct);
    if (ddp_shutdown(ddp) != DDP_OK) { printf("FAIL gpu_overlap_shutdown\n"); return 1; }
    return test_summary("test_gpu_overlap");
}
