/* bosc_table.c - the data file's bucket table (format 2, see bosc.h): per bucket,
 * the sweep whose write of its chain the file last synced. A block that reads
 * as empty, or as a valid but older copy, is then told from a bucket that was
 * never written or not written since: bosc_chain_read checks every chain
 * against it. Pages are kept as two copies, written alternately like the
 * superblock, so a torn page write leaves the previous page whole. The flusher
 * writes the pages (after the sweep's data sync, before its superblock);
 * bosc_open reads them. Parses untrusted bytes: every page is checked. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
#include "durability/bosc_int.h"

/* Where everything lies once nbuckets is known, and the per-bucket arrays.
 * Returns 0, -EINVAL (too many buckets for 32-bit block numbers) or -ENOMEM. */
int bosc_layout(struct bosc *b, char *err, size_t errlen)
{
    b->tab_pages = (uint32_t)(((uint64_t)b->nbuckets + TAB_PER_PAGE - 1) / TAB_PER_PAGE);
    b->first_home = FIRST_TABLE + 2 * (uint64_t)b->tab_pages;
    b->first_over = b->first_home + 2 * (uint64_t)b->nbuckets;
    if (b->first_over >= MAX_BLOCKS) {
        snprintf(err, errlen, "data file buckets %" PRIu32 " out of range (1..%u)", b->nbuckets, MAX_BLOCKS / 4);
        return -EINVAL;
    }
    free(b->tab);
    free(b->slot);
    free(b->tslot);
    b->tab = calloc(b->nbuckets, sizeof *b->tab);
    b->slot = calloc(b->nbuckets, 1);
    b->tslot = calloc(b->tab_pages, 1);
    if (!b->tab || !b->slot || !b->tslot) {
        snprintf(err, errlen, "out of memory for %" PRIu32 " buckets", b->nbuckets);
        return -ENOMEM;
    }
    return 0;
}

/* Read every table page (the valid copy with the higher sequence). A page of
 * which neither copy was ever written records nothing (a new file). Returns 0
 * or -errno (-EILSEQ: both copies damaged, or a page that does not fit). */
int bosc_tab_read(struct bosc *b, char *err, size_t errlen)
{
    unsigned char two[2 * BLK];
    for (uint32_t pg = 0; pg < b->tab_pages; pg++) {
        uint64_t no = FIRST_TABLE + 2 * (uint64_t)pg;
        int rc = pread_all(b->fd, two, sizeof two, (off_t)(no * BLK));
        if (rc) {
            snprintf(err, errlen, "cannot read %s block %" PRIu64 ": %s", b->path, no, strerror(-rc));
            return rc;
        }
        uint32_t first = pg * TAB_PER_PAGE;
        uint32_t n = b->nbuckets - first < TAB_PER_PAGE ? b->nbuckets - first : TAB_PER_PAGE;
        int best = -1, bad = 0;
        for (int c = 0; c < 2; c++) {
            unsigned char *p = two + c * BLK;
            int v = bosc_block_check(b, p, no + (uint64_t)c, TAB_MAGIC, err, errlen);
            if (v == 1 && (get32(p + 28) != pg || get32(p + 24) != n * 8)) {
                snprintf(err, errlen, "data file %s damaged: block %" PRIu64 ": not bucket table page %" PRIu32,
                         b->path, no + (uint64_t)c, pg);
                v = -EILSEQ;
            }
            bad |= v < 0;
            if (v == 1 && (best < 0 || get64(p + 32) > get64(two + best * BLK + 32)))
                best = c;
        }
        if (best < 0 && bad)
            return -EILSEQ; /* err names the last damaged copy */
        b->tslot[pg] = (uint8_t)(best < 0 ? 0 : best);
        if (best < 0)
            continue;
        const unsigned char *e = two + best * BLK + BHDR;
        for (uint32_t i = 0; i < n; i++)
            atomic_store_explicit(&b->tab[first + i], get64(e + 8 * (size_t)i), memory_order_relaxed);
    }
    return 0;
}

/* After the sweep's data sync: record sweep b->wseq for every bucket it wrote
 * and write the pages holding them, each to the copy that does not hold the
 * synced page (a torn write leaves that one whole). The superblock write that
 * follows syncs them. Flusher only. Returns 0 or -errno. */
int bosc_tab_write(struct bosc *b)
{
    unsigned char p[BLK];
    for (size_t i = 0; i < b->ntouched; i++)
        atomic_store_explicit(&b->tab[b->touched[i]], b->wseq, memory_order_relaxed);
    for (size_t i = 0; i < b->ntouched;) {
        uint32_t pg = b->touched[i] / TAB_PER_PAGE, first = pg * TAB_PER_PAGE;
        uint32_t n = b->nbuckets - first < TAB_PER_PAGE ? b->nbuckets - first : TAB_PER_PAGE;
        for (uint32_t k = 0; k < n; k++)
            put64(p + BHDR + 8 * (size_t)k, atomic_load_explicit(&b->tab[first + k], memory_order_relaxed));
        uint32_t no = (uint32_t)(FIRST_TABLE + 2 * (uint64_t)pg + (b->tslot[pg] ^ 1u));
        bosc_block_seal(p, TAB_MAGIC, no, 0, 0, n * 8, pg, b->wseq);
        int rc = pwrite_all(b->fd, p, BLK, (off_t)no * BLK);
        if (rc)
            return rc;
        add(&b->st.blocks_written, 1);
        add(&b->st.bytes_written, BLK);
        add(&b->st.write_calls, 1);
        while (i < b->ntouched && b->touched[i] / TAB_PER_PAGE == pg) /* touched is ascending */
            i++;
    }
    b->done_seq = b->wseq;
    return 0;
}

/* The superblock that recorded the sweep is synced: its table pages are the
 * synced copies now, and the next sweep gets the next sequence. */
void bosc_tab_done(struct bosc *b)
{
    uint32_t last = UINT32_MAX;
    for (size_t i = 0; i < b->ntouched; i++) {
        uint32_t pg = b->touched[i] / TAB_PER_PAGE;
        if (pg != last)
            b->tslot[pg] ^= 1;
        last = pg;
    }
    b->ntouched = 0;
    b->wseq++;
}
