/* nbd.c - the NBD protocol's bytes: parsers (untrusted input, bounded: never a
 * read past n) and encoders (see nbd.h). No state: any thread. */
#include "proto/nbd.h"

#include <errno.h>
#include <string.h>

void nbd_enc_greeting(uint8_t *dst)
{
    nbd_put64(dst, NBD_MAGIC);
    nbd_put64(dst + 8, NBD_IHAVEOPT);
    nbd_put16(dst + 16, NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES);
}

int nbd_parse_client_flags(const uint8_t *p, size_t n, uint32_t *flags)
{
    if (n < 4)
        return 0;
    *flags = nbd_get32(p);
    return *flags & ~(uint32_t)(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES) ? -EPROTO : 4;
}

int nbd_parse_opt_hdr(const uint8_t *p, size_t n, struct nbd_opt_hdr *h)
{
    if (n < NBD_OPT_HDR_LEN)
        return 0;
    if (nbd_get64(p) != NBD_IHAVEOPT)
        return -EBADMSG;
    h->option = nbd_get32(p + 8);
    h->length = nbd_get32(p + 12);
    return NBD_OPT_HDR_LEN;
}

int nbd_parse_opt_go(const uint8_t *p, size_t n, struct nbd_opt_go *go)
{
    if (n < 6)
        return -EINVAL;
    uint32_t nl = nbd_get32(p);
    /* 4 + name + 2 + 2 * ninfo == n, each part bounded before it is used */
    if (nl > NBD_MAX_NAME || nl > n - 6)
        return -EINVAL;
    go->name = (const char *)p + 4;
    go->name_len = nl;
    size_t at = 4 + (size_t)nl;
    uint16_t ni = nbd_get16(p + at);
    at += 2;
    if (ni > NBD_MAX_INFO_REQS || (size_t)ni * 2 != n - at)
        return -EINVAL;
    go->ninfo = ni;
    for (uint16_t i = 0; i < ni; i++)
        go->info[i] = nbd_get16(p + at + 2 * (size_t)i);
    return 0;
}

void nbd_enc_opt_reply(uint8_t *dst, uint32_t option, uint32_t type, uint32_t len)
{
    nbd_put64(dst, NBD_REP_MAGIC);
    nbd_put32(dst + 8, option);
    nbd_put32(dst + 12, type);
    nbd_put32(dst + 16, len);
}

size_t nbd_enc_export_name_reply(uint8_t *dst, uint64_t size, uint16_t flags, int no_zeroes)
{
    nbd_put64(dst, size);
    nbd_put16(dst + 8, flags);
    if (no_zeroes)
        return 10;
    memset(dst + 10, 0, 124);
    return 134;
}

int nbd_parse_request(const uint8_t *p, size_t n, struct nbd_request *r)
{
    if (n < NBD_REQ_LEN)
        return 0;
    if (nbd_get32(p) != NBD_REQUEST_MAGIC)
        return -EBADMSG;
    r->flags = nbd_get16(p + 4);
    r->type = nbd_get16(p + 6);
    r->cookie = nbd_get64(p + 8);
    r->offset = nbd_get64(p + 16);
    r->length = nbd_get32(p + 24);
    return NBD_REQ_LEN;
}

void nbd_enc_simple_reply(uint8_t *dst, uint32_t error, uint64_t cookie)
{
    nbd_put32(dst, NBD_SIMPLE_REPLY_MAGIC);
    nbd_put32(dst + 4, error);
    nbd_put64(dst + 8, cookie);
}

void nbd_enc_chunk(uint8_t *dst, uint16_t flags, uint16_t type, uint64_t cookie, uint32_t length)
{
    nbd_put32(dst, NBD_STRUCTURED_REPLY_MAGIC);
    nbd_put16(dst + 4, flags);
    nbd_put16(dst + 6, type);
    nbd_put64(dst + 8, cookie);
    nbd_put32(dst + 16, length);
}

size_t nbd_enc_error_chunk(uint8_t *dst, uint64_t cookie, uint32_t error, const char *msg, uint16_t msg_len)
{
    nbd_enc_chunk(dst, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_ERROR, cookie, 6u + msg_len);
    nbd_put32(dst + NBD_CHUNK_HDR_LEN, error);
    nbd_put16(dst + NBD_CHUNK_HDR_LEN + 4, msg_len);
    memcpy(dst + NBD_CHUNK_HDR_LEN + 6, msg, msg_len);
    return NBD_CHUNK_HDR_LEN + 6u + msg_len;
}

uint32_t nbd_error_of(int neg_errno)
{
    switch (-neg_errno) {
    case 0: return 0;
    case EPERM: return NBD_EPERM;
    case EIO: return NBD_EIO;
    case ENOMEM: return NBD_ENOMEM;
    case ENOSPC: return NBD_ENOSPC;
    case EOVERFLOW: return NBD_EOVERFLOW;
    case ENOTSUP: return NBD_ENOTSUP;
    case ESHUTDOWN: return NBD_ESHUTDOWN;
    default: return NBD_EINVAL;
    }
}

const char *nbd_cmd_name(uint16_t type)
{
    static const char *const names[] = {"read", "write", "disconnect", "flush", "trim", "cache", "write_zeroes",
                                        "block_status"};
    return type < sizeof names / sizeof names[0] ? names[type] : "unknown";
}
