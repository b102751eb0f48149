/* fuzz_data.c — libFuzzer target for train_gpt's data loader (examples/gpt/gpt_data.h).
   An input is a configuration (first 3 bytes: context 1..64, batch 1..8, world 1..4) and a
   training file (the rest). gpt_load_data must refuse a file that is empty or too small with a
   message, and when it accepts one, every rank has a batch from the sampler and every window of it
   lies inside the training split (ASan checks each byte read). */
#define DDP_IMPLEMENTATION
#include "../ddp.h"
#include "../examples/gpt/gpt_data.h"

static char fuzz_path[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gpt_data_spec o;
    gpt_dataset d;
    char err[1024];
    int world, rank, step, *tok, *tgt;
    FILE *f;
    if (size < 3) return 0;
    if (!fuzz_path[0]) snprintf(fuzz_path, sizeof fuzz_path, "/tmp/fuzz_data.%d", (int)getpid());
    memset(&o, 0, sizeof o);
    o.path = fuzz_path;
    o.seq = 1 + data[0] % 64;
    o.batch = 1 + data[1] % 8;
    o.accum = 1;
    world = 1 + data[2] % 4;
    o.seed = data[0] * 31u + data[1];
    if (!(f = fopen(fuzz_path, "wb"))) return 0;
    if (size > 3) fwrite(data + 3, 1, size - 3, f);
    fclose(f);
    err[0] = 0;
    if (!gpt_load_data(&o, 0, world, &d, err, sizeof err)) {
        if (!err[0]) { fprintf(stderr, "fuzz_data: refused without a message\n"); abort(); }
        return 0;
    }
    tok = (int *)malloc(sizeof(int) * (size_t)o.batch * o.seq);
    tgt = (int *)malloc(sizeof(int) * (size_t)o.batch * o.seq);
    for (step = 0; step < 3; step++)
        for (rank = 0; rank < world; rank++) {   /* what train_gpt draws: a file gpt_load_data accepts always has a batch */
            ddp_sampler s = gpt_window_sampler(d.train_len, o.seq, world, rank, o.seed);
            uint64_t epoch, first;
            if (gpt_batch_position(&s, o.batch, o.accum, (uint64_t)step, 0, &epoch, &first) != DDP_OK ||
                gpt_sampled_batch(d.bytes, &s, epoch, first, o.batch, o.seq, tok, tgt) != DDP_OK) {
                fprintf(stderr, "fuzz_data: gpt_load_data accepted a file with no batch for rank %d step %d: %s\n", rank, step,
                        ddp_last_error(NULL));
                abort();
            }
        }
    free(tok);
    free(tgt);
    free(d.bytes);
    return 0;
}
