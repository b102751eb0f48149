/* train_gpt.c — train the tiny byte-level GPT (examples/gpt/gpt.h) data-parallel with ddp.h.

       make build/train_gpt && build/ddprun -n 2 build/train_gpt --data input.txt --steps 500

   One source, two builds. A C compiler makes the CPU trainer (build/train_gpt). nvcc (-x cu)
   makes build/gpu/train_gpt, which runs the CUDA model (gpt_cuda.cuh) when ddp.h picks its NCCL
   backend (a GPU is visible) and gpt.h's CPU model otherwise (or with --cpu), so one binary
   serves both kinds of machine. -DGPT_CUDA_EMULATE with a C++ compiler runs the CUDA model's
   code on the host (tests: the GPU path of this file without a GPU).

   Every optimizer step takes a global batch of world x batch x grad-accum windows of seq+1 bytes
   from the first 90% of the file, in epochs: ddp.h's distributed sampler (ddp_sample) gives
   each rank its disjoint share of each epoch's permutation of the windows, and global batches are
   consecutive positions of the epoch (gpt_data.h: gpt_batch_position), so N ranks train exactly what
   1 rank trains at N x batch, and the step alone says where the data stand (a checkpoint needs
   nothing more). Validation: the last 10%, the same fixed windows every time, averaged over
   ranks. Run with --help for the flags. */
#define DDP_IMPLEMENTATION
#define DDP_TEST_KILL_POINTS   /* its tests kill rank 0 inside ddp_save (DDP_TEST_DIE_IN_CHECKPOINT) */
#include "../../ddp.h"
#include "gpt.h"
#include "gpt_data.h"   /* the training file and the windows each rank trains on */
#if defined(__CUDACC__) || defined(GPT_CUDA_EMULATE)
#define TRAIN_CUDA_MODEL 1
#include "gpt_cuda.cuh"
#endif
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct options {
    const char *data, *save, *resume, *dump_init, *prompt;
    gpt_config model;
    int steps, warmup, accum, eval_every, eval_batches, sample, top_k, stop_at, save_every, log_every;
    int cpu, tf32, bf16;           /* --cpu: CPU backend and model even where a GPU is; --tf32; --bf16 */
    int shard;                     /* --shard LEVEL: ddp_desc.shard (a ddp_shard; 0: ddp.h's default, so DDP_SHARD
                                      may choose); after ddp_init the level ddp.h resolved */
    int shard_optimizer;           /* --shard-optimizer: ddp_desc.shard_optimizer = 1, which is --shard optimizer
                                      (the field, so that DDP_SHARD_OPTIMIZER=0 still overrides it) */
    int shard_group;               /* --shard-group N: ddp_desc.shard_group (hybrid: shard within N consecutive ranks) */
    int prefetch_off;              /* --prefetch off: ddp_desc.shard_prefetch_off = 1 (ZeRO-3 gathers each unit when needed) */
    int fresh;                     /* --fresh: --save PATH starts over even where PATH holds a checkpoint */
    float lr, min_lr, wd, clip, beta1, beta2, temperature, bucket_mb, dropout;
    float inject_latency_ms, inject_gbps;   /* ddp.h's emulated network (benchmarks: tools/scaling.py) */
    float straggler_pct;           /* --straggler-pct: a straggler line when the wait for the last rank is this share of a step */
    uint64_t seed;
    /* --outer and its flags: ddp_desc.outer (replica groups, DiLoCo, streaming DiLoCo). The
       lr, momentum, mix < 0 and wire -1 mean "not given" (ddp.h's defaults). */
    ddp_outer outer;
    int outer_wire_given;
} options;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(FILE *f) {
    fprintf(f,
        "usage: train_gpt [flags]        (launch several ranks with: ddprun -n N train_gpt [flags])\n"
        "  --data PATH        training text, any file as bytes (default " GPT_DEFAULT_DATA ", made by `make run`\n"
        "                     or `make build/fortunes.txt`)\n"
        "  --layers N         transformer blocks (4)          --heads N   attention heads (4)\n"
        "  --dim N            width (128)                     --seq N     context length (64)\n"
        "  --batch N          sequences per rank per micro-step (8)\n"
        "  --grad-accum N     micro-steps per optimizer step (1); loss scaled by 1/N\n"
        "  --dropout P        dropout probability while training, 0 <= P < 1 (0): embedding, attention,\n"
        "                     residual branches; the masks follow the global batch, not the rank\n"
        "  --steps N          optimizer steps; the cosine schedule ends here (500)\n"
        "  --lr X             peak learning rate (1e-3)       --min-lr X  end of the cosine (1e-4)\n"
        "  --warmup N         linear warmup steps (100)       --wd X      AdamW weight decay (0.1)\n"
        "  --beta1 X --beta2 X  AdamW betas (0.9, 0.99)       --clip X    global-norm clip, 0 = off (1.0)\n"
        "  --seed N           init, data order and sampling (1337)\n"
        "  --eval-every N     validation every N steps, 0 = only at the end (100)\n"
        "  --eval-batches N   validation batches of world x batch windows (20)\n"
        "  --save PATH        checkpoint at the end (and every --save-every N steps); if PATH already\n"
        "                     holds a checkpoint of this run, continue from it (ddprun --max-restarts)\n"
        "  --fresh            with --save: start over, overwriting what PATH holds\n"
        "  --resume PATH      continue from a checkpoint: bit-identical to never stopping\n"
        "  --stop-at N        stop after step N, 0: before the first (the schedule still follows --steps)\n"
        "  --sample N         print N generated bytes at the end (0 = none; default 300)\n"
        "  --temperature X    sampling temperature (1.0)      --top-k N   0 = off (0)\n"
        "  --prompt TEXT      what generation starts from (a newline)\n"
        "  --log-every N      progress line every N steps (1)\n"
        "  --straggler-pct P  a straggler line (with the progress line) when the ranks waited P%% of a step or\n"
        "                     more (and 1 ms or more) for the rank that arrived last: which rank, how long (20;\n"
        "                     0 = off; CPU and MPI backends: ddp_step_stats.slowest_rank, straggler_*)\n"
        "  --bucket-mb X      gradient bucket cap in MiB (ddp.h's default, 25; smaller: more, earlier buckets)\n"
        "  --inject-latency-ms X --inject-gbps X  benchmarks only: each allreduce takes at least as long as\n"
        "                     over a network of X ms latency and X GB/s (1e9 bytes/s) (ddp.h's inject_comm_*)\n"
        "  --dump-init PATH   write the initial parameters (float32, registration order) and exit\n"
        "  --cpu              the CPU backend and model even where a GPU is visible (GPU build)\n"
        "  --shard LEVEL      what is sharded across the ranks (ddp_desc.shard; same results at every level):\n"
        "                     none (DDP), optimizer (ZeRO-1: AdamW's m, v and a bf16 run's fp32 master),\n"
        "                     gradients (ZeRO-2: the averaged gradients too; CPU and MPI backends),\n"
        "                     parameters (ZeRO-3 / FSDP); default: ddp.h's (DDP_SHARD, else none)\n"
        "  --shard-optimizer  the same as --shard optimizer\n"
        "  --shard-group N    hybrid sharding: shard within groups of N consecutive ranks, replicate across\n"
        "                     them (ddp_desc.shard_group; 0: every rank, the default)\n"
        "  --prefetch on|off  ZeRO-3: prefetch the next unit's gather (on, the default) or gather each unit\n"
        "                     only when it is needed (off: one unit gathered at a time, less memory, no\n"
        "                     overlap; ddp_desc.shard_prefetch_off; DDP_SHARD_PREFETCH wins); same results\n"
        "  --units            declare the model's units (a block each, the embeddings, the final LayerNorm)\n"
        "                     at every level, as --shard parameters does (ZeRO-3): the same buckets, so\n"
        "                     the same bits at every level\n"
        "  --tf32             GPU: TF32 tensor-core matmuls (faster, less exact; default pure fp32)\n"
        "  --bf16             GPU: bf16 weights, gradients and activations, fp32 accumulation and master\n"
        "                     weights (the CUDA model only: not with --cpu or --tf32)\n"
        "outer sync across replica groups (ddp_desc.outer; across slow links: DiLoCo, streaming DiLoCo):\n"
        "  --outer MODE       off (default: DDP, every step averages the whole world), average (the groups'\n"
        "                     parameters averaged every H steps), diloco (outer Nesterov SGD every H steps),\n"
        "                     streaming (diloco in --fragments F pieces, one every H/F steps)\n"
        "  --inner-steps H    inner steps between two syncs of a fragment (the whole model: diloco), H >= 1\n"
        "  --group-size S     ranks a replica group (DDP inside it); default: the ranks on a host\n"
        "  --outer-lr X       outer learning rate, > 0 (diloco, streaming: 0.7)\n"
        "  --outer-momentum X outer Nesterov momentum, in [0, 1) (0.9)\n"
        "  --outer-wire W     fp32, bf16 or int8 (blockwise, one scale per --quant-block values): what the\n"
        "                     outer gradient travels as (bf16; average: fp32)\n"
        "  --quant-block N    int8 wire: values per scale (64)\n"
        "  --fragments F      streaming: contiguous pieces of the parameters, F <= H (1)\n"
        "  --outer-delay T    streaming: inner steps a fragment's exchange overlaps, T < H/F (0)\n"
        "  --outer-mix A      streaming: the merge keeps A of the local values, in [0, 1) (0)\n");
}

/* The fragment ddp.h sends after inner step t (1, 2, ...), or -1: fragment f at the steps with
   (t + f * H / F) % H == 0 (ddp.h's >>outer schedule; for the log lines only). */
static int outer_due(const ddp_outer *u, int64_t t) {
    int f, H = u->inner_steps, F = u->fragments > 0 ? u->fragments : 1;
    for (f = 0; f < F && H > 0; f++)
        if ((t + (int64_t)f * H / F) % H == 0) return f;
    return -1;
}

/* The outer flags checked against each other and filled into o->outer as ddp_desc.outer wants
   it (0: ddp.h's default). What ddp.h would also refuse is said here in the flags' names. */
static int outer_args(options *o, char *err, size_t errn) {
    ddp_outer *u = &o->outer;
    static const char *const mode_name[] = { "off", "average", "diloco", "streaming" };
    const char *mode = mode_name[u->mode];
    int lr_given = u->lr >= 0, mom_given = u->momentum >= 0;
    if (u->mode == DDP_OUTER_OFF) {
        const char *stray = u->inner_steps >= 0 ? "--inner-steps" : u->group_size >= 0 ? "--group-size" : lr_given ? "--outer-lr" :
                            mom_given ? "--outer-momentum" : o->outer_wire_given ? "--outer-wire" : u->quant_block >= 0 ? "--quant-block" :
                            u->fragments >= 0 ? "--fragments" : u->delay_steps >= 0 ? "--outer-delay" : u->mix >= 0 ? "--outer-mix" : NULL;
        if (stray) { snprintf(err, errn, "%s is a setting of the outer sync: add --outer average|diloco|streaming (or drop it)", stray); return 0; }
        memset(u, 0, sizeof *u);
        return 1;
    }
    if (u->inner_steps < 1) {
        snprintf(err, errn, "--outer %s needs --inner-steps H >= 1 (the inner steps between two syncs; DiLoCo's paper: 500)%s", mode,
                 u->inner_steps == 0 ? ", not 0" : "");
        return 0;
    }
    if (u->group_size == 0) { snprintf(err, errn, "--group-size must be >= 1 (or left out: the ranks on a host)"); return 0; }
    if (u->mode == DDP_OUTER_AVERAGE && (lr_given || mom_given)) {
        snprintf(err, errn, "--outer average is outer lr 1 and momentum 0: --outer-lr and --outer-momentum go with --outer diloco or streaming");
        return 0;
    }
    if (lr_given && !(u->lr > 0)) { snprintf(err, errn, "--outer-lr must be > 0 (got %g)", (double)u->lr); return 0; }
    if (mom_given && !(u->momentum < 1)) { snprintf(err, errn, "--outer-momentum must be in [0, 1) (got %g)", (double)u->momentum); return 0; }
    if (u->mode != DDP_OUTER_STREAMING && (u->fragments >= 0 || u->delay_steps >= 0 || u->mix >= 0)) {
        snprintf(err, errn, "%s is streaming DiLoCo's: use --outer streaming (not --outer %s)",
                 u->fragments >= 0 ? "--fragments" : u->delay_steps >= 0 ? "--outer-delay" : "--outer-mix", mode);
        return 0;
    }
    if (u->fragments == 0) { snprintf(err, errn, "--fragments must be >= 1"); return 0; }
    if (u->mix >= 0 && !(u->mix < 1)) { snprintf(err, errn, "--outer-mix must be in [0, 1) (got %g)", (double)u->mix); return 0; }
    if (u->fragments > u->inner_steps) {
        snprintf(err, errn, "--fragments %d is more than --inner-steps %d: each fragment is sent once every H steps, one every "
                 "H/F steps", u->fragments, u->inner_steps);
        return 0;
    }
    if (u->delay_steps >= 0 && u->delay_steps >= u->inner_steps / (u->fragments > 0 ? u->fragments : 1)) {
        snprintf(err, errn, "--outer-delay %d must be less than --inner-steps / --fragments = %d: at most one fragment is in flight",
                 u->delay_steps, u->inner_steps / (u->fragments > 0 ? u->fragments : 1));
        return 0;
    }
    if (u->quant_block == 0 || (u->quant_block > 0 && u->quant_block > 1 << 20)) {
        snprintf(err, errn, "--quant-block must be in 1 .. 1048576 (got %d)", u->quant_block);
        return 0;
    }
    if (u->quant_block > 0 && u->wire != DDP_WIRE_INT8) { snprintf(err, errn, "--quant-block goes with --outer-wire int8"); return 0; }
    /* Given lr or momentum: both exactly as given (0 momentum included), the other one its default. */
    if (lr_given || mom_given) {
        u->as_given = 1;
        if (!lr_given) u->lr = 0.7f;
        if (!mom_given) u->momentum = 0.9f;
    } else u->lr = u->momentum = 0;
    if (u->group_size < 0) u->group_size = 0;
    if (u->fragments < 0) u->fragments = 0;
    if (u->delay_steps < 0) u->delay_steps = 0;
    if (u->mix < 0) u->mix = 0;
    if (u->quant_block < 0) u->quant_block = 0;
    return 1;
}

static int parse_args(int argc, char **argv, options *o, char *err, size_t errn) {
    int i;
    memset(o, 0, sizeof *o);
    o->model.layers = 4; o->model.heads = 4; o->model.dim = 128; o->model.seq = 64; o->model.batch = 8;
    o->steps = 500; o->warmup = 100; o->accum = 1; o->eval_every = 100; o->eval_batches = 20; o->sample = 300;
    o->lr = 1e-3f; o->min_lr = 1e-4f; o->wd = 0.1f; o->clip = 1.0f; o->beta1 = 0.9f; o->beta2 = 0.99f;
    o->temperature = 1.0f; o->seed = 1337; o->log_every = 1; o->prompt = "\n"; o->straggler_pct = 20;
    o->stop_at = -1;   /* not given (--stop-at 0 stops before the first step) */
    o->outer.lr = o->outer.momentum = o->outer.mix = -1;   /* not given */
    o->outer.inner_steps = o->outer.group_size = o->outer.fragments = o->outer.delay_steps = o->outer.quant_block = -1;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        int *ip = NULL;
        float *fp = NULL;
        const char **sp = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); exit(0); }
        else if (!strcmp(a, "--cpu")) { o->cpu = 1; continue; }
        else if (!strcmp(a, "--tf32")) { o->tf32 = 1; continue; }
        else if (!strcmp(a, "--bf16")) { o->bf16 = 1; continue; }
        else if (!strcmp(a, "--shard-optimizer")) { o->shard_optimizer = 1; continue; }
        else if (!strcmp(a, "--units")) { gpt_declare_units = 1; continue; }
        else if (!strcmp(a, "--shard-group")) ip = &o->shard_group;
        else if (!strcmp(a, "--shard")) {
            static const char *const levels[] = { "none", "optimizer", "gradients", "parameters" };
            int k;
            if (!v) { snprintf(err, errn, "%s needs a value", a); return 0; }
            for (k = 0; k < 4 && strcmp(v, levels[k]) != 0; k++) {}
            if (k == 4) { snprintf(err, errn, "%s: '%s' is not one of none, optimizer, gradients, parameters", a, v); return 0; }
            o->shard = DDP_SHARD_NONE + k;   /* DDP_SHARD_NONE, _OPTIMIZER, _GRADIENTS, _PARAMETERS in order */
            i++;
            continue;
        }
        else if (!strcmp(a, "--prefetch")) {
            if (!v) { snprintf(err, errn, "%s needs a value", a); return 0; }
            if (strcmp(v, "on") != 0 && strcmp(v, "off") != 0) { snprintf(err, errn, "%s: '%s' is neither on nor off", a, v); return 0; }
            o->prefetch_off = !strcmp(v, "off");
            i++;
            continue;
        }
        else if (!strcmp(a, "--fresh")) { o->fresh = 1; continue; }
        else if (!strcmp(a, "--data")) sp = &o->data;
        else if (!strcmp(a, "--save")) sp = &o->save;
        else if (!strcmp(a, "--resume")) sp = &o->resume;
        else if (!strcmp(a, "--dump-init")) sp = &o->dump_init;
        else if (!strcmp(a, "--prompt")) sp = &o->prompt;
        else if (!strcmp(a, "--layers")) ip = &o->model.layers;
        else if (!strcmp(a, "--heads")) ip = &o->model.heads;
        else if (!strcmp(a, "--dim")) ip = &o->model.dim;
        else if (!strcmp(a, "--seq")) ip = &o->model.seq;
        else if (!strcmp(a, "--batch")) ip = &o->model.batch;
        else if (!strcmp(a, "--steps")) ip = &o->steps;
        else if (!strcmp(a, "--warmup")) ip = &o->warmup;
        else if (!strcmp(a, "--grad-accum")) ip = &o->accum;
        else if (!strcmp(a, "--eval-every")) ip = &o->eval_every;
        else if (!strcmp(a, "--eval-batches")) ip = &o->eval_batches;
        else if (!strcmp(a, "--sample")) ip = &o->sample;
        else if (!strcmp(a, "--top-k")) ip = &o->top_k;
        else if (!strcmp(a, "--stop-at")) ip = &o->stop_at;
        else if (!strcmp(a, "--save-every")) ip = &o->save_every;
        else if (!strcmp(a, "--log-every")) ip = &o->log_every;
        else if (!strcmp(a, "--lr")) fp = &o->lr;
        else if (!strcmp(a, "--min-lr")) fp = &o->min_lr;
        else if (!strcmp(a, "--wd")) fp = &o->wd;
        else if (!strcmp(a, "--clip")) fp = &o->clip;
        else if (!strcmp(a, "--beta1")) fp = &o->beta1;
        else if (!strcmp(a, "--beta2")) fp = &o->beta2;
        else if (!strcmp(a, "--temperature")) fp = &o->temperature;
        else if (!strcmp(a, "--bucket-mb")) fp = &o->bucket_mb;
        else if (!strcmp(a, "--dropout")) fp = &o->dropout;
        else if (!strcmp(a, "--inject-latency-ms")) fp = &o->inject_latency_ms;
        else if (!strcmp(a, "--inject-gbps")) fp = &o->inject_gbps;
        else if (!strcmp(a, "--straggler-pct")) fp = &o->straggler_pct;
        else if (!strcmp(a, "--inner-steps")) ip = &o->outer.inner_steps;
        else if (!strcmp(a, "--group-size")) ip = &o->outer.group_size;
        else if (!strcmp(a, "--fragments")) ip = &o->outer.fragments;
        else if (!strcmp(a, "--outer-delay")) ip = &o->outer.delay_steps;
        else if (!strcmp(a, "--quant-block")) ip = &o->outer.quant_block;
        else if (!strcmp(a, "--outer-lr")) fp = &o->outer.lr;
        else if (!strcmp(a, "--outer-momentum")) fp = &o->outer.momentum;
        else if (!strcmp(a, "--outer-mix")) fp = &o->outer.mix;
        else if (!strcmp(a, "--outer") || !strcmp(a, "--outer-wire")) {
            static const char *const modes[] = { "off", "average", "diloco", "streaming" }, *const wires[] = { "fp32", "bf16", "int8" };
            int is_mode = !strcmp(a, "--outer"), k, n = is_mode ? 4 : 3;
            const char *const *names = is_mode ? modes : wires;
            if (!v) { snprintf(err, errn, "%s needs a value", a); return 0; }
            for (k = 0; k < n && strcmp(v, names[k]) != 0; k++) {}
            if (k == n) {
                snprintf(err, errn, "%s: '%s' is not one of %s", a, v, is_mode ? "off, average, diloco, streaming" : "fp32, bf16, int8");
                return 0;
            }
            if (is_mode) o->outer.mode = (ddp_outer_mode)k;   /* DDP_OUTER_OFF, _AVERAGE, _DILOCO, _STREAMING in order */
            else { o->outer.wire = (ddp_outer_wire)(k + 1); o->outer_wire_given = 1; }   /* DDP_WIRE_FP32, _BF16, _INT8 */
            i++;
            continue;
        }
        else if (!strcmp(a, "--seed")) {
            if (!v) { snprintf(err, errn, "%s needs a value", a); return 0; }
            errno = 0;
            o->seed = strtoull(v, &end, 10);
            if (errno || !*v || *end || *v < '0' || *v > '9') {   /* strtoull takes "-1" as 2^64 - 1 */
                snprintf(err, errn, "%s: '%s' is not a non-negative integer", a, v);
                return 0;
            }
            i++;
            continue;
        } else { snprintf(err, errn, "unknown flag '%s' (--help lists them)", a); return 0; }
        if (!v) { snprintf(err, errn, "%s needs a value", a); return 0; }
        i++;
        if (sp) { *sp = v; continue; }
        errno = 0;
        if (ip) {
            long x = strtol(v, &end, 10);
            if (errno || !*v || *end || x < 0 || x > 1000000000L) { snprintf(err, errn, "%s: '%s' is not an integer >= 0", a, v); return 0; }
            *ip = (int)x;
        } else {
            float x = strtof(v, &end);
            uint32_t bits;
            memcpy(&bits, &x, sizeof bits);   /* NaN and Inf by their bits: -Ofast folds isinf/isnan and x >= 0 to "finite" */
            if (errno == ERANGE && *v && !*end) {
                snprintf(err, errn, "%s: '%s' is beyond a float's range (%s)", a, v,
                         (bits & 0x7f800000u) == 0x7f800000u ? "too large" : "too small: it would round to 0 or lose its digits");
                return 0;
            }
            if (errno || !*v || *end || (bits & 0x7f800000u) == 0x7f800000u || !(x >= 0)) { snprintf(err, errn, "%s: '%s' is not a finite number >= 0", a, v); return 0; }
            *fp = x;
        }
    }
    if (!gpt_config_check(&o->model, err, errn)) return 0;
    if (!(o->straggler_pct <= 100)) { snprintf(err, errn, "--straggler-pct is a share of the step, 0 to 100 (got %g)", (double)o->straggler_pct); return 0; }
    if (!(o->dropout < 1)) { snprintf(err, errn, "--dropout must be in [0, 1) (got %g)", (double)o->dropout); return 0; }
    if (o->accum < 1 || o->eval_batches < 1 || o->log_every < 1) { snprintf(err, errn, "--grad-accum, --eval-batches and --log-every must be >= 1"); return 0; }
    if (!(o->beta1 < 1 && o->beta2 < 1) || !(o->temperature > 0)) { snprintf(err, errn, "betas must be < 1 and the temperature > 0"); return 0; }
    if (o->save_every > 0 && !o->save) { snprintf(err, errn, "--save-every goes with --save PATH (where the checkpoints go)"); return 0; }
    if (o->fresh && (!o->save || o->resume)) { snprintf(err, errn, "--fresh goes with --save PATH (start over there) and not with --resume"); return 0; }
    if (o->bf16 && o->tf32) { snprintf(err, errn, "--bf16 and --tf32 are two precisions of the CUDA model's matmuls: pick one"); return 0; }
    if (o->bf16 && o->cpu) { snprintf(err, errn, "--bf16 is the CUDA model's mode and --cpu runs gpt.h's fp32 CPU model: not both"); return 0; }
#ifndef TRAIN_CUDA_MODEL
    if (o->bf16) { snprintf(err, errn, "--bf16 needs the CUDA model: this build has none (build/gpu/train_gpt, or build/train_gpt_emulated)"); return 0; }
#endif
    return outer_args(o, err, errn);
}

/* Learning rate at step s: linear warmup to lr over `warmup` steps, then a cosine to min_lr at
   `steps` (nanoGPT's schedule). */
static float lr_at(const options *o, int s) {
    double ratio;
    if (s < o->warmup) return o->lr * (float)(s + 1) / (float)(o->warmup + 1);
    if (s >= o->steps || o->steps <= o->warmup) return o->min_lr;
    ratio = (double)(s - o->warmup) / (double)(o->steps - o->warmup);
    return (float)(o->min_lr + 0.5 * (1.0 + cos(3.14159265358979323846 * ratio)) * (o->lr - o->min_lr));
}

/* ---- the model: gpt.h's on the CPU backend, gpt_cuda.cuh's on NCCL ---- */
typedef struct model {
    int on_gpu;                    /* the CUDA model (device buffers); else gpt.h's */
    gpt cpu;
#ifdef TRAIN_CUDA_MODEL
    gpt_cuda gpu;
#endif
    size_t num_floats;
    float *losses;                 /* CPU model: losses of the forwards not read yet */
    int num_losses, cap_losses;
} model;

/* The CUDA model runs where ddp.h runs on NCCL (its buffers are device memory there); the
   host emulation build runs it on the CPU backend unless --cpu. */
static int model_uses_cuda(ddp_context *ddp, const options *o) {
#if defined(GPT_CUDA_EMULATE)
    (void)ddp;
    return !o->cpu;
#elif defined(__CUDACC__)
    (void)o;
    return ddp_config(ddp)->backend == DDP_BACKEND_NCCL;
#else
    (void)ddp; (void)o;
    return 0;
#endif
}

static ddp_result model_create(model *mo, ddp_context *ddp, const options *o) {
    ddp_result r;
    memset(mo, 0, sizeof *mo);
    mo->on_gpu = model_uses_cuda(ddp, o);
#ifdef TRAIN_CUDA_MODEL
    if (mo->on_gpu) {
        r = gpt_cuda_create(&mo->gpu, ddp, &o->model, o->seed, o->bf16 ? GPT_CUDA_BF16 : o->tf32 ? GPT_CUDA_TF32 : GPT_CUDA_FP32);
        mo->num_floats = mo->gpu.num_floats;
        if (r == DDP_OK) gpt_cuda_set_dropout(&mo->gpu, o->dropout, o->seed ^ 0xd40b0u);   /* checked in parse */
        return r;
    }
#endif
    r = gpt_create(&mo->cpu, ddp, &o->model, o->seed);
    mo->num_floats = mo->cpu.num_floats;
    if (r == DDP_OK) gpt_set_dropout(&mo->cpu, o->dropout, o->seed ^ 0xd40b0u);
    return r;
}

/* GPT_OP_TIMES=1 (the CUDA model): a span of the trainer's own, the end of a step, a reset
   after the warm-up steps, the table at the end (rank 0). No-ops otherwise. */
static void model_time_begin(model *mo, const char *name) {
#ifdef TRAIN_CUDA_MODEL
    if (mo->on_gpu) gpt_cuda_time_begin(&mo->gpu, name);
#endif
    (void)mo; (void)name;
}
static void model_time_end(model *mo) {
#ifdef TRAIN_CUDA_MODEL
    if (mo->on_gpu) gpt_cuda_time_end(&mo->gpu);
#endif
    (void)mo;
}
static void model_op_times_step(model *mo, int step, int counted_after) {
#ifdef TRAIN_CUDA_MODEL
    if (mo->on_gpu) {
        gpt_cuda_op_times_step(&mo->gpu);
        if (step == counted_after) gpt_cuda_op_times_reset(&mo->gpu);
    }
#endif
    (void)mo; (void)step; (void)counted_after;
}
static void model_op_times_restart(model *mo) {
#ifdef TRAIN_CUDA_MODEL
    if (mo->on_gpu) gpt_cuda_op_times_restart(&mo->gpu);
#endif
    (void)mo;
}
static void model_op_times_print(model *mo) {
#ifdef TRAIN_CUDA_MODEL
    if (mo->on_gpu) gpt_cuda_op_times_print(&mo->gpu, stdout);
#endif
    (void)mo;
}

/* Where the next training forward's rows sit in the step's global batch (dropout's masks):
   row b is global position row0 + b * stride. */
static void model_set_rows(model *mo, int step, uint64_t row0, uint64_t stride) {
#ifdef TRAIN_CUDA_MODEL
    if (mo->on_gpu) { gpt_cuda_set_rows(&mo->gpu, (uint64_t)step, row0, stride); return; }
#endif
    gpt_set_rows(&mo->cpu, (uint64_t)step, row0, stride);
}

/* Whether the model keeps no [B, NH, T, T] attention matrices (the CUDA model's GPT_ATTENTION=fused,
   known once gpt_cuda_create has read it, also when it then failed). */
static int model_attention_fused(const model *mo) {
#ifdef TRAIN_CUDA_MODEL
    return mo->on_gpu && mo->gpu.attention_fused;
#else
    (void)mo;
    return 0;
#endif
}

/* What a failed model_create says. gpt.h's and gpt_cuda.cuh's own allocations fail with a bare
   DDP_ERR_OUT_OF_MEMORY (ddp.h's last error stays empty): say then how much the model needs
   (fused attention keeps a row's logsumexp, [B, NH, T], where the explicit one keeps [B, NH, T, T]). */
static const char *model_create_failure(ddp_context *ddp, const options *o, int fused, ddp_result r, char *buf, size_t n) {
    const gpt_config *c = &o->model;
    double C = c->dim, T = c->seq, L = c->layers, BT = (double)c->batch * c->seq;
    double params = GPT_VOCAB * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
    double att = (double)c->batch * c->heads * T * (fused ? 1 : T);
    double acts = L * (21 * BT * C + att + 4 * BT) + 16 * BT * C + 2 * BT * GPT_VOCAB;
    if (strcmp(ddp_last_error(ddp), "no error") != 0) return ddp_last_error(ddp);
    if (r != DDP_ERR_OUT_OF_MEMORY) {
        snprintf(buf, n, "rank %d: cannot create the model: %s", ddp_rank(ddp), ddp_result_string(r));
        return buf;
    }
    snprintf(buf, n, "rank %d: out of memory creating the model: --layers %d --heads %d --dim %d --seq %d --batch %d has %.3g "
             "parameters and needs about %.3g GiB (parameters, gradients, AdamW m and v, activations); make --dim, --layers, "
             "--seq or --batch smaller", ddp_rank(ddp), c->layers, c->heads, c->dim, c->seq, c->batch, params,
             (20 * params + 4 * acts) / (1024.0 * 1024 * 1024));
    return buf;
}

static void model_destroy(model *mo) {
#ifdef TRAIN_CUDA_MODEL
    if (mo->on_gpu) gpt_cuda_destroy(&mo->gpu);
    else
#endif
    gpt_destroy(&mo->cpu);
    free(mo->losses);
}

/* gpt_forward; the loss (with targets) is kept for model_loss_sum. On the GPU nothing here
   waits for the device. */
static void model_forward(model *mo, const int *tok, const int *tgt, int B, int T, float loss_scale, int train) {
    float loss;
#ifdef TRAIN_CUDA_MODEL
    if (mo->on_gpu) { gpt_cuda_forward(&mo->gpu, tok, tgt, B, T, loss_scale, train); return; }
#endif
    loss = gpt_forward(&mo->cpu, tok, tgt, B, T, loss_scale, train);
    if (!tgt) return;
    if (mo->num_losses == mo->cap_losses) {
        int cap = mo->cap_losses ? 2 * mo->cap_losses : 64;
        float *grown = (float *)realloc(mo->losses, sizeof(float) * (size_t)cap);
        if (!grown) { fprintf(stderr, "train_gpt: rank %d: out of memory keeping %d losses\n", ddp_rank(mo->cpu.ddp), cap); exit(1); }
        mo->losses = grown;
        mo->cap_losses = cap;
    }
    mo->losses[mo->num_losses++] = loss;
}

/* Sum of loss / divisor over the last `last` forwards with targets, in order: what the loop
   `loss += gpt_forward(...) / divisor` over them gives, to the bit. Earlier unread losses (steps
   without a progress line) are dropped. On the GPU this waits for the device. */
static float model_loss_sum(model *mo, float divisor, int last) {
    const float *l = mo->losses;
    float sum = 0;
    int n = mo->num_losses, i;
#ifdef TRAIN_CUDA_MODEL
    if (mo->on_gpu) l = gpt_cuda_losses(&mo->gpu, &n);
#endif
    for (i = n > last ? n - last : 0; i < n; i++) sum += l[i] / divisor;
    mo->num_losses = 0;
    return sum;
}

/* Row `row` of the last forward's logits. */
static void model_logits_row(model *mo, int row, float *out) {
#ifdef TRAIN_CUDA_MODEL
    if (mo->on_gpu) { gpt_cuda_logits_row(&mo->gpu, row, out); return; }
#endif
    memcpy(out, mo->cpu.logits + (size_t)row * GPT_VOCAB, sizeof(float) * GPT_VOCAB);
}

static const char *model_describe(const model *mo, char *buf, size_t n) {
#ifdef TRAIN_CUDA_MODEL
    if (mo->on_gpu) { gpt_cuda_describe(&mo->gpu, buf, n); return buf; }
#else
    (void)mo;
#endif
    snprintf(buf, n, "%s", gpt_blas_name());
    return buf;
}

/* TEST-ONLY fault hook (tests/test_restart.sh): DDP_TEST_KILL="R:S[:save],..." makes rank R
   SIGKILL itself in step S (1 = the first), after its backward and before the AdamW step, or with
   ":save" (rank 0) in the middle of writing the checkpoint of step S (ddp.h's own test hook,
   DDP_TEST_DIE_IN_CHECKPOINT, does the kill inside ddp_save). With DDP_TEST_KILL_ONCE=DIR each
   point fires once (it leaves DIR/kill.<its index>), so a restarted job gets past it. */
/* Tests (tests/test_gpt.sh, straggler): GPT_TEST_SLOW_RANK=R:MS makes rank R sleep MS ms before
   each step's forward, a straggler the others must see. */
static void test_slow_rank(int rank) {
    const char *p = getenv("GPT_TEST_SLOW_RANK");
    int r, ms;
    if (p && sscanf(p, "%d:%d", &r, &ms) == 2 && r == rank && ms > 0) {
        struct timespec ts;
        ts.tv_sec = ms / 1000;
        ts.tv_nsec = (long)(ms % 1000) * 1000000L;
        nanosleep(&ts, NULL);
    }
}

static void test_kill_point(int rank, int step, const char *where) {
    const char *p = getenv("DDP_TEST_KILL"), *once = getenv("DDP_TEST_KILL_ONCE");
    int index = 0;
    for (; p && *p; index++) {
        char w[16] = "step", mark[4096];
        int r, s, used = 0, fd;
        if (sscanf(p, "%d:%d%n:%15[a-z]%n", &r, &s, &used, w, &used) < 2) return;
        p += used;
        p += *p == ',';
        if (r != rank || s != step || strcmp(w, where) != 0) continue;
        if (once) {
            snprintf(mark, sizeof mark, "%s/kill.%d", once, index);
            if ((fd = open(mark, O_WRONLY | O_CREAT | O_EXCL, 0600)) < 0) continue;   /* fired before */
            close(fd);
        }
        if (!strcmp(where, "save")) {
            char at[32];
            snprintf(at, sizeof at, "%d", step);
            setenv("DDP_TEST_DIE_IN_CHECKPOINT", at, 1);
            return;
        }
        kill(getpid(), SIGKILL);
    }
}

/* ---- checkpoints: ddp.h's ddp_save / ddp_load; this program's part is the run_state blob ---- */

/* What train_gpt keeps in a checkpoint besides ddp.h's state (parameters, AdamW m, v, step):
   the model's shape, the seed and where the run is. The position is global (the step, and the
   windows of the training split consumed so far, world x batch x grad-accum a step), so it means
   the same at any world size. ddp.h stores it as an opaque blob; the same program reads it. */
typedef struct run_state {
    char magic[8];                 /* "GPTRUN01" */
    uint32_t vocab;
    int32_t layers, heads, dim, seq;
    float dropout;                 /* --dropout: another one is another run */
    int64_t step;                  /* optimizer steps done: the next batch is step's */
    uint64_t seed;
    uint64_t windows;              /* training windows consumed (global: every rank's) */
} run_state;
#define RUN_MAGIC "GPTRUN01"

/* The largest step a run can reach (--steps is at most 10^9): a checkpoint's step beyond it is damage. */
#define CKPT_MAX_STEP 1000000000

static run_state run_state_of(const options *o, int step, uint64_t windows) {
    run_state rs;
    memset(&rs, 0, sizeof rs);
    memcpy(rs.magic, RUN_MAGIC, 8);
    rs.vocab = GPT_VOCAB;
    rs.layers = o->model.layers; rs.heads = o->model.heads; rs.dim = o->model.dim; rs.seq = o->model.seq;
    rs.dropout = o->dropout;
    rs.step = step; rs.seed = o->seed; rs.windows = windows;
    return rs;
}

typedef struct resume_check { const options *o; const char *path; } resume_check;

/* ddp_load's check, on rank 0, of a checkpoint whose checksum holds: is it this run's? The
   model first (ddp.h would name the first parameter that differs; the flags say more), then the
   step, then the seed (the data order and the sampling follow it: another one is another run),
   then the dropout. */
static int check_run_state(void *arg, const ddp_checkpoint_info *info, const void *user, size_t n, char *err, size_t errn) {
    const resume_check *rc = (const resume_check *)arg;
    const options *o = rc->o;
    run_state rs;
    if (n != sizeof rs || memcmp(user, RUN_MAGIC, 8) != 0) {
        snprintf(err, errn, "checkpoint '%s' was not written by train_gpt (its user blob is %zu bytes, not a train_gpt "
                 "run state of %zu)", rc->path, n, sizeof rs);
        return 0;
    }
    memcpy(&rs, user, sizeof rs);
    if (rs.layers != o->model.layers || rs.heads != o->model.heads || rs.dim != o->model.dim || rs.seq != o->model.seq ||
        rs.vocab != GPT_VOCAB)
        snprintf(err, errn, "checkpoint '%s' holds a model with --layers %d --heads %d --dim %d --seq %d; this run asks for "
                 "--layers %d --heads %d --dim %d --seq %d", rc->path, rs.layers, rs.heads, rs.dim, rs.seq,
                 o->model.layers, o->model.heads, o->model.dim, o->model.seq);
    else if (rs.step < 0 || rs.step > CKPT_MAX_STEP || info->step > rs.step)
        snprintf(err, errn, "checkpoint '%s' holds step %lld and AdamW step %lld; a checkpoint train_gpt wrote has "
                 "0 <= AdamW step <= step <= %d", rc->path, (long long)rs.step, (long long)info->step, CKPT_MAX_STEP);
    else if (rs.seed != o->seed)
        snprintf(err, errn, "checkpoint '%s' was trained with --seed %llu, this run has --seed %llu; the seed picks the data "
                 "order, so resuming with another one silently changes the run: pass --seed %llu", rc->path,
                 (unsigned long long)rs.seed, (unsigned long long)o->seed, (unsigned long long)rs.seed);
    else if (rs.dropout != o->dropout)
        snprintf(err, errn, "checkpoint '%s' was trained with --dropout %g, this run has --dropout %g: pass --dropout %g",
                 rc->path, (double)rs.dropout, (double)o->dropout, (double)rs.dropout);
    else return 1;
    return 0;
}

/* The FNV-1a of the flat parameters (padding included), streamed to rank 0 a chunk at a time:
   the hash the tests compare between runs. Every rank calls it; rank 0's *hash is the one. */
static ddp_result params_hash(ddp_context *ddp, uint64_t *hash) {
    static float buf[1 << 16];
    const size_t CHUNK = sizeof buf / sizeof buf[0];
    size_t n, done, k;
    ddp_result r = DDP_OK;
    /* the flat size (bf16 parameters: ddp_flat_params counts this rank's parts of the master when sharded) */
    if (ddp_config(ddp)->param_dtype == DDP_DTYPE_BF16) ddp_flat_params_bf16(ddp, &n);
    else ddp_flat_params(ddp, &n);
    *hash = GPT_FNV_INIT;
    for (done = 0; done < n && r == DDP_OK; done += k) {
        k = n - done < CHUNK ? n - done : CHUNK;
        r = ddp_gather_to_host(ddp, DDP_PARAMS, done, ddp_rank(ddp) == 0 ? buf : NULL, k, 0);
        if (r == DDP_OK && ddp_rank(ddp) == 0) *hash = gpt_fnv1a(buf, k * sizeof(float), *hash);
    }
    return r;
}

/* A checkpoint of step `step` to --save (every rank calls it: ddp_save is collective). */
static ddp_result save_run(ddp_context *ddp, const options *o, int step, uint64_t windows) {
    run_state rs = run_state_of(o, step, windows);
    test_kill_point(ddp_rank(ddp), step, "save");
    return ddp_save(ddp, o->save, &rs, sizeof rs);
}

/* ---- evaluation and sampling ---- */

/* Mean loss over eval_batches x world x batch fixed windows of the validation split, every rank
   its own slice, averaged across ranks, into *loss: NAN when the split is shorter than a window. */
static ddp_result evaluate(ddp_context *ddp, model *mo, const options *o, const gpt_dataset *d, int *tok, int *tgt, float *loss) {
    int B = o->model.batch, T = o->model.seq, rank = ddp_rank(ddp), k;
    *loss = NAN;
    if (d->val_len < (size_t)T + 1) return DDP_OK;
    for (k = 0; k < o->eval_batches; k++) {
        gpt_make_batch(d->bytes + d->train_len, d->val_len, o->seed ^ 0xe7a1u, (uint64_t)k, rank * B, B, T, tok, tgt);
        model_forward(mo, tok, tgt, B, T, 1.0f, 0);
    }
    *loss = model_loss_sum(mo, (float)o->eval_batches, o->eval_batches);
    return ddp_allreduce(ddp, loss, 1, DDP_AVG);
}

static uint64_t rng_next(uint64_t *s) { *s += 0x9e3779b97f4a7c15ull; return gpt__mix(*s); }

static void put_byte(int c) {
    if (c == '\n' || c == '\t' || (c >= 32 && c < 127)) putchar(c);
    else printf("\\x%02x", c);
}

/* Generate n bytes after the prompt, temperature and optional top-k, seeded; printed when `print`
   (rank 0). Returns 0 when out of memory. Rank 0 alone, except where the forward's gathers are
   collectives (ZeRO-3 with the CUDA model: NCCL's all-gathers): every rank then, each drawing
   the same bytes from the same logits. */
static int sample_text(model *mo, const options *o, int print) {
    size_t cap = strlen(o->prompt) + (size_t)o->sample + 1;
    int T = o->model.seq, len = 0, i, v;
    int *ctx = (int *)malloc(sizeof(int) * cap);
    float probs[GPT_VOCAB], sorted[GPT_VOCAB], z[GPT_VOCAB];
    uint64_t rng = o->seed * 0x2545f4914f6cdd1dull + 7;
    if (!ctx) return 0;
    for (i = 0; o->prompt[i]; i++) ctx[len++] = (unsigned char)o->prompt[i];
    if (len == 0) ctx[len++] = '\n';
    if (print) printf("---- sample (%d bytes, temperature %g%s) ----\n", o->sample, o->temperature, o->top_k ? ", top-k" : "");
    for (i = 0; print && o->prompt[i]; i++) put_byte((unsigned char)o->prompt[i]);
    for (i = 0; i < o->sample; i++) {
        int n = len < T ? len : T, pick = GPT_VOCAB - 1;
        float mx, sum = 0, cut = -INFINITY, u, acc = 0;
        model_forward(mo, ctx + len - n, NULL, 1, n, 1.0f, 0);
        model_logits_row(mo, n - 1, z);
        if (o->top_k > 0 && o->top_k < GPT_VOCAB) {   /* the k-th largest logit is the cut */
            int a, b;
            memcpy(sorted, z, sizeof sorted);
            for (a = 0; a < o->top_k; a++)
                for (b = a + 1; b < GPT_VOCAB; b++)
                    if (sorted[b] > sorted[a]) { float t = sorted[a]; sorted[a] = sorted[b]; sorted[b] = t; }
            cut = sorted[o->top_k - 1];
        }
        mx = gpt__max(z, GPT_VOCAB);
        for (v = 0; v < GPT_VOCAB; v++) { probs[v] = z[v] >= cut ? expf((z[v] - mx) / o->temperature) : 0.0f; sum += probs[v]; }
        u = (float)((rng_next(&rng) >> 40) / 16777216.0) * sum;
        for (v = 0; v < GPT_VOCAB; v++) { acc += probs[v]; if (u < acc) { pick = v; break; } }
        ctx[len++] = pick;
        if (print) put_byte(pick);
    }
    if (print) printf("\n---- end of sample ----\n");
    fflush(stdout);
    free(ctx);
    return 1;
}

/* ---- main ---- */

/* ddp.h's message for a failed call, or, where a call failed without one, the rank and what the
   result means: no failure of train_gpt goes unexplained. */
static const char *failure_text(ddp_context *ddp, ddp_result r, char *buf, size_t n) {
    if (!ddp || strcmp(ddp_last_error(ddp), "no error") != 0) return ddp_last_error(ddp);
    snprintf(buf, n, "rank %d: %s", ddp_rank(ddp), ddp_result_string(r));
    return buf;
}

#define DIE(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); if (ddp) ddp_shutdown(ddp); return 1; } while (0)
#define CHECK(call) do { ddp_result r_ = (call); if (r_ != DDP_OK) DIE("%s", failure_text(ddp, r_, why, sizeof why)); } while (0)

/* --straggler-pct: the steps since the last progress line in which the ranks waited that share of
   the step (and 1 ms or more) for the rank that arrived last; the line shows the worst. The
   spread is the same on every rank of a host (ddp_step_stats), so rank 0 says it, no collective. */
typedef struct stragglers {
    int over, step, rank;
    double share, spread_ms, wait_ms, step_ms;
} stragglers;

static void straggler_note(stragglers *l, const options *o, const ddp_step_stats *st, int step, double step_ms) {
    double share = step_ms > 0 ? 100.0 * st->straggler_spread_ms / step_ms : 0;
    if (o->straggler_pct <= 0 || st->slowest_rank < 0 || st->straggler_spread_ms < 1.0 || share < o->straggler_pct) return;
    if (!l->over++ || share > l->share) {
        l->step = step; l->rank = st->slowest_rank; l->share = share;
        l->spread_ms = st->straggler_spread_ms; l->wait_ms = st->straggler_wait_ms; l->step_ms = step_ms;
    }
}

static void straggler_print(const stragglers *l, const options *o) {
    if (!l->over) return;
    printf("straggler: step %d | rank %d arrived last: the ranks waited up to %.1f ms for it, %.0f%% of the step's %.1f ms "
           "(--straggler-pct %g) | rank 0 waited %.1f ms | %d step(s) over since the last line\n", l->step, l->rank,
           l->spread_ms, l->share, l->step_ms, (double)o->straggler_pct, l->wait_ms, l->over);
}

int main(int argc, char **argv) {
    options o;
    char err[8192], what[256], why[512];
    const char *resume_from;       /* --resume, or the --save path when it holds a checkpoint */
    ddp_context *ddp = NULL;
    gpt_dataset data;
    model mo;
    int rank, world, step = 0, B, T, *tok, *tgt;
    uint64_t windows = 0;          /* training windows consumed, all ranks (the checkpoint's position) */
    ddp_sampler sampler;           /* this rank's share of each epoch of training windows */
    double t_start, t_line;   /* t_line, step_line: when and at which step the last progress line was */
    double t_eval = 0;        /* seconds spent in the validations so far: the val lines' clock leaves them out */
    stragglers late;          /* the steps a straggler held up since the last progress line */
    int step_line, timed_after;
    float val = NAN;

    if (!parse_args(argc, argv, &o, err, sizeof err)) { fprintf(stderr, "train_gpt: %s\n", err); return 2; }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (o.dump_init) {   /* for tests/support/gpt_reference.py: the initial parameters, nothing else */
        ddp_desc solo;
        gpt cpu_model;
        size_t n;
        FILE *f;
        memset(&solo, 0, sizeof solo);
        solo.world_size = 1;
        solo.backend = DDP_BACKEND_CPU;   /* host buffers to write out; the init is the same everywhere */
        CHECK(ddp_init(&ddp, &solo));
        gpt_blas_init(1);
        {
            ddp_result r = gpt_create(&cpu_model, ddp, &o.model, o.seed);
            if (r != DDP_OK) DIE("train_gpt: %s", model_create_failure(ddp, &o, 0, r, err, sizeof err));
        }
        {   /* a temporary file renamed into place: a full disk leaves no partial file behind */
            const float *p = ddp_flat_params(ddp, &n);
            char tmp[4200];
            int e = 0;
            if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld", o.dump_init, (long)getpid()) >= sizeof tmp) e = ENAMETOOLONG;
            else if (!(f = fopen(tmp, "wb"))) e = errno;
            else {
                if (fwrite(p, sizeof(float), n, f) != n || fflush(f) != 0) e = errno ? errno : EIO;
                if (fclose(f) != 0 && !e) e = errno;
                if (!e && rename(tmp, o.dump_init) != 0) e = errno;
                if (e) unlink(tmp);
            }
            if (e) DIE("train_gpt: cannot write '%s': %s", o.dump_init, strerror(e));
        }
        printf("wrote %zu initial parameters to %s\n", n, o.dump_init);
        gpt_destroy(&cpu_model);
        return ddp_shutdown(ddp) == DDP_OK ? 0 : 1;
    }

    {
        ddp_desc desc;
        memset(&desc, 0, sizeof desc);
        desc.bucket_cap_mb = o.bucket_mb;
        desc.inject_comm_latency_ms = o.inject_latency_ms;
        desc.inject_comm_gbps = o.inject_gbps;
        desc.backend = o.cpu ? DDP_BACKEND_CPU : DDP_BACKEND_AUTO;
        desc.shard = (ddp_shard)o.shard;
        desc.shard_optimizer = o.shard_optimizer;
        desc.shard_group = o.shard_group;
        desc.shard_prefetch_off = o.prefetch_off;
        /* --bf16: ddp.h keeps bf16 working copies and gradients (the model's) and the fp32 master
           weights and AdamW's moments; gradient buckets travel as bf16 (reduce_dtype's default).
           Without it the field stays 0 (the default), and DDP_PARAM_DTYPE may choose. */
        desc.param_dtype = o.bf16 ? DDP_DTYPE_BF16 : DDP_DTYPE_DEFAULT;
        desc.outer = o.outer;   /* --outer and its flags (outer_args); mode off: zeros, plain DDP */
#ifdef __CUDACC__
        /* The compute stream: this thread's per-thread default stream. It is a stream of
           whichever device ddp_init selects (LOCAL_RANK modulo the devices), so it can be named
           before that choice is made; cuBLAS and every kernel of the model use it too. The
           handle means "the calling thread's": fine, as every CUDA, cuBLAS and NCCL call of a
           step comes from this thread (ddp.h's communicator is a blocking one; NCCL issue #1976
           is what a non-blocking one would do with it). */
        desc.cuda_stream = (void *)cudaStreamPerThread;
#endif
        CHECK(ddp_init(&ddp, &desc));
        gpt_blas_init(ddp_config(ddp)->local_world_size);
        /* A DDP_* variable that is set wins over the descriptor (ddp.h's ENVIRONMENT): train with
           what ddp.h resolved, and refuse what this build cannot do, as --bf16 would be. */
        o.shard = ddp_config(ddp)->shard;
        if ((ddp_config(ddp)->param_dtype == DDP_DTYPE_BF16) != o.bf16) {
            o.bf16 = !o.bf16;
#ifndef TRAIN_CUDA_MODEL
            if (o.bf16)
                DIE("train_gpt: rank %d: DDP_PARAM_DTYPE=bf16 asks for bf16 parameters, which need the CUDA model: this "
                    "build has none (build/gpu/train_gpt, or build/train_gpt_emulated)", ddp_rank(ddp));
#endif
            if (o.bf16 && (o.tf32 || o.cpu))
                DIE("train_gpt: rank %d: DDP_PARAM_DTYPE=bf16 asks for the CUDA model's bf16 mode, which %s rules out",
                    ddp_rank(ddp), o.tf32 ? "--tf32" : "--cpu");
        }
    }
    rank = ddp_rank(ddp);
    world = ddp_world_size(ddp);
    B = o.model.batch;
    T = o.model.seq;
    {
        gpt_data_spec spec;
        memset(&spec, 0, sizeof spec);
        spec.path = o.data;
        spec.seq = T;
        spec.batch = B;
        spec.accum = o.accum;
        spec.seed = o.seed;
        if (!gpt_load_data(&spec, rank, world, &data, err, sizeof err)) DIE("train_gpt: %s", err);
    }
    sampler = gpt_window_sampler(data.train_len, T, world, rank, o.seed);
    {
        ddp_result r = model_create(&mo, ddp, &o);
        if (r != DDP_OK) DIE("train_gpt: %s", model_create_failure(ddp, &o, model_attention_fused(&mo), r, err, sizeof err));
    }
    if (o.bf16 && !mo.on_gpu)
        DIE("train_gpt: rank %d: --bf16 (or DDP_PARAM_DTYPE=bf16) needs the CUDA model, and ddp.h chose its CPU backend (no GPU visible)", rank);
    tok = (int *)malloc(sizeof(int) * (size_t)B * T);
    tgt = (int *)malloc(sizeof(int) * (size_t)B * T);
    if (!tok || !tgt) DIE("train_gpt: rank %d: out of memory for a batch of %d x %d tokens", rank, B, T);
    resume_from = o.resume;
    if (o.save) {
        /* The destination is checked now, not after the run. A restarted job (ddprun
           --max-restarts) runs the same command again: it continues from its last complete
           checkpoint, which --save PATH holds (unless --fresh or --resume). */
        int there = 0;
        CHECK(ddp_save_check(ddp, o.save, &there));
        if (there && !o.resume && !o.fresh) resume_from = o.save;
    }
    if (resume_from) {
        run_state rs;
        resume_check rc;
        ddp_result r;
        rc.o = &o;
        rc.path = resume_from;
        r = ddp_load(ddp, resume_from, &rs, sizeof rs, check_run_state, &rc, NULL);
        if (r != DDP_OK && resume_from != o.resume)
            DIE("train_gpt: %s; --save '%s' already holds that file: pass --fresh to start over and overwrite it, or "
                "--save another path", failure_text(ddp, r, why, sizeof why), o.save);
        if (r != DDP_OK) DIE("train_gpt: %s", failure_text(ddp, r, why, sizeof why));
        step = (int)rs.step;
        windows = rs.windows;
    }
    if (rank == 0) {
        printf("train_gpt: %d rank(s) | %d layers, %d heads, dim %d, context %d | %zu parameters | batch %d x %d ranks x %d accum "
               "= %d windows, %d tokens/step | %d gradient buckets | %s\n", world, o.model.layers, o.model.heads, o.model.dim, T, mo.num_floats, B,
               world, o.accum, B * world * o.accum, B * world * o.accum * T, ddp_num_buckets(ddp), model_describe(&mo, what, sizeof what));
        printf("data: %s, %zu bytes (train %zu, val %zu%s) | steps %d, lr %g -> %g, warmup %d, AdamW betas %g/%g wd %g, clip %g%s\n",
               o.data ? o.data : GPT_DEFAULT_DATA, data.len, data.train_len, data.val_len,
               data.val_len < (size_t)T + 1 ? ": less than a window, so no validation: val loss is nan" : "", o.steps, o.lr, o.min_lr, o.warmup,
               o.beta1, o.beta2, o.wd, o.clip, o.resume ? "" : "");
        {   /* what ddp.h resolved (the descriptor and the DDP_* variables, which win when set) */
            static const char *const levels[] = { "default", "debug", "info", "warn", "error", "off" };
            const ddp_desc *c = ddp_config(ddp);
            printf("ddp.h: %s backend | timeout %g s | parameters %s | optimizer %s | check_ready %d | log %s | "
                   "timeline %s | job '%s'\n", ddp_backend_name(ddp), c->timeout_s,
                   c->param_dtype == DDP_DTYPE_BF16 ? "bf16" : "fp32", c->shard == DDP_SHARD_PARAMETERS
                   ? (c->shard_prefetch_off ? "and parameters sharded (ZeRO-3, prefetch off)" : "and parameters sharded (ZeRO-3)")
                   : c->shard == DDP_SHARD_GRADIENTS ? "and gradients sharded (ZeRO-2)" : c->shard_optimizer ? "sharded (ZeRO-1)" : "unsharded",
                   c->check_ready, (unsigned)c->log_level <= DDP_LOG_OFF ? levels[c->log_level] : "?",
                   c->timeline_path && *c->timeline_path ? c->timeline_path : "off", c->job_id ? c->job_id : "");
        }
        if (o.outer.mode != DDP_OUTER_OFF) {   /* what ddp.h resolved: the defaults filled in */
            static const char *const modes[] = { "off", "average", "diloco", "streaming" }, *const wires[] = { "default", "fp32", "bf16", "int8" };
            const ddp_outer *u = &ddp_config(ddp)->outer;
            ddp_outer_status os = ddp_outer_state(ddp);
            printf("outer: %s | %d group(s) of %d rank(s) | every %d inner steps | outer lr %g momentum %g%s | wire %s",
                   modes[u->mode], os.groups, os.group_size, u->inner_steps, u->lr, u->momentum, u->momentum > 0 ? " (Nesterov)" : "",
                   wires[u->wire]);
            if (u->wire == DDP_WIRE_INT8) printf(" (blocks of %d)", u->quant_block);
            if (u->mode == DDP_OUTER_STREAMING)
                printf(" | %d fragment(s), one every %d steps, delay %d, mix %g", u->fragments, u->inner_steps / u->fragments,
                       u->delay_steps, u->mix);
            printf("\n");
        }
        if (o.resume) printf("resumed from %s at step %d\n", o.resume, step);
        else if (resume_from) printf("resumed from %s at step %d (the --save path held a checkpoint; --fresh starts over)\n", resume_from, step);
    }

    t_start = t_line = now_s();
    step_line = step;
    memset(&late, 0, sizeof late);
    timed_after = step + (o.steps - step > 4 ? 3 : 1);   /* GPT_OP_TIMES: the steps after these */
    while (step < o.steps && !(o.stop_at >= 0 && step >= o.stop_at)) {
        double ms, t_step = now_s();
        float loss, lr = lr_at(&o, step), norm = 0;
        ddp_adamw opt;
        ddp_step_stats st;
        int u, logs;
        CHECK(ddp_zero_grad(ddp));
        test_slow_rank(rank);
        for (u = 0; u < o.accum; u++) {   /* micro-step u: this rank's next B samples of the epoch */
            uint64_t epoch = 0, first = 0;
            if (gpt_batch_position(&sampler, B, o.accum, (uint64_t)step, u, &epoch, &first) != DDP_OK ||
                gpt_sampled_batch(data.bytes, &sampler, epoch, first, B, T, tok, tgt) != DDP_OK)   /* gpt_load_data made sure it cannot */
                DIE("train_gpt: rank %d: no batch for step %d: %s", rank, step + 1, ddp_last_error(NULL));
            model_set_rows(&mo, step, first * (uint64_t)world + (uint64_t)rank, (uint64_t)world);   /* global positions: dropout's masks */
            ddp_set_sync(ddp, u == o.accum - 1);
            model_forward(&mo, tok, tgt, B, T, 1.0f / (float)o.accum, 1);
            CHECK(ddp_backward(ddp));
        }
        test_kill_point(rank, step + 1, "step");
        windows += (uint64_t)world * B * o.accum;
        memset(&opt, 0, sizeof opt);
        opt.lr = lr; opt.beta1 = o.beta1; opt.beta2 = o.beta2; opt.weight_decay = o.wd; opt.max_grad_norm = o.clip;
        step++;
        /* The loss is averaged across ranks, and the gradient norm read back, only for the lines
           that show them: every collective is a point where all ranks wait for the slowest, and
           on a GPU reading the norm is a wait for the device; the step needs neither (clipping
           happens on the device). The same decision on every rank: it depends on the step. */
        logs = step % o.log_every == 0 || step == 1 || step == o.steps;
        model_time_begin(&mo, "ddp adamw step (+ norm, clip)");
        {
            ddp_outer_status before = ddp_outer_state(ddp), after;
            double t0 = now_s();
            CHECK(ddp_adamw_step(ddp, &opt, logs ? &norm : NULL));   /* with --outer: the outer step too, when due */
            after = ddp_outer_state(ddp);
            /* An outer sync line where a fragment was sent or merged: the step's optimizer time
               (AdamW, the exchange, the merge) is what the sync cost this rank. */
            if (rank == 0 && o.outer.mode != DDP_OUTER_OFF && (after.syncs != before.syncs || after.in_flight != before.in_flight)) {
                const ddp_outer *u = &ddp_config(ddp)->outer;
                int sent = after.inner_steps != before.inner_steps ? outer_due(u, after.inner_steps) : -1;
                printf("outer step %5d | ", step);
                if (sent >= 0) printf("sent fragment %d/%d | ", sent, u->fragments);
                if (after.syncs != before.syncs) {
                    printf("merged fragment %d/%d | exchange %.1f ms | ", before.in_flight >= 0 ? before.in_flight : sent, u->fragments,
                           after.exchange_ms);
                    if (after.slowest_group >= 0) printf("last at the exchange: group %d, +%.1f ms | ", after.slowest_group, after.straggler_ms);
                }
                if (after.in_flight >= 0) printf("in flight until inner step %lld | ", (long long)(after.inner_steps + u->delay_steps));
                printf("syncs %lld | inner steps %lld | adamw + outer %.1f ms | waited for exchanges %.1f ms in all\n",
                       (long long)after.syncs, (long long)after.inner_steps, 1e3 * (now_s() - t0), after.wait_ms);
            }
        }
        model_time_end(&mo);
        st = ddp_last_step_stats(ddp);
        straggler_note(&late, &o, &st, step, 1e3 * (now_s() - t_step));
        if (logs) {
            loss = model_loss_sum(&mo, (float)o.accum, o.accum);   /* this step's; GPU: waits for the device */
            CHECK(ddp_allreduce(ddp, &loss, 1, DDP_AVG));
            ms = 1e3 * (now_s() - t_line) / (step - step_line);   /* the mean step since the last line */
            t_line = now_s();
            step_line = step;
            if (rank == 0)
                printf("step %5d/%d | loss %.6f | lr %.3e | norm %.3f | %7.1f ms | %6.0f tok/s | compute %.1f ms comm %.2f ms "
                       "exposed %.2f ms overlap %3.0f%% last bucket %.2f ms\n", step, o.steps, loss, lr, norm, ms,
                       (double)world * B * T * o.accum / (ms / 1e3), st.backward_ms, st.comm_ms, st.exposed_ms, st.overlap_pct,
                       st.last_bucket_comm_ms);
            if (rank == 0) straggler_print(&late, &o);
            memset(&late, 0, sizeof late);
        }
        /* op times: the step's end (a device wait, only with GPT_OP_TIMES=1); the run's first
           steps are warm-up and not counted */
        model_op_times_step(&mo, step, timed_after);
        if (o.eval_every > 0 && step % o.eval_every == 0 && step < o.steps) {
            double t_val = now_s();
            CHECK(evaluate(ddp, &mo, &o, &data, tok, tgt, &val));
            /* the training time so far (validations left out): a loss-against-wall-clock curve */
            if (rank == 0) printf("step %5d | val loss %.4f | %.2f s training\n", step, val, t_val - t_start - t_eval);
            t_eval += now_s() - t_val;
            model_op_times_restart(&mo);
            t_line = now_s();   /* the next line's mean is of training steps only */
            step_line = step;
        }
        if (o.save && o.save_every > 0 && step % o.save_every == 0) {
            CHECK(save_run(ddp, &o, step, windows));
            model_op_times_restart(&mo);
        }
    }
    {
        double secs = now_s() - t_start;
        uint64_t hash;
        if (rank == 0) model_op_times_print(&mo);   /* before the evaluation: training steps only */
        CHECK(evaluate(ddp, &mo, &o, &data, tok, tgt, &val));
        CHECK(params_hash(ddp, &hash));
        if (rank == 0) {
            printf("done: step %d | val loss %.4f | %.1f s training | %.2f s without the validations\n", step, val, secs, secs - t_eval);
            printf("params fnv1a %016llx\n", (unsigned long long)hash);
        }
    }
    if (o.save) CHECK(save_run(ddp, &o, step, windows));
    if (o.save && rank == 0) printf("checkpoint: %s (step %d)\n", o.save, step);
    /* ZeRO-3 where a gather is a collective (NCCL's all-gather, MPI's): every rank samples alike */
    if (o.sample > 0 && (rank == 0 || ((mo.on_gpu || ddp_config(ddp)->backend == DDP_BACKEND_MPI) &&
                                       ddp_config(ddp)->shard == DDP_SHARD_PARAMETERS)) &&
        !sample_text(&mo, &o, rank == 0))
        DIE("train_gpt: rank %d: out of memory for a sample of %d bytes", rank, o.sample);
    CHECK(ddp_barrier(ddp));
    free(tok); free(tgt); free(data.bytes);
    model_destroy(&mo);
    return ddp_shutdown(ddp) == DDP_OK ? 0 : 1;
}
