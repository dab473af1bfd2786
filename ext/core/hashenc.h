/* hashenc.h - a hash's fields as one byte string: the value the table (table.h)
 * stores, logs, spills and accounts for a key of type KVT_HASH.
 *
 * Format (little-endian; the same in memory, in the log and in the data file):
 *     u32 count                        fields that follow
 *     count times, in insertion order:
 *         varint flen, field (flen bytes)
 *         varint vlen, value (vlen bytes)
 * A varint is unsigned LEB128 (7 bits a byte, low group first, high bit = more
 * follows) in its shortest form, at most HASHENC_MAX_LEN. A field or value under
 * 128 bytes costs one length byte: n short pairs take 4 + n * (2 + field + value).
 * A stored hash has count >= 1 (removing its last field deletes the key); the
 * empty encoding (count 0) exists only while an operation builds a value.
 *
 * Order: a new field goes at the end, a field set again keeps its place, a removal
 * closes the gap: the order of Redis's listpack, so HGETALL and HKEYS list a hash
 * as Redis lists a small (listpack-encoded) one.
 *
 * Cost: a hash is one value, so every change rewrites it whole (one logged write
 * of the whole hash per change, like Redis's listpack). Each operation is one
 * pass over the encoded bytes, O(size of the hash), plus O(k) for the k fields a
 * command names: k > HASHENC_SMALL fields are hashed into a table made for the
 * call (SipHash with the process key, so clients cannot make them collide), so
 * HSET, HDEL or HMGET of k fields cost O(n + k) expected, not O(n * k).
 * hashenc_len reads the count: O(1).
 *
 * Untrusted bytes: a value may come from a damaged file or a replayed log. Every
 * length is checked against the bytes left before it is used and the count
 * against the least size of an entry (2 bytes), so no input makes a reader step
 * outside the value; a reader that stops early (HGET) has checked what it read.
 * A whole pass (every writer, hashenc_validate, hashenc_next to its end) also
 * requires exactly count entries and no byte after them. A malformed value gives
 * -EBADMSG. That fields are distinct is the writers' invariant, not checked (a
 * duplicate breaks no bound).
 *
 * Pure functions over the caller's memory, any thread; writers append to a
 * caller's kvbuf and allocate only there and for the k-field table.
 */
#ifndef KV_HASHENC_H
#define KV_HASHENC_H

#include <stddef.h>
#include <stdint.h>

struct kvbuf;

#define HASHENC_HDR 4                          /* the u32 count */
#define HASHENC_MAX_LEN (512u * 1024 * 1024)   /* a field, a value, a whole hash (KVT_MAX_VALUE) */
#define HASHENC_SMALL 8                        /* up to this many named fields: compared in turn */

/* One field of a hash, pointing into the encoded value. raw/rawlen span the
 * whole entry (lengths included), for copying it unchanged. */
struct hashenc_entry {
    const char *f, *v;
    size_t flen, vlen;
    const char *raw;
    size_t rawlen;
};

struct hashenc_iter {
    const unsigned char *p, *end;
    uint32_t left; /* entries not read yet */
};

/* The count of an encoded hash. Returns it (>= 0), or -EBADMSG when val is too
 * short for the header or its count cannot fit in vlen bytes. NULL/0 is the
 * empty hash (0). */
int64_t hashenc_len(const void *val, size_t vlen);

/* Start reading val (NULL/0: the empty hash). Returns 0 or -EBADMSG (header). */
int hashenc_iter_init(struct hashenc_iter *it, const void *val, size_t vlen);
/* Next entry. Returns 1 (*e set), 0 at the end (every entry read and the value
 * ends exactly there), or -EBADMSG. */
int hashenc_next(struct hashenc_iter *it, struct hashenc_entry *e);

/* The entry that starts off bytes into val (an offset a walk gave: e->raw - val),
 * for random access after one walk (HRANDFIELD). Returns 1 (*e set) or -EBADMSG. */
int hashenc_entry_at(const void *val, size_t vlen, size_t off, struct hashenc_entry *e);

/* Check the whole value. Returns 0 or -EBADMSG. */
int hashenc_validate(const void *val, size_t vlen);

/* Find one field. Returns 1 (*e set), 0 absent, -EBADMSG (the walk met damage
 * before finding it). */
int hashenc_find(const void *val, size_t vlen, const void *f, size_t flen, struct hashenc_entry *e);

/* Fields named by a command: n of them at f[i * stride], lengths l[i * stride]
 * (stride 2 walks the fields of field/value pairs). */
struct hashenc_fields {
    const char *const *f;
    const size_t *l;
    size_t n, stride;
};

/* For each named field i, its entry: found[i].f is NULL when the hash lacks it
 * (a field named twice gets the same entry twice). Returns 0, -EBADMSG (whole
 * value checked), -ENOMEM, -E2BIG (over 2^30 names). */
int hashenc_lookup(const void *val, size_t vlen, const struct hashenc_fields *fs, struct hashenc_entry *found);

/* Writers. The new encoding is appended to out from out->len (the caller
 * empties it first); cur/curlen is the current encoding (NULL/0: a new hash),
 * which must not lie inside out. */

/* Set npairs fields: field fv[2i] to value fv[2i + 1] (lengths fvl[]); a field
 * named twice gets its last value, at the place of its first naming. Returns
 * the number of fields added (>= 0), -EBADMSG, -ENOMEM, or -E2BIG (a field,
 * value or the result longer than HASHENC_MAX_LEN, or 2^32 fields). */
int64_t hashenc_set(struct kvbuf *out, const void *cur, size_t curlen, const char *const *fv,
                    const size_t *fvl, size_t npairs);

/* Remove the named fields. Returns the number removed (>= 0; out's count is
 * then hashenc_len(cur) minus it, 0 meaning the key should go), -EBADMSG, -ENOMEM. */
int64_t hashenc_del(struct kvbuf *out, const void *cur, size_t curlen, const struct hashenc_fields *fs);

#endif
