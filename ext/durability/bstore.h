/* bstore.h - the data file's batch store: sealed stream batches written once,
 * appended to segment files, while a stream's record in the data file holds
 * only references to them (paper 004: a stream is a log already, so its
 * batches are written sequentially, not rewritten with the stream).
 *
 * Files: <dir>/<n>.seg, n = 1, 2, ... in hex; a segment is raw batch bytes one
 * after another, each found by a reference (segment, offset, length, CRC-32C)
 * that the stream's record carries. The flusher stages a batch (bstore_stage:
 * copied, placed at the current segment's end) while it takes a stream's
 * snapshot, and commits the staged bytes (bstore_commit: written and synced)
 * before it writes any record that refers to them. A segment grows to
 * BSTORE_SEG_BYTES (plus one batch) and the next one starts; a store
 * opened again starts a new segment (a torn tail is never appended to).
 *
 * Space: live bytes per segment count the references held by the records the
 * data file holds (bosc's open scan counts them; a sweep adds a record's when
 * it writes it and takes an old record's off once the chains that replaced it
 * are synced). A segment other than the current one with no live bytes is
 * deleted by bstore_collect; a FLUSHALL retires every segment before it
 * (bstore_retire, then bstore_drop_retired once the superblock records the new
 * generation). A failed commit leaves the segment's synced length where it
 * was and moves on to a new segment: a reference into the unsynced part is not
 * durable (bstore_durable), so its batch is staged again.
 *
 * Threads: the flusher stages, commits, counts and collects; bstore_read may be
 * called from any thread (the loader's). */
#ifndef KV_BSTORE_H
#define KV_BSTORE_H

#include <stddef.h>
#include <stdint.h>

#include "core/stream.h" /* struct xs_ref: where a batch's bytes are (segment 0: nowhere) */

#define BSTORE_SEG_BYTES (64u << 20)
#define BSTORE_MAX_BATCH (512u << 20) /* as a data-file record's bound */

struct bstore;
struct bstore_stats {
    uint64_t segments, live_bytes, file_bytes;  /* now: segment files, the bytes records refer to, synced bytes */
    uint64_t batches, reads;                    /* written and synced; read back */
};

/* Open (create) the store in dir. 0, or -errno with err set. */
int bstore_open(struct bstore **out, const char *dir, char *err, size_t errlen);
void bstore_close(struct bstore *s);

/* Stage len bytes at the current segment's end (copied): *ref says where they
 * will be. 0 or -ENOMEM. */
int bstore_stage(struct bstore *s, const void *p, uint32_t len, struct xs_ref *ref);
/* Write the staged bytes and sync them (0), or -errno (they are dropped, the
 * store moves on to a new segment). Nothing staged: 0 at once. */
int bstore_commit(struct bstore *s);
int bstore_pending(const struct bstore *s);
/* 1 if ref's bytes are synced and its segment kept: a record may refer to it,
 * its batch may leave memory. Any thread. */
int bstore_durable(struct bstore *s, const struct xs_ref *ref);
/* Live bytes of ref's segment += bytes (negative: -=). Segments not known are
 * noted (an open scan counts references before it knows a segment is missing:
 * bstore_read reports it then). */
void bstore_count(struct bstore *s, const struct xs_ref *ref, int add);
/* Delete the segments with no live bytes (not the current one, nor one with
 * staged bytes). Returns how many were deleted. */
int bstore_collect(struct bstore *s);
/* FLUSHALL: every segment so far is retired (its references read as not
 * durable: batches are staged again, into a new segment) ... */
void bstore_retire(struct bstore *s);
/* ... and deleted once nothing can refer to them (the file's new generation is recorded). */
void bstore_drop_retired(struct bstore *s);

/* Read ref's bytes into buf (ref->len bytes). 0, -ENOENT (no such segment),
 * -EILSEQ (short or checksum mismatch: damaged), -errno. Any thread. */
int bstore_read(struct bstore *s, const struct xs_ref *ref, void *buf);

void bstore_stats(struct bstore *s, struct bstore_stats *out);

#endif
