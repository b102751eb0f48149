/* fuzz_store.c — libFuzzer target for the rendezvous store's message handling (ddp.h).
   Each input is what one client sends: it goes through a socketpair into the server's own
   reader (ddp__conn_read -> ddp__serve_request), exactly as bytes from the network would, and
   the server's replies are drained. Anything may arrive: garbage, lies about lengths, requests
   before the handshake, huge or truncated frames. The server must stay well.
   The server's handshake nonces are fixed here (DDP__FIXED_NONCES_FOR_FUZZING), so seeds can
   carry a valid proof of the job token and the fuzzer gets past the handshake.
   Build and run: make fuzz  (or: make build/fuzz_store && build/fuzz_store fuzz/corpus/store) */
#define DDP_IMPLEMENTATION
#define DDP__FIXED_NONCES_FOR_FUZZING
#include "../ddp.h"

static ddp_context ctx;
static ddp__store_server server;

static void setup_once(void) {
    static int done;
    if (done) return;
    done = 1;
    ctx.rank = 0;
    ctx.world = 4;
    snprintf(ctx.job.token, sizeof ctx.job.token, "fuzz-token");
    ddp__derive_store_key(&ctx);   /* job id "": fuzz/make_store_corpus.py makes its proofs the same way */
    ctx.desc.log_level = DDP_LOG_OFF;
    ctx.desc.timeout_s = 5;
    pthread_mutex_init(&ctx.err_lock, NULL);
    server.ctx = &ctx;
    server.lost_rank = -1;
    server.max_conns = 1;
    server.listen_fd = server.wake_pipe[0] = server.wake_pipe[1] = -1;
    server.conns = (ddp__conn *)ddp__calloc(sizeof(ddp__conn));
}

static void drain(int fd) {
    char sink[4096];
    while (recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int sv[2], i, rc = 0;
    setup_once();
    if (size > 60000 || socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return 0;
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
    memset(&server.conns[0], 0, sizeof(ddp__conn));
    server.conns[0].fd = sv[0];
    server.conns[0].opened = ddp__now();
    server.num_conns = 1;
    if (size && write(sv[1], data, size) != (ssize_t)size) { close(sv[0]); close(sv[1]); return 0; }
    shutdown(sv[1], SHUT_WR);
    for (i = 0; i < 10000 && rc == 0 && server.num_conns == 1; i++) {
        size_t before = server.conns[0].got;
        rc = ddp__conn_read(&server, &server.conns[0]);
        drain(sv[1]);
        ddp__serve_parked(&server);
        drain(sv[1]);
        if (rc == 0 && server.num_conns == 1 && server.conns[0].got == before && !server.conns[0].waiting) break;
        if (server.conns[0].waiting) break;   /* a GET parked for a key nobody sets */
    }
    if (server.num_conns == 1) ddp__conn_close(&server, 0);
    else close(sv[0]);
    close(sv[1]);
    /* Keep runs independent: forget the keys this input set. */
    for (i = 0; i < server.num_kv; i++) { DDP_FREE(server.kv[i].key); DDP_FREE(server.kv[i].val); }
    server.num_kv = 0;
    server.lost_rank = -1;
    return 0;
}
