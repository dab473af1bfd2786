/* nbd_backend_test.c - the block device's network backends (ext/frontend/nbd_resp.c,
 * nbd_memcache.c over nbd_netkv.c) against a real server, driven as the NBD server
 * drives them: a context opened on an epoll, ops submitted, flushed, completed from
 * on_event. Run by tests/integration/test_nbd_backends.py, which starts the server.
 *
 *   nbd_backend_test URL PREFIX basic [BADBLOCK]   pipelined PUT/GET/DEL/SYNC of many
 *        blocks, absent = zeros, per-block order, 32 requests in one writev, a large
 *        pipeline through a full socket; BADBLOCK: a key of the wrong length -> -EIO
 *   nbd_backend_test URL PREFIX openfail       open must fail: prints its message
 *   nbd_backend_test URL PREFIX kill [durable] interactive (stdin/stdout with the test):
 *        ops in flight when the server dies complete with -EIO, ops while it is down
 *        fail, the context reconnects once the server is back; durable: the writes
 *        completed before the kill read back after the restart (else zeros)
 *   nbd_backend_test URL PREFIX stall          interactive: a server that stops
 *        answering fails the requests in flight after NK_STALL_MS (built 1000)
 *   nbd_backend_test URL PREFIX probe K        GET blocks 0..K-1 one by one from the
 *        test's scripted server: each one's rc and content
 *   nbd_backend_test URL PREFIX bench get|put QD CONNS SECONDS   throughput, side by side
 * Prints "ok" last on success; exits 1 with a message on the first failure.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "frontend/nbd_backend.h"
#include "frontend/nbd_netkv.h"
#include "frontend/nbd_netkv_int.h" /* NK_STALL_MS */

#ifndef BS
#define BS 4096 /* the block size (the test builds 65536 too) */
#endif

/* Allocations by the backend (linked with -Wl,--wrap=malloc,--wrap=realloc,--wrap=calloc):
 * once warm, an operation must cost none. */
static unsigned long allocs;
void *__real_malloc(size_t n);
void *__real_realloc(void *p, size_t n);
void *__real_calloc(size_t k, size_t n);
void *__wrap_malloc(size_t n)
{
    allocs++;
    return __real_malloc(n);
}
void *__wrap_realloc(void *p, size_t n)
{
    allocs++;
    return __real_realloc(p, n);
}
void *__wrap_calloc(size_t k, size_t n)
{
    allocs++;
    return __real_calloc(k, n);
}

static int epfd;
static int in_submit;
static const struct nbd_backend_ops *be;

static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    exit(1);
}

#define CHECK(cond, ...)                                                                                           \
    do {                                                                                                           \
        if (!(cond))                                                                                               \
            fail(__VA_ARGS__);                                                                                     \
    } while (0)

struct top {
    struct nbd_kvop op;
    int done;
    char buf[BS];
};

static void on_done(struct nbd_kvop *op)
{
    CHECK(!in_submit, "done called from inside submit (block %llu)", (unsigned long long)op->block);
    struct top *t = (struct top *)op;
    CHECK(!t->done, "done called twice for block %llu", (unsigned long long)op->block);
    t->done = 1;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void *open_ctx(const char *url, const char *prefix, int conns)
{
    struct nbd_backend_cfg cfg = {.url = url, .key_prefix = prefix, .block_size = BS, .conns = conns, .epfd = epfd};
    char err[512];
    void *ctx = NULL;
    int rc = be->open(&ctx, &cfg, err, sizeof err);
    CHECK(rc == 0, "open %s: %d: %s", url, rc, err);
    return ctx;
}

/* Run the epoll loop (every context on it) for up to ms, or until every op in
 * ops[0..n) is done (n > 0). Returns the number not done. */
static int run(struct top *ops, int n, int ms)
{
    uint64_t end = now_ms() + (uint64_t)ms;
    for (;;) {
        int left = 0;
        for (int i = 0; i < n; i++)
            left += !ops[i].done;
        if ((n && !left) || now_ms() >= end)
            return left;
        struct epoll_event ev[64];
        int k = epoll_wait(epfd, ev, 64, 10);
        for (int i = 0; i < k; i++) {
            struct nbd_watch *w = ev[i].data.ptr;
            CHECK(w->kind == NBD_WATCH_BACKEND, "a watch of kind %d", w->kind);
            be->on_event(w->ctx, w, ev[i].events);
        }
    }
}

static void fill(char *buf, uint64_t block, unsigned gen)
{
    uint64_t s = block * 0x9E3779B97F4A7C15ull + gen + 1;
    for (int i = 0; i < BS; i += 8) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        memcpy(buf + i, &s, 8);
    }
}

static void submit(void *ctx, struct top *t, int kind, uint64_t block, unsigned gen)
{
    t->op = (struct nbd_kvop){.kind = kind, .block = block, .buf = t->buf, .done = on_done};
    t->done = 0;
    if (kind == NBD_KV_PUT)
        fill(t->buf, block, gen);
    else
        memset(t->buf, 0xAA, BS); /* a GET of an absent block must zero it */
    in_submit = 1;
    int rc = be->submit(ctx, &t->op);
    in_submit = 0;
    CHECK(rc == 0, "submit of block %llu: %d", (unsigned long long)block, rc);
}

static void expect_block(struct top *t, uint64_t block, unsigned gen, const char *what)
{
    static char want[BS];
    CHECK(t->op.rc == 0, "%s: GET of block %llu: rc %d", what, (unsigned long long)block, t->op.rc);
    if (gen == 0)
        memset(want, 0, BS);
    else
        fill(want, block, gen);
    CHECK(!memcmp(want, t->buf, BS), "%s: block %llu is not what was written (gen %u)", what,
          (unsigned long long)block, gen);
}

static void all_ok(struct top *ops, int n, const char *what)
{
    int left = run(ops, n, 20000);
    CHECK(!left, "%s: %d of %d ops not done in 20 s", what, left, n);
    for (int i = 0; i < n; i++)
        CHECK(ops[i].op.rc == 0, "%s: op %d (kind %d, block %llu): rc %d", what, i, ops[i].op.kind,
              (unsigned long long)ops[i].op.block, ops[i].op.rc);
}

static void basic(const char *url, const char *prefix, long badblock)
{
    enum { N = 256, BIG = (8 << 20) / BS > 256 ? (8 << 20) / BS : 256 }; /* BIG: 8 MiB or 256 blocks */
    static struct top ops[BIG];
    void *a = open_ctx(url, prefix, 2);
    void *b = open_ctx(url, prefix, 1);
    /* blocks 0..N-1 and some far ones; every other one written */
    uint64_t blocks[N];
    for (int i = 0; i < N; i++)
        blocks[i] = i < N - 4 ? (uint64_t)i : 1000000000000ull + (uint64_t)i;
    for (int i = 0; i < N; i++)
        submit(a, &ops[i], NBD_KV_DEL, blocks[i], 0); /* a clean slate, whatever ran before */
    be->flush(a);
    all_ok(ops, N, "DEL all");
    for (int i = 0; i < N; i += 2)
        submit(a, &ops[i / 2], NBD_KV_PUT, blocks[i], 1);
    be->flush(a);
    all_ok(ops, N / 2, "PUT every other block");
    for (int i = 0; i < N; i++)
        submit(a, &ops[i], NBD_KV_GET, blocks[i], 0);
    be->flush(a);
    all_ok(ops, N, "GET all");
    for (int i = 0; i < N; i++)
        expect_block(&ops[i], blocks[i], i % 2 ? 0 : 1, "pipelined GET (absent = zeros)");

    /* one batch: PUT v2, PUT v3, GET, DEL, GET of one block: in order, on one connection */
    for (int j = 0; j < 8; j++) {
        uint64_t blk = (uint64_t)j * 3;
        struct top *t = &ops[j * 5];
        submit(a, &t[0], NBD_KV_PUT, blk, 2);
        submit(a, &t[1], NBD_KV_PUT, blk, 3);
        submit(a, &t[2], NBD_KV_GET, blk, 0);
        submit(a, &t[3], NBD_KV_DEL, blk, 0);
        submit(a, &t[4], NBD_KV_GET, blk, 0);
    }
    be->flush(a);
    all_ok(ops, 40, "PUT PUT GET DEL GET batch");
    for (int j = 0; j < 8; j++) {
        expect_block(&ops[j * 5 + 2], (uint64_t)j * 3, 3, "GET after two PUTs in one batch");
        expect_block(&ops[j * 5 + 4], (uint64_t)j * 3, 0, "GET after DEL in one batch");
    }

    /* SYNC: taken, completed later (never inside submit), rc 0 */
    submit(a, &ops[0], NBD_KV_SYNC, 0, 0);
    CHECK(!ops[0].done, "SYNC completed inside submit");
    be->flush(a);
    all_ok(ops, 1, "SYNC");

    /* 128 KiB = 32 blocks: 32 requests leave in one writev on context b (1
       connection). PUTs first, on a context that has sent nothing yet: the first
       writev carries all 32 (it may not send all their bytes at once) */
    struct nk_counters c0, c1;
    for (int i = 0; i < 32; i++)
        submit(b, &ops[i], NBD_KV_PUT, 64 + (uint64_t)i, 4);
    be->flush(b);
    nk_get_counters(b, &c0);
    CHECK(c0.max_requests_per_writev == 32, "32 PUTs: one writev carried at most %llu requests",
          (unsigned long long)c0.max_requests_per_writev);
    all_ok(ops, 32, "32 PUTs");
    nk_get_counters(b, &c0);
    for (int i = 0; i < 32; i++)
        submit(b, &ops[i], NBD_KV_GET, 64 + (uint64_t)i, 0);
    be->flush(b);
    nk_get_counters(b, &c1);
    CHECK(c1.writev_calls - c0.writev_calls == 1 && c1.requests_sent - c0.requests_sent == 32,
          "32 GETs took %llu writev calls for %llu requests", (unsigned long long)(c1.writev_calls - c0.writev_calls),
          (unsigned long long)(c1.requests_sent - c0.requests_sent));
    all_ok(ops, 32, "32 GETs");
    for (int i = 0; i < 32; i++)
        expect_block(&ops[i], 64 + (uint64_t)i, 4, "GET through the second context");
    printf("128 KiB: 32 PUTs in one writev call, 32 GETs in 1 writev\n");

    /* a pipeline larger than the socket buffers: 8 MiB of PUTs, then GETs */
    for (int i = 0; i < BIG; i++)
        submit(a, &ops[i], NBD_KV_PUT, 10000 + (uint64_t)i, 5);
    be->flush(a);
    all_ok(ops, BIG, "big PUT pipeline");
    for (int i = 0; i < BIG; i++)
        submit(a, &ops[i], NBD_KV_GET, 10000 + (uint64_t)i, 0);
    be->flush(a);
    all_ok(ops, BIG, "big GET pipeline");
    for (int i = 0; i < BIG; i++)
        expect_block(&ops[i], 10000 + (uint64_t)i, 5, "big pipeline");
    /* warm now: the same pipelines again allocate nothing */
    unsigned long before = allocs;
    for (int i = 0; i < BIG; i++)
        submit(a, &ops[i], NBD_KV_PUT, 10000 + (uint64_t)i, 6);
    be->flush(a);
    all_ok(ops, BIG, "big PUT pipeline, warm");
    for (int i = 0; i < BIG; i++)
        submit(a, &ops[i], NBD_KV_GET, 10000 + (uint64_t)i, 0);
    be->flush(a);
    all_ok(ops, BIG, "big GET pipeline, warm");
    CHECK(allocs == before, "%lu allocations for %d warm operations", allocs - before, 2 * BIG);
    for (int i = 0; i < BIG; i++)
        expect_block(&ops[i], 10000 + (uint64_t)i, 6, "big pipeline, warm");
    printf("warm: no allocation in %d operations\n", 2 * BIG);
    for (int i = 0; i < BIG; i++)
        submit(a, &ops[i], NBD_KV_DEL, 10000 + (uint64_t)i, 0);
    be->flush(a);
    all_ok(ops, BIG, "big DEL pipeline");
    nk_get_counters(a, &c1);
    printf("big pipeline: %llu writev calls, %llu reads, %llu bytes read straight into blocks\n",
           (unsigned long long)c1.writev_calls, (unsigned long long)c1.reads,
           (unsigned long long)c1.zero_copy_bytes);

    struct nbd_backend_stats st = {0};
    if (badblock >= 0) {
        /* the test stored a value of the wrong length there: EIO, and the connection goes on */
        submit(a, &ops[0], NBD_KV_GET, (uint64_t)badblock, 0);
        submit(a, &ops[1], NBD_KV_GET, 64, 0);
        be->flush(a);
        CHECK(!run(ops, 2, 20000), "GET of the bad block not done");
        CHECK(ops[0].op.rc == -EIO, "GET of a value of the wrong length: rc %d, expected -EIO", ops[0].op.rc);
        expect_block(&ops[1], 64, 4, "GET after the bad block");
        be->add_stats(a, &st);
        CHECK(st.errors == 1, "errors %llu, expected 1", (unsigned long long)st.errors);
        printf("wrong-length value: EIO\n");
    }
    CHECK(be->pending(a) == 0 && be->pending(b) == 0, "ops still pending");
    st = (struct nbd_backend_stats){0};
    be->add_stats(b, &st);
    CHECK(st.errors == 0 && st.reconnects == 0, "context b: %llu errors, %llu reconnects",
          (unsigned long long)st.errors, (unsigned long long)st.reconnects);
    be->close(a);
    be->close(b);
}

static void wait_line(const char *tell)
{
    char line[64];
    printf("%s\n", tell);
    fflush(stdout);
    CHECK(fgets(line, sizeof line, stdin), "no reply from the test to %s", tell);
}

static void kill_test(const char *url, const char *prefix, int durable)
{
    enum { N = 64 };
    static struct top ops[2 * N];
    void *a = open_ctx(url, prefix, 2);
    for (int i = 0; i < N; i++)
        submit(a, &ops[i], NBD_KV_PUT, (uint64_t)i, 1);
    be->flush(a);
    all_ok(ops, N, "PUT before the kill");
    wait_line("FREEZE"); /* the test stops the server (SIGSTOP) */
    for (int i = 0; i < N; i++) {
        submit(a, &ops[i], NBD_KV_PUT, (uint64_t)i, 2);
        submit(a, &ops[N + i], NBD_KV_GET, (uint64_t)i, 0);
    }
    be->flush(a);
    int left = run(ops, 2 * N, 300);
    CHECK(left == 2 * N, "%d ops completed while the server was stopped", 2 * N - left);
    CHECK(be->pending(a) == 2 * N, "pending %llu, expected %d", (unsigned long long)be->pending(a), 2 * N);
    wait_line("KILL"); /* the test kills it (SIGKILL) */
    left = run(ops, 2 * N, 20000);
    CHECK(!left, "%d ops in flight not completed after the server died", left);
    for (int i = 0; i < 2 * N; i++)
        CHECK(ops[i].op.rc == -EIO, "op %d in flight when the server died: rc %d, expected -EIO", i, ops[i].op.rc);
    /* while it is down: ops fail (later, not inside submit) */
    run(NULL, 0, 100);
    submit(a, &ops[0], NBD_KV_GET, 1, 0);
    CHECK(!ops[0].done, "done inside submit while the server is down");
    be->flush(a);
    CHECK(!run(ops, 1, 20000), "GET while down not completed");
    CHECK(ops[0].op.rc == -EIO, "GET while the server is down: rc %d", ops[0].op.rc);
    printf("in flight at the kill: %d ops failed with EIO\n", 2 * N);
    wait_line("RESTART"); /* the test starts the server again on the same port */
    uint64_t end = now_ms() + 20000;
    int tries = 0;
    for (;;) {
        tries++;
        submit(a, &ops[0], NBD_KV_PUT, 7, 3);
        submit(a, &ops[1], NBD_KV_GET, 7, 0);
        be->flush(a);
        CHECK(!run(ops, 2, 20000), "ops not completed after the restart");
        if (ops[0].op.rc == 0 && ops[1].op.rc == 0)
            break;
        CHECK(now_ms() < end, "no reconnect within 20 s of the restart (last rc %d)", ops[1].op.rc);
        run(NULL, 0, 50);
    }
    expect_block(&ops[1], 7, 3, "GET after the reconnect");
    /* every connection of the context is back; what the restarted server holds: the
       writes completed before the kill if it is durable, nothing otherwise (the ones
       in flight at the kill were never applied: the server was stopped) */
    for (int i = 0; i < N; i++)
        submit(a, &ops[i], NBD_KV_GET, (uint64_t)i, 0);
    be->flush(a);
    all_ok(ops, N, "GETs on every connection after the reconnect");
    for (int i = 0; i < N; i++)
        expect_block(&ops[i], (uint64_t)i, i == 7 ? 3 : durable ? 1 : 0, "after the restart");
    struct nbd_backend_stats st = {0};
    be->add_stats(a, &st);
    CHECK(st.reconnects >= 2, "reconnects %llu, expected one per connection (2)", (unsigned long long)st.reconnects);
    CHECK(st.errors >= 2 * N + 1, "errors %llu", (unsigned long long)st.errors);
    printf("reconnected after %d tries: %llu reconnects\n", tries, (unsigned long long)st.reconnects);
    be->close(a);
}

/* The server stops answering (SIGSTOP) with requests in flight: they fail with
 * EIO once NK_STALL_MS (built 1000 for this test) passes without a reply; the
 * connection comes back when the server does (SIGCONT). */
static void stall_test(const char *url, const char *prefix)
{
    static struct top ops[16];
    void *a = open_ctx(url, prefix, 1);
    wait_line("FREEZE");
    uint64_t t0 = now_ms();
    for (int i = 0; i < 16; i++)
        submit(a, &ops[i], NBD_KV_GET, (uint64_t)i, 0);
    be->flush(a);
    int left = run(ops, 16, 20000);
    uint64_t waited = now_ms() - t0;
    CHECK(!left, "%d requests to a stopped server still pending after 20 s", left);
    for (int i = 0; i < 16; i++)
        CHECK(ops[i].op.rc == -EIO, "request to a stopped server: rc %d, expected -EIO", ops[i].op.rc);
    CHECK(waited >= NK_STALL_MS * 9 / 10, "failed after %llu ms, before the stall limit of %d ms",
          (unsigned long long)waited, NK_STALL_MS);
    printf("unanswered requests failed after %llu ms (limit %d ms)\n", (unsigned long long)waited, NK_STALL_MS);
    wait_line("THAW");
    uint64_t end = now_ms() + 20000;
    do {
        run(NULL, 0, 50);
        submit(a, &ops[0], NBD_KV_GET, 3, 0);
        be->flush(a);
        CHECK(!run(ops, 1, 20000), "GET after the server came back not completed");
        CHECK(now_ms() < end, "no reconnect within 20 s");
    } while (ops[0].op.rc != 0);
    printf("reconnected\n");
    be->close(a);
}

/* Throughput of one context (conns connections): qd 4 KiB ops kept in flight for
 * secs seconds, resubmitted after each round of events as the NBD server does;
 * prints ops/s and this process's CPU per op. For side-by-side runs, not a test. */
static void bench(const char *url, const char *prefix, int kind, int qd, int conns, double secs)
{
    enum { SPAN = 4096 };
    static struct top ops[1024];
    CHECK(qd >= 1 && qd <= 1024, "qd 1..1024");
    void *a = open_ctx(url, prefix, conns);
    for (int i = 0; i < SPAN; i += 256) { /* the span written once, so GETs hit */
        for (int j = 0; j < 256; j++)
            submit(a, &ops[j], NBD_KV_PUT, (uint64_t)(i + j), 1);
        be->flush(a);
        all_ok(ops, 256, "bench fill");
    }
    uint64_t seed = 88172645463325252ull, done = 0;
    struct timespec c0, c1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    uint64_t t0 = now_ms(), end = t0 + (uint64_t)(secs * 1000);
    for (int i = 0; i < qd; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        submit(a, &ops[i], kind, seed % SPAN, 1);
    }
    be->flush(a);
    while (now_ms() < end) {
        struct epoll_event ev[64];
        int k = epoll_wait(epfd, ev, 64, 10);
        for (int i = 0; i < k; i++) {
            struct nbd_watch *w = ev[i].data.ptr;
            be->on_event(w->ctx, w, ev[i].events);
        }
        for (int i = 0; i < qd; i++) {
            if (!ops[i].done)
                continue;
            CHECK(ops[i].op.rc == 0, "bench op: rc %d", ops[i].op.rc);
            done++;
            seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
            ops[i].op = (struct nbd_kvop){.kind = kind, .block = seed % SPAN, .buf = ops[i].buf, .done = on_done};
            ops[i].done = 0;
            CHECK(be->submit(a, &ops[i].op) == 0, "bench submit");
        }
        be->flush(a);
    }
    double el = (double)(now_ms() - t0) / 1000.0;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    double cpu = (double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) / 1e9;
    run(ops, qd, 20000);
    struct nk_counters cn;
    nk_get_counters(a, &cn);
    printf("bench %s qd %d conns %d: %.0f ops/s, client CPU %.2f us/op, %.1f requests per writev\n",
           kind == NBD_KV_GET ? "GET" : "PUT", qd, conns, (double)done / el, cpu * 1e6 / (double)(done ? done : 1),
           (double)cn.requests_sent / (double)(cn.writev_calls ? cn.writev_calls : 1));
    be->close(a);
}

/* GET blocks 0..k-1 one at a time from a scripted server (the test's fake): prints
 * each one's rc and whether it holds fill(block, 1), zeros, or something else. */
static void probe(const char *url, const char *prefix, int k)
{
    static struct top op;
    static char want[BS], zeros[BS];
    void *a = open_ctx(url, prefix, 1);
    for (int i = 0; i < k; i++) {
        submit(a, &op, NBD_KV_GET, (uint64_t)i, 0);
        be->flush(a);
        CHECK(!run(&op, 1, 10000), "GET %d not done in 10 s", i);
        fill(want, (uint64_t)i, 1);
        printf("get %d rc=%d %s\n", i, op.op.rc,
               op.op.rc ? "-" : !memcmp(op.buf, want, BS) ? "block" : !memcmp(op.buf, zeros, BS) ? "zeros" : "other");
    }
    /* whatever happened, block 0 can be read again (after a reconnect if need be) */
    uint64_t end = now_ms() + 10000;
    do {
        run(NULL, 0, 50);
        submit(a, &op, NBD_KV_GET, 0, 0);
        be->flush(a);
        CHECK(!run(&op, 1, 10000), "GET 0 not done in 10 s");
        CHECK(now_ms() < end, "block 0 not readable again within 10 s: rc %d", op.op.rc);
    } while (op.op.rc != 0);
    fill(want, 0, 1);
    printf("recovered: %s\n", memcmp(op.buf, want, BS) ? "other" : "block");
    CHECK(be->pending(a) == 0, "ops still pending");
    be->close(a);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s URL PREFIX basic|openfail|kill [BADBLOCK]\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *url = argv[1], *prefix = argv[2], *mode = argv[3];
    be = !strncmp(url, "memcached://", 12) ? &nbd_be_memcached
         : !strncmp(url, "redis://", 8)    ? &nbd_be_redis
                                           : &nbd_be_kvstore;
    epfd = epoll_create1(EPOLL_CLOEXEC);
    CHECK(epfd >= 0, "epoll_create1: %s", strerror(errno));
    if (!strcmp(mode, "basic")) {
        basic(url, prefix, argc > 4 ? atol(argv[4]) : -1);
    } else if (!strcmp(mode, "openfail")) {
        struct nbd_backend_cfg cfg = {.url = url, .key_prefix = prefix, .block_size = BS, .conns = 2, .epfd = epfd};
        char err[512] = "";
        void *ctx = NULL;
        int rc = be->open(&ctx, &cfg, err, sizeof err);
        CHECK(rc < 0, "open of %s succeeded", url);
        printf("open failed: %d: %s\n", rc, err);
    } else if (!strcmp(mode, "bench") && argc > 7) {
        bench(url, prefix, !strcmp(argv[4], "put") ? NBD_KV_PUT : NBD_KV_GET, atoi(argv[5]), atoi(argv[6]),
              atof(argv[7]));
    } else if (!strcmp(mode, "probe") && argc > 4) {
        probe(url, prefix, atoi(argv[4]));
    } else if (!strcmp(mode, "stall")) {
        stall_test(url, prefix);
    } else if (!strcmp(mode, "kill")) {
        kill_test(url, prefix, argc > 4 && !strcmp(argv[4], "durable"));
    } else {
        fail("unknown mode %s", mode);
    }
    close(epfd);
    printf("ok\n");
    return 0;
}
