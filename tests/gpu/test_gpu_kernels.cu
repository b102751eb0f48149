/* test_gpu_kernels.cu — ddp_kernels.cuh against CPU references: AdamW against ddp.h's CPU loop
   (<= 1e-6 relative; the arithmetic is the same, so normally bit for bit), the bf16 step
   (ddp_k_scale_bf16, the bf16 norm, ddp_k_adamw_bf16) against ddp.h's CPU bf16 step bit for bit, the sum of squares
   against float64 (and the same bits twice), ddp.h's norm blocks and their total against its
   CPU functions bit for bit, fp32->bf16 over all 2^32 bit patterns and
   bf16->fp32 over all 2^16 against the CPU's round-to-nearest-even, fill and scale, ZeRO-2's
   shard_accumulate kernels (fp32, bf16) against ddp.h's CPU accumulator bit for bit, and a
   launcher after the caller's polling left cudaErrorNotReady behind.
   Prints "SKIP gpu: ..." and exits 0 without a device. */
#include "../testlib.h"
#include "gpu_common.h"

static __global__ void iota_bits(uint32_t *out, uint32_t base, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = base + (uint32_t)i;
}

static void test_casts(void) {
    const size_t chunk = (size_t)1 << 26;
    uint32_t *d_in;
    uint16_t *d_out, *h_out = (uint16_t *)malloc(chunk * sizeof(uint16_t)), *d_h;
    float *d_f, *h_f = (float *)malloc(65536 * sizeof(float));
    uint64_t base, bad = 0, first_bad = 0;
    size_t i;
    CK(cudaMalloc((void **)&d_in, chunk * 4));
    CK(cudaMalloc((void **)&d_out, chunk * 2));
    for (base = 0; base < ((uint64_t)1 << 32); base += chunk) {
        iota_bits<<<(unsigned)((chunk + 255) / 256), 256>>>(d_in, (uint32_t)base, chunk);
        CK(cudaGetLastError());
        CK(ddp_k_f32_to_bf16((const float *)d_in, d_out, chunk, 0));
        CK(cudaMemcpy(h_out, d_out, chunk * 2, cudaMemcpyDeviceToHost));
        for (i = 0; i < chunk; i++) {
            uint32_t u = (uint32_t)(base + i);
            float f;
            memcpy(&f, &u, 4);
            if (h_out[i] != ddp__to_bf16(f)) { if (!bad) first_bad = base + i; bad++; }
        }
    }
    verdict(bad == 0, "gpu_f32_to_bf16_exhaustive_2^32", "%llu mismatches, first at bits 0x%08llx",
            (unsigned long long)bad, (unsigned long long)first_bad);
    bad = 0;
    CK(cudaMalloc((void **)&d_h, 65536 * 2));
    CK(cudaMalloc((void **)&d_f, 65536 * 4));
    for (i = 0; i < 65536; i++) h_out[i] = (uint16_t)i;
    CK(cudaMemcpy(d_h, h_out, 65536 * 2, cudaMemcpyHostToDevice));
    CK(ddp_k_bf16_to_f32(d_h, d_f, 65536, 0));
    CK(cudaMemcpy(h_f, d_f, 65536 * 4, cudaMemcpyDeviceToHost));
    for (i = 0; i < 65536; i++) {
        float want = ddp__from_bf16((uint16_t)i);
        if (memcmp(&want, &h_f[i], 4)) bad++;
    }
    verdict(bad == 0, "gpu_bf16_to_f32_exhaustive_2^16", "%llu mismatches", (unsigned long long)bad);
    cudaFree(d_in); cudaFree(d_out); cudaFree(d_h); cudaFree(d_f);
    free(h_out); free(h_f);
}

static void test_norm(void) {
    const size_t n = 10000003;   /* odd: the float4 path and its tail */
    float *h = (float *)malloc(n * 4), *d;
    double *partials, *d_out, got[2], ref = 0;
    size_t i;
    for (i = 0; i < n; i++) { h[i] = test_value(7, i) * (i % 11 == 0 ? 1e3f : 1.0f); ref += (double)h[i] * h[i]; }
    CK(cudaMalloc((void **)&d, n * 4));
    CK(cudaMalloc((void **)&partials, DDP_K_NORM_BLOCKS * sizeof(double)));
    CK(cudaMalloc((void **)&d_out, sizeof(double)));
    CK(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice));
    for (i = 0; i < 2; i++) {
        CK(ddp_k_sum_squares(d, n, partials, d_out, 0));
        CK(cudaMemcpy(&got[i], d_out, sizeof(double), cudaMemcpyDeviceToHost));
    }
    verdict(fabs(got[0] - ref) <= 1e-12 * ref, "gpu_sum_squares_vs_float64", "got %.17g, want %.17g", got[0], ref);
    verdict(memcmp(&got[0], &got[1], sizeof(double)) == 0, "gpu_sum_squares_deterministic", "%.17g vs %.17g", got[0], got[1]);
    CK(ddp_k_sum_squares(d + 1, n - 1, partials, d_out, 0));   /* unaligned: the scalar path */
    CK(cudaMemcpy(&got[1], d_out, sizeof(double), cudaMemcpyDeviceToHost));
    ref -= (double)h[0] * h[0];
    verdict(fabs(got[1] - ref) <= 1e-12 * ref, "gpu_sum_squares_unaligned", "got %.17g, want %.17g", got[1], ref);
    cudaFree(d); cudaFree(partials); cudaFree(d_out); free(h);
}

/* ddp.h's norm on the device: the blocks (ddp_k_norm_blocks, and ddp_k_norm_blocks_bf16 of the
   same values rounded to bf16) against ddp__sum_squares (ddp__sum_squares_bf16) per block, and
   their total (ddp_k_sum_doubles) against ddp__norm_sum, bit for bit; grains 1024 (ddp.h's) and
   7 (every tail length of the 8 lanes), an unaligned start, a part of a block. */
static void test_norm_blocks(int bf16) {
    const size_t n = 3000011, grains[2] = { 1024, 7 };
    float *h = (float *)malloc(n * 4), *d;
    ddp_bf16 *h16 = (ddp_bf16 *)malloc(n * 2), *d16;
    double *sums = (double *)malloc((n / 7 + 2) * sizeof(double)), *d_sums, *d_total, total;
    size_t i, k, bad = 0, first_bad = 0;
    int g;
    for (i = 0; i < n; i++) h[i] = test_value(11, i) * (i % 13 == 0 ? 1e4f : i % 5 == 0 ? 1e-3f : 1.0f);
    for (i = 0; i < n; i++) h16[i] = ddp__to_bf16(h[i]);
    CK(cudaMalloc((void **)&d, n * 4));
    CK(cudaMalloc((void **)&d16, n * 2));
    CK(cudaMalloc((void **)&d_sums, (n / 7 + 2) * sizeof(double)));
    CK(cudaMalloc((void **)&d_total, sizeof(double)));
    CK(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d16, h16, n * 2, cudaMemcpyHostToDevice));
    for (g = 0; g < 2; g++) {
        for (k = 0; k < 3; k++) {   /* the whole buffer; from element 1; a count below one block */
            size_t at = k == 1 ? 1 : 0, count = k == 2 ? grains[g] - 1 : n - at, blocks = (count + grains[g] - 1) / grains[g];
            if (bf16) CK(ddp_k_norm_blocks_bf16(d16 + at, count, grains[g], d_sums, 0));
            else CK(ddp_k_norm_blocks(d + at, count, grains[g], d_sums, 0));
            CK(ddp_k_sum_doubles(d_sums, blocks, d_total, 0));
            CK(cudaMemcpy(sums, d_sums, blocks * sizeof(double), cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(&total, d_total, sizeof(double), cudaMemcpyDeviceToHost));
            for (i = 0; i < blocks; i++) {
                size_t len = count - i * grains[g] < grains[g] ? count - i * grains[g] : grains[g];
                double want = bf16 ? ddp__sum_squares_bf16(h16 + at + i * grains[g], len) : ddp__sum_squares(h + at + i * grains[g], len);
                if (memcmp(&want, &sums[i], sizeof want)) { if (!bad) first_bad = i; bad++; }
            }
            {
                double want = ddp__norm_sum(sums, blocks);
                if (memcmp(&want, &total, sizeof want)) {
                    if (!bad) first_bad = (size_t)-1;
                    bad++;
                }
            }
        }
    }
    verdict(bad == 0, bf16 ? "gpu_norm_blocks_bf16_and_total_equal_cpu_bitwise" : "gpu_norm_blocks_and_total_equal_cpu_bitwise",
            "%zu mismatches, first at block %zd", bad, (ssize_t)first_bad);
    cudaFree(d); cudaFree(d16); cudaFree(d_sums); cudaFree(d_total); free(h); free(h16); free(sums);
}

/* AdamW: N0 elements with decay then N1 without (a 16-aligned boundary, as ddp.h lays out). */
static void test_adamw(int offset) {
    enum { N0 = 1 << 20, N1 = 4096 + 16, STEPS = 6 };
    const size_t n = N0 + N1;
    const float lr = 0.01f, b1 = 0.8f, b2 = 0.99f, eps = 1e-6f, wd = 0.1f;
    float *hp = (float *)malloc(n * 4), *hg = (float *)malloc(n * 4), *hm = (float *)calloc(n, 4), *hv = (float *)calloc(n, 4);
    float *got = (float *)malloc(n * 4), *buf;
    unsigned char mask[N0 / DDP_K_MASK_GROUP + N1 / DDP_K_MASK_GROUP], *d_mask;
    double *partials, *norm_sq;
    ddp_k_adamw_state *state;
    size_t i, exact = 0, count = n - (size_t)offset;
    double worst = 0;
    int step;
    char name[96];
    for (i = 0; i < n; i++) hp[i] = 0.5f + 0.5f * fabsf(test_value(1, i));
    for (i = 0; i < sizeof mask; i++) mask[i] = i >= N0 / DDP_K_MASK_GROUP;
    CK(cudaMalloc((void **)&buf, (4 * n + 64) * 4));   /* four buffers 16 floats apart, each up to n + 1 */
    CK(cudaMalloc((void **)&d_mask, sizeof mask));
    CK(cudaMalloc((void **)&partials, DDP_K_NORM_BLOCKS * sizeof(double)));
    CK(cudaMalloc((void **)&norm_sq, sizeof(double)));
    CK(cudaMalloc((void **)&state, sizeof *state));
    CK(cudaMemset(state, 0, sizeof *state));
    CK(cudaMemset(buf, 0, (4 * n + 64) * 4));
    CK(cudaMemcpy(d_mask, mask, sizeof mask, cudaMemcpyHostToDevice));
    float *dp = buf + offset, *dg = buf + n + 16 + offset, *dm = buf + 2 * n + 32 + offset, *dv = buf + 3 * n + 48 + offset;
    if (offset) CK(cudaMalloc((void **)&dv, n * 4));   /* keep one pointer aligned, others not */
    CK(cudaMemcpy(dp, hp + offset, count * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(dm, 0, count * 4));
    CK(cudaMemset(dv, 0, count * 4));
    for (step = 1; step <= STEPS; step++) {
        float max_norm = step % 2 ? 1.0f : 0.0f, clip = 1, step_size, bc2_sqrt;
        double norm;
        for (i = 0; i < n; i++) hg[i] = test_value(100 + (uint64_t)step, i) * (i % 3 ? 0.01f : 1.0f);
        norm = sqrt(ddp__sum_squares(hg + offset, count));
        if (max_norm > 0 && norm > max_norm) clip = (float)(max_norm / (norm + 1e-6));
        step_size = (float)(lr / (1.0 - pow(b1, (double)step)));
        bc2_sqrt = (float)sqrt(1.0 - pow(b2, (double)step));
        ddp__adamw_range(hp + offset, hg + offset, hm + offset, hv + offset, (offset ? N0 - offset : N0), clip, lr, b1, b2, eps, wd, step_size, bc2_sqrt);
        ddp__adamw_range(hp + N0, hg + N0, hm + N0, hv + N0, N1, clip, lr, b1, b2, eps, 0.0f, step_size, bc2_sqrt);
        CK(cudaMemcpy(dg, hg + offset, count * 4, cudaMemcpyHostToDevice));
        CK(ddp_k_sum_squares(dg, count, partials, norm_sq, 0));
        CK(ddp_k_adamw_prepare(state, norm_sq, max_norm, lr, b1, b2, 0));
        /* the mask is indexed from the pointer given: the unaligned run has none and is compared
           only where it decays, [offset, N0) */
        CK(ddp_k_adamw(dp, dg, dm, dv, count, offset ? NULL : d_mask, lr, b1, b2, eps, wd, state, 0));
    }
    CK(cudaMemcpy(got + offset, dp, count * 4, cudaMemcpyDeviceToHost));
    for (i = (size_t)offset; i < (offset ? (size_t)N0 : n); i++) {
        double rel = fabs((double)got[i] - hp[i]) / fabs(hp[i]);
        if (rel > worst) worst = rel;
        exact += memcmp(&got[i], &hp[i], 4) == 0;
    }
    snprintf(name, sizeof name, "gpu_adamw_vs_cpu%s", offset ? "_unaligned_scalar_path" : "_float4_path_with_no_decay_mask");
    verdict(worst <= 1e-6, name, "worst relative error %.3g", worst);
    printf("  (%s: worst relative error %.3g, %zu of %zu elements bit-identical)\n", name, worst, exact,
           (offset ? (size_t)N0 : n) - (size_t)offset);
    cudaFree(buf); cudaFree(d_mask); cudaFree(partials); cudaFree(norm_sq); cudaFree(state);
    if (offset) cudaFree(dv);
    free(hp); free(hg); free(hm); free(hv); free(got);
}

/* bf16 parameters, as ddp.h's NCCL step runs them: bf16 gradients (rescaled by ddp_k_scale_bf16
   now and then, as uneven_inputs' DIVIDE_BY_ACTIVE does), the norm from ddp_k_norm_blocks_bf16 +
   ddp_k_sum_doubles, ddp_k_adamw_prepare, ddp_k_adamw_bf16 on the fp32 master with its bf16
   working copy — against ddp.h's CPU step (ddp__host_scale's rounding, ddp__sum_squares_bf16 per
   block and ddp__norm_sum, ddp__adamw_range_bf16), bit for bit: the scaled gradients, the norm,
   the master, the working copies, m and v after every step. The CPU side takes the step scalars
   the device's prepare computed (pow there is CUDA's, here the host's libm: a last-bit difference
   would say nothing about the kernels); those are compared with the CPU's own within 1 ulp. */
static void test_adamw_bf16(void) {
    enum { N0 = (1 << 20) + 80, N1 = 4096 + 19, STEPS = 6 };   /* N0 a whole number of mask groups; n odd */
    const size_t n = N0 + N1, grain = 1024, blocks = (n + grain - 1) / grain;
    const float lr = 0.01f, b1 = 0.9f, b2 = 0.99f, eps = 1e-8f, wd = 0.1f;
    float *hp = (float *)malloc(n * 4), *hm = (float *)calloc(n, 4), *hv = (float *)calloc(n, 4), *got = (float *)malloc(n * 4);
    ddp_bf16 *hw = (ddp_bf16 *)malloc(n * 2), *hg = (ddp_bf16 *)malloc(n * 2), *got16 = (ddp_bf16 *)malloc(n * 2);
    double *sums = (double *)malloc(blocks * sizeof(double)), *d_sums, *d_norm, norm_dev, norm_cpu;
    unsigned char *mask = (unsigned char *)calloc(n / DDP_K_MASK_GROUP + 1, 1), *d_mask;
    float *dp, *dm, *dv;
    uint16_t *dw, *dg;
    ddp_k_adamw_state *d_state, st;
    size_t i, k;
    int step, bad_step = 0, scalars_off = 0;
    const char *bad_what = "";
    size_t bad_at = 0;
    for (i = 0; i < n; i++) { hp[i] = 0.5f * test_value(21, i); hw[i] = ddp__to_bf16(hp[i]); }
    for (i = N0 / DDP_K_MASK_GROUP; i <= n / DDP_K_MASK_GROUP; i++) mask[i] = 1;   /* the tail: no decay, per group */
    CK(cudaMalloc((void **)&dp, n * 4)); CK(cudaMalloc((void **)&dm, n * 4)); CK(cudaMalloc((void **)&dv, n * 4));
    CK(cudaMalloc((void **)&dw, n * 2)); CK(cudaMalloc((void **)&dg, n * 2));
    CK(cudaMalloc((void **)&d_sums, blocks * sizeof(double))); CK(cudaMalloc((void **)&d_norm, sizeof(double)));
    CK(cudaMalloc((void **)&d_mask, n / DDP_K_MASK_GROUP + 1)); CK(cudaMalloc((void **)&d_state, sizeof st));
    CK(cudaMemset(d_state, 0, sizeof st)); CK(cudaMemset(dm, 0, n * 4)); CK(cudaMemset(dv, 0, n * 4));
    CK(cudaMemcpy(dp, hp, n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, hw, n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_mask, mask, n / DDP_K_MASK_GROUP + 1, cudaMemcpyHostToDevice));
    for (step = 1; step <= STEPS && !bad_step; step++) {
        float factor = step % 2 ? 1.0f : 2.0f / 3.0f, max_norm = step % 3 ? 1.0f : 0.0f, clip = 1, step_size, bc2_sqrt;
        for (i = 0; i < n; i++) hg[i] = ddp__to_bf16(test_value(200 + (uint64_t)step, i) * (i % 3 ? 0.01f : 0.5f));
        CK(cudaMemcpy(dg, hg, n * 2, cudaMemcpyHostToDevice));
        if (factor != 1.0f) {
            for (i = 0; i < n; i++) hg[i] = ddp__to_bf16(ddp__from_bf16(hg[i]) * factor);   /* ddp__host_scale */
            CK(ddp_k_scale_bf16(dg, n, factor, 0));
            CK(cudaMemcpy(got16, dg, n * 2, cudaMemcpyDeviceToHost));
            for (i = 0; i < n && !bad_step; i++)
                if (got16[i] != hg[i]) { bad_step = step; bad_what = "scaled gradient"; bad_at = i; }
        }
        for (k = 0; k < blocks; k++) sums[k] = ddp__sum_squares_bf16(hg + k * grain, k + 1 < blocks ? grain : n - k * grain);
        norm_cpu = ddp__norm_sum(sums, blocks);
        CK(ddp_k_norm_blocks_bf16(dg, n, grain, d_sums, 0));
        CK(ddp_k_sum_doubles(d_sums, blocks, d_norm, 0));
        CK(ddp_k_adamw_prepare(d_state, d_norm, max_norm, lr, b1, b2, 0));
        CK(ddp_k_adamw_bf16(dp, dw, dg, dm, dv, n, d_mask, lr, b1, b2, eps, wd, d_state, 0));
        CK(cudaMemcpy(&norm_dev, d_norm, sizeof norm_dev, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(&st, d_state, sizeof st, cudaMemcpyDeviceToHost));
        if (!bad_step && memcmp(&norm_dev, &norm_cpu, sizeof norm_dev)) { bad_step = step; bad_what = "norm"; }
        /* the CPU's own scalars (ddp__adamw_prepare): within 1 ulp of the device's */
        if (max_norm > 0 && sqrt(norm_cpu) > max_norm) clip = (float)(max_norm / (sqrt(norm_cpu) + 1e-6));
        step_size = (float)(lr / (1.0 - pow(b1, (double)step)));
        bc2_sqrt = (float)sqrt(1.0 - pow(b2, (double)step));
        scalars_off += fabsf(clip - st.clip) > ldexpf(1.0f, -23) * clip || fabsf(step_size - st.step_size) > ldexpf(1.0f, -23) * step_size ||
                       fabsf(bc2_sqrt - st.bc2_sqrt) > ldexpf(1.0f, -23) * bc2_sqrt || st.step != step || st.skip;
        ddp__adamw_range_bf16(hp, hw, hg, hm, hv, N0, st.clip, lr, b1, b2, eps, wd, st.step_size, st.bc2_sqrt);
        ddp__adamw_range_bf16(hp + N0, hw + N0, hg + N0, hm + N0, hv + N0, N1, st.clip, lr, b1, b2, eps, 0.0f, st.step_size, st.bc2_sqrt);
        CK(cudaMemcpy(got, dp, n * 4, cudaMemcpyDeviceToHost));
        for (i = 0; i < n && !bad_step; i++) if (memcmp(&got[i], &hp[i], 4)) { bad_step = step; bad_what = "master"; bad_at = i; }
        CK(cudaMemcpy(got16, dw, n * 2, cudaMemcpyDeviceToHost));
        for (i = 0; i < n && !bad_step; i++) if (got16[i] != hw[i]) { bad_step = step; bad_what = "working copy"; bad_at = i; }
        CK(cudaMemcpy(got, dm, n * 4, cudaMemcpyDeviceToHost));
        for (i = 0; i < n && !bad_step; i++) if (memcmp(&got[i], &hm[i], 4)) { bad_step = step; bad_what = "m"; bad_at = i; }
        CK(cudaMemcpy(got, dv, n * 4, cudaMemcpyDeviceToHost));
        for (i = 0; i < n && !bad_step; i++) if (memcmp(&got[i], &hv[i], 4)) { bad_step = step; bad_what = "v"; bad_at = i; }
    }
    verdict(bad_step == 0, "gpu_adamw_bf16_and_scale_bf16_vs_cpu_bitwise", "first difference at step %d: the %s, element %zu",
            bad_step, bad_what, bad_at);
    verdict(scalars_off == 0 && st.diverged == 0, "gpu_adamw_bf16_step_scalars_match_cpu",
            "%d step(s) with clip/step_size/bc2_sqrt beyond 1 ulp of the CPU's, or a wrong count; %llu diverged", scalars_off,
            st.diverged);
    printf("  (%d steps over %zu bf16 parameters (the last %d without decay), rescaled every other step)\n", STEPS, n, (int)N1);
    cudaFree(dp); cudaFree(dm); cudaFree(dv); cudaFree(dw); cudaFree(dg); cudaFree(d_sums); cudaFree(d_norm); cudaFree(d_mask);
    cudaFree(d_state);
    free(hp); free(hm); free(hv); free(got); free(hw); free(hg); free(got16); free(sums); free(mask);
}

/* Non-finite gradients: prepare marks the step skipped, AdamW changes nothing, the step count stays. */
static void test_adamw_skip(void) {
    const size_t n = 1024;
    float *d, h[1024], before[1024];
    double *partials, *norm_sq;
    ddp_k_adamw_state *state, st;
    size_t i;
    CK(cudaMalloc((void **)&d, 4 * n * 4));
    CK(cudaMalloc((void **)&partials, DDP_K_NORM_BLOCKS * sizeof(double)));
    CK(cudaMalloc((void **)&norm_sq, sizeof(double)));
    CK(cudaMalloc((void **)&state, sizeof *state));
    CK(cudaMemset(state, 0, sizeof *state));
    CK(cudaMemset(d, 0, 4 * n * 4));
    CK(ddp_k_fill(d, n, 1.5f, 0));
    CK(ddp_k_fill(d + n, n, 2.0f, 0));
    CK(ddp_k_scale(d + n, n, 0.25f, 0));   /* grads 0.5 */
    CK(cudaMemcpy(before, d, n * 4, cudaMemcpyDeviceToHost));
    h[0] = NAN;
    CK(cudaMemcpy(d + n + 3, h, 4, cudaMemcpyHostToDevice));
    CK(ddp_k_sum_squares(d + n, n, partials, norm_sq, 0));
    CK(ddp_k_adamw_prepare(state, norm_sq, 0.0f, 0.1f, 0.9f, 0.999f, 0));
    CK(ddp_k_adamw(d, d + n, d + 2 * n, d + 3 * n, n, NULL, 0.1f, 0.9f, 0.999f, 1e-8f, 0.1f, state, 0));
    CK(cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&st, state, sizeof st, cudaMemcpyDeviceToHost));
    verdict(memcmp(h, before, sizeof h) == 0 && st.skip == 1 && st.skipped == 1 && st.step == 0,
            "gpu_adamw_skips_nonfinite_on_device", "skip %d skipped %lld step %lld", st.skip, st.skipped, st.step);
    CK(cudaMemcpy(h, d + n, n * 4, cudaMemcpyDeviceToHost));
    for (i = 0; i < n && (i == 3 || h[i] == 0.5f); i++) {}
    verdict(i == n, "gpu_fill_and_scale", "element %zu is %g", i, i < n ? h[i] : 0.0f);
    cudaFree(d); cudaFree(partials); cudaFree(norm_sq); cudaFree(state);
}

/* A caller that polls (cudaEventQuery on unfinished work) leaves cudaErrorNotReady as the
   thread's last error; a launcher must not report it as its own launch failing. */
static void test_stale_not_ready(void) {
    cudaEvent_t e;
    cudaError_t q, launched, after;
    float *d;
    CK(cudaMalloc((void **)&d, 1024 * sizeof(float)));
    CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CK(ddp_k_spin(200.0, 0));
    CK(cudaEventRecord(e, 0));
    q = cudaEventQuery(e);
    launched = ddp_k_fill(d, 1024, 1.0f, 0);
    after = cudaGetLastError();
    verdict(q == cudaErrorNotReady && launched == cudaSuccess && after == cudaSuccess, "gpu_launcher_ignores_a_stale_not_ready",
            "query %s, launch %s, then %s", cudaGetErrorName(q), cudaGetErrorName(launched), cudaGetErrorName(after));
    CK(cudaDeviceSynchronize());
    cudaEventDestroy(e);
    cudaFree(d);
}

/* ZeRO-2's shard_accumulate on the device: three micro-steps (copy, add, the final sum into g)
   of fp32 and bf16 gradients against ddp.h's CPU accumulator's loop, bit for bit. */
static void test_accumulate(void) {
    enum { N = 100003, MICRO = 3 };
    float *acc = (float *)malloc(N * 4), *g = (float *)malloc(N * 4), *ref = (float *)malloc(N * 4), *d_acc, *d_g;
    uint16_t *gb = (uint16_t *)malloc(N * 2), *d_gb;
    size_t i, bad = 0, bad_bf16 = 0;
    int u, bf16;
    CK(cudaMalloc((void **)&d_acc, N * 4));
    CK(cudaMalloc((void **)&d_g, N * 4));
    CK(cudaMalloc((void **)&d_gb, N * 2));
    for (bf16 = 0; bf16 < 2; bf16++)
        for (u = 0; u < MICRO; u++) {
            int mode = u == MICRO - 1 ? DDP_K_ACC_FINAL : u == 0 ? DDP_K_ACC_FIRST : DDP_K_ACC_ADD;
            for (i = 0; i < N; i++) {
                g[i] = (float)test_value(31 * (uint64_t)u + 7 * (uint64_t)bf16, i) * (i % 5 == 0 ? 1e-30f : i % 7 == 0 ? 1e20f : 1.0f);
                if (i % 11 == 0) g[i] = -0.0f;
                gb[i] = ddp__to_bf16(g[i]);
            }
            if (bf16) CK(cudaMemcpy(d_gb, gb, N * 2, cudaMemcpyHostToDevice));
            else CK(cudaMemcpy(d_g, g, N * 4, cudaMemcpyHostToDevice));
            CK(bf16 ? ddp_k_accumulate_bf16(d_acc, d_gb, N, mode, 0) : ddp_k_accumulate(d_acc, d_g, N, mode, 0));
            for (i = 0; i < N; i++) {   /* ddp__z2_accumulate's loop */
                float w = bf16 ? ddp__from_bf16(gb[i]) : g[i];
                if (mode == DDP_K_ACC_FIRST) ref[i] = w;
                else if (mode == DDP_K_ACC_ADD) ref[i] = ref[i] + w;
                else if (bf16) gb[i] = ddp__to_bf16(ref[i] + w);
                else g[i] = ref[i] + w;
            }
            CK(cudaMemcpy(acc, d_acc, N * 4, cudaMemcpyDeviceToHost));
            for (i = 0; i < N; i++) (bf16 ? bad_bf16 : bad) += memcmp(&acc[i], &ref[i], 4) != 0;
            if (mode == DDP_K_ACC_FINAL && bf16) {
                uint16_t *out = (uint16_t *)malloc(N * 2);
                CK(cudaMemcpy(out, d_gb, N * 2, cudaMemcpyDeviceToHost));
                for (i = 0; i < N; i++) bad_bf16 += out[i] != gb[i];
                free(out);
            } else if (mode == DDP_K_ACC_FINAL) {
                float *out = (float *)malloc(N * 4);
                CK(cudaMemcpy(out, d_g, N * 4, cudaMemcpyDeviceToHost));
                for (i = 0; i < N; i++) bad += memcmp(&out[i], &g[i], 4) != 0;
                free(out);
            }
        }
    verdict(bad == 0, "gpu_accumulate_vs_cpu_zero2_accumulator_bitwise", "%zu element-steps differ", bad);
    verdict(bad_bf16 == 0, "gpu_accumulate_bf16_vs_cpu_zero2_accumulator_bitwise", "%zu element-steps differ", bad_bf16);
    cudaFree(d_acc); cudaFree(d_g); cudaFree(d_gb);
    free(acc); free(g); free(ref); free(gb);
}

int main(void) {
    gpu_require_device();
    test_stale_not_ready();
    printf("  (device: %s)\n", gpu_name());
    test_adamw(0);
    test_adamw(1);
    test_adamw_bf16();
    test_adamw_skip();
    test_norm();
    test_norm_blocks(0);
    test_norm_blocks(1);
    test_casts();
    test_accumulate();
    return test_summary("test_gpu_kernels");
}
