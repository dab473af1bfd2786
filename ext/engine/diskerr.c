/* diskerr.c - a full or failing disk as commands and INFO see it (see
 * diskerr.h). The state lives in the log and the data file, which retry by
 * themselves; this only reads it. Any thread. */
#include "engine/diskerr.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/kvbuf.h"
#include "durability/bosc.h"
#include "durability/wal.h"
#include "engine/engine.h"

int eng_disk_refusal(struct kv_engine *e, char *msg, size_t n)
{
    const char *what = "durability log";
    int err = e->wal ? wal_write_error(e->wal, NULL, 0) : 0;
    if (!err && e->bosc) {
        err = bosc_write_error(e->bosc, NULL, 0, NULL);
        what = "data file";
    }
    if (!err)
        return 0;
    /* Redis's text with the file it could not write; then what happens next,
     * since unlike Redis's "see the logs" the node recovers by itself. */
    snprintf(msg, n,
             "MISCONF Errors writing to the %s: %s. Writes are refused until it can be written again "
             "(retried automatically; see INFO persistence)", what, strerror(err));
    return 1;
}

void eng_disk_info(void *arg, struct kvbuf *out)
{
    struct kv_engine *e = arg;
    char msg[256] = "";
    if (e->wal) {
        struct wal_stats ws;
        wal_get_stats(e->wal, &ws);
        int err = wal_write_error(e->wal, msg, sizeof msg);
        kvbuf_printf(out, "aof_last_write_status:%s\r\nlog_write_status:%s\r\nlog_write_error:%s\r\n"
                          "log_write_errors:%llu\r\n", err ? "err" : "ok", err ? "err" : "ok", msg,
                     (unsigned long long)ws.write_errors);
    } else {
        kvbuf_printf(out, "aof_last_write_status:ok\r\n");
    }
    if (e->bosc) {
        uint64_t n = 0;
        int err = bosc_write_error(e->bosc, msg, sizeof msg, &n);
        kvbuf_printf(out, "datafile_write_status:%s\r\ndatafile_write_error:%s\r\ndatafile_write_errors:%llu\r\n",
                     err ? "err" : "ok", err ? msg : "", (unsigned long long)n);
    }
}
