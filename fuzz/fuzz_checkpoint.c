/* fuzz_checkpoint.c — libFuzzer target for train_gpt's checkpoint loader (examples/gpt).
   Each input is a whole checkpoint file: the loader must refuse anything but a complete,
   checksummed checkpoint of the same model and seed, with nothing after the checksum and a step
   a run can reach, with a clear message, and never read or write out of bounds. The model is tiny so that a real checkpoint (the seed) is a few KiB.
   Seeds: a valid checkpoint and a few damaged ones, written by this binary when it is run with
   FUZZ_WRITE_SEEDS=DIR (fuzz/run.sh does that). */
#define main train_gpt_main
#include "../examples/gpt/train_gpt.c"
#undef main

static ddp_context *fuzz_ddp;
static model fuzz_model;
static options fuzz_options;
static char fuzz_path[64];

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) { if (n) fwrite(data, 1, n, f); fclose(f); }
}

static void write_seeds(const char *dir) {
    char err[512], path[512], *buf;
    long n;
    FILE *f;
    snprintf(path, sizeof path, "%s/valid", dir);
    if (!save_checkpoint(fuzz_ddp, &fuzz_options, 7, path, err, sizeof err)) { fprintf(stderr, "%s\n", err); exit(1); }
    if (!(f = fopen(path, "rb")) || fseek(f, 0, SEEK_END) || (n = ftell(f)) <= 0) exit(1);
    buf = (char *)malloc((size_t)n);
    rewind(f);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) exit(1);
    fclose(f);
    snprintf(path, sizeof path, "%s/truncated", dir);
    write_file(path, buf, (size_t)n / 2);
    buf[n / 3] ^= 0x40;
    snprintf(path, sizeof path, "%s/flipped_bit", dir);
    write_file(path, buf, (size_t)n);
    snprintf(path, sizeof path, "%s/header_only", dir);
    write_file(path, buf, sizeof(ckpt_header));
    free(buf);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    ddp_desc desc;
    options *o = &fuzz_options;
    (void)argc; (void)argv;
    memset(&desc, 0, sizeof desc);
    desc.world_size = 1;
    desc.log_level = DDP_LOG_OFF;
    memset(o, 0, sizeof *o);
    o->model.layers = 1; o->model.heads = 1; o->model.dim = 4; o->model.seq = 2; o->model.batch = 1;
    o->seed = 1;
    if (ddp_init(&fuzz_ddp, &desc) != DDP_OK || model_create(&fuzz_model, fuzz_ddp, o) != DDP_OK) {
        fprintf(stderr, "fuzz_checkpoint: setup failed: %s\n", ddp_last_error(fuzz_ddp));
        exit(1);
    }
    snprintf(fuzz_path, sizeof fuzz_path, "/tmp/fuzz_checkpoint.%d", (int)getpid());
    if (getenv("FUZZ_WRITE_SEEDS")) { write_seeds(getenv("FUZZ_WRITE_SEEDS")); exit(0); }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[1024];
    int step;
    err[0] = 0;
    write_file(fuzz_path, data, size);
    step = load_checkpoint(fuzz_ddp, &fuzz_options, fuzz_path, err, sizeof err);
    if (step < 0 && !err[0]) {
        fprintf(stderr, "fuzz_checkpoint: a refused checkpoint without a message\n");
        abort();
    }
    if (step > CKPT_MAX_STEP) {   /* accepted: the step must be one a run can reach */
        fprintf(stderr, "fuzz_checkpoint: accepted step %d\n", step);
        abort();
    }
    return 0;
}
