/* info.c - the INFO command: renders the sections the engine's owners registered
 * (engine/engine.h), in Redis's order, as one verbatim string. Runs on a front-end
 * thread; providers read other threads' counters with relaxed atomics or their
 * components' locks (statistics may be a moment stale). */
#include <string.h>
#include <strings.h>

#include "cmd/cmd_int.h"
#include "core/table.h"
#include "engine/engine.h"

/* As Redis: no argument or "default" is every section but commandstats and
 * latencystats (long, and costly to make); "all" and "everything" are all. */
static int want_section(int argc, const char **argv, const size_t *argl, const char *name)
{
    int in_default = strcmp(name, "commandstats") && strcmp(name, "latencystats");
    if (argc == 0)
        return in_default;
    for (int i = 0; i < argc; i++) {
        if (argl[i] == strlen(name) && strncasecmp(argv[i], name, argl[i]) == 0)
            return 1;
        if ((argl[i] == 3 && strncasecmp(argv[i], "all", 3) == 0) ||
            (argl[i] == 7 && strncasecmp(argv[i], "default", 7) == 0 && in_default) ||
            (argl[i] == 10 && strncasecmp(argv[i], "everything", 10) == 0))
            return 1;
    }
    return 0;
}

int cmd_info(struct cmd_client *c, int argc, const char **argv, const size_t *argl)
{
    struct kv_engine *e = c->eng;
    struct kvbuf b = {0};
    int first = 1;
    const char *sec;
    for (int si = 0; (sec = eng_info_section(si)); si++) {
        if (!want_section(argc, argv, argl, sec))
            continue;
        kvbuf_printf(&b, "%s# %c%s\r\n", first ? "" : "\r\n", sec[0] - 32, sec + 1);
        first = 0;
        for (int i = 0; i < e->ninfo; i++)
            if (e->info[i].section == si)
                e->info[i].fn(e->info[i].arg, &b);
        cmd_stats_info(c, sec, &b); /* the command layer's own lines (cmd/stats.c) */
    }
    int rc = resp_add_verbatim(c->out, c->resp, b.p ? b.p : "", b.len);
    kvbuf_free(&b);
    return rc;
}
