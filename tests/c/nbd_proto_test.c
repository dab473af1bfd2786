/* nbd_proto_test.c - ext/proto/nbd.c, the NBD protocol's bytes, built with
 * AddressSanitizer+UBSan by tests/c/test_c_sanitizers.py.
 *
 * usage: nbd_proto_test SEED [ITERATIONS]   (default 200000)
 *
 * First the encoders against exact bytes from the protocol document (greeting,
 * option reply, export-name reply with and without zeroes, simple reply,
 * structured chunk, error chunk) and the errno mapping. Then, per iteration, a
 * valid handshake option (GO / INFO data with a random name and information
 * requests), request header and client flags are built, checked to parse back
 * exactly, then mutated (byte flips, truncation, extension, random bytes) and
 * fed to every parser in a buffer of exactly their size (a fresh malloc: ASan
 * reports any read past it). Checked on every call: a parser returns 0 below
 * its fixed length, never consumes more than it was given, and what it
 * returns points inside the input and respects the bounds (name length,
 * information requests). Exits 0 and prints a summary, or "FAIL: ..." and 1. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/nbd.h"
#include "rng.h"

static struct rng rng;

static uint64_t rnd(void) { return rng_next(&rng); }

static int failures;

#define CHECK(cond, ...)                                                                                           \
    do {                                                                                                           \
        if (!(cond)) {                                                                                             \
            printf("FAIL: %s:%d: %s: ", __FILE__, __LINE__, #cond);                                                \
            printf(__VA_ARGS__);                                                                                   \
            printf("\n");                                                                                          \
            exit(1);                                                                                               \
        }                                                                                                          \
    } while (0)

static void expect_bytes(const uint8_t *got, const char *hex, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        CHECK(got[i] == v, "%s: byte %zu is %02x, expected %02x", what, i, got[i], v);
    }
}

static void encoders(void)
{
    uint8_t b[256];
    nbd_enc_greeting(b);
    expect_bytes(b, "4e42444d41474943" "49484156454f5054" "0003", NBD_GREETING_LEN, "greeting");
    nbd_enc_opt_reply(b, NBD_OPT_GO, NBD_REP_ERR_UNKNOWN, 5);
    expect_bytes(b, "0003e889045565a9" "00000007" "80000006" "00000005", NBD_OPT_REPLY_LEN, "option reply");
    CHECK(nbd_enc_export_name_reply(b, 0x100000, 0x0123, 1) == 10, "no zeroes: 10 bytes");
    expect_bytes(b, "0000000000100000" "0123", 10, "export name reply");
    memset(b, 0xff, sizeof b);
    CHECK(nbd_enc_export_name_reply(b, 1, 1, 0) == 134, "with zeroes: 134 bytes");
    for (int i = 10; i < 134; i++)
        CHECK(b[i] == 0, "zero padding at %d", i);
    nbd_enc_simple_reply(b, NBD_EIO, 0x0102030405060708ull);
    expect_bytes(b, "67446698" "00000005" "0102030405060708", NBD_SIMPLE_REPLY_LEN, "simple reply");
    nbd_enc_chunk(b, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_OFFSET_DATA, 9, 4104);
    expect_bytes(b, "668e33ef" "0001" "0001" "0000000000000009" "00001008", NBD_CHUNK_HDR_LEN, "chunk");
    CHECK(nbd_enc_error_chunk(b, 7, NBD_EINVAL, "bad", 3) == NBD_CHUNK_HDR_LEN + 9, "error chunk length");
    expect_bytes(b, "668e33ef" "0001" "8001" "0000000000000007" "00000009" "00000016" "0003" "626164",
                 NBD_CHUNK_HDR_LEN + 9, "error chunk");
    CHECK(nbd_error_of(0) == 0, "0");
    CHECK(nbd_error_of(-EPERM) == 1 && nbd_error_of(-EIO) == 5 && nbd_error_of(-ENOMEM) == 12, "errno");
    CHECK(nbd_error_of(-EINVAL) == 22 && nbd_error_of(-ENOSPC) == 28 && nbd_error_of(-EOVERFLOW) == 75, "errno");
    CHECK(nbd_error_of(-ENOTSUP) == 95 && nbd_error_of(-ESHUTDOWN) == 108, "errno");
    CHECK(nbd_error_of(-EBADF) == NBD_EINVAL, "an errno the protocol does not name is EINVAL");
    CHECK(!strcmp(nbd_cmd_name(NBD_CMD_WRITE_ZEROES), "write_zeroes") && !strcmp(nbd_cmd_name(999), "unknown"),
          "names");
}

/* A copy of p[0..n) in a buffer of exactly n bytes (ASan bounds). */
static uint8_t *exact(const uint8_t *p, size_t n)
{
    uint8_t *q = malloc(n ? n : 1);
    if (n)
        memcpy(q, p, n);
    return q;
}

static void mutate(uint8_t *b, size_t *n, size_t cap)
{
    int k = 1 + (int)(rnd() % 4);
    for (int i = 0; i < k; i++) {
        switch (rnd() % 5) {
        case 0:
            if (*n)
                b[rnd() % *n] ^= (uint8_t)(1u << (rnd() % 8));
            break;
        case 1:
            if (*n)
                b[rnd() % *n] = (uint8_t)rnd();
            break;
        case 2: *n = *n ? rnd() % *n : 0; break;              /* truncate */
        case 3:
            while (*n < cap && rnd() % 4) /* extend */
                b[(*n)++] = (uint8_t)rnd();
            break;
        default:
            for (size_t j = 0; j < *n; j++) /* random bytes, same length */
                if (rnd() % 8 == 0)
                    b[j] = (uint8_t)rnd();
        }
    }
}

/* Every parser over p[0..n): the safety checks. */
static void parse_all(const uint8_t *src, size_t n, long *valid)
{
    uint8_t *p = exact(src, n);
    uint32_t flags;
    int rc = nbd_parse_client_flags(p, n, &flags);
    CHECK(n >= 4 ? rc == 4 || rc == -EPROTO : rc == 0, "client flags rc %d n %zu", rc, n);
    struct nbd_opt_hdr h;
    rc = nbd_parse_opt_hdr(p, n, &h);
    CHECK(n >= NBD_OPT_HDR_LEN ? rc == NBD_OPT_HDR_LEN || rc == -EBADMSG : rc == 0, "opt hdr rc %d n %zu", rc, n);
    struct nbd_request r;
    rc = nbd_parse_request(p, n, &r);
    CHECK(n >= NBD_REQ_LEN ? rc == NBD_REQ_LEN || rc == -EBADMSG : rc == 0, "request rc %d n %zu", rc, n);
    struct nbd_opt_go go;
    rc = nbd_parse_opt_go(p, n, &go);
    CHECK(rc == 0 || rc == -EINVAL, "go rc %d", rc);
    if (rc == 0) {
        const uint8_t *name = (const uint8_t *)go.name;
        CHECK(name == p + 4 && go.name_len <= NBD_MAX_NAME && 4 + (size_t)go.name_len + 2 <= n, "go name");
        CHECK(go.ninfo <= NBD_MAX_INFO_REQS && 4 + go.name_len + 2 + 2 * (size_t)go.ninfo == n, "go infos");
        (*valid)++;
    }
    free(p);
}

int main(int argc, char **argv)
{
    rng_seed(&rng, argc > 1 ? strtoull(argv[1], NULL, 10) : 1, 0);
    long iters = argc > 2 ? strtol(argv[2], NULL, 10) : 200000;
    encoders();
    enum { CAP = 4 + NBD_MAX_NAME + 2 + 2 * NBD_MAX_INFO_REQS + 64 };
    static uint8_t b[CAP];
    long valid_go = 0, parsed = 0;
    for (long it = 0; it < iters; it++) {
        size_t n;
        switch (it % 3) {
        case 0: { /* GO / INFO data */
            uint32_t nl = (uint32_t)(rnd() % 4 ? rnd() % 64 : rnd() % (NBD_MAX_NAME + 1));
            uint16_t ni = (uint16_t)(rnd() % (NBD_MAX_INFO_REQS + 1));
            nbd_put32(b, nl);
            for (uint32_t i = 0; i < nl; i++)
                b[4 + i] = (uint8_t)('a' + rnd() % 26);
            nbd_put16(b + 4 + nl, ni);
            for (uint16_t i = 0; i < ni; i++)
                nbd_put16(b + 6 + nl + 2 * i, (uint16_t)(rnd() % 5));
            n = 6 + nl + 2 * (size_t)ni;
            uint8_t *p = exact(b, n);
            struct nbd_opt_go go;
            CHECK(nbd_parse_opt_go(p, n, &go) == 0, "valid GO (name %u, infos %u) refused", nl, ni);
            CHECK(go.name_len == nl && !memcmp(go.name, b + 4, nl) && go.ninfo == ni, "GO parsed back");
            for (uint16_t i = 0; i < ni; i++)
                CHECK(go.info[i] == nbd_get16(b + 6 + nl + 2 * i), "info %u", i);
            free(p);
            break;
        }
        case 1: { /* a request header */
            struct nbd_request want = {(uint16_t)rnd(), (uint16_t)rnd(), rnd(), rnd(), (uint32_t)rnd()};
            nbd_put32(b, NBD_REQUEST_MAGIC);
            nbd_put16(b + 4, want.flags);
            nbd_put16(b + 6, want.type);
            nbd_put64(b + 8, want.cookie);
            nbd_put64(b + 16, want.offset);
            nbd_put32(b + 24, want.length);
            n = NBD_REQ_LEN;
            uint8_t *p = exact(b, n);
            struct nbd_request got;
            CHECK(nbd_parse_request(p, n, &got) == NBD_REQ_LEN, "valid request refused");
            CHECK(got.flags == want.flags && got.type == want.type && got.cookie == want.cookie &&
                      got.offset == want.offset && got.length == want.length, "request parsed back");
            for (size_t k = 0; k < NBD_REQ_LEN; k++) /* every split: 0 until the whole header is there */
                CHECK(nbd_parse_request(p, k, &got) == 0, "request with %zu bytes", k);
            free(p);
            break;
        }
        default: { /* option header, client flags */
            nbd_put64(b, NBD_IHAVEOPT);
            nbd_put32(b + 8, (uint32_t)rnd());
            nbd_put32(b + 12, (uint32_t)rnd());
            n = NBD_OPT_HDR_LEN;
            struct nbd_opt_hdr h;
            CHECK(nbd_parse_opt_hdr(b, n, &h) == NBD_OPT_HDR_LEN && h.option == nbd_get32(b + 8) &&
                      h.length == nbd_get32(b + 12), "option header parsed back");
            uint32_t f;
            uint8_t fl[4] = {0, 0, 0, (uint8_t)(rnd() % 4)};
            CHECK(nbd_parse_client_flags(fl, 4, &f) == 4 && f == fl[3], "known client flags");
            fl[(rnd() % 4)] |= (uint8_t)(4u << (rnd() % 5)) | 0x80;
            CHECK(nbd_parse_client_flags(fl, 4, &f) == -EPROTO, "unknown client flag accepted");
        }
        }
        mutate(b, &n, CAP);
        parse_all(b, n, &valid_go);
        parsed++;
    }
    printf("nbd_proto_test: %ld mutated inputs parsed, %ld still valid GO data, encoders exact: ok\n", parsed,
           valid_go);
    return failures != 0;
}
