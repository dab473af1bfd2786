/* poller_life.c - the poller front end's lifecycle (struct kv_frontend_ops):
 * create its pollers (epoll, eventfd, listeners: plain and TLS), start their
 * threads, stop and destroy them. Control thread only. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "engine/engine.h"
#include "frontend/frontend.h"
#include "frontend/poller_int.h"

static void poller_stop(void *st);
static void poller_destroy(void *st);

static int poller_create(void **out, struct kv_engine *eng, char *err, size_t errlen)
{
    const struct kv_config *cfg = &eng->cfg;
    const struct pp_policy *pol = pp_find(cfg->poll_policy);
    if (!pol) {
        snprintf(err, errlen, "unknown poll policy '%s': expected one of %s", cfg->poll_policy, pp_names());
        return -EINVAL;
    }
    if (strcmp(cfg->accept, "reuseport") && strcmp(cfg->accept, "handoff")) {
        snprintf(err, errlen, "unknown accept mode '%s': expected reuseport or handoff", cfg->accept);
        return -EINVAL;
    }
    struct poller_server *ps = calloc(1, sizeof *ps);
    if (!ps) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    int rc = tcp_init(&ps->tcp, eng, cfg->threads, err, errlen); /* checks threads */
    if (rc < 0 || !(ps->pollers = aligned_alloc(64, sizeof *ps->pollers * (size_t)cfg->threads))) {
        if (!rc)
            snprintf(err, errlen, "out of memory");
        tcp_free(&ps->tcp);
        free(ps);
        return rc < 0 ? rc : -ENOMEM;
    }
    memset(ps->pollers, 0, sizeof *ps->pollers * (size_t)cfg->threads);
    ps->eng = eng;
    ps->policy = pol;
    ps->handoff = !strcmp(cfg->accept, "handoff");
    for (int i = 0; i < cfg->threads; i++) /* so a failed create never closes fd 0 */
        ps->pollers[i].epfd = ps->pollers[i].lfd = ps->pollers[i].evfd = ps->pollers[i].tls_lfd =
            ps->pollers[i].mqtt_lfd = -1;
    ps->npollers = cfg->threads;
    if ((rc = tlsio_create(&ps->tls, eng, err, errlen)) < 0)
        goto fail;
    eng->mqtt_port = -1;
    int mqtt_probed = 0;
    if (cfg->mqtt_port >= 0) {
        if (cfg->mqtt_port > 65535 || cfg->mqtt_max_packet < 2 || cfg->mqtt_max_inflight < 1 ||
            cfg->mqtt_max_inflight > 65535 || cfg->mqtt_max_sessions < 1) {
            snprintf(err, errlen, "mqtt settings out of range: port 0..65535, max packet >= 2, max inflight "
                                  "1..65535, max sessions >= 1");
            rc = -EINVAL;
            goto fail;
        }
        eng->mqtt_port = cfg->mqtt_port;
        if ((rc = mqtt_create(&ps->mqtt, eng, err, errlen)) < 0)
            goto fail;
    }
    for (int i = 0; i < ps->npollers; i++) {
        struct poller *p = &ps->pollers[i];
        p->idx = i;
        p->ps = ps;
        p->st = &ps->tcp.st[i];
        list_init(&p->all);
        list_init(&p->waiting);
        list_init(&p->stalled);
        p->block_deadline = INT64_MAX;
        list_init(&p->big);
        p->listener_tag = TAG_LISTENER;
        p->event_tag = TAG_EVENT;
        p->epfd = epoll_create1(EPOLL_CLOEXEC);
        p->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        fdq_init(&p->handed, p->evfd);
        if (p->epfd < 0 || p->evfd < 0) {
            rc = -errno;
            snprintf(err, errlen, "epoll/eventfd: %s", strerror(errno));
            goto fail;
        }
        struct epoll_event e = {.events = EPOLLIN, .data.ptr = &p->event_tag};
        epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->evfd, &e);
        if ((rc = ses_subscribe(eng, p->evfd, err, errlen)) < 0)
            goto fail;
        /* --port -1 with --tls-port: no plain listener at all (Redis's port 0) */
        if ((i == 0 || !ps->handoff) && !(ps->tls && cfg->tls_only)) {
            p->lfd = tcp_listen(&ps->tcp, !ps->handoff, err, errlen);
            if (p->lfd < 0) {
                rc = p->lfd;
                goto fail;
            }
            struct epoll_event le = {.events = EPOLLIN, .data.ptr = &p->listener_tag};
            epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->lfd, &le);
        }
        if ((i == 0 || !ps->handoff) && ps->tls) { /* the TLS port: listeners alike, connections marked TLS */
            if ((p->tls_lfd = tlsio_listen(ps->tls, !ps->handoff, err, errlen)) < 0) {
                rc = p->tls_lfd;
                goto fail;
            }
            p->tls_listener_tag = TAG_TLS_LISTENER;
            struct epoll_event te = {.events = EPOLLIN, .data.ptr = &p->tls_listener_tag};
            epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->tls_lfd, &te);
        }
        if ((i == 0 || !ps->handoff) && ps->mqtt) { /* the MQTT port: its connections speak MQTT */
            p->mqtt_lfd = tcp_listen_port(eng, &eng->mqtt_port, &mqtt_probed, !ps->handoff, "listen (MQTT) on", err,
                                          errlen);
            if (p->mqtt_lfd < 0) {
                rc = p->mqtt_lfd;
                goto fail;
            }
            p->mqtt_listener_tag = TAG_MQTT_LISTENER;
            struct epoll_event me = {.events = EPOLLIN, .data.ptr = &p->mqtt_listener_tag};
            epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->mqtt_lfd, &me);
        }
    }
    *out = ps;
    return 0;
fail:
    poller_destroy(ps);
    return rc;
}

static int poller_start(void *st, char *err, size_t errlen)
{
    struct poller_server *ps = st;
    for (int i = 0; i < ps->npollers; i++) {
        struct poller *p = &ps->pollers[i];
        int rc = pthread_create(&p->th, NULL, poller_main, p);
        if (rc) {
            snprintf(err, errlen, "cannot start poller thread: %s", strerror(rc));
            poller_stop(ps);
            return -rc;
        }
        p->started = 1;
        char name[16];
        snprintf(name, sizeof name, "kv-poller-%d", i % 10000);
        pthread_setname_np(p->th, name);
    }
    return 0;
}

static void poller_stop(void *st)
{
    struct poller_server *ps = st;
    /* release: pollers that see stopping also see everything written before it */
    atomic_store_explicit(&ps->stopping, 1, memory_order_release);
    for (int i = 0; i < ps->npollers; i++) {
        uint64_t one = 1;
        if (ps->pollers[i].evfd >= 0) {
            ssize_t w = write(ps->pollers[i].evfd, &one, sizeof one);
            (void)w;
        }
    }
    for (int i = 0; i < ps->npollers; i++) {
        if (ps->pollers[i].started) {
            pthread_join(ps->pollers[i].th, NULL);
            ps->pollers[i].started = 0;
        }
    }
}

static void poller_destroy(void *st)
{
    struct poller_server *ps = st;
    if (!ps)
        return;
    poller_stop(ps);
    for (int i = 0; ps->pollers && i < ps->npollers; i++) {
        struct poller *p = &ps->pollers[i];
        if (p->lfd >= 0)
            close(p->lfd);
        if (p->tls_lfd >= 0)
            close(p->tls_lfd);
        if (p->mqtt_lfd >= 0)
            close(p->mqtt_lfd);
        if (p->evfd >= 0)
            close(p->evfd);
        if (p->epfd >= 0)
            close(p->epfd);
        fdq_free(&p->handed);
        resp_args_free(&p->args);
    }
    free(ps->pollers);
    tlsio_free(ps->tls);
    mqtt_destroy(ps->mqtt);
    tcp_free(&ps->tcp);
    free(ps);
}

/* tcp_fe_*: the state begins with its struct tcp_front */
const struct kv_frontend_ops fe_poller = {"poller", poller_create, poller_start, poller_stop, poller_destroy,
                                          tcp_fe_port, tcp_fe_add_stats, tcp_fe_thread_stats};
