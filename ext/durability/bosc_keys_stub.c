/* bosc_keys_stub.c - placeholder until the data file's key listing lands (branch bosc-keys):
 * SCAN and KEYS over keys that left memory answer an error meanwhile. Removed by that merge. */
#include <errno.h>
#include "durability/bosc.h"
int64_t bosc_keys_request(struct bosc *b, uint32_t first, uint32_t n, int evfd)
{
    (void)b, (void)first, (void)n, (void)evfd;
    return -ENOSYS;
}
int bosc_keys_take(struct bosc *b, int64_t ticket, struct kvbuf *out)
{
    (void)b, (void)ticket, (void)out;
    return -ENOSYS;
}
void bosc_keys_wait(struct bosc *b, int64_t ticket) { (void)b, (void)ticket; }
uint32_t bosc_buckets(struct bosc *b) { (void)b; return 0; }
