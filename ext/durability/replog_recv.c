/* replog_recv.c - the log receiver thread (see replog.h): stores each sender's
 * records verbatim as segment files under <peer_dir>/<node id>/, acks them,
 * syncs every sync_ms and serves FETCH to a recovering node. Threads: the
 * receiver thread owns its listener and connections; stats are read under
 * stat_lock. Frames are untrusted; a peer that breaks the protocol is dropped.
 * Every connection must first prove it holds the pair's secret (the handshake,
 * rl_auth_server_step, one step per frame so a silent client never holds the
 * thread); until then it may send nothing else, and it is closed if it has not
 * done so within HANDSHAKE_MS. A refused connection gets an ERROR frame, is
 * counted (auth_failures) and logged, rate-limited. After the handshake the
 * connection may only act in the role and for the node id it proved.
 * --repl-tls: the connection is a TLS server session from accept on; its TLS
 * handshake (the client's certificate required and verified) is driven by the
 * same non-blocking steps before the first frame, and refused the same way.
 * Units (wal.h): a BATCH may end inside a unit (frames are cut by size, catch-up
 * by bytes); its records are stored as they come, but the ACK names only the
 * last whole unit (or plain record), because the sender makes the ACK its
 * durable LSN, which must never fall inside a unit. A unit the stored log ends
 * inside is dropped by the recovery at the next HELLO (or by the node that
 * fetches the log), like a torn tail; a new segment starts only between units. */
#define _GNU_SOURCE
#include "durability/replog.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "core/bytes.h"
#include "core/crc32c.h"
#include "core/kvbuf.h"
#include "durability/wal.h"
#include "durability/replog_frame.h"
#include "core/log.h"

#include <openssl/crypto.h>

#define HANDSHAKE_MS 5000 /* an unauthenticated connection is closed after this long */
#define PREAUTH_PER_IP 4  /* unauthenticated connections one IP address may hold (see accept_one) */

/* ===================================================================== receiver */

struct rconn {
    struct rl_link link;
    struct rl_auth_state auth;
    uint64_t auth_deadline;  /* ms: closed if not authenticated by then */
    char addr[64];           /* the client's IP:port, for the log */
    uint32_t ip;             /* the client's IPv4 address (network order): the pre-auth cap */
    unsigned char hs[HDR + 16 + RL_NONCE]; /* a handshake frame as it arrives */
    size_t hs_len;
    int has_id;
    int dead;                /* replaced by a newer connection of the same node: close */
    int logged;              /* why it is closed was logged already (refused) */
    char why[200];           /* why it is dropped, for the log ("": said by its error code) */
    char hex[33];
    char dir[4096];
    int dirfd, segfd;
    uint64_t seg_size, held;
    uint64_t whole;          /* last LSN not inside a unit (ACKed): held, or before an open unit */
    int in_unit;             /* the records held end inside a unit */
    int dirty;
};

struct rl_receiver {
    int lfd, evfd, port;
    char *peer_dir;
    uint32_t sync_ms;
    unsigned char key[RL_KEY];
    uint8_t self[16];        /* this node's id (under stat_lock; has_self once set) */
    int has_self;
    struct tls_ctx *tls;     /* --repl-tls: the server context (NULL: plain TCP) */
    pthread_t th;
    _Atomic int stop;
    struct rconn conns[MAX_PEERS];
    int nconns;
    struct kvbuf pl;
    pthread_mutex_t stat_lock;
    struct rl_receiver_stats st;
};

/* Every connection the receiver drops says why in the log (rconn_drop): a path
 * that sets no reason is still named by its error code. */
#define DROP(c, rc, ...) (snprintf((c)->why, sizeof(c)->why, __VA_ARGS__), (rc))

static void rconn_close(struct rl_receiver *r, int i)
{
    struct rconn *c = &r->conns[i];
    if (c->segfd >= 0) {
        fdatasync(c->segfd);
        close(c->segfd);
    }
    if (c->dirfd >= 0)
        close(c->dirfd);
    rl_link_close(&c->link);
    r->conns[i] = r->conns[--r->nconns];
}

static void hexid(const unsigned char *id, char *hex)
{
    for (int i = 0; i < 16; i++)
        sprintf(hex + 2 * i, "%02x", id[i]);
}

/* Open (and check) the stored log of node hex: held = its last valid LSN. */
static int open_peer_log(struct rl_receiver *r, struct rconn *c)
{
    snprintf(c->dir, sizeof c->dir, "%s/%s", r->peer_dir, c->hex);
    mkdir(r->peer_dir, 0755);
    if (mkdir(c->dir, 0755) && errno != EEXIST)
        return DROP(c, -errno, "cannot create %s: %s", c->dir, strerror(errno));
    c->dirfd = open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (c->dirfd < 0)
        return DROP(c, -errno, "cannot open %s: %s", c->dir, strerror(errno));
    struct wal_recovery rec;
    char err[512];
    int rc = wal_recover(NULL, c->dir, 0, 1, &rec, err, sizeof err);
    if (rc)
        return DROP(c, rc, "cannot recover the stored log in %s: %s", c->dir, err);
    c->held = c->whole = rec.last_lsn; /* a unit cut short at the end was just cut away */
    c->in_unit = 0;
    c->segfd = -1; /* a new segment starts with the next batch */
    return 0;
}

/* Store the records of a BATCH [first, last]: skip what is already held. */
static int store_batch(struct rl_receiver *r, struct rconn *c, const struct frame *f)
{
    const unsigned char *p = (unsigned char *)r->pl.p;
    size_t n = r->pl.len, off = 0;
    if (f->a > c->held + 1)
        return DROP(c, -EPROTO, "a batch from LSN %" PRIu64 " leaves a gap: held up to %" PRIu64, f->a, c->held);
    uint64_t nrec = 0;
    while (off < n) { /* validate every record; find the first one not yet held */
        size_t l = rec_len(p + off, n - off);
        if (!l || !wal_rec_ok(p + off, l))
            return DROP(c, -EBADMSG, "a batch carries a malformed record");
        if (rec_lsn(p + off, l) <= c->held) {
            off += l;
            continue;
        }
        break;
    }
    size_t start = off;
    uint64_t last = c->held, first = 0, whole = c->whole;
    int in_unit = c->in_unit, began_in_unit = c->in_unit;
    while (off < n) {
        size_t l = rec_len(p + off, n - off);
        if (!l || !wal_rec_ok(p + off, l))
            return DROP(c, -EBADMSG, "a batch carries a malformed record");
        uint64_t lsn = rec_lsn(p + off, l);
        if (lsn != last + 1)
            return DROP(c, -EPROTO, "a batch carries LSN %" PRIu64 " after %" PRIu64, lsn, last);
        /* The unit rules recovery enforces: a COMMIT closes an open unit; no plain
         * record inside one. */
        int op = p[off + WAL_OFF_OP], unit = p[off + WAL_OFF_FLAGS] & WAL_F_UNIT;
        if (op == WAL_COMMIT ? !in_unit : (!unit && in_unit))
            return DROP(c, -EPROTO, "a batch breaks the unit rules at LSN %" PRIu64, lsn);
        in_unit = unit;
        if (!in_unit)
            whole = lsn;
        if (!first)
            first = lsn;
        last = lsn;
        off += l;
        nrec++;
    }
    if (last != f->b || (nrec && first < f->a))
        return DROP(c, -EPROTO, /* the frame's LSN range must be what its records carry */
                    "a batch named LSNs %" PRIu64 "-%" PRIu64 " but carried %" PRIu64 " records up to LSN %" PRIu64
                    " (held up to %" PRIu64 ")",
                    f->a, f->b, nrec, last, c->held);
    if (!nrec)
        return 0;
    /* A new segment only between units: recovery reads a unit within one file. */
    if (c->segfd < 0 || (c->seg_size >= SEG_LIMIT && !began_in_unit)) {
        char err[256];
        if (c->segfd >= 0) {
            fdatasync(c->segfd);
            close(c->segfd);
        }
        c->segfd = wal_seg_create(c->dir, c->dirfd, first, err, sizeof err);
        if (c->segfd < 0)
            return DROP(c, c->segfd, "cannot create a segment file: %s", err);
        c->seg_size = WAL_SEG_HDR;
    }
    int wrc = wal_write_all(c->segfd, r->pl.p + start, n - start);
    if (wrc)
        return DROP(c, wrc, "cannot write a segment file in %s: %s", c->dir, strerror(-wrc));
    c->seg_size += n - start;
    c->held = last;
    c->whole = whole;
    c->in_unit = in_unit;
    c->dirty = 1;
    pthread_mutex_lock(&r->stat_lock);
    r->st.batches++;
    r->st.records += nrec;
    r->st.bytes += n - start;
    r->st.held_lsn = whole;
    pthread_mutex_unlock(&r->stat_lock);
    return 0;
}

/* Stream node hex's stored segments to a recovering node, then END carrying
 * the held LSN and the node id. An all-zero id asks for the only log held here
 * (a node that lost its disk, identity included). */
static int serve_fetch(struct rl_receiver *r, struct rl_link *l, const char *want)
{
    char hex[33];
    snprintf(hex, sizeof hex, "%s", want);
    if (!strcmp(hex, "00000000000000000000000000000000")) {
        int found = 0;
        DIR *pd = opendir(r->peer_dir);
        struct dirent *de;
        while (pd && (de = readdir(pd)))
            if (strlen(de->d_name) == 32 && strspn(de->d_name, "0123456789abcdef") == 32 && found++ == 0)
                snprintf(hex, sizeof hex, "%s", de->d_name);
        if (pd)
            closedir(pd);
        if (found > 1) {
            rl_send_error(l, "this peer holds the logs of several nodes: name one (node id)");
            return -EINVAL;
        }
    }
    unsigned char id[16] = {0};
    for (int i = 0; i < 16 && hex[2 * i]; i++)
        sscanf(hex + 2 * i, "%2hhx", &id[i]);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", r->peer_dir, hex);
    /* Data written by a sender connection of this thread is already in the files. */
    struct wal_recovery rec;
    char err[512];
    uint64_t held = 0;
    if (!access(dir, F_OK) && !wal_recover(NULL, dir, 0, 0, &rec, err, sizeof err))
        held = rec.last_lsn;
    DIR *d = opendir(dir);
    int rc = 0;
    if (d) {
        struct dirent *de;
        while (!rc && (de = readdir(d))) {
            uint64_t first;
            if (strlen(de->d_name) != 24 || sscanf(de->d_name, "wal-%16" SCNx64 ".log", &first) != 1)
                continue;
            char path[8192];
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            int f = open(path, O_RDONLY | O_CLOEXEC);
            struct stat st;
            struct kvbuf b = {0};
            rc = -EIO; /* a segment that cannot be sent whole fails the fetch: never a silent gap */
            if (f >= 0 && !fstat(f, &st) && st.st_size < MAX_FRAME && !kvbuf_reserve(&b, (size_t)st.st_size + 1)) {
                ssize_t got = pread(f, b.p, (size_t)st.st_size, 0);
                if (got == st.st_size)
                    rc = rl_send_frame(l, F_FILE, first, 0, b.p, (size_t)got, 10000);
            }
            if (rc == -EIO) {
                char msg[256];
                snprintf(msg, sizeof msg, "cannot read stored segment %s", de->d_name);
                rl_send_error(l, msg);
            }
            kvbuf_free(&b);
            if (f >= 0)
                close(f);
        }
        closedir(d);
    }
    if (!rc)
        rc = rl_send_frame(l, F_END, held, 0, id, 16, 10000);
    pthread_mutex_lock(&r->stat_lock);
    r->st.fetches++;
    pthread_mutex_unlock(&r->stat_lock);
    return rc;
}

/* A refused connection: counted and logged, rate-limited (anyone who reaches the
 * port can repeat it). Returns rc (the connection is closed). */
static int refused(struct rl_receiver *r, struct rconn *c, int rc, const char *why)
{
    static struct kvlog_rate rate = KVLOG_RATE_INIT(5);
    pthread_mutex_lock(&r->stat_lock);
    r->st.auth_failures++;
    pthread_mutex_unlock(&r->stat_lock);
    kvlog_rated(&rate, KVLOG_WARNING, "log receiver: refused the connection from %s: %s", c->addr, why);
    c->logged = 1;
    return rc ? rc : -EACCES;
}

static int is_self(struct rl_receiver *r, const uint8_t id[16])
{
    pthread_mutex_lock(&r->stat_lock);
    int same = r->has_self && !memcmp(r->self, id, 16);
    pthread_mutex_unlock(&r->stat_lock);
    return same;
}

/* Before the handshake is done: its next step, or the refusal. Its frames are
 * small and read without blocking into the connection's own buffer: a stranger
 * sending a byte at a time cannot stall this thread, which serves the peer too. */
static int handle_handshake(struct rl_receiver *r, struct rconn *c)
{
    char why[400];
    struct frame f = {0};
    static const struct kvbuf none = {0};
    if (c->link.tls && !tls_conn_ready(c->link.tls)) {
        int rc = tls_handshake(c->link.tls);
        c->link.want = rc == -EAGAIN ? POLLIN : rc == TLS_WANT_WRITE ? POLLOUT : 0;
        if (rc == -EAGAIN || rc == TLS_WANT_WRITE)
            return 0; /* the next step when the socket is ready (the deadline bounds it) */
        if (rc) {
            snprintf(why, sizeof why, "TLS handshake failed (--repl-tls): %s", tls_conn_error(c->link.tls));
            return refused(r, c, -EACCES, why);
        }
    }
    for (;;) {
        if (c->hs_len >= HDR) {
            if (rl_parse_header(c->hs, &f) || (f.type != F_AUTH_HELLO && f.type != F_AUTH_PROOF)) {
                /* a data frame (an unauthenticated peer of protocol 1), or not a frame of ours */
                rl_auth_server_step(&c->link, &c->auth, r->key, &(struct frame){.type = F_HELLO}, &none, why,
                                    sizeof why);
                return refused(r, c, -EACCES, why);
            }
            if (c->hs_len == HDR + f.len)
                break;
        }
        size_t want = c->hs_len < HDR ? HDR : HDR + f.len;
        long n = rl_io_recv(&c->link, c->hs + c->hs_len, want - c->hs_len);
        if (n == -EAGAIN)
            return 0; /* the rest comes with a later poll (or the deadline closes it) */
        if (n <= 0) {
            snprintf(why, sizeof why, "%s during the handshake", n ? strerror((int)-n) : "closed");
            return refused(r, c, n ? (int)n : -ECONNRESET, why);
        }
        c->hs_len += (size_t)n;
    }
    c->hs_len = 0;
    struct kvbuf pl = {.p = (char *)c->hs + HDR, .len = f.len};
    if (f.len && crc32c(0, pl.p, f.len) != get32(c->hs + 12))
        return refused(r, c, -EBADMSG, "a handshake frame failed its CRC");
    if (f.type == F_AUTH_HELLO && f.len >= 16 && is_self(r, (const uint8_t *)pl.p)) {
        /* A reflection: this node's own sender (or fetch) redirected to its own
         * receiver. The pair's secret cannot tell the two ends apart, the id can. */
        snprintf(why, sizeof why, "the connection speaks for this node's own id (its own sender or fetch "
                                  "redirected to its own --repl-port?): a node cannot be its own peer");
        rl_send_error(&c->link, why);
        return refused(r, c, -EACCES, why);
    }
    int rc = rl_auth_server_step(&c->link, &c->auth, r->key, &f, &pl, why, sizeof why);
    return rc ? refused(r, c, rc, why) : 0;
}

static int handle_frame(struct rl_receiver *r, int i)
{
    struct rconn *c = &r->conns[i];
    if (!c->link.authed)
        return handle_handshake(r, c);
    struct frame f;
    int rc = rl_recv_frame(&c->link, &f, &r->pl, 5000);
    if (rc == -EACCES)
        return refused(r, c, rc, "a frame failed its MAC check (altered, replayed or out of order)");
    if (rc == -ECONNRESET)
        return DROP(c, rc, "the peer closed the connection");
    if (rc == -ETIMEDOUT)
        return DROP(c, rc, "a frame came only in part within 5 s");
    if (rc)
        return DROP(c, rc, "a bad frame: %s", strerror(-rc));
    if (f.type == F_HELLO || f.type == F_FETCH) {
        if (r->pl.len != 16 || (f.type == F_HELLO && f.a != RL_VERSION)) {
            rl_send_error(&c->link, "bad hello");
            return DROP(c, -EPROTO, "a bad HELLO (length %zu, version %" PRIu64 ")", r->pl.len, f.a);
        }
        /* Only what the handshake proved: a fetch connection cannot write a log,
         * nor a sender write another node's. */
        if (c->auth.role != (f.type == F_HELLO ? RL_ROLE_SENDER : RL_ROLE_FETCH) ||
            memcmp(r->pl.p, c->auth.node_id, 16)) {
            rl_send_error(&c->link, "this connection was authenticated for another role or node id");
            return refused(r, c, -EACCES, "a frame outside the role or node id its handshake named");
        }
        char hex[33];
        hexid((unsigned char *)r->pl.p, hex);
        if (f.type == F_FETCH)
            return serve_fetch(r, &c->link, hex) ? DROP(c, -EIO, "serving a fetch of node %s failed", hex)
                                                  : 1; /* 1: done, close */
        if (c->has_id)
            return DROP(c, -EPROTO, "a second HELLO on one connection"); /* one HELLO per connection */
        for (int j = 0; j < r->nconns; j++)
            if (j != i && r->conns[j].has_id && !strcmp(r->conns[j].hex, hex)) {
                r->conns[j].dead = 1; /* one sender per node: the newest wins (the old one may
                                         be a ghost of a machine that vanished without a FIN) */
                snprintf(r->conns[j].why, sizeof r->conns[j].why,
                         "replaced by a newer connection of the same node, from %s", c->addr);
            }
        memcpy(c->hex, hex, sizeof hex);
        if ((rc = open_peer_log(r, c)))
            return rc;
        c->has_id = 1;
        if ((rc = rl_send_frame(&c->link, F_HELLO_ACK, c->held, 0, NULL, 0, 1000)))
            return DROP(c, rc, "sending HELLO_ACK failed: %s", strerror(-rc));
        return 0;
    }
    if (f.type == F_BATCH && c->has_id) {
        if ((rc = store_batch(r, c, &f)))
            return rc;
        if ((rc = rl_send_frame(&c->link, F_ACK, c->whole, 0, NULL, 0, 1000)))
            return DROP(c, rc, "sending the ACK of LSN %" PRIu64 " failed: %s", c->whole, strerror(-rc));
        return 0;
    }
    return DROP(c, -EPROTO, "an unexpected frame (type %u%s)", (unsigned)f.type, c->has_id ? "" : ", before HELLO");
}

/* Unauthenticated connections from address ip. */
static int preauth_from(const struct rl_receiver *r, uint32_t ip)
{
    int n = 0;
    for (int i = 0; i < r->nconns; i++)
        n += !r->conns[i].link.authed && r->conns[i].ip == ip;
    return n;
}

/* The unauthenticated connection that makes room for a new one from ip, or -1.
 * Plain "oldest first" let a stranger opening connections faster than the
 * peer's handshake round trips evict the peer's connection every time. So each
 * address may hold at most PREAUTH_PER_IP unauthenticated connections: past
 * that, its newcomer evicts that address's own oldest one; when the table is
 * full, the oldest of the address holding the most makes room. A stranger then
 * only ever evicts itself (or another flooding address), never the peer's one
 * connection in progress, unless it floods from more addresses than there are
 * slots. */
static int victim(const struct rl_receiver *r, uint32_t ip)
{
    int own = preauth_from(r, ip) >= PREAUTH_PER_IP;
    if (!own && r->nconns < MAX_PEERS)
        return -1;
    int best = -1, best_n = 0;
    for (int i = 0; i < r->nconns; i++) {
        const struct rconn *c = &r->conns[i];
        if (c->link.authed || (own && c->ip != ip))
            continue;
        int n = own ? 0 : preauth_from(r, c->ip);
        if (best < 0 || n > best_n || (n == best_n && c->auth_deadline < r->conns[best].auth_deadline)) {
            best = i;
            best_n = n;
        }
    }
    return best;
}

/* Accept one connection, making room (victim) if needed: idle or flooding
 * strangers cannot lock the peer out. */
static void accept_one(struct rl_receiver *r)
{
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    int fd = accept4(r->lfd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
        return;
    int v = victim(r, sa.sin_addr.s_addr);
    if (v >= 0) {
        refused(r, &r->conns[v], -EACCES, "not authenticated, and its slot was needed");
        rconn_close(r, v);
    }
    if (r->nconns == MAX_PEERS) {
        static struct kvlog_rate rate = KVLOG_RATE_INIT(5);
        kvlog_rated(&rate, KVLOG_WARNING, "log receiver: closed a new connection: all %d slots are authenticated",
                    MAX_PEERS);
        close(fd);
        return;
    }
    int one = 1, idle = 5, intvl = 2, cnt = 3;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* a peer machine that vanished sends no FIN: find out within ~11 s */
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    struct rconn *c = &r->conns[r->nconns++];
    *c = (struct rconn){.dirfd = -1, .segfd = -1, .auth_deadline = now_ms() + HANDSHAKE_MS,
                        .ip = sa.sin_addr.s_addr};
    rl_link_init(&c->link, fd, 1);
    if (r->tls && rl_link_use_tls(&c->link, r->tls)) { /* out of memory: drop this one */
        kvlog(KVLOG_WARNING, "log receiver: closed a new connection: no memory for its TLS session");
        rl_link_close(&c->link);
        r->nconns--;
        return;
    }
    char ip[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
    snprintf(c->addr, sizeof c->addr, "%s:%u", ip, (unsigned)ntohs(sa.sin_port));
}

/* Close connection i, first saying why in the log (unless refused() did, or rc
 * is 1: a fetch served whole), rate-limited: a peer can repeat it. */
static void rconn_drop(struct rl_receiver *r, int i, int rc)
{
    static struct kvlog_rate rate = KVLOG_RATE_INIT(10);
    struct rconn *c = &r->conns[i];
    if (rc != 1 && !c->logged)
        kvlog_rated(&rate, KVLOG_WARNING, "log receiver: dropped the connection from %s%s%s%s: %s", c->addr,
                    c->has_id ? " (node " : "", c->has_id ? c->hex : "", c->has_id ? ")" : "",
                    c->why[0] ? c->why : strerror(rc < 0 ? -rc : EPROTO));
    rconn_close(r, i);
}

static void *receiver_main(void *arg)
{
    struct rl_receiver *r = arg;
    uint64_t last_sync = now_ms();
    int rc;
    while (!atomic_load_explicit(&r->stop, memory_order_acquire)) {
        struct pollfd p[MAX_PEERS + 2];
        p[0] = (struct pollfd){.fd = r->lfd, .events = POLLIN};
        p[1] = (struct pollfd){.fd = r->evfd, .events = POLLIN};
        int buffered = 0; /* TLS: bytes already read from a socket, which poll cannot see */
        for (int i = 0; i < r->nconns; i++) {
            p[i + 2] = (struct pollfd){.fd = r->conns[i].link.fd, .events = rl_link_events(&r->conns[i].link)};
            buffered |= rl_link_pending(&r->conns[i].link) > 0;
        }
        int nfds = r->nconns + 2;
        int n = poll(p, (nfds_t)nfds, buffered ? 0 : (int)r->sync_ms);
        for (int i = 0; i < r->nconns; i++)
            if (rl_link_pending(&r->conns[i].link))
                p[i + 2].revents |= POLLIN;
        for (int i = nfds - 3; i >= 0; i--) /* backwards: closing moves the last one here */
            /* not a replaced connection: its node's log was reopened (and maybe cut) */
            if (i < r->nconns && p[i + 2].revents && !r->conns[i].dead && (rc = handle_frame(r, i)))
                rconn_drop(r, i, rc);
        if (n > 0 && (p[0].revents & POLLIN)) /* after the frames: p[] names the connections as they were */
            accept_one(r);
        uint64_t now = now_ms();
        for (int i = r->nconns - 1; i >= 0; i--) {
            struct rconn *c = &r->conns[i];
            if (!c->dead && !c->link.authed && now > c->auth_deadline) {
                rl_send_error(&c->link, "the handshake took too long");
                refused(r, c, -ETIMEDOUT, "no handshake within 5 s");
                c->dead = 1;
            }
            if (c->dead)
                rconn_drop(r, i, -ECONNABORTED);
        }
        if (now_ms() - last_sync >= r->sync_ms) {
            /* The peer's memory (page cache) acknowledged; its disk copy follows. */
            for (int i = 0; i < r->nconns; i++) {
                if (r->conns[i].dirty && r->conns[i].segfd >= 0 && !fdatasync(r->conns[i].segfd)) {
                    r->conns[i].dirty = 0;
                    pthread_mutex_lock(&r->stat_lock);
                    r->st.syncs++;
                    pthread_mutex_unlock(&r->stat_lock);
                }
            }
            last_sync = now_ms();
        }
        pthread_mutex_lock(&r->stat_lock);
        r->st.peers_connected = 0;
        for (int i = 0; i < r->nconns; i++)
            r->st.peers_connected += r->conns[i].has_id;
        pthread_mutex_unlock(&r->stat_lock);
    }
    while (r->nconns)
        rconn_close(r, r->nconns - 1);
    return NULL;
}

int rl_receiver_start(struct rl_receiver **out, const char *addr, int port, const char *peer_dir,
                      uint32_t sync_ms, const uint8_t *key, const struct rl_tls_files *tls, char *err,
                      size_t errlen)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
        snprintf(err, errlen, "replication bind address '%s' is not an IPv4 address", addr);
        return -EINVAL;
    }
    struct rl_receiver *r = calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    int rc = rl_tls_ctx(&r->tls, tls, 1, err, errlen);
    if (rc) {
        free(r);
        return rc;
    }
    r->peer_dir = strdup(peer_dir);
    r->sync_ms = sync_ms ? sync_ms : 1000;
    memcpy(r->key, key, RL_KEY);
    pthread_mutex_init(&r->stat_lock, NULL);
    r->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    r->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (r->lfd < 0 || r->evfd < 0)
        rc = -errno;
    if (!rc)
        setsockopt(r->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (!rc && (bind(r->lfd, (struct sockaddr *)&sa, sizeof sa) || listen(r->lfd, 16)))
        rc = -errno;
    if (rc) {
        snprintf(err, errlen, "cannot listen for replication on %s:%d: %s", addr, port, strerror(-rc));
        goto fail;
    }
    socklen_t sl = sizeof sa;
    getsockname(r->lfd, (struct sockaddr *)&sa, &sl);
    r->port = ntohs(sa.sin_port);
    if ((rc = -pthread_create(&r->th, NULL, receiver_main, r))) {
        snprintf(err, errlen, "cannot start the log receiver: %s", strerror(-rc));
        goto fail;
    }
    pthread_setname_np(r->th, "kv-logrecv");
    *out = r;
    return 0;
fail:
    if (r->lfd >= 0)
        close(r->lfd);
    if (r->evfd >= 0)
        close(r->evfd);
    tls_ctx_free(r->tls);
    free(r->peer_dir);
    free(r);
    return rc;
}

int rl_receiver_port(struct rl_receiver *r) { return r->port; }

void rl_receiver_set_self(struct rl_receiver *r, const uint8_t node_id[16])
{
    pthread_mutex_lock(&r->stat_lock);
    memcpy(r->self, node_id, 16);
    r->has_self = 1;
    pthread_mutex_unlock(&r->stat_lock);
}

void rl_receiver_stop(struct rl_receiver *r)
{
    if (!r)
        return;
    atomic_store_explicit(&r->stop, 1, memory_order_release);
    uint64_t one = 1;
    ssize_t wr = write(r->evfd, &one, sizeof one);
    (void)wr;
    pthread_join(r->th, NULL);
    close(r->lfd);
    close(r->evfd);
    kvbuf_free(&r->pl);
    tls_ctx_free(r->tls);
    OPENSSL_cleanse(r->key, sizeof r->key);
    pthread_mutex_destroy(&r->stat_lock);
    free(r->peer_dir);
    free(r);
}

void rl_receiver_get_stats(struct rl_receiver *r, struct rl_receiver_stats *st)
{
    pthread_mutex_lock(&r->stat_lock);
    *st = r->st;
    pthread_mutex_unlock(&r->stat_lock);
}
