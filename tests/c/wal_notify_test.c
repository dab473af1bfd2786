/* wal_notify_test.c - the log's wake-up list (durability/wal_notify.h), for TSan
 * and ASan/UBSan. A waker moves the durable LSN on one step at a time, up to a
 * limit the sleeper sets, and wakes the list; a sleeper, over and over, wants an LSN a little ahead and, unless
 * wal_notify_want says it is durable already, sleeps on its eventfd (poll, at
 * most WAIT_S): a lost wake-up (a want published too late for the waker, or an
 * LSN read too early) is a timeout. A second subscriber that wants nothing must never be written, until
 * a failure (wake all) writes it. Usage: wal_notify_test ROUNDS */
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "durability/wal_notify.h"

#define WAIT_S 5

static struct wal_notify nt;
static _Atomic uint64_t durable;
static _Atomic int stop;

static _Atomic uint64_t limit; /* the waker stops here: the last move is the only wake-up */

static void *waker(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        if (atomic_load(&durable) >= atomic_load(&limit)) {
            sched_yield();
            continue;
        }
        uint64_t d = atomic_fetch_add(&durable, 1) + 1; /* seq_cst, as wal_publish_durable */
        wal_notify_wake(&nt, d, 0);
    }
    return NULL;
}

static int fail(const char *what, uint64_t want, uint64_t d)
{
    fprintf(stderr, "FAIL: %s (wanted %llu, durable %llu)\n", what, (unsigned long long)want,
            (unsigned long long)d);
    return 1;
}

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? atol(argv[1]) : 20000;
    wal_notify_init(&nt);
    int fd = eventfd(0, EFD_NONBLOCK), idle = eventfd(0, EFD_NONBLOCK);
    if (fd < 0 || idle < 0 || wal_notify_add(&nt, idle) || wal_notify_add(&nt, fd))
        return fail("setup", 0, 0);
    int slot = -1, idle_slot = -1;
    wal_notify_want(&nt, &idle_slot, idle, UINT64_MAX, &durable);
    pthread_t th;
    pthread_create(&th, NULL, waker, NULL);
    long slept = 0, ready = 0, spurious = 0;
    uint64_t v;
    for (long i = 0; i < rounds; i++) {
        uint64_t want = atomic_load(&durable) + 1 + (uint64_t)(i % 3);
        atomic_store(&limit, want); /* the LSN moves to want and stops: racing with the want below */
        uint64_t d = wal_notify_want(&nt, &slot, fd, want, &durable);
        if (d >= want) {
            ready++;
        } else {
            /* asleep, as a poller told "not durable yet": only a wake-up ends
             * it. One meant for an earlier want may be left in the counter
             * (written after the last drain): spurious, sleep again. */
            do {
                struct pollfd p = {.fd = fd, .events = POLLIN};
                if (poll(&p, 1, WAIT_S * 1000) != 1)
                    return fail("lost wake-up", want, atomic_load(&durable));
                if (read(fd, &v, sizeof v) < 0)
                    return fail("read", want, atomic_load(&durable));
            } while (atomic_load(&durable) < want && ++spurious);
            slept++;
        }
        wal_notify_want(&nt, &slot, fd, UINT64_MAX, &durable); /* awake */
        if (read(fd, &v, sizeof v) < 0) { /* drained: a wake-up from the last round may be left */
        }
    }
    atomic_store(&stop, 1);
    pthread_join(th, NULL);
    if (read(idle, &v, sizeof v) == sizeof v)
        return fail("a subscriber that wants nothing was woken", UINT64_MAX, atomic_load(&durable));
    wal_notify_wake(&nt, atomic_load(&durable), 1); /* the log failed: everyone */
    if (read(idle, &v, sizeof v) != sizeof v || read(fd, &v, sizeof v) != sizeof v)
        return fail("a failure did not wake every subscriber", 0, atomic_load(&durable));
    wal_notify_destroy(&nt);
    printf("%ld rounds: %ld slept and were woken (%ld early wake-ups left from an earlier want), %ld found "
           "their LSN durable; no wake-up lost\nok\n", rounds, slept, spurious, ready);
    return 0;
}
