/* nbd_server_test.c - the NBD server (ext/frontend/nbd*.c) with the embedded
 * backend on a real table and disk log, driven over a unix socket by raw NBD
 * clients in threads; built with TSan and with ASan/UBSan by
 * tests/c/test_c_sanitizers.py.
 *
 * usage: nbd_server_test DIR [ROUNDS]
 *
 * Two server threads, two client connections (handed to different threads).
 * Each round both clients write the same unaligned range (1 byte to 3 blocks,
 * so both edge blocks are read-modify-written) with their own byte, at once,
 * some of them with FUA; then client 0 reads the blocks back: the part of each
 * block the range covers must hold one value, one writer's byte, never a mix.
 * In some rounds client 1 writes client 0's first (partial) block whole instead:
 * the part of it outside client 0's range must then be client 1's, whichever
 * came first (a read-modify-write that read before the full write and wrote
 * after it would bring back the old bytes). The block-lock table serializes a
 * read-modify-write against every other write of its block, on any thread. Every few rounds a FLUSH (it waits for the
 * log's fsync), a TRIM and a WRITE_ZEROES of whole blocks (their keys are gone
 * from the table) and requests pipelined without waiting. Prints a summary
 * ending in "ok", or "FAIL: ..." and exits 1. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/table.h"
#include "durability/wal.h"
#include "engine/engine.h"
#include "frontend/nbd.h"
#include "proto/nbd.h"
#include "stress.h"

#define BS 4096u
#define BLOCKS 64u
#define SIZE ((uint64_t)BS * BLOCKS)

static char sock_path[256];
static pthread_barrier_t bar;
static int rounds = 400;

struct range { uint64_t off; uint32_t len; int full; int fua; };
static struct range *plan;

static void send_all(int fd, const void *p, size_t n)
{
    for (size_t off = 0; off < n;) {
        ssize_t k = send(fd, (const char *)p + off, n - off, MSG_NOSIGNAL);
        CHECK(k > 0, "send: %s", strerror(errno));
        off += (size_t)k;
    }
}

static void recv_all(int fd, void *p, size_t n)
{
    for (size_t off = 0; off < n;) {
        ssize_t k = recv(fd, (char *)p + off, n - off, 0);
        CHECK(k > 0, "recv: %s", k ? strerror(errno) : "end of stream");
        off += (size_t)k;
    }
}

static int connect_nbd(void)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", sock_path);
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect: %s", strerror(errno));
    uint8_t g[NBD_GREETING_LEN];
    recv_all(fd, g, sizeof g);
    CHECK(nbd_get64(g) == NBD_MAGIC && nbd_get64(g + 8) == NBD_IHAVEOPT);
    uint8_t b[64];
    nbd_put32(b, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
    nbd_put64(b + 4, NBD_IHAVEOPT);
    nbd_put32(b + 12, NBD_OPT_GO);
    nbd_put32(b + 16, 6);
    nbd_put32(b + 20, 0); /* "" = the default export */
    nbd_put16(b + 24, 0);
    send_all(fd, b, 26);
    for (;;) { /* INFO replies, then ACK */
        uint8_t h[NBD_OPT_REPLY_LEN], d[256];
        recv_all(fd, h, sizeof h);
        uint32_t type = nbd_get32(h + 12), len = nbd_get32(h + 16);
        CHECK(len <= sizeof d, "reply length %u", len);
        recv_all(fd, d, len);
        if (type == NBD_REP_INFO && nbd_get16(d) == NBD_INFO_EXPORT) {
            CHECK(nbd_get64(d + 2) == SIZE);
            CHECK(nbd_get16(d + 10) & NBD_FLAG_CAN_MULTI_CONN);
        }
        if (type == NBD_REP_ACK)
            break;
        CHECK(type == NBD_REP_INFO, "option reply type %#x", type);
    }
    return fd;
}

static void request(int fd, uint16_t type, uint16_t flags, uint64_t cookie, uint64_t off, uint32_t len,
                    const void *data)
{
    uint8_t h[NBD_REQ_LEN];
    nbd_put32(h, NBD_REQUEST_MAGIC);
    nbd_put16(h + 4, flags);
    nbd_put16(h + 6, type);
    nbd_put64(h + 8, cookie);
    nbd_put64(h + 16, off);
    nbd_put32(h + 24, len);
    send_all(fd, h, sizeof h);
    if (data)
        send_all(fd, data, len);
}

/* A simple reply: its cookie; data (for a READ) into buf. */
static uint64_t reply(int fd, void *buf, uint32_t len)
{
    uint8_t h[NBD_SIMPLE_REPLY_LEN];
    recv_all(fd, h, sizeof h);
    CHECK(nbd_get32(h) == NBD_SIMPLE_REPLY_MAGIC);
    CHECK(nbd_get32(h + 4) == 0, "error %u", nbd_get32(h + 4));
    if (buf)
        recv_all(fd, buf, len);
    return nbd_get64(h + 8);
}

struct client { int id; int fd; long checked, mixed_blocks_seen; };

static void check_range(struct client *c, int round)
{
    const struct range *r = &plan[round];
    static uint8_t buf[4 * BS];
    uint64_t first = r->off / BS, last = (r->off + r->len - 1) / BS, base = first * BS;
    uint32_t n = (uint32_t)((last + 1 - first) * BS);
    request(c->fd, NBD_CMD_READ, 0, 7, base, n, NULL);
    CHECK(reply(c->fd, buf, n) == 7);
    uint8_t a = (uint8_t)(2 * round + 1), b = (uint8_t)(2 * round + 2);
    if (r->full) /* client 1 wrote block `first` whole: whatever client 0's read-modify-write of it
                    did, the part outside client 0's range is client 1's */
        for (uint64_t i = base; i < r->off; i++)
            CHECK(buf[i - base] == b, "round %d: byte %llu of block %llu is %u, not the full write's %u: a "
                  "read-modify-write undid it", round, (unsigned long long)i, (unsigned long long)first,
                  buf[i - base], b);
    for (uint64_t pos = r->off; pos < r->off + r->len;) {
        uint64_t end = (pos / BS + 1) * BS;
        if (end > r->off + r->len)
            end = r->off + r->len;
        uint8_t v = buf[pos - base];
        CHECK(v == a || (v == b && (!r->full || pos / BS == first)), "round %d: byte %llu is %u, not a writer's "
              "(%u, %u)", round, (unsigned long long)pos, v, a, b);
        for (uint64_t i = pos; i < end; i++)
            CHECK(buf[i - base] == v, "round %d: block %llu mixes %u and %u", round, (unsigned long long)(pos / BS),
                  v, buf[i - base]);
        c->checked++;
        pos = end;
    }
}

static void *client_main(void *arg)
{
    struct client *c = arg;
    static uint8_t bufs[2][3 * BS + BS];
    uint8_t *w = bufs[c->id];
    for (int i = 0; i < rounds; i++) {
        const struct range *r = &plan[i];
        uint8_t v = (uint8_t)(2 * i + 1 + c->id);
        pthread_barrier_wait(&bar);
        if (c->id == 1 && r->full) {
            memset(w, v, BS);
            request(c->fd, NBD_CMD_WRITE, 0, 1, (r->off / BS) * BS, BS, w);
        } else {
            memset(w, v, r->len);
            request(c->fd, NBD_CMD_WRITE, r->fua ? NBD_CMD_FLAG_FUA : 0, 1, r->off, r->len, w);
        }
        CHECK(reply(c->fd, NULL, 0) == 1);
        pthread_barrier_wait(&bar);
        if (c->id == 0)
            check_range(c, i);
        if (c->id == 1 && i % 16 == 5) { /* pipelined: trim, zero and flush in one send, replies in any order */
            request(c->fd, NBD_CMD_TRIM, 0, 11, (BLOCKS - 2) * BS, BS, NULL);
            request(c->fd, NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_FUA, 12, (BLOCKS - 1) * BS, BS, NULL);
            request(c->fd, NBD_CMD_FLUSH, 0, 13, 0, 0, NULL);
            uint64_t seen = 0;
            for (int k = 0; k < 3; k++)
                seen |= 1ull << reply(c->fd, NULL, 0);
            CHECK(seen == (1ull << 11 | 1ull << 12 | 1ull << 13));
        }
    }
    return NULL;
}

int main(int argc, char **argv)
{
    CHECK(argc >= 2, "usage: nbd_server_test DIR [ROUNDS]");
    if (argc > 2)
        rounds = atoi(argv[2]);
    char err[512], logdir[512];
    snprintf(logdir, sizeof logdir, "%s/log", argv[1]);
    snprintf(sock_path, sizeof sock_path, "%s/nbd.sock", argv[1]);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    plan = calloc((size_t)rounds, sizeof *plan);
    for (int i = 0; i < rounds; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        struct range *r = &plan[i];
        r->len = 1 + (uint32_t)(s % (3 * BS));
        r->off = (s >> 20) % (SIZE - 4 * BS);
        r->fua = (s >> 40) % 8 == 0;
        r->full = r->off % BS && (s >> 44) % 2; /* client 1 writes client 0's first, partial block whole */
    }

    struct kv_table *t;
    CHECK(kvt_create(&t, 0) == 0);
    struct wal_config wc = {.dir = logdir, .sync = 1, .first_lsn = 1};
    struct wal *w;
    CHECK(wal_open(&w, &wc, err, sizeof err) == 0, "wal_open: %s", err);
    CHECK(wal_start(w) == 0);
    kvt_set_log(t, wal_log_fn, w);
    struct kv_config cfg = {.bind = "127.0.0.1", .threads = 1, .maxclients = 10, .wal = w,
                            .durability = "disk", .arch = "poller"};
    struct kv_engine *e;
    CHECK(eng_create(&e, t, &cfg, err, sizeof err) == 0, "eng_create: %s", err);

    struct nbd_config nc = {.port = -1, .unix_path = sock_path, .export_name = "disk", .size = SIZE,
                            .block_size = BS, .threads = 2, .conns_per_thread = 1, .max_clients = 8,
                            .backend = "embedded"};
    struct nbd_server *srv;
    CHECK(nbd_create(&srv, &nc, e, err, sizeof err) == 0, "nbd_create: %s", err);
    CHECK(nbd_port(srv) == -1);
    CHECK(nbd_start(srv, err, sizeof err) == 0, "nbd_start: %s", err);

    pthread_barrier_init(&bar, NULL, 2);
    struct client cl[2] = {{.id = 0}, {.id = 1}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        cl[i].fd = connect_nbd();
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, client_main, &cl[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);

    /* trimmed and zeroed blocks are no keys; a written one is one block */
    CHECK(!kvt_exists(t, "nbd:disk:63", 11), "a zeroed block is no key");
    static char blk[BS];
    uint64_t first = plan[0].off / BS;
    CHECK(kvt_get_copy(t, "nbd:disk:0", 10, blk, 0) == BS || first > 0, "a written block is one block");
    struct nbd_stats st;
    nbd_get_stats(srv, &st);
    CHECK(st.rmw > 0 && st.kv_syncs > 0 && st.errors == 0 && st.protocol_errors == 0);
    CHECK(st.writes == 2ull * (uint64_t)rounds, "writes %llu", (unsigned long long)st.writes);
    CHECK(st.total_connections == 2 && st.connections == 2);
    /* Stopping with requests in flight: FUA writes and FLUSHes (each waits for the
     * log's fsync) pipelined, nbd_stop as soon as the server has read them all; it
     * lets them finish and answers them (the backend's pending count), and what a
     * backend still held would be freed by nbd_destroy (LeakSanitizer checks). */
    int fd = connect_nbd();
    struct timeval tmo = {.tv_sec = 20};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tmo, sizeof tmo);
    enum { LATE = 64 };
    static uint8_t late[BS];
    memset(late, 0x5a, sizeof late);
    for (int i = 0; i < LATE; i++) {
        request(fd, NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, 1000 + (uint64_t)i, (uint64_t)(i % BLOCKS) * BS, BS, late);
        request(fd, NBD_CMD_FLUSH, 0, 2000 + (uint64_t)i, 0, 0, NULL);
    }
    for (int tries = 0; tries < 20000; tries++) { /* the server has read them all */
        struct nbd_stats now;
        nbd_get_stats(srv, &now);
        if (now.writes - st.writes == LATE && now.flushes - st.flushes == LATE)
            break;
        usleep(1000);
    }
    nbd_stop(srv);
    for (int i = 0; i < 2 * LATE; i++)
        reply(fd, NULL, 0); /* all answered, without error */
    close(fd);
    for (int i = 0; i < 2; i++)
        close(cl[i].fd);
    nbd_destroy(srv);
    wal_close(w); /* its thread feeds the engine's latency monitor: first */
    eng_destroy(e);
    kvt_destroy(t);
    free(plan);
    printf("nbd_server_test: %d rounds, %ld block parts checked, %llu read-modify-writes, %llu syncs: ok\n", rounds,
           cl[0].checked, (unsigned long long)st.rmw, (unsigned long long)st.kv_syncs);
    return 0;
}
