/* session_test.c - the request runner (ext/engine/session.c) on a real table,
 * log and data file: what ses_run answers (DONE, HOLD, STALL) and what it leaves
 * in the reply buffer, for the blocking (ses_wait) and the woken (eventfd) ways
 * of waiting, with memory too small for the keys so that writes wait for the
 * flusher and reads for the loader. Usage: session_test DIR (an empty directory). */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "core/table.h"
#include "durability/bosc.h"
#include "durability/wal.h"
#include "engine/engine.h"
#include "engine/session.h"
#include "stress.h"

#define KEYS 3000
#define VALUE 200
#define MAX_MEMORY (256 * 1024) /* far below KEYS * VALUE: most keys live only in the file */

static struct kvbuf out;

/* Run the request given as NULL-terminated words until it does not stall (blocking). */
static int run(struct session *s, int *stalls, ...)
{
    const char *argv[16];
    size_t argl[16];
    int argc = 0;
    va_list ap;
    va_start(ap, stalls);
    for (const char *a; (a = va_arg(ap, const char *)); argc++) {
        argv[argc] = a;
        argl[argc] = strlen(a);
    }
    va_end(ap);
    int r;
    while ((r = ses_run(s, argc, argv, argl)) == SES_STALL) {
        CHECK(s->stall != CMD_STALL_NONE);
        CHECK(ses_wait(s) >= 0, "ses_wait failed");
        if (stalls)
            (*stalls)++;
    }
    return r;
}

static void value_of(int i, char *v)
{
    memset(v, 'a' + i % 26, VALUE);
    snprintf(v, VALUE + 1, "%d", i);
    v[strlen(v)] = '-'; /* keep the fill after the number */
    v[VALUE] = 0;
}

static void wait_durable(struct wal *w, uint64_t lsn)
{
    for (int i = 0; i < 10000 && wal_durable_lsn(w) < lsn; i++)
        usleep(1000);
    CHECK(wal_durable_lsn(w) >= lsn, "log never made LSN %llu durable", (unsigned long long)lsn);
}

int main(int argc, char **argv)
{
    CHECK(argc == 2, "usage: session_test DIR");
    char err[512], logdir[512], path[512];
    snprintf(logdir, sizeof logdir, "%s/log", argv[1]);
    snprintf(path, sizeof path, "%s/data.kvd", argv[1]);

    struct kv_table *t;
    CHECK(kvt_create(&t, MAX_MEMORY) == 0);
    struct bosc *b;
    struct bosc_open_info info;
    struct bosc_config bc = {.path = path, .buckets = 64, .flush_interval_ms = 50, .log_dir = logdir};
    CHECK(bosc_open(&b, t, &bc, &info, err, sizeof err) == 0, "bosc_open: %s", err);
    /* a slow disk: every group's sync takes 20 ms, so a reply is held for a while */
    struct wal_config wc = {.dir = logdir, .sync = 1, .first_lsn = 1, .sync_delay_us = 20000};
    struct wal *w;
    CHECK(wal_open(&w, &wc, err, sizeof err) == 0, "wal_open: %s", err);
    CHECK(wal_start(w) == 0);
    kvt_set_log(t, wal_log_fn, w);
    bosc_set_log(b, w);
    CHECK(bosc_start(b) == 0);

    struct kv_config cfg = {.bind = "127.0.0.1", .threads = 1, .maxclients = 10, .wal = w, .bosc = b,
                            .durability = "disk", .arch = "poller"};
    struct kv_engine *e;
    CHECK(eng_create(&e, t, &cfg, err, sizeof err) == 0, "eng_create: %s", err);
    int evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    CHECK(evfd >= 0);
    CHECK(ses_subscribe(e, evfd, err, sizeof err) == 0, "ses_subscribe: %s", err);

    /* 1. A write waits for the log: HOLD with the LSN it appended, DONE once durable.
     * (A loaded machine may deschedule us past the 20 ms sync: then it is DONE, and
     * rightly so; a few tries see the HOLD.) */
    struct session s;
    ses_init(&s, e, &out, "test:1", 0, -1);
    int r = SES_DONE;
    for (int i = 0; i < 50 && r != SES_HOLD; i++) {
        out.len = 0;
        r = run(&s, NULL, "SET", "k", "v", NULL);
        CHECK(r == SES_HOLD || wal_durable_lsn(w) >= s.need, "SET: DONE before its LSN was durable");
    }
    CHECK(r == SES_HOLD && s.need > 0, "SET: %d need %llu", r, (unsigned long long)s.need);
    CHECK(out.len == 5 && !memcmp(out.p, "+OK\r\n", 5));
    uint64_t need = s.need;
    wait_durable(w, need);
    out.len = 0;
    r = run(&s, NULL, "GET", "k", NULL);
    CHECK(r == SES_DONE && s.need == need, "GET after durable: %d need %llu", r, (unsigned long long)s.need);
    CHECK(out.len == 7 && !memcmp(out.p, "$1\r\nv\r\n", 7));
    out.len = 0;
    r = run(&s, NULL, "PING", NULL);
    CHECK(r == SES_DONE && s.need == 0, "PING depends on nothing: %d %llu", r, (unsigned long long)s.need);

    /* 2. Far more data than memory: writes stall for the flusher (blocking waits). */
    char v[VALUE + 1], k[32];
    int mem_stalls = 0;
    for (int i = 0; i < KEYS; i++) {
        snprintf(k, sizeof k, "key:%d", i);
        value_of(i, v);
        out.len = 0;
        r = run(&s, &mem_stalls, "SET", k, v, NULL);
        CHECK(r == SES_DONE || r == SES_HOLD, "SET %s: %d", k, r);
        CHECK(out.len == 5 && !memcmp(out.p, "+OK\r\n", 5), "SET %s replied %.*s", k, (int)out.len, out.p);
    }
    CHECK(mem_stalls > 0, "memory never filled: no write had to wait");

    /* 3. Reads of keys that left memory stall for the loader and leave no reply;
     * the run after ses_wait answers, and the reply waits for every LSN it read. */
    int load_stalls = 0;
    char want[VALUE + 32];
    for (int i = 0; i < KEYS; i += 97) {
        snprintf(k, sizeof k, "key:%d", i);
        value_of(i, v);
        out.len = 0;
        r = run(&s, &load_stalls, "GET", k, NULL);
        int n = snprintf(want, sizeof want, "$%d\r\n%s\r\n", VALUE, v);
        CHECK(r != SES_STALL && out.len == (size_t)n && !memcmp(out.p, want, (size_t)n), "GET %s", k);
    }
    CHECK(load_stalls > 0, "no read had to load its key");

    /* 4. MGET over evicted keys: each stall keeps the part of the reply made so far
     * (resume_i), and the whole reply comes out right, once. */
    out.len = 0;
    int mget_stalls = 0;
    r = run(&s, &mget_stalls, "MGET", "key:1", "key:2", "nokey", "key:2999", NULL);
    struct kvbuf exp = {0};
    kvbuf_append(&exp, "*4\r\n", 4);
    for (int i = 0; i < 4; i++) {
        int id = i == 0 ? 1 : i == 1 ? 2 : i == 3 ? 2999 : -1;
        if (id < 0) {
            kvbuf_append(&exp, "$-1\r\n", 5);
            continue;
        }
        value_of(id, v);
        kvbuf_printf(&exp, "$%d\r\n%s\r\n", VALUE, v);
    }
    CHECK(out.len == exp.len && !memcmp(out.p, exp.p, exp.len), "MGET reply: %.*s", (int)out.len, out.p);

    /* 5. The woken way: with an eventfd, a stall asks the loader itself and the
     * data file writes the eventfd when the key is in; nothing blocks. */
    struct session as;
    ses_init(&as, e, &out, "test:2", 0, evfd);
    int woken_stalls = 0;
    for (int i = 5; i < KEYS; i += 211) {
        snprintf(k, sizeof k, "key:%d", i);
        const char *av[] = {"GET", k};
        size_t al[] = {3, strlen(k)};
        out.len = 0;
        for (int tries = 0; (r = ses_run(&as, 2, av, al)) == SES_STALL; tries++) {
            CHECK(out.len == 0, "a stalled GET left a reply");
            CHECK(tries < 1000, "GET %s never loaded", k);
            woken_stalls++;
            struct pollfd pf = {.fd = evfd, .events = POLLIN};
            poll(&pf, 1, 100);
            uint64_t x;
            ssize_t rd = read(evfd, &x, sizeof x);
            (void)rd;
        }
        value_of(i, v);
        int n = snprintf(want, sizeof want, "$%d\r\n%s\r\n", VALUE, v);
        CHECK(out.len == (size_t)n && !memcmp(out.p, want, (size_t)n), "woken GET %s", k);
    }
    CHECK(woken_stalls > 0, "no woken read had to load its key");

    /* 6. A reply held in a byte stream: ses_hold / ses_sendable keep it back until
     * the log holds its LSN, and replies before it go out. */
    size_t at = 0;
    r = SES_DONE;
    for (int i = 0; i < 50 && r != SES_HOLD; i++) {
        out.len = 0;
        kvbuf_append(&out, "+early\r\n", 8);
        at = out.len;
        while ((r = ses_run(&as, 3, (const char *[]){"SET", "held", "1"}, (size_t[]){3, 4, 1})) == SES_STALL)
            CHECK(ses_wait(&as) >= 0); /* memory is full: wait for the flusher */
    }
    CHECK(r == SES_HOLD, "SET on the slow log: %d", r);
    CHECK(ses_hold(&as, at, as.need) == 0);
    size_t end = ses_sendable(&as, out.len);
    CHECK(end == at || wal_durable_lsn(w) >= as.need, "the held reply must not be sendable before its LSN");
    wait_durable(w, as.need);
    CHECK(ses_sendable(&as, out.len) == out.len, "durable: all of it is sendable");

    ses_free(&s);
    ses_free(&as);
    kvbuf_free(&exp);
    kvbuf_free(&out);
    kvt_set_log(t, NULL, NULL);
    bosc_close(b);
    wal_close(w);
    eng_destroy(e);
    kvt_destroy(t);
    close(evfd);
    printf("session_test: %d memory stalls, %d load stalls, %d MGET stalls, %d woken stalls: ok\n", mem_stalls,
           load_stalls, mget_stalls, woken_stalls);
    return 0;
}
