/* mqtt_proto_test.c - ext/proto/mqtt.c, the MQTT 3.1.1 packet codec, built with
 * AddressSanitizer+UBSan by tests/c/test_c_sanitizers.py.
 *
 * usage: mqtt_proto_test SEED [ITERATIONS]   (default 200000)
 *
 * First the rules of the specification (OASIS MQTT 3.1.1), each against exact
 * expectations: the remaining length at every varint boundary and the framing of
 * every prefix, the maximum packet size, reserved packet types and the fixed
 * header's flags (2.2); CONNECT with every combination of its flags parsed back
 * field by field, refused protocol names and levels, reserved and inconsistent
 * flags, empty client ids, trailing bytes, every truncation and ill-formed UTF-8
 * (3.1, 1.5.3); PUBLISH (3.3), the acknowledgements' packet id (2.3.1), SUBSCRIBE
 * and UNSUBSCRIBE walked filter by filter (3.8, 3.10); topic names, filters and
 * matching against the examples of section 4.7, then exhaustively against a
 * reference matcher written here (levels split on '/'); UTF-8 against a reference
 * validator (RFC 3629's table); the encoders against exact bytes, framed and parsed
 * back.
 *
 * Then, per iteration, a packet of the corpus (valid packets of every type) is
 * mutated (bit flips, bytes set, inserts, deletes, truncation, splices, a second
 * packet appended, the length field damaged; half the time the remaining length is
 * then made right again so the body parsers see framed bodies) and framed in a
 * buffer of exactly its size (a fresh malloc: ASan reports any read past it),
 * checked against a reference framer; the body (or, if it does not frame, the whole
 * input) is given to every parser, each twice in separate exact-size copies:
 * results only the documented ones, the same both times, equal to the references'
 * (written from the specification in this file), and every string returned inside
 * the body. Exits 0 and prints a summary ending in "ok", or "FAIL: ..." (with the
 * input in hex) and 1. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/kvbuf.h"
#include "proto/mqtt.h"
#include "rng.h"

static struct rng rng;

static uint64_t rnd(void) { return rng_next(&rng); }

static size_t below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

/* The input being checked, shown on failure. */
static const uint8_t *cur_in;
static size_t cur_n;
static long cur_iter = -1;

static void fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5), noreturn));
static void fail(const char *file, int line, const char *cond, const char *fmt, ...)
{
    va_list ap;
    printf("FAIL: %s:%d: %s: ", file, line, cond);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    if (cur_iter >= 0)
        printf("iteration %ld\n", cur_iter);
    if (cur_in) {
        printf("input (%zu bytes):", cur_n);
        for (size_t i = 0; i < cur_n && i < 1024; i++)
            printf(" %02x", cur_in[i]);
        printf("%s\n", cur_n > 1024 ? " ..." : "");
    }
    fflush(stdout);
    exit(1);
}

#define CHECK(cond, ...)                                                                                           \
    do {                                                                                                           \
        if (!(cond))                                                                                               \
            fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                                                          \
    } while (0)

/* A copy of p[0..n) in a buffer of exactly n bytes (ASan bounds; malloc(0) gives a
 * pointer to nothing readable). */
static uint8_t *exact(const void *p, size_t n)
{
    uint8_t *q = malloc(n);
    if (!q && n) {
        printf("out of memory\n");
        exit(2);
    }
    if (n)
        memcpy(q, p, n);
    return q;
}

/* ---- building packets */

enum { PK_CAP = 4096 };

struct pk {
    uint8_t b[PK_CAP];
    size_t n;
};

struct s {
    const char *p;
    size_t n;
};
#define L(x) ((struct s){x, sizeof(x) - 1})

static void put8(struct pk *o, unsigned v)
{
    CHECK(o->n < PK_CAP, "builder overflow");
    o->b[o->n++] = (uint8_t)v;
}

static void put16(struct pk *o, unsigned v)
{
    put8(o, v >> 8 & 255);
    put8(o, v & 255);
}

static void putraw(struct pk *o, const void *p, size_t n)
{
    CHECK(o->n + n <= PK_CAP, "builder overflow");
    if (n)
        memcpy(o->b + o->n, p, n);
    o->n += n;
}

static void putstr(struct pk *o, struct s v)
{
    put16(o, (unsigned)v.n);
    putraw(o, v.p, v.n);
}

/* The remaining length as 2.2.3 encodes it (written here, not the codec's). */
static size_t enc_len(uint8_t *h, size_t len)
{
    size_t k = 0;
    do {
        uint8_t d = len & 127;
        len >>= 7;
        h[k++] = d | (len ? 128 : 0);
    } while (len);
    return k;
}

static void wrap(struct pk *out, unsigned first, const uint8_t *body, size_t n)
{
    uint8_t h[8];
    out->n = 0;
    put8(out, first);
    putraw(out, h, enc_len(h, n));
    putraw(out, body, n);
}

static void expect_hex(const uint8_t *got, size_t n, const char *hex, const char *what)
{
    CHECK(n == strlen(hex) / 2, "%s: %zu bytes, expected %zu", what, n, strlen(hex) / 2);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        CHECK(got[i] == v, "%s: byte %zu is %02x, expected %02x", what, i, got[i], v);
    }
}

/* ---- references, written from the specification, independent of the codec */

/* Well-formed UTF-8 (RFC 3629 section 4's table; 1.5.3) without U+0000. */
static int ref_utf8(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint8_t c = p[i], lo = 0x80, hi = 0xbf;
        size_t k;
        if (c == 0)
            return 0;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xc2 && c <= 0xdf)
            k = 1;
        else if (c == 0xe0)
            k = 2, lo = 0xa0;
        else if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef)
            k = 2;
        else if (c == 0xed)
            k = 2, hi = 0x9f;
        else if (c == 0xf0)
            k = 3, lo = 0x90;
        else if (c >= 0xf1 && c <= 0xf3)
            k = 3;
        else if (c == 0xf4)
            k = 3, hi = 0x8f;
        else
            return 0;
        if (n - i <= k)
            return 0;
        if (p[i + 1] < lo || p[i + 1] > hi)
            return 0;
        for (size_t j = 2; j <= k; j++)
            if (p[i + j] < 0x80 || p[i + j] > 0xbf)
                return 0;
        i += k + 1;
    }
    return 1;
}

static int ref_topic_ok(const uint8_t *p, size_t n) /* 4.7.1-1, 4.7.3-1 */
{
    return n > 0 && n <= 65535 && !memchr(p, '+', n) && !memchr(p, '#', n) && ref_utf8(p, n);
}

static int ref_filter_ok(const uint8_t *p, size_t n) /* 4.7.1-2, 4.7.1-3, 4.7.3-1 */
{
    if (n == 0 || n > 65535 || !ref_utf8(p, n))
        return 0;
    size_t s = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && p[i] != '/')
            continue;
        size_t ln = i - s; /* the level p[s..i) */
        if (ln && memchr(p + s, '+', ln) && ln != 1)
            return 0;
        if (ln && memchr(p + s, '#', ln) && (ln != 1 || i != n))
            return 0;
        s = i + 1;
    }
    return 1;
}

enum { MAXLV = 256 };

static size_t split(const uint8_t *p, size_t n, const uint8_t **lv, size_t *ln)
{
    size_t k = 0, s = 0;
    for (size_t i = 0; i <= n; i++)
        if (i == n || p[i] == '/') {
            CHECK(k < MAXLV, "too many levels");
            lv[k] = p + s;
            ln[k++] = i - s;
            s = i + 1;
        }
    return k;
}

/* 4.7: level by level; '#' matches its parent and any number of levels below;
 * '+' one whole level (possibly empty); a wildcard at the start never matches a
 * topic starting with '$' (4.7.2). */
static int ref_match(const uint8_t *f, size_t fn, const uint8_t *t, size_t tn)
{
    const uint8_t *fl[MAXLV], *tl[MAXLV];
    size_t fln[MAXLV], tln[MAXLV];
    if (tn && t[0] == '$' && fn && (f[0] == '+' || f[0] == '#'))
        return 0;
    size_t nf = split(f, fn, fl, fln), nt = split(t, tn, tl, tln);
    for (size_t i = 0; i < nf; i++) {
        if (fln[i] == 1 && fl[i][0] == '#')
            return 1;
        if (i >= nt)
            return 0;
        if (fln[i] == 1 && fl[i][0] == '+')
            continue;
        if (fln[i] != tln[i] || memcmp(fl[i], tl[i], fln[i]))
            return 0;
    }
    return nf == nt;
}

/* 2.2: type, flags (table 2.2), remaining length of at most four bytes. */
static int ref_frame(const uint8_t *p, size_t n, size_t max, struct mqtt_frame *f)
{
    if (n < 2)
        return 0;
    int type = p[0] >> 4, flags = p[0] & 15;
    if (type == 0 || type == 15)
        return -1;
    if (type == MQTT_PUBLISH ? ((flags >> 1) & 3) == 3
                             : flags != (type == MQTT_PUBREL || type == MQTT_SUBSCRIBE || type == MQTT_UNSUBSCRIBE ? 2 : 0))
        return -1;
    size_t len = 0, mult = 1;
    for (size_t i = 1; i <= 4; i++) {
        if (i >= n)
            return 0;
        len += (size_t)(p[i] & 127) * mult;
        mult *= 128;
        if (!(p[i] & 128)) {
            f->type = type;
            f->flags = flags;
            f->hlen = i + 1;
            f->len = len;
            if (f->hlen + len > max)
                return -1;
            return n >= f->hlen + len;
        }
    }
    return -1;
}

struct rr {
    const uint8_t *p;
    size_t n, off;
};

static int rr_u8(struct rr *r, int *v)
{
    if (r->n - r->off < 1)
        return -1;
    *v = r->p[r->off++];
    return 0;
}

static int rr_u16(struct rr *r, int *v)
{
    if (r->n - r->off < 2)
        return -1;
    *v = r->p[r->off] << 8 | r->p[r->off + 1];
    r->off += 2;
    return 0;
}

static int rr_bin(struct rr *r, struct mqtt_str *s)
{
    int l;
    if (rr_u16(r, &l) || r->n - r->off < (size_t)l)
        return -1;
    s->p = r->p + r->off;
    s->n = (size_t)l;
    r->off += (size_t)l;
    return 0;
}

static int rr_str(struct rr *r, struct mqtt_str *s) { return rr_bin(r, s) || !ref_utf8(s->p, s->n) ? -1 : 0; }

/* The protocol name MQIsdp (3.1) at a level other than 3: the specification lets
 * the server refuse it either way (3.1.2-1: MAY disconnect). */
#define EITHER 99

static int ref_connect(const uint8_t *b, size_t n, struct mqtt_connect *c)
{
    struct rr r = {b, n, 0};
    int flags;
    memset(c, 0, sizeof *c);
    if (rr_str(&r, &c->proto) || rr_u8(&r, &c->level))
        return -1;
    int mqtt = c->proto.n == 4 && !memcmp(c->proto.p, "MQTT", 4);
    int mqisdp = c->proto.n == 6 && !memcmp(c->proto.p, "MQIsdp", 6);
    if (mqtt && c->level != 4)
        return MQTT_CONN_VERSION; /* 3.1.2-2 */
    if (mqisdp)
        return c->level == 3 ? MQTT_CONN_VERSION : EITHER;
    if (!mqtt)
        return -1; /* 3.1.2-1 */
    if (rr_u8(&r, &flags) || rr_u16(&r, &c->keepalive))
        return -1;
    if (flags & 1)
        return -1; /* 3.1.2-3 */
    c->clean = !!(flags & 2);
    c->will = !!(flags & 4);
    c->will_qos = flags >> 3 & 3;
    c->will_retain = !!(flags & 32);
    c->has_pass = !!(flags & 64);
    c->has_user = !!(flags & 128);
    if (!c->will && (c->will_qos || c->will_retain))
        return -1; /* 3.1.2-11, -13, -15 */
    if (c->will_qos == 3)
        return -1; /* 3.1.2-14 */
    if (c->has_pass && !c->has_user)
        return -1; /* 3.1.2-22 */
    if (rr_str(&r, &c->client_id))
        return -1; /* 3.1.3-3, -4 */
    if (c->will) {
        if (rr_str(&r, &c->will_topic) || !ref_topic_ok(c->will_topic.p, c->will_topic.n))
            return -1;
        if (rr_bin(&r, &c->will_msg))
            return -1;
    }
    if (c->has_user && rr_str(&r, &c->user))
        return -1;
    if (c->has_pass && rr_bin(&r, &c->pass))
        return -1;
    if (r.off != n)
        return -1;
    if (c->client_id.n == 0 && !c->clean)
        return MQTT_CONN_ID; /* 3.1.3-8 */
    return 0;
}

static int ref_publish(int flags, const uint8_t *b, size_t n, struct mqtt_publish *m)
{
    struct rr r = {b, n, 0};
    int id = 0;
    memset(m, 0, sizeof *m);
    m->qos = flags >> 1 & 3;
    m->retain = flags & 1;
    m->dup = !!(flags & 8);
    if (m->qos == 0 && m->dup)
        return -1; /* 3.3.1-2 */
    if (rr_bin(&r, &m->topic) || !ref_topic_ok(m->topic.p, m->topic.n))
        return -1; /* 3.3.2-1, -2 */
    if (m->qos && (rr_u16(&r, &id) || id == 0))
        return -1; /* 2.3.1-1 */
    m->id = (uint16_t)id;
    m->payload.p = b + r.off;
    m->payload.n = n - r.off;
    return 0;
}

enum { MAXSUBS = PK_CAP };
static struct mqtt_str ref_filters[MAXSUBS];
static int ref_qos[MAXSUBS];

/* SUBSCRIBE (with_qos) or UNSUBSCRIBE: the number of filters or -1 (3.8.3, 3.10.3). */
static int ref_subs(const uint8_t *b, size_t n, int with_qos, uint16_t *id)
{
    struct rr r = {b, n, 0};
    int v, count = 0;
    if (rr_u16(&r, &v) || v == 0)
        return -1;
    *id = (uint16_t)v;
    while (r.off < n) {
        struct mqtt_str f;
        int q = 0;
        if (rr_bin(&r, &f) || (with_qos && rr_u8(&r, &q)))
            return -1;
        if (!ref_filter_ok(f.p, f.n) || q > 2) /* 3.8.3-4: QoS 0..2, reserved bits 0 */
            return -1;
        CHECK(count < MAXSUBS, "too many filters");
        ref_filters[count] = f;
        ref_qos[count++] = q;
    }
    return count ? count : -1; /* 3.8.3-3, 3.10.3-2 */
}

/* ---- helpers for checking parser output */

static int inside(const struct mqtt_str *s, const uint8_t *b, size_t n)
{
    uintptr_t p = (uintptr_t)s->p, lo = (uintptr_t)b;
    if (s->n == 0)
        return s->p == NULL || (p >= lo && p - lo <= n);
    return s->p && p >= lo && s->n <= n && p - lo <= n - s->n;
}

static long off_of(const struct mqtt_str *s, const uint8_t *b)
{
    return s->p ? (long)((uintptr_t)s->p - (uintptr_t)b) : -1;
}

static void str_eq(const struct mqtt_str *m, const uint8_t *b, size_t n, struct s want, const char *what)
{
    CHECK(inside(m, b, n), "%s outside the body", what);
    CHECK(m->n == want.n && (!want.n || !memcmp(m->p, want.p, want.n)), "%s is %zu bytes, expected %zu \"%.*s\"",
          what, m->n, want.n, (int)want.n, want.p);
}

#define CONNECT_STRS(X) X(proto) X(client_id) X(will_topic) X(will_msg) X(user) X(pass)

static void same_connect(const struct mqtt_connect *a, const uint8_t *ab, const struct mqtt_connect *b,
                         const uint8_t *bb, int only_head, const char *what)
{
    CHECK(a->level == b->level && off_of(&a->proto, ab) == off_of(&b->proto, bb) && a->proto.n == b->proto.n,
          "%s: protocol name or level differ", what);
    if (only_head)
        return;
    CHECK(a->clean == b->clean && a->keepalive == b->keepalive && a->will == b->will && a->will_qos == b->will_qos &&
              a->will_retain == b->will_retain && a->has_user == b->has_user && a->has_pass == b->has_pass,
          "%s: CONNECT's flags or keep alive differ (clean %d/%d keepalive %d/%d will %d/%d qos %d/%d retain %d/%d "
          "user %d/%d pass %d/%d)",
          what, a->clean, b->clean, a->keepalive, b->keepalive, a->will, b->will, a->will_qos, b->will_qos,
          a->will_retain, b->will_retain, a->has_user, b->has_user, a->has_pass, b->has_pass);
#define SAME(f)                                                                                                    \
    CHECK(off_of(&a->f, ab) == off_of(&b->f, bb) && a->f.n == b->f.n, "%s: " #f " at %ld+%zu against %ld+%zu", what, \
          off_of(&a->f, ab), a->f.n, off_of(&b->f, bb), b->f.n);
    CONNECT_STRS(SAME)
#undef SAME
}

static int parse_connect_copy(const uint8_t *src, size_t n, struct mqtt_connect *c, uint8_t **buf)
{
    const char *err = NULL;
    *buf = exact(src, n);
    int rc = mqtt_parse_connect(*buf, n, c, &err);
    CHECK(rc >= -1 && rc <= MQTT_CONN_ID, "mqtt_parse_connect returned %d", rc);
    CHECK(rc != -1 || (err && *err), "-1 without a reason");
    return rc;
}

static int connect_rc(const uint8_t *src, size_t n)
{
    struct mqtt_connect c;
    uint8_t *buf;
    int rc = parse_connect_copy(src, n, &c, &buf);
    free(buf);
    return rc;
}

static int publish_rc(int flags, const uint8_t *src, size_t n, struct mqtt_publish *m, uint8_t **buf)
{
    const char *err = NULL;
    *buf = exact(src, n);
    int rc = mqtt_parse_publish(flags, *buf, n, m, &err);
    CHECK(rc == 0 || rc == -1, "mqtt_parse_publish returned %d", rc);
    CHECK(rc != -1 || (err && *err), "-1 without a reason");
    return rc;
}

static int subs_rc(const uint8_t *src, size_t n, int with_qos, uint16_t *id)
{
    const char *err = NULL;
    uint8_t *buf = exact(src, n);
    int rc = mqtt_parse_subs(buf, n, with_qos, id, &err);
    CHECK(rc == -1 || rc >= 1, "mqtt_parse_subs returned %d", rc);
    CHECK(rc != -1 || (err && *err), "-1 without a reason");
    free(buf);
    return rc;
}

static int frame_rc(const uint8_t *src, size_t n, size_t max, struct mqtt_frame *f)
{
    const char *err = NULL;
    uint8_t *buf = exact(src, n);
    int rc = mqtt_frame(buf, n, max, f, &err);
    CHECK(rc >= -1 && rc <= 1, "mqtt_frame returned %d", rc);
    CHECK(rc != -1 || (err && *err), "-1 without a reason");
    free(buf);
    return rc;
}

/* ---- 1. framing (2.2) */

static long frames_checked;

static void check_frame(void)
{
    static const struct {
        size_t len;
        const char *hex;
    } vb[] = {{0, "00"},           {127, "7f"},         {128, "8001"},         {16383, "ff7f"},
              {16384, "808001"},   {2097151, "ffff7f"}, {2097152, "80808001"}, {268435455, "ffffff7f"}};
    static const int types[][2] = {{MQTT_PUBLISH, 0}, {MQTT_SUBSCRIBE, 2}, {MQTT_CONNECT, 0}, {MQTT_PUBREL, 2}};
    struct mqtt_frame f;
    for (size_t i = 0; i < sizeof vb / sizeof vb[0]; i++) {
        int type = types[i % 4][0], flags = types[i % 4][1];
        struct kvbuf b = {0};
        CHECK(mqtt_put_header(&b, type, flags, vb[i].len) == 0, "mqtt_put_header");
        CHECK(b.len >= 2 && (uint8_t)b.p[0] == (type << 4 | flags), "first byte %02x", (uint8_t)b.p[0]);
        expect_hex((const uint8_t *)b.p + 1, b.len - 1, vb[i].hex, "remaining length");
        size_t hlen = b.len, total = hlen + vb[i].len;
        /* the whole packet in a buffer of exactly its size (the body untouched: the
         * framer must not read it) */
        uint8_t *pkt = malloc(total);
        CHECK(pkt, "out of memory for %zu bytes", total);
        memcpy(pkt, b.p, hlen);
        const char *err = NULL;
        memset(&f, 0xee, sizeof f);
        CHECK(mqtt_frame(pkt, total, total, &f, &err) == 1, "remaining length %zu not framed", vb[i].len);
        CHECK(f.type == type && f.flags == flags && f.hlen == hlen && f.len == vb[i].len,
              "framed type %d flags %d hlen %zu len %zu, expected %d %d %zu %zu", f.type, f.flags, f.hlen, f.len, type,
              flags, hlen, vb[i].len);
        err = NULL;
        CHECK(mqtt_frame(pkt, total, total - 1, &f, &err) == -1 && err, "hlen+len > max_packet accepted (len %zu)",
              vb[i].len);
        if (vb[i].len) {
            CHECK(mqtt_frame(pkt, total - 1, total, &f, &err) == 0, "one byte short of %zu not 0", total);
            CHECK(mqtt_frame(pkt, hlen, (size_t)-1, &f, &err) == 0, "the fixed header alone not 0");
        }
        free(pkt);
        for (size_t k = 0; k < hlen; k++) /* a part of the fixed header */
            CHECK(frame_rc((const uint8_t *)b.p, k, (size_t)-1, &f) == 0, "%zu bytes of the header not 0", k);
        kvbuf_free(&b);
    }
    /* a fifth length byte: four with the continuation bit set */
    static const uint8_t five[][6] = {{0x30, 0x80, 0x80, 0x80, 0x80, 0x01},
                                      {0x30, 0xff, 0xff, 0xff, 0xff, 0x7f},
                                      {0xc0, 0x80, 0x80, 0x80, 0x80, 0x00}};
    for (size_t i = 0; i < 3; i++) {
        CHECK(frame_rc(five[i], 6, (size_t)-1, &f) == -1, "5-byte remaining length accepted (%zu)", i);
        CHECK(frame_rc(five[i], 5, (size_t)-1, &f) == -1, "4 length bytes all continued not -1 (%zu)", i);
        CHECK(frame_rc(five[i], 4, (size_t)-1, &f) == 0, "3 length bytes continued not 0 (%zu)", i);
    }
    /* max_packet: a PUBLISH of 2+10 bytes */
    static const uint8_t pub[] = {0x30, 10, 0, 3, 'a', '/', 'b', 'x', 'y', 'z', 'w', 'v'};
    CHECK(frame_rc(pub, 12, 12, &f) == 1 && f.hlen == 2 && f.len == 10, "hlen+len == max refused");
    CHECK(frame_rc(pub, 12, 11, &f) == -1, "hlen+len == max+1 accepted");
    CHECK(frame_rc(pub, 5, 11, &f) == -1, "too large not refused as soon as its header is there");
    CHECK(frame_rc(pub, 5, 12, &f) == 0, "incomplete packet within max not 0");
    CHECK(frame_rc(pub, 2, 1, &f) == -1, "max below the header not -1");
    /* every type and flag nibble (table 2.1, 2.2; 3.3.1-4) */
    for (int t = 0; t < 16; t++)
        for (int fl = 0; fl < 16; fl++) {
            uint8_t p[2] = {(uint8_t)(t << 4 | fl), 0};
            int want;
            if (t == 0 || t == 15)
                want = -1;
            else if (t == MQTT_PUBLISH)
                want = ((fl >> 1) & 3) == 3 ? -1 : 1;
            else
                want = fl == (t == MQTT_PUBREL || t == MQTT_SUBSCRIBE || t == MQTT_UNSUBSCRIBE ? 2 : 0) ? 1 : -1;
            int rc = frame_rc(p, 2, 1024, &f);
            CHECK(rc == want, "first byte %02x: %d, expected %d", p[0], rc, want);
            if (rc == 1)
                CHECK(f.type == t && f.flags == fl && f.hlen == 2 && f.len == 0, "first byte %02x framed wrong", p[0]);
            frames_checked++;
        }
}

/* ---- 2. CONNECT (3.1) */

struct conn_spec {
    struct s name;
    int level, flags, keepalive;
    struct s id, wt, wm, user, pass;
};

static void build_connect(struct pk *o, const struct conn_spec *c)
{
    o->n = 0;
    putstr(o, c->name);
    put8(o, (unsigned)c->level);
    put8(o, (unsigned)c->flags);
    put16(o, (unsigned)c->keepalive);
    putstr(o, c->id);
    if (c->flags & 4) {
        putstr(o, c->wt);
        putstr(o, c->wm);
    }
    if (c->flags & 128)
        putstr(o, c->user);
    if (c->flags & 64)
        putstr(o, c->pass);
}

static const struct conn_spec base_conn = {
    .name = {"MQTT", 4},
    .level = 4,
    .flags = 2,
    .keepalive = 60,
    .id = {"client-1", 8},
    .wt = {"will/topic", 10},
    .wm = {"\x00\xff\xc0\x80", 4},     /* binary data (3.1.3.3): NUL and ill-formed UTF-8 allowed */
    .user = {"\xc3\xbcser", 5},         /* "üser" */
    .pass = {"\x00\xed\xa0\x80pw", 6}, /* binary data (3.1.3.5) */
};

static long connects_checked;

static void check_connect(void)
{
    static struct pk o;
    int combos = 0;
    for (int clean = 0; clean < 2; clean++)
        for (int will = 0; will < 2; will++)
            for (int wq = 0; wq <= (will ? 2 : 0); wq++)
                for (int wr = 0; wr <= will; wr++)
                    for (int user = 0; user < 2; user++)
                        for (int pass = 0; pass <= user; pass++) {
                            struct conn_spec cs = base_conn;
                            cs.flags = clean << 1 | will << 2 | wq << 3 | wr << 5 | pass << 6 | user << 7;
                            cs.keepalive = combos == 0 ? 0 : combos == 1 ? 65535 : (combos * 4099) & 0xffff;
                            build_connect(&o, &cs);
                            cur_in = o.b;
                            cur_n = o.n;
                            struct mqtt_connect c;
                            uint8_t *b;
                            int rc = parse_connect_copy(o.b, o.n, &c, &b);
                            CHECK(rc == 0, "valid CONNECT (flags %02x) returned %d", cs.flags, rc);
                            str_eq(&c.proto, b, o.n, L("MQTT"), "protocol name");
                            CHECK(c.level == 4 && c.clean == clean && c.keepalive == cs.keepalive && c.will == will &&
                                      c.will_qos == wq && c.will_retain == wr && c.has_user == user &&
                                      c.has_pass == pass,
                                  "flags %02x parsed back as level %d clean %d keepalive %d will %d qos %d retain %d "
                                  "user %d pass %d",
                                  cs.flags, c.level, c.clean, c.keepalive, c.will, c.will_qos, c.will_retain,
                                  c.has_user, c.has_pass);
                            str_eq(&c.client_id, b, o.n, cs.id, "client id");
                            str_eq(&c.will_topic, b, o.n, will ? cs.wt : L(""), "will topic");
                            str_eq(&c.will_msg, b, o.n, will ? cs.wm : L(""), "will message");
                            str_eq(&c.user, b, o.n, user ? cs.user : L(""), "user name");
                            str_eq(&c.pass, b, o.n, pass ? cs.pass : L(""), "password");
                            free(b);
                            for (size_t k = 0; k < o.n; k++) /* every truncation */
                                CHECK(connect_rc(o.b, k) == -1, "CONNECT (flags %02x) cut to %zu of %zu bytes accepted",
                                      cs.flags, k, o.n);
                            o.b[o.n] = 0; /* a trailing byte (3.1.3: the payload is these fields) */
                            CHECK(connect_rc(o.b, o.n + 1) == -1, "CONNECT with a trailing byte accepted");
                            o.b[7] |= 1; /* the reserved flag (3.1.2-3) */
                            CHECK(connect_rc(o.b, o.n) == -1, "CONNECT with the reserved flag accepted");
                            combos++;
                            connects_checked += (long)o.n + 3;
                        }
    CHECK(combos == 2 * (1 + 3 * 2) * 3, "%d combinations", combos);

    struct conn_spec cs = base_conn;
    /* protocol level other than 4 under the name MQTT (3.1.2-2): CONNACK 0x01 */
    static const int levels[] = {0, 3, 5, 255};
    for (size_t i = 0; i < 4; i++) {
        cs = base_conn;
        cs.level = levels[i];
        build_connect(&o, &cs);
        cur_in = o.b, cur_n = o.n;
        CHECK(connect_rc(o.b, o.n) == MQTT_CONN_VERSION, "MQTT level %d not MQTT_CONN_VERSION", levels[i]);
        CHECK(connect_rc(o.b, 7) == MQTT_CONN_VERSION, "MQTT level %d, nothing after it, not MQTT_CONN_VERSION",
              levels[i]);
    }
    cs = base_conn;
    cs.name = L("MQIsdp"), cs.level = 3;
    build_connect(&o, &cs);
    cur_in = o.b, cur_n = o.n;
    CHECK(connect_rc(o.b, o.n) == MQTT_CONN_VERSION, "MQIsdp level 3 not MQTT_CONN_VERSION");
    /* other protocol names (3.1.2-1): malformed, close */
    static const struct s names[] = {{"MQTX", 4}, {"mqtt", 4}, {"MQT", 3},    {"", 0},      {"MQTTT", 5},
                                     {"MQIsdq", 6}, {"MQIsd", 5}, {"MQ\0T", 4}, {"MQTT\0", 5}, {"\xc0\x80QTT", 5}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        cs = base_conn;
        cs.name = names[i];
        build_connect(&o, &cs);
        cur_in = o.b, cur_n = o.n;
        CHECK(connect_rc(o.b, o.n) == -1, "protocol name %zu accepted", i);
    }
    /* inconsistent flags */
    static const struct {
        int flags;
        const char *why;
    } bad[] = {
        {0x02 | 0x08, "will QoS 1 without the will flag (3.1.2-13)"},
        {0x02 | 0x10, "will QoS 2 without the will flag (3.1.2-13)"},
        {0x02 | 0x20, "will retain without the will flag (3.1.2-15)"},
        {0x02 | 0x38, "will QoS 3 and retain without the will flag"},
        {0x02 | 0x04 | 0x18, "will QoS 3 (3.1.2-14)"},
        {0x02 | 0x04 | 0x18 | 0x20, "will QoS 3 with retain (3.1.2-14)"},
        {0x02 | 0x40, "password without user name (3.1.2-22)"},
        {0x40, "password without user name, clean 0 (3.1.2-22)"},
        {0x02 | 0x04 | 0x40, "password without user name, with a will (3.1.2-22)"},
        {0x03, "reserved flag (3.1.2-3)"},
        {0xff, "every flag"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cs = base_conn;
        cs.flags = bad[i].flags;
        build_connect(&o, &cs);
        cur_in = o.b, cur_n = o.n;
        CHECK(connect_rc(o.b, o.n) == -1, "%s: accepted", bad[i].why);
    }
    /* an empty client id (3.1.3-7, -8) */
    cs = base_conn;
    cs.id = L("");
    cs.flags = 0;
    build_connect(&o, &cs);
    cur_in = o.b, cur_n = o.n;
    CHECK(connect_rc(o.b, o.n) == MQTT_CONN_ID, "empty client id with clean 0 not MQTT_CONN_ID");
    cs.flags = 0x80 | 0x40 | 0x04 | 0x08; /* with the other fields too */
    build_connect(&o, &cs);
    cur_in = o.b, cur_n = o.n;
    CHECK(connect_rc(o.b, o.n) == MQTT_CONN_ID, "empty client id with clean 0 (and a will, user, password) not 2");
    o.b[o.n] = 'x';
    CHECK(connect_rc(o.b, o.n + 1) == -1, "empty client id, clean 0 and a trailing byte not -1");
    cs.flags = 2;
    build_connect(&o, &cs);
    cur_in = o.b, cur_n = o.n;
    {
        struct mqtt_connect c;
        uint8_t *b;
        CHECK(parse_connect_copy(o.b, o.n, &c, &b) == 0, "empty client id with clean 1 refused");
        str_eq(&c.client_id, b, o.n, L(""), "empty client id");
        free(b);
    }
    /* ill-formed UTF-8 (1.5.3-1, -2) in the client id, will topic, user name */
    static const struct s bad_utf8[] = {
        {"\xc0\x80", 2},         /* overlong U+0000 */
        {"\xc1\xbf", 2},         /* overlong U+007F */
        {"\xe0\x80\x80", 3},     /* overlong, 3 bytes */
        {"\xe0\x9f\xbf", 3},     /* overlong U+07FF */
        {"\xf0\x80\x80\x80", 4}, /* overlong, 4 bytes */
        {"\xf0\x8f\xbf\xbf", 4}, /* overlong U+FFFF */
        {"\xed\xa0\x80", 3},     /* U+D800 */
        {"\xed\xbf\xbf", 3},     /* U+DFFF */
        {"a\x00" "b", 3},        /* U+0000 */
        {"\x00", 1},
        {"\xf4\x90\x80\x80", 4}, /* U+110000 */
        {"\xf5\x80\x80\x80", 4},
        {"\xf8\x88\x80\x80\x80", 5},
        {"\xe2\x82", 2},         /* truncated U+20AC */
        {"ab\xc3", 3},           /* truncated at the end */
        {"\xf0\x9f\x98", 3},     /* truncated 4-byte sequence */
        {"\x80", 1},             /* a lone continuation byte */
        {"\xc3\x28", 2},         /* a lead byte without its continuation */
        {"\xff", 1},
        {"\xfe", 1},
    };
    for (size_t i = 0; i < sizeof bad_utf8 / sizeof bad_utf8[0]; i++) {
        cs = base_conn;
        cs.id = bad_utf8[i];
        build_connect(&o, &cs);
        cur_in = o.b, cur_n = o.n;
        CHECK(connect_rc(o.b, o.n) == -1, "ill-formed UTF-8 %zu in the client id accepted", i);
        cs = base_conn;
        cs.flags = 0x80 | 0x02;
        cs.user = bad_utf8[i];
        build_connect(&o, &cs);
        cur_in = o.b, cur_n = o.n;
        CHECK(connect_rc(o.b, o.n) == -1, "ill-formed UTF-8 %zu in the user name accepted", i);
        cs = base_conn;
        cs.flags = 0x04 | 0x02;
        cs.wt = bad_utf8[i];
        build_connect(&o, &cs);
        cur_in = o.b, cur_n = o.n;
        CHECK(connect_rc(o.b, o.n) == -1, "ill-formed UTF-8 %zu in the will topic accepted", i);
    }
    /* well-formed UTF-8 at the edges of each length, kept as is (a BOM too: 1.5.3-3) */
    static const struct s good_utf8[] = {
        {"\x7f", 1},         {"\xc2\x80", 2},     {"\xdf\xbf", 2},         {"\xe0\xa0\x80", 3},
        {"\xed\x9f\xbf", 3}, {"\xee\x80\x80", 3}, {"\xef\xbb\xbf" "a", 4}, {"\xef\xbf\xbf", 3},
        {"\xf0\x90\x80\x80", 4}, {"\xf4\x8f\xbf\xbf", 4}, {"caf\xc3\xa9 \xe2\x82\xac", 9},
    };
    for (size_t i = 0; i < sizeof good_utf8 / sizeof good_utf8[0]; i++) {
        cs = base_conn;
        cs.id = good_utf8[i];
        build_connect(&o, &cs);
        cur_in = o.b, cur_n = o.n;
        struct mqtt_connect c;
        uint8_t *b;
        CHECK(parse_connect_copy(o.b, o.n, &c, &b) == 0, "well-formed UTF-8 %zu in the client id refused", i);
        str_eq(&c.client_id, b, o.n, good_utf8[i], "client id");
        free(b);
    }
    /* the will topic is where the will is published: a topic name (3.1.2.5, 3.3.2-2, 4.7.3-1) */
    static const struct s bad_wt[] = {{"", 0}, {"a/+", 3}, {"#", 1}, {"a/#", 3}, {"+", 1}};
    for (size_t i = 0; i < sizeof bad_wt / sizeof bad_wt[0]; i++) {
        cs = base_conn;
        cs.flags = 0x04 | 0x02;
        cs.wt = bad_wt[i];
        build_connect(&o, &cs);
        cur_in = o.b, cur_n = o.n;
        CHECK(connect_rc(o.b, o.n) == -1, "will topic \"%s\" accepted", bad_wt[i].p);
    }
    cur_in = NULL;
}

/* ---- 3. PUBLISH (3.3) */

static void check_publish(void)
{
    static uint8_t big[300];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (uint8_t)(i * 7);
    static const struct s topics[] = {{"a", 1}, {"sport/tennis/player1", 20}, {"/", 1}, {"$SYS/x", 6},
                                      {"caf\xc3\xa9/\xe2\x82\xac", 9}, {"a b", 3}};
    const struct s payloads[] = {{"", 0}, {"hello", 5}, {"\x00\x01\xff", 3}, {"\x00\x07", 2},
                                 {(const char *)big, sizeof big}};
    static const uint16_t ids[] = {1, 0x1234, 0xffff, 0x0100};
    static struct pk o;
    int n = 0;
    for (int qos = 0; qos < 3; qos++)
        for (int retain = 0; retain < 2; retain++)
            for (int dup = 0; dup <= (qos ? 1 : 0); dup++)
                for (size_t ti = 0; ti < sizeof topics / sizeof topics[0]; ti++)
                    for (size_t pi = 0; pi < sizeof payloads / sizeof payloads[0]; pi++) {
                        uint16_t id = qos ? ids[n % 4] : 0;
                        o.n = 0;
                        putstr(&o, topics[ti]);
                        if (qos)
                            put16(&o, id);
                        putraw(&o, payloads[pi].p, payloads[pi].n);
                        cur_in = o.b, cur_n = o.n;
                        int flags = dup << 3 | qos << 1 | retain;
                        struct mqtt_publish m;
                        uint8_t *b;
                        CHECK(publish_rc(flags, o.b, o.n, &m, &b) == 0, "valid PUBLISH (flags %x) refused", flags);
                        CHECK(m.qos == qos && m.retain == retain && m.dup == dup && m.id == id,
                              "flags %x id %u parsed back as qos %d retain %d dup %d id %u", flags, id, m.qos, m.retain,
                              m.dup, m.id);
                        str_eq(&m.topic, b, o.n, topics[ti], "topic");
                        CHECK(m.topic.p == b + 2, "topic not at offset 2");
                        str_eq(&m.payload, b, o.n, payloads[pi], "payload");
                        size_t hdr = 2 + topics[ti].n + (qos ? 2 : 0);
                        CHECK(m.payload.p == b + hdr && m.payload.n == o.n - hdr, "payload not the rest of the body");
                        free(b);
                        /* every cut: malformed inside the variable header, a shorter payload after it */
                        for (size_t k = 0; k < o.n; k++) {
                            int rc = publish_rc(flags, o.b, k, &m, &b);
                            CHECK(rc == (k >= hdr ? 0 : -1), "PUBLISH cut to %zu bytes (header %zu): %d", k, hdr, rc);
                            if (rc == 0)
                                CHECK(m.payload.p == b + hdr && m.payload.n == k - hdr, "cut payload");
                            free(b);
                        }
                        n++;
                    }
    /* topic names: no wildcards, not empty, well-formed (3.3.2-2, 4.7.3-1, 1.5.3) */
    static const struct s bad_topics[] = {{"a+", 2},  {"+", 1},       {"a/#", 3}, {"#", 1},      {"", 0},
                                          {"sport/+/x", 9}, {"\xc0\x80", 2}, {"a\0", 2},  {"\xed\xa0\x80", 3}, {"a/b#", 4}};
    for (size_t i = 0; i < sizeof bad_topics / sizeof bad_topics[0]; i++)
        for (int qos = 0; qos < 3; qos++) {
            o.n = 0;
            putstr(&o, bad_topics[i]);
            if (qos)
                put16(&o, 7);
            putraw(&o, "pl", 2);
            cur_in = o.b, cur_n = o.n;
            struct mqtt_publish m;
            uint8_t *b;
            CHECK(publish_rc(qos << 1, o.b, o.n, &m, &b) == -1, "topic %zu at QoS %d accepted", i, qos);
            free(b);
        }
    struct mqtt_publish m;
    uint8_t *b;
    o.n = 0;
    putstr(&o, L("a/b"));
    put16(&o, 5);
    cur_in = o.b, cur_n = o.n;
    for (int retain = 0; retain < 2; retain++) { /* DUP with QoS 0 (3.3.1-2) */
        CHECK(publish_rc(8 | retain, o.b, o.n, &m, &b) == -1, "QoS 0 with DUP accepted");
        free(b);
    }
    o.n = 0;
    putstr(&o, L("a/b"));
    put16(&o, 0);
    putraw(&o, "x", 1);
    cur_in = o.b, cur_n = o.n;
    for (int qos = 1; qos < 3; qos++)
        for (int dup = 0; dup < 2; dup++) { /* packet id 0 (2.3.1-1) */
            CHECK(publish_rc(dup << 3 | qos << 1, o.b, o.n, &m, &b) == -1, "QoS %d with packet id 0 accepted", qos);
            free(b);
        }
    CHECK(publish_rc(0, o.b, o.n, &m, &b) == 0 && m.id == 0 && m.payload.n == 3, "QoS 0: the id bytes are payload");
    free(b);
    static const uint8_t over[] = {0, 5, 'a', 'b', 'c', 'd'}; /* a topic longer than the body */
    cur_in = over, cur_n = sizeof over;
    CHECK(publish_rc(0, over, sizeof over, &m, &b) == -1, "topic past the body accepted");
    free(b);
    cur_in = NULL;
}

/* ---- 4. packet ids (3.4 - 3.7, 3.11; 2.3.1) */

static void check_ids(void)
{
    static const struct {
        uint8_t b[3];
        size_t n;
        int id; /* -1: refused */
    } t[] = {{{0}, 0, -1},          {{1}, 1, -1},          {{0, 1, 0}, 3, -1}, {{0, 0}, 2, -1},
             {{0, 1}, 2, 1},        {{0x12, 0x34}, 2, 0x1234}, {{0xff, 0xff}, 2, 0xffff}, {{1, 0}, 2, 0x100},
             {{0x80, 0x00}, 2, 0x8000}, {{0, 0, 1}, 3, -1}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        uint8_t *b = exact(t[i].b, t[i].n);
        uint16_t id = 0xabcd;
        const char *err = NULL;
        int rc = mqtt_parse_id(b, t[i].n, &id, &err);
        CHECK(rc == (t[i].id < 0 ? -1 : 0), "id case %zu: %d", i, rc);
        CHECK(rc != 0 || id == t[i].id, "id case %zu: %u, expected %d", i, id, t[i].id);
        CHECK(rc == 0 || (err && *err), "-1 without a reason");
        free(b);
    }
}

/* ---- 5. SUBSCRIBE and UNSUBSCRIBE (3.8, 3.10) */

static const struct s sub_filters[] = {{"a", 1}, {"sport/tennis/player1/#", 22}, {"#", 1}, {"+", 1}, {"+/+", 3},
                                       {"/", 1}, {"$SYS/#", 6}, {"sport/+/player1", 15}, {"\xc3\xa9/+", 4},
                                       {"a//b", 4}, {"+/#", 3}};
#define NSUBF (sizeof sub_filters / sizeof sub_filters[0])

static long subs_checked;

static void check_subs(void)
{
    static struct pk o;
    struct mqtt_str f;
    int qos;
    for (int round = 0; round < 3000; round++) {
        int with_qos = !(round & 1), nf = 1 + (int)below(5), qs[5];
        size_t fi[5], ends[5];
        uint16_t id = (uint16_t)(1 + below(65535)), got = 0;
        o.n = 0;
        put16(&o, id);
        for (int i = 0; i < nf; i++) {
            fi[i] = below(NSUBF);
            qs[i] = with_qos ? (int)below(3) : 0;
            putstr(&o, sub_filters[fi[i]]);
            if (with_qos)
                put8(&o, (unsigned)qs[i]);
            ends[i] = o.n;
        }
        cur_in = o.b, cur_n = o.n;
        CHECK(subs_rc(o.b, o.n, with_qos, &got) == nf && got == id, "%d filters (qos %d) not parsed: id %u/%u", nf,
              with_qos, got, id);
        uint8_t *b = exact(o.b, o.n);
        size_t off = 2;
        for (int i = 0; i < nf; i++) {
            qos = -1;
            CHECK(mqtt_next_sub(b, o.n, with_qos, &off, &f, &qos) == 1, "filter %d not walked", i);
            str_eq(&f, b, o.n, sub_filters[fi[i]], "filter");
            CHECK(qos == qs[i] && off == ends[i], "filter %d: qos %d off %zu, expected %d %zu", i, qos, off, qs[i],
                  ends[i]);
        }
        CHECK(mqtt_next_sub(b, o.n, with_qos, &off, &f, &qos) == 0 && off == o.n, "walk does not end at the end");
        free(b);
        /* every cut: at the end of a filter (and its QoS) the filters before it, else malformed */
        for (size_t k = 0; k < o.n; k++) {
            int want = -1;
            for (int i = 0; i < nf; i++)
                if (ends[i] == k)
                    want = i + 1;
            int rc = subs_rc(o.b, k, with_qos, &got);
            CHECK(rc == want, "cut to %zu bytes: %d, expected %d", k, rc, want);
        }
        if (with_qos) { /* a requested QoS above 2, or a reserved bit set (3.8.3-4) */
            static const uint8_t badq[] = {3, 4, 0x80, 0x81, 0xff, 0x40, 0x08, 0x10, 0x20, 0x84};
            int i = (int)below((size_t)nf);
            uint8_t keep = o.b[ends[i] - 1];
            o.b[ends[i] - 1] = badq[round / 2 % sizeof badq];
            CHECK(subs_rc(o.b, o.n, 1, &got) == -1, "requested QoS byte %02x accepted", o.b[ends[i] - 1]);
            o.b[ends[i] - 1] = keep;
        }
        subs_checked++;
    }
    uint16_t got;
    static const uint8_t only_id[] = {0, 1};
    static const uint8_t id0[] = {0, 0, 0, 1, 'a', 0};
    static const uint8_t empty_f[] = {0, 1, 0, 0, 0};
    static const uint8_t bad_f[] = {0, 1, 0, 6, 's', 'p', 'o', 'r', 't', '+', 0};
    static const uint8_t qos4[] = {0, 1, 0, 1, 'a', 4};
    static const uint8_t no_qos[] = {0, 1, 0, 1, 'a'};
    static const uint8_t over[] = {0, 1, 0, 9, 'a', 'b', 0};
    CHECK(subs_rc(only_id, 2, 1, &got) == -1 && subs_rc(only_id, 2, 0, &got) == -1, "no filter accepted");
    CHECK(subs_rc(id0, 6, 1, &got) == -1 && subs_rc(id0, 5, 0, &got) == -1, "packet id 0 accepted");
    CHECK(subs_rc(empty_f, 5, 1, &got) == -1 && subs_rc(empty_f, 4, 0, &got) == -1, "empty filter accepted");
    CHECK(subs_rc(bad_f, 11, 1, &got) == -1 && subs_rc(bad_f, 10, 0, &got) == -1, "filter sport+ accepted");
    CHECK(subs_rc(qos4, 6, 1, &got) == -1, "requested QoS 0x04 accepted");
    CHECK(subs_rc(no_qos, 5, 1, &got) == -1, "SUBSCRIBE without the QoS byte accepted");
    CHECK(subs_rc(no_qos, 5, 0, &got) == 1 && got == 1, "UNSUBSCRIBE of a refused");
    CHECK(subs_rc(over, 7, 1, &got) == -1 && subs_rc(over, 7, 0, &got) == -1, "filter past the body accepted");
    size_t off = 5;
    CHECK(mqtt_next_sub(no_qos, 5, 0, &off, &f, &qos) == 0 && off == 5, "next_sub at the end");
    cur_in = NULL;
}

/* ---- 6. topic names, filters, matching (4.7) */

static long match_pairs, match_hits;

static int filter_ok(const char *s) { return mqtt_filter_ok((const uint8_t *)s, strlen(s)); }
static int topic_ok(const char *s) { return mqtt_topic_ok((const uint8_t *)s, strlen(s)); }

static int match_exact(const uint8_t *f, size_t fn, const uint8_t *t, size_t tn)
{
    uint8_t *a = exact(f, fn), *b = exact(t, tn);
    int m = mqtt_match(a, fn, b, tn);
    free(a);
    free(b);
    return m;
}

static void cross_check(const uint8_t *f, size_t fn, const uint8_t *t, size_t tn)
{
    int want = ref_match(f, fn, t, tn), got = mqtt_match(f, fn, t, tn);
    CHECK(got == want, "mqtt_match(\"%.*s\", \"%.*s\") = %d, the reference says %d", (int)fn, f, (int)tn, t, got,
          want);
    match_pairs++;
    match_hits += want;
}

static void check_topics(void)
{
    static const struct {
        const char *f, *t;
        int m;
    } table[] = {
        {"sport/tennis/player1/#", "sport/tennis/player1", 1},
        {"sport/tennis/player1/#", "sport/tennis/player1/ranking", 1},
        {"sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", 1},
        {"sport/tennis/player1/#", "sport/tennis/player2", 0},
        {"sport/tennis/player1/#", "sport/tennis", 0},
        {"sport/#", "sport", 1},
        {"sport/#", "sports", 0},
        {"#", "sport", 1},
        {"#", "/", 1},
        {"#", "a/b/c", 1},
        {"#", "/finance", 1},
        {"sport/tennis/+", "sport/tennis/player1", 1},
        {"sport/tennis/+", "sport/tennis/player2", 1},
        {"sport/tennis/+", "sport/tennis/player1/ranking", 0},
        {"sport/+", "sport", 0},
        {"sport/+", "sport/", 1},
        {"+", "sport", 1},
        {"+", "sport/", 0},
        {"+/+", "/finance", 1},
        {"/+", "/finance", 1},
        {"+", "/finance", 0},
        {"+/+", "finance", 0},
        {"+/tennis/#", "sport/tennis/player1/ranking", 1},
        {"+/tennis/#", "sport/tennis", 1},
        {"+/tennis/#", "sport/golf", 0},
        {"sport/+/player1", "sport/tennis/player1", 1},
        {"sport/+/player1", "sport//player1", 1},
        {"$SYS/#", "$SYS/x", 1},
        {"$SYS/#", "$SYS", 1},
        {"$SYS/monitor/+", "$SYS/monitor/Clients", 1},
        {"#", "$SYS/monitor/Clients", 0},
        {"+/monitor/Clients", "$SYS/monitor/Clients", 0},
        {"#", "$SYS", 0},
        {"+", "$", 0},
        {"+/#", "$x/y", 0},
        {"a/$b", "a/$b", 1},
        {"a/+", "a/$b", 1},
        {"ACCOUNTS", "Accounts", 0}, /* case sensitive (4.7.3) */
        {"sport/tennis", "sport/tennis/", 0},
        {"/finance", "finance", 0},
        {"sport/tennis/player1", "sport/tennis/player1", 1},
        {"a b", "a b", 1},
        {"/", "/", 1},
        {"/", "", 0},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        const char *f = table[i].f, *t = table[i].t;
        size_t fn = strlen(f), tn = strlen(t);
        CHECK(filter_ok(f), "filter \"%s\" refused", f);
        if (tn) {
            CHECK(topic_ok(t), "topic \"%s\" refused", t);
            CHECK(ref_match((const uint8_t *)f, fn, (const uint8_t *)t, tn) == table[i].m, "the reference matcher on "
                  "\"%s\" \"%s\"", f, t);
        }
        int m = match_exact((const uint8_t *)f, fn, (const uint8_t *)t, tn);
        CHECK(m == table[i].m, "mqtt_match(\"%s\", \"%s\") = %d, expected %d", f, t, m, table[i].m);
    }
    static const char *const bad_filters[] = {"sport/tennis#", "sport/tennis/#/ranking", "sport+", "#/", "##", "++",
                                              "a/b+", "+a", "a/#b", "a/#/", "#/a", "+#", "#+", "a/+b/c", ""};
    for (size_t i = 0; i < sizeof bad_filters / sizeof bad_filters[0]; i++) {
        uint8_t *b = exact(bad_filters[i], strlen(bad_filters[i]));
        CHECK(!mqtt_filter_ok(b, strlen(bad_filters[i])), "invalid filter \"%s\" accepted", bad_filters[i]);
        free(b);
    }
    static const char *const good_filters[] = {"#",      "+",    "+/+",   "/+", "sport/#", "+/tennis/#", "/",
                                               "//",     "$SYS/#", "a/+/b", "+/#", "a b",   "/#",        "+//+"};
    for (size_t i = 0; i < sizeof good_filters / sizeof good_filters[0]; i++) {
        uint8_t *b = exact(good_filters[i], strlen(good_filters[i]));
        CHECK(mqtt_filter_ok(b, strlen(good_filters[i])), "valid filter \"%s\" refused", good_filters[i]);
        free(b);
    }
    CHECK(!mqtt_filter_ok((const uint8_t *)"a\0", 2) && !mqtt_filter_ok((const uint8_t *)"\xc0\x80", 2) &&
              !mqtt_topic_ok((const uint8_t *)"a\0", 2) && !mqtt_topic_ok((const uint8_t *)"\xed\xa0\x80", 3),
          "ill-formed UTF-8 accepted as a topic or filter");
    static const char *const bad_topics[] = {"", "a+", "#", "a/#", "+", "sport/+/x"};
    for (size_t i = 0; i < sizeof bad_topics / sizeof bad_topics[0]; i++) {
        uint8_t *b = exact(bad_topics[i], strlen(bad_topics[i]));
        CHECK(!mqtt_topic_ok(b, strlen(bad_topics[i])), "invalid topic \"%s\" accepted", bad_topics[i]);
        free(b);
    }
    /* 65535 bytes is the most a string holds (1.5.3) */
    uint8_t *longs = malloc(65536);
    memset(longs, 'a', 65536);
    CHECK(mqtt_topic_ok(longs, 65535) && mqtt_filter_ok(longs, 65535), "65535-byte topic refused");
    CHECK(!mqtt_topic_ok(longs, 65536) && !mqtt_filter_ok(longs, 65536), "65536-byte topic accepted");
    free(longs);

    /* exhaustive: every filter of 1..4 characters over {a,b,/,+,#,$} (validity against the
     * reference), against every topic of 1..5 characters over {a,b,/,$} */
    static const char alpha[] = "ab/+#$";
    static uint8_t filters[1600][4];
    static size_t flen[1600];
    size_t nfil = 0, nvalid_f = 0;
    for (size_t len = 1; len <= 4; len++) {
        size_t count = 1;
        for (size_t i = 0; i < len; i++)
            count *= 6;
        for (size_t x = 0; x < count; x++) {
            uint8_t s[4];
            size_t v = x;
            for (size_t i = 0; i < len; i++, v /= 6)
                s[i] = (uint8_t)alpha[v % 6];
            uint8_t *e = exact(s, len);
            int ok = mqtt_filter_ok(e, len), tok = mqtt_topic_ok(e, len);
            free(e);
            CHECK(ok == ref_filter_ok(s, len), "mqtt_filter_ok(\"%.*s\") = %d", (int)len, s, ok);
            CHECK(tok == ref_topic_ok(s, len), "mqtt_topic_ok(\"%.*s\") = %d", (int)len, s, tok);
            if (ok) {
                memcpy(filters[nfil], s, len);
                flen[nfil++] = len;
                nvalid_f++;
            }
        }
    }
    for (size_t len = 1; len <= 5; len++) {
        size_t count = 1;
        for (size_t i = 0; i < len; i++)
            count *= 4;
        for (size_t x = 0; x < count; x++) {
            uint8_t t[5];
            size_t v = x;
            for (size_t i = 0; i < len; i++, v /= 4)
                t[i] = (uint8_t)"ab/$"[v % 4];
            CHECK(mqtt_topic_ok(t, len), "topic \"%.*s\" refused", (int)len, t);
            for (size_t k = 0; k < nfil; k++)
                cross_check(filters[k], flen[k], t, len);
        }
    }
    /* random longer ones: filters over the alphabet, topics made from a filter (its
     * wildcards replaced) or random */
    for (int it = 0; it < 100000; it++) {
        uint8_t f[24], t[64];
        size_t fn = 1 + below(sizeof f), tn = 0;
        for (size_t i = 0; i < fn; i++)
            f[i] = (uint8_t)alpha[below(6)];
        int fok = mqtt_filter_ok(f, fn);
        CHECK(fok == ref_filter_ok(f, fn), "mqtt_filter_ok(\"%.*s\") = %d", (int)fn, f, fok);
        if (!fok)
            continue;
        if (below(3)) {
            for (size_t i = 0; i < fn; i++) {
                if (f[i] == '+' || f[i] == '#') {
                    size_t lv = f[i] == '#' ? below(4) : 1;
                    if (f[i] == '#' && lv == 0 && tn > 0 && t[tn - 1] == '/' && below(2))
                        tn--; /* "a/#" against "a" */
                    for (size_t l = 0; l < lv; l++) {
                        if (l)
                            t[tn++] = '/';
                        for (size_t c = below(3); c > 0; c--)
                            t[tn++] = (uint8_t)"ab$"[below(3)];
                    }
                } else {
                    t[tn++] = f[i];
                }
            }
        } else {
            tn = 1 + below(16);
            for (size_t i = 0; i < tn; i++)
                t[i] = (uint8_t)"ab/$"[below(4)];
        }
        if (!ref_topic_ok(t, tn))
            continue;
        CHECK(mqtt_topic_ok(t, tn), "topic \"%.*s\" refused", (int)tn, t);
        cross_check(f, fn, t, tn);
    }
    CHECK(match_hits > 1000 && match_pairs - match_hits > 1000, "%ld of %ld pairs matched", match_hits, match_pairs);
    (void)nvalid_f;
}

/* UTF-8 against the reference: every 1- and 2-byte string, every 3-byte string with a
 * non-ASCII first byte, random 4..8-byte ones from the bytes at the edges. */
static long utf8_checked;

static void check_utf8(void)
{
    uint8_t *b1 = malloc(1), *b2 = malloc(2), *b3 = malloc(3);
    for (unsigned x = 0; x < 256; x++) {
        b1[0] = (uint8_t)x;
        CHECK(mqtt_utf8_ok(b1, 1) == ref_utf8(b1, 1), "utf8 %02x", x);
    }
    for (unsigned x = 0; x < 65536; x++) {
        b2[0] = (uint8_t)(x >> 8), b2[1] = (uint8_t)x;
        CHECK(mqtt_utf8_ok(b2, 2) == ref_utf8(b2, 2), "utf8 %02x %02x", b2[0], b2[1]);
    }
    for (unsigned x = 0x800000; x < 0x1000000; x++) {
        b3[0] = (uint8_t)(x >> 16), b3[1] = (uint8_t)(x >> 8), b3[2] = (uint8_t)x;
        CHECK(mqtt_utf8_ok(b3, 3) == ref_utf8(b3, 3), "utf8 %02x %02x %02x", b3[0], b3[1], b3[2]);
    }
    utf8_checked = 256 + 65536 + 0x800000;
    free(b1);
    free(b2);
    free(b3);
    static const uint8_t edge[] = {0x00, 0x01, 0x41, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2,
                                   0xdf, 0xe0, 0xe1, 0xec, 0xed, 0xee, 0xef, 0xf0, 0xf1, 0xf3, 0xf4, 0xf5, 0xf7,
                                   0xf8, 0xfe, 0xff};
    for (int it = 0; it < 300000; it++) {
        uint8_t s[8];
        size_t n = 4 + below(5);
        for (size_t i = 0; i < n; i++)
            s[i] = below(4) ? edge[below(sizeof edge)] : (uint8_t)rnd();
        if (below(2)) { /* a well-formed lead, then its continuation bytes at the edges */
            s[0] = (uint8_t)(0xf0 + below(5));
            for (size_t i = 1; i < 4; i++)
                s[i] = (uint8_t)(0x80 + (below(2) ? below(64) : (below(2) ? 0 : 63)));
        }
        uint8_t *e = exact(s, n);
        CHECK(mqtt_utf8_ok(e, n) == ref_utf8(s, n), "utf8 of %zu bytes %02x %02x %02x %02x", n, s[0], s[1], s[2],
              s[3]);
        free(e);
        utf8_checked++;
    }
}

/* ---- 7. encoders */

static void expect_buf(struct kvbuf *b, const char *hex, const char *what)
{
    expect_hex((const uint8_t *)b->p, b->len, hex, what);
}

/* What an encoder wrote frames as one whole packet of this type and flags; returns
 * the body (an exact copy, to free). */
static uint8_t *frame_back(struct kvbuf *b, int type, int flags, size_t *blen)
{
    struct mqtt_frame f;
    cur_in = (const uint8_t *)b->p, cur_n = b->len;
    CHECK(frame_rc((const uint8_t *)b->p, b->len, b->len, &f) == 1, "an encoded packet does not frame");
    CHECK(f.type == type && f.flags == flags && f.hlen + f.len == b->len, "encoded packet framed as %d/%d %zu+%zu",
          f.type, f.flags, f.hlen, f.len);
    for (size_t k = 0; k < b->len; k++)
        CHECK(frame_rc((const uint8_t *)b->p, k, b->len, &f) == 0, "%zu bytes of an encoded packet not 0", k);
    *blen = f.len;
    return exact(b->p + f.hlen, f.len);
}

static long encodings_checked;

static void check_encoders(void)
{
    struct kvbuf b = {0};
    size_t n;
    uint8_t *body;
    for (size_t len = 0; len < 70000; len += len < 300 ? 1 : 997) { /* mqtt_put_header against enc_len */
        uint8_t h[8];
        size_t k = enc_len(h, len);
        b.len = 0;
        CHECK(mqtt_put_header(&b, MQTT_PUBLISH, 1, len) == 0 && b.len == k + 1 && (uint8_t)b.p[0] == 0x31 &&
                  !memcmp(b.p + 1, h, k),
              "mqtt_put_header(%zu)", len);
        encodings_checked++;
    }
    b.len = 0;
    CHECK(mqtt_put_header(&b, MQTT_PINGRESP, 0, 0) == 0, "header");
    expect_buf(&b, "d000", "PINGRESP");
    body = frame_back(&b, MQTT_PINGRESP, 0, &n);
    free(body);

    /* CONNACK (3.2): session present only with return code 0 (3.2.2-4) */
    static const struct {
        int sp, code;
        const char *hex;
    } ca[] = {{0, 0, "20020000"}, {1, 0, "20020100"}, {1, MQTT_CONN_VERSION, "20020001"},
              {0, MQTT_CONN_ID, "20020002"}, {1, MQTT_CONN_NOT_AUTHORIZED, "20020005"}};
    for (size_t i = 0; i < sizeof ca / sizeof ca[0]; i++) {
        b.len = 0;
        CHECK(mqtt_put_connack(&b, ca[i].sp, ca[i].code) == 0, "connack");
        expect_buf(&b, ca[i].hex, "CONNACK");
        body = frame_back(&b, MQTT_CONNACK, 0, &n);
        CHECK(n == 2, "CONNACK body");
        free(body);
        encodings_checked++;
    }

    /* PUBACK, PUBREC, PUBREL (flags 2: 3.6.1-1), PUBCOMP, UNSUBACK */
    static const struct {
        int type;
        uint16_t id;
        const char *hex;
    } acks[] = {{MQTT_PUBACK, 0x1234, "40021234"}, {MQTT_PUBREC, 1, "50020001"}, {MQTT_PUBREL, 0xffff, "6202ffff"},
                {MQTT_PUBCOMP, 0x0100, "70020100"}, {MQTT_UNSUBACK, 0x00ff, "b00200ff"}};
    for (size_t i = 0; i < sizeof acks / sizeof acks[0]; i++) {
        b.len = 0;
        CHECK(mqtt_put_ack(&b, acks[i].type, acks[i].id) == 0, "ack");
        expect_buf(&b, acks[i].hex, "ack");
        body = frame_back(&b, acks[i].type, acks[i].type == MQTT_PUBREL ? 2 : 0, &n);
        uint16_t id = 0;
        const char *err = NULL;
        CHECK(mqtt_parse_id(body, n, &id, &err) == 0 && id == acks[i].id, "ack id %u parsed back as %u", acks[i].id,
              id);
        free(body);
        encodings_checked++;
    }

    /* PUBLISH (3.3): no packet id at QoS 0; DUP bit 3, QoS bits 2-1, RETAIN bit 0 */
    static const struct {
        int qos, retain, dup;
        uint16_t id;
        const char *topic, *payload, *hex;
    } pubs[] = {
        {0, 1, 0, 77, "a/b", "hi", "3107" "0003612f62" "6869"},
        {0, 0, 0, 0, "t", "", "3003" "000174"},
        {1, 0, 1, 0x0102, "a/b", "hi", "3a09" "0003612f62" "0102" "6869"},
        {2, 1, 1, 0xffff, "x", "", "3d05" "000178" "ffff"},
        {2, 0, 0, 7, "x", "p", "3406" "000178" "0007" "70"},
        {1, 1, 0, 1, "x", "", "3305" "000178" "0001"},
    };
    for (size_t i = 0; i < sizeof pubs / sizeof pubs[0]; i++) {
        b.len = 0;
        size_t tl = strlen(pubs[i].topic), pl = strlen(pubs[i].payload);
        CHECK(mqtt_put_publish(&b, pubs[i].qos, pubs[i].retain, pubs[i].dup, pubs[i].id, pubs[i].topic, tl,
                               pubs[i].payload, pl) == 0,
              "publish");
        expect_buf(&b, pubs[i].hex, "PUBLISH");
        int flags = pubs[i].dup << 3 | pubs[i].qos << 1 | pubs[i].retain;
        body = frame_back(&b, MQTT_PUBLISH, flags, &n);
        struct mqtt_publish m;
        const char *err = NULL;
        CHECK(mqtt_parse_publish(flags, body, n, &m, &err) == 0, "encoded PUBLISH %zu refused: %s", i, err);
        CHECK(m.qos == pubs[i].qos && m.retain == pubs[i].retain && m.dup == pubs[i].dup &&
                  m.id == (pubs[i].qos ? pubs[i].id : 0),
              "encoded PUBLISH %zu parsed back", i);
        str_eq(&m.topic, body, n, (struct s){pubs[i].topic, tl}, "topic");
        str_eq(&m.payload, body, n, (struct s){pubs[i].payload, pl}, "payload");
        free(body);
        encodings_checked++;
    }
    /* random PUBLISH round trips, payloads across the 1- to 3-byte remaining lengths */
    static uint8_t payload[20000];
    for (size_t i = 0; i < sizeof payload; i++)
        payload[i] = (uint8_t)rnd();
    for (int it = 0; it < 300; it++) {
        int qos = (int)below(3), retain = (int)below(2), dup = qos ? (int)below(2) : 0;
        uint16_t id = (uint16_t)(1 + below(65535));
        char topic[40];
        size_t tl = 1 + below(sizeof topic);
        for (size_t i = 0; i < tl; i++)
            topic[i] = "ab/$c"[below(5)];
        size_t pl = below(4) ? below(200) : below(sizeof payload);
        b.len = 0;
        CHECK(mqtt_put_publish(&b, qos, retain, dup, id, topic, tl, payload, pl) == 0, "publish");
        int flags = dup << 3 | qos << 1 | retain;
        body = frame_back(&b, MQTT_PUBLISH, flags, &n);
        CHECK(n == 2 + tl + (qos ? 2 : 0) + pl, "PUBLISH length %zu", n);
        struct mqtt_publish m;
        const char *err = NULL;
        CHECK(mqtt_parse_publish(flags, body, n, &m, &err) == 0, "encoded PUBLISH refused: %s", err);
        CHECK(m.qos == qos && m.retain == retain && m.dup == dup && m.id == (qos ? id : 0), "PUBLISH parsed back");
        str_eq(&m.topic, body, n, (struct s){topic, tl}, "topic");
        str_eq(&m.payload, body, n, (struct s){(const char *)payload, pl}, "payload");
        free(body);
        encodings_checked++;
    }

    /* SUBACK (3.9): return codes 0, 1, 2, 0x80 */
    static const uint8_t codes[] = {0, 1, 2, 0x80};
    b.len = 0;
    CHECK(mqtt_put_suback(&b, 7, codes, 4) == 0, "suback");
    expect_buf(&b, "9006" "0007" "00010280", "SUBACK");
    body = frame_back(&b, MQTT_SUBACK, 0, &n);
    CHECK(n == 6 && body[0] == 0 && body[1] == 7 && !memcmp(body + 2, codes, 4), "SUBACK body");
    free(body);
    static uint8_t many[200];
    memset(many, 0x80, sizeof many);
    b.len = 0;
    CHECK(mqtt_put_suback(&b, 0xfffe, many, sizeof many) == 0, "suback");
    CHECK(b.len == 3 + 2 + sizeof many && (uint8_t)b.p[0] == 0x90 && (uint8_t)b.p[1] == 0xca && b.p[2] == 0x01 &&
              (uint8_t)b.p[3] == 0xff && (uint8_t)b.p[4] == 0xfe && !memcmp(b.p + 5, many, sizeof many),
          "SUBACK of 200 codes");
    body = frame_back(&b, MQTT_SUBACK, 0, &n);
    free(body);
    encodings_checked += 2;
    kvbuf_free(&b);
    cur_in = NULL;
}

/* ---- 8. the fuzzer */

struct ent {
    uint8_t first;
    struct pk body;
};

enum { MAXCORPUS = 64 };
static struct ent corpus[MAXCORPUS];
static size_t ncorpus;

static void add(unsigned first, const struct pk *body)
{
    CHECK(ncorpus < MAXCORPUS, "corpus full");
    corpus[ncorpus].first = (uint8_t)first;
    corpus[ncorpus].body = *body;
    ncorpus++;
}

static void add_kvbuf(struct kvbuf *b)
{
    struct mqtt_frame f;
    CHECK(frame_rc((const uint8_t *)b->p, b->len, b->len, &f) == 1, "corpus packet does not frame");
    struct pk body = {.n = 0};
    putraw(&body, b->p + f.hlen, f.len);
    add((uint8_t)b->p[0], &body);
    b->len = 0;
}

static void build_corpus(void)
{
    static struct pk o;
    static const int cflags[] = {0x02, 0x00, 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80, 0x04 | 0x10, 0x80 | 0x02};
    for (size_t i = 0; i < sizeof cflags / sizeof cflags[0]; i++) {
        struct conn_spec cs = base_conn;
        cs.flags = cflags[i];
        build_connect(&o, &cs);
        add(MQTT_CONNECT << 4, &o);
    }
    struct conn_spec cs = base_conn;
    cs.id = L("");
    build_connect(&o, &cs);
    add(MQTT_CONNECT << 4, &o);
    cs.level = 3;
    cs.name = L("MQIsdp");
    build_connect(&o, &cs);
    add(MQTT_CONNECT << 4, &o);
    struct kvbuf b = {0};
    mqtt_put_connack(&b, 1, 0);
    add_kvbuf(&b);
    static uint8_t pl[300];
    memset(pl, 'p', sizeof pl);
    mqtt_put_publish(&b, 0, 0, 0, 0, "sport/tennis", 12, "hello", 5);
    add_kvbuf(&b);
    mqtt_put_publish(&b, 1, 1, 1, 0x1234, "a/b", 3, "", 0);
    add_kvbuf(&b);
    mqtt_put_publish(&b, 2, 0, 0, 9, "$SYS/x", 6, pl, sizeof pl);
    add_kvbuf(&b);
    mqtt_put_publish(&b, 0, 1, 0, 0, "caf\xc3\xa9", 5, "\x00\x01", 2);
    add_kvbuf(&b);
    static const int ack_types[] = {MQTT_PUBACK, MQTT_PUBREC, MQTT_PUBREL, MQTT_PUBCOMP, MQTT_UNSUBACK};
    for (size_t i = 0; i < 5; i++) {
        mqtt_put_ack(&b, ack_types[i], (uint16_t)(0x101 * (i + 1)));
        add_kvbuf(&b);
    }
    for (int with_qos = 0; with_qos < 2; with_qos++)
        for (int v = 0; v < 2; v++) {
            o.n = 0;
            put16(&o, 0x0a0b);
            for (size_t i = 0; i < 2 + 2 * (size_t)v; i++) {
                putstr(&o, sub_filters[(i * 5 + (size_t)v) % NSUBF]);
                if (with_qos)
                    put8(&o, (unsigned)(i % 3));
            }
            add(with_qos ? (MQTT_SUBSCRIBE << 4 | 2) : (MQTT_UNSUBSCRIBE << 4 | 2), &o);
        }
    static const uint8_t codes[] = {0, 1, 2, 0x80};
    mqtt_put_suback(&b, 3, codes, 4);
    add_kvbuf(&b);
    o.n = 0;
    add(MQTT_PINGREQ << 4, &o);
    add(MQTT_PINGRESP << 4, &o);
    add(MQTT_DISCONNECT << 4, &o);
    kvbuf_free(&b);
    /* every packet of the corpus frames whole, every strict prefix is "need more" */
    static struct pk w;
    for (size_t i = 0; i < ncorpus; i++) {
        wrap(&w, corpus[i].first, corpus[i].body.b, corpus[i].body.n);
        cur_in = w.b, cur_n = w.n;
        struct mqtt_frame f;
        CHECK(frame_rc(w.b, w.n, w.n, &f) == 1 && f.hlen + f.len == w.n && f.len == corpus[i].body.n,
              "corpus packet %zu", i);
        for (size_t k = 0; k < w.n; k++)
            CHECK(frame_rc(w.b, k, w.n, &f) == 0, "corpus packet %zu: prefix of %zu bytes not 0", i, k);
    }
    cur_in = NULL;
}

static const uint8_t interesting[] = {0x00, 0x01, 0x02, 0x03, 0x04, 0x7f, 0x80, 0xff, '+', '#', '/', '$',
                                      0xc0, 0xed, 0xf4, 0x10, 0x20, 0x30, 0x32, 0x82, 0xa2, 'M', 'Q'};

static void mutate(struct pk *o, size_t from)
{
    int k = (int)below(5); /* 0: as built */
    for (int i = 0; i < k; i++) {
        size_t pos = from + below(o->n - from + 1);
        switch (below(9)) {
        case 0:
            if (o->n > from)
                o->b[from + below(o->n - from)] ^= (uint8_t)(1u << below(8));
            break;
        case 1:
            if (o->n > from)
                o->b[from + below(o->n - from)] = (uint8_t)rnd();
            break;
        case 2:
            if (o->n > from)
                o->b[from + below(o->n - from)] = interesting[below(sizeof interesting)];
            break;
        case 3: { /* insert */
            size_t m = 1 + below(8);
            if (o->n + m > PK_CAP)
                break;
            memmove(o->b + pos + m, o->b + pos, o->n - pos);
            for (size_t j = 0; j < m; j++)
                o->b[pos + j] = below(2) ? (uint8_t)rnd() : interesting[below(sizeof interesting)];
            o->n += m;
            break;
        }
        case 4: { /* delete */
            size_t m = 1 + below(8);
            if (pos + m > o->n)
                m = o->n - pos;
            memmove(o->b + pos, o->b + pos + m, o->n - pos - m);
            o->n -= m;
            break;
        }
        case 5: /* truncate */
            o->n = from + below(o->n - from + 1);
            break;
        case 6: { /* splice in part of another corpus body */
            const struct pk *c = &corpus[below(ncorpus)].body;
            if (!c->n)
                break;
            size_t s = below(c->n), m = 1 + below(c->n - s);
            if (o->n + m > PK_CAP)
                break;
            memmove(o->b + pos + m, o->b + pos, o->n - pos);
            memcpy(o->b + pos, c->b + s, m);
            o->n += m;
            break;
        }
        case 7: /* a 16-bit length field made large or small */
            if (o->n >= from + 2) {
                size_t at = from + below(o->n - from - 1);
                uint16_t v = below(2) ? (uint16_t)rnd() : (uint16_t)below(8);
                o->b[at] = (uint8_t)(v >> 8);
                o->b[at + 1] = (uint8_t)v;
            }
            break;
        default: /* duplicate a range of itself */
            if (o->n > from) {
                size_t s = from + below(o->n - from), m = 1 + below(o->n - s < 16 ? o->n - s : 16);
                uint8_t tmp[16];
                if (o->n + m > PK_CAP)
                    break;
                memcpy(tmp, o->b + s, m);
                memmove(o->b + pos + m, o->b + pos, o->n - pos);
                memcpy(o->b + pos, tmp, m);
                o->n += m;
            }
        }
    }
}

static long accepted[6], framed[3];

/* Every parser over src[0..n), twice, each in its own exact-size copy. */
static void parse_all(const uint8_t *src, size_t n, int pub_flags, int type)
{
    uint8_t *a = exact(src, n), *b = exact(src, n);
    const char *ea = NULL, *eb = NULL;

    /* CONNECT */
    struct mqtt_connect ca, cb, cr;
    int ra = mqtt_parse_connect(a, n, &ca, &ea), rb = mqtt_parse_connect(b, n, &cb, &eb);
    int rr = ref_connect(a, n, &cr);
    CHECK(ra >= -1 && ra <= MQTT_CONN_ID, "mqtt_parse_connect returned %d", ra);
    CHECK(ra == rb && (ra != -1 || (ea && eb && !strcmp(ea, eb))), "CONNECT not deterministic: %d %d", ra, rb);
    CHECK(rr == EITHER ? ra == -1 || ra == MQTT_CONN_VERSION : ra == rr, "CONNECT: %d, the reference says %d (%s)",
          ra, rr, ra == -1 ? ea : "");
    if (ra != -1) {
        same_connect(&ca, a, &cb, b, ra == MQTT_CONN_VERSION, "CONNECT twice");
        same_connect(&ca, a, &cr, a, ra == MQTT_CONN_VERSION, "CONNECT against the reference");
#define IN(f) CHECK(inside(&ca.f, a, n), "CONNECT's " #f " outside the body");
        CONNECT_STRS(IN)
#undef IN
        CHECK(ra != MQTT_CONN_ID || (ca.client_id.n == 0 && !ca.clean), "MQTT_CONN_ID");
        if (type == MQTT_CONNECT)
            accepted[0]++;
    }

    /* PUBLISH */
    struct mqtt_publish ma, mb, mr;
    ea = eb = NULL;
    ra = mqtt_parse_publish(pub_flags, a, n, &ma, &ea);
    rb = mqtt_parse_publish(pub_flags, b, n, &mb, &eb);
    rr = ref_publish(pub_flags, a, n, &mr);
    CHECK(ra == 0 || ra == -1, "mqtt_parse_publish returned %d", ra);
    CHECK(ra == rb && (ra == 0 || (ea && eb && !strcmp(ea, eb))), "PUBLISH not deterministic");
    CHECK(ra == rr, "PUBLISH (flags %x): %d, the reference says %d (%s)", pub_flags, ra, rr, ra ? ea : "");
    if (ra == 0) {
        CHECK(inside(&ma.topic, a, n) && inside(&ma.payload, a, n), "PUBLISH's strings outside the body");
        CHECK(ma.qos == mb.qos && ma.retain == mb.retain && ma.dup == mb.dup && ma.id == mb.id &&
                  off_of(&ma.topic, a) == off_of(&mb.topic, b) && ma.topic.n == mb.topic.n &&
                  off_of(&ma.payload, a) == off_of(&mb.payload, b) && ma.payload.n == mb.payload.n,
              "PUBLISH twice differs");
        CHECK(ma.qos == mr.qos && ma.retain == mr.retain && ma.dup == mr.dup && ma.id == mr.id &&
                  ma.topic.p == mr.topic.p && ma.topic.n == mr.topic.n && ma.payload.p == mr.payload.p &&
                  ma.payload.n == mr.payload.n,
              "PUBLISH differs from the reference");
        CHECK(ma.payload.p + ma.payload.n == a + n, "the payload is not the rest of the body");
        if (type == MQTT_PUBLISH)
            accepted[1]++;
    }

    /* packet ids */
    uint16_t ia = 0, ib = 0;
    ea = eb = NULL;
    ra = mqtt_parse_id(a, n, &ia, &ea);
    rb = mqtt_parse_id(b, n, &ib, &eb);
    CHECK(ra == 0 || ra == -1, "mqtt_parse_id returned %d", ra);
    CHECK(ra == rb && (ra || ia == ib), "mqtt_parse_id not deterministic");
    CHECK(ra == (n == 2 && (src[0] || src[1]) ? 0 : -1), "mqtt_parse_id on %zu bytes: %d", n, ra);
    CHECK(ra || ia == (src[0] << 8 | src[1]), "packet id %u", ia);
    if (ra == 0 && type >= MQTT_PUBACK && type <= MQTT_PUBCOMP)
        accepted[2]++;

    /* SUBSCRIBE, UNSUBSCRIBE */
    for (int with_qos = 0; with_qos < 2; with_qos++) {
        uint16_t sa = 0, sb = 0, sr = 0;
        ea = eb = NULL;
        ra = mqtt_parse_subs(a, n, with_qos, &sa, &ea);
        rb = mqtt_parse_subs(b, n, with_qos, &sb, &eb);
        rr = ref_subs(a, n, with_qos, &sr);
        CHECK(ra == -1 || ra >= 1, "mqtt_parse_subs returned %d", ra);
        CHECK(ra == rb && (ra == -1 ? ea && eb && !strcmp(ea, eb) : sa == sb), "mqtt_parse_subs not deterministic");
        CHECK(ra == rr, "%s: %d, the reference says %d (%s)", with_qos ? "SUBSCRIBE" : "UNSUBSCRIBE", ra, rr,
              ra == -1 ? ea : "");
        if (ra >= 1)
            CHECK(sa == sr, "packet id %u, the reference says %u", sa, sr);
        /* walk it (also when refused: next_sub is safe on any body) */
        size_t off = 2, steps = 0;
        int k, count = 0;
        if (n >= 2)
            for (;;) {
                struct mqtt_str f = {0};
                int q = -1;
                size_t before = off;
                k = mqtt_next_sub(a, n, with_qos, &off, &f, &q);
                CHECK(k >= -1 && k <= 1, "mqtt_next_sub returned %d", k);
                if (k != 1) {
                    CHECK(off == before, "next_sub moved on %d", k);
                    CHECK(ra < 1 || (k == 0 && off == n && count == ra), "walk ended with %d at %zu after %d of %d", k,
                          off, count, ra);
                    break;
                }
                CHECK(off > before && off <= n && inside(&f, a, n), "next_sub: off %zu -> %zu of %zu", before, off, n);
                CHECK(q >= 0 && q <= 255 && (with_qos || q == 0), "next_sub qos %d", q);
                if (ra >= 1) {
                    CHECK(count < ra && f.p == ref_filters[count].p && f.n == ref_filters[count].n &&
                              q == ref_qos[count],
                          "filter %d differs from the reference", count);
                    CHECK(mqtt_filter_ok(f.p, f.n), "filter %d of an accepted packet is not a filter", count);
                }
                count++;
                CHECK(++steps <= n, "next_sub does not end");
            }
        if (ra >= 1 && type == (with_qos ? MQTT_SUBSCRIBE : MQTT_UNSUBSCRIBE))
            accepted[3 + with_qos]++;
    }
    free(a);
    free(b);
}

static void fuzz(long iters)
{
    static struct pk in, body;
    struct mqtt_frame f, rf;
    for (cur_iter = 0; cur_iter < iters; cur_iter++) {
        const struct ent *e = &corpus[below(ncorpus)];
        unsigned first = e->first;
        if (below(8) == 0) /* another type or flag nibble */
            first = below(2) ? (uint8_t)rnd() : (first & 0xf0) | (unsigned)below(16);
        if (below(2)) { /* mutate the body, then give it its right remaining length */
            body = e->body;
            mutate(&body, 0);
            wrap(&in, first, body.b, body.n);
        } else { /* mutate the whole packet, its header too */
            wrap(&in, first, e->body.b, e->body.n);
            if (below(4) == 0) { /* a second packet after it */
                const struct ent *e2 = &corpus[below(ncorpus)];
                static struct pk w;
                wrap(&w, e2->first, e2->body.b, e2->body.n);
                if (in.n + w.n <= PK_CAP)
                    putraw(&in, w.b, w.n);
            }
            mutate(&in, 0);
            if (below(8) == 0 && in.n >= 2) /* the length field itself */
                in.b[1 + below(in.n - 1 < 4 ? in.n - 1 : 4)] = below(2) ? (uint8_t)rnd() : 0x80 | (uint8_t)below(4);
        }
        cur_in = in.b, cur_n = in.n;
        size_t max = below(8) ? (size_t)1 << 20 : 2 + below(400);
        memset(&rf, 0, sizeof rf);
        int rc = frame_rc(in.b, in.n, max, &f), rr = ref_frame(in.b, in.n, max, &rf);
        CHECK(rc == rr, "mqtt_frame: %d, the reference says %d (max %zu)", rc, rr, max);
        framed[rc + 1]++;
        int pub_flags = (int)below(16);
        if ((pub_flags >> 1 & 3) == 3)
            pub_flags &= ~4; /* QoS 3 never reaches the parser: framing refuses it */
        if (rc == 1) {
            CHECK(f.type == rf.type && f.flags == rf.flags && f.hlen == rf.hlen && f.len == rf.len,
                  "framed %d/%d %zu+%zu, the reference says %d/%d %zu+%zu", f.type, f.flags, f.hlen, f.len, rf.type,
                  rf.flags, rf.hlen, rf.len);
            CHECK(f.hlen >= 2 && f.hlen <= 5 && f.hlen + f.len <= in.n && f.hlen + f.len <= max, "frame bounds");
            size_t total = f.hlen + f.len;
            struct mqtt_frame g;
            CHECK(frame_rc(in.b, total - 1, max, &g) == 0, "one byte short of a whole packet not 0");
            CHECK(frame_rc(in.b, below(total), max, &g) == 0, "a prefix of a whole packet not 0");
            if (f.type == MQTT_PUBLISH)
                pub_flags = f.flags;
            parse_all(in.b + f.hlen, f.len, pub_flags, f.type);
        } else {
            parse_all(in.b, in.n, pub_flags, 0);
        }
    }
    cur_iter = -1;
    cur_in = NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s SEED [ITERATIONS]\n", argv[0]);
        return 2;
    }
    uint64_t seed = strtoull(argv[1], NULL, 0);
    long iters = argc > 2 ? strtol(argv[2], NULL, 0) : 200000;
    rng_seed(&rng, seed, 0);
    check_frame();
    check_connect();
    check_publish();
    check_ids();
    check_subs();
    check_topics();
    check_utf8();
    check_encoders();
    build_corpus();
    fuzz(iters);
    printf("mqtt_proto_test seed %" PRIu64 ": %ld frame cases, %ld CONNECT cases, %ld SUBSCRIBE rounds, %ld match "
           "pairs (%ld matching) and %ld UTF-8 strings against the references, %ld encodings, encoders exact; "
           "%ld mutated packets (%ld whole, %ld need more, %ld malformed), valid by type: %ld CONNECT %ld PUBLISH "
           "%ld acks %ld UNSUBSCRIBE %ld SUBSCRIBE: ok\n",
           seed, frames_checked, connects_checked, subs_checked, match_pairs, match_hits, utf8_checked,
           encodings_checked, iters, framed[2], framed[1], framed[0], accepted[0], accepted[1], accepted[2],
           accepted[3], accepted[4]);
    return 0;
}
