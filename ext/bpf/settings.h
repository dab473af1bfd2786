/* settings.h - how the host side loads settings into kvstore's XDP objects (libbpf):
 * each object's read-only globals (.rodata) start with its programs' settings struct,
 * written before the object is loaded (the verifier then sees constants). Host only. */
#ifndef KV_BPF_SETTINGS_H
#define KV_BPF_SETTINGS_H

#include <bpf/libbpf.h>
#include <errno.h>
#include <string.h>

/* Put len bytes of settings at the start of obj's .rodata (opened, not loaded yet).
 * 0, or -EINVAL when the object has no such section or it is not 8..256 bytes and at
 * least len. */
static inline int kv_bpf_set_settings(struct bpf_object *obj, const void *settings, size_t len)
{
    struct bpf_map *m, *rodata = NULL;
    bpf_object__for_each_map(m, obj) {
        const char *name = bpf_map__name(m);
        size_t n = strlen(name);
        if (bpf_map__is_internal(m) && n >= 7 && !strcmp(name + n - 7, ".rodata"))
            rodata = m;
    }
    size_t sz = 0;
    const void *init = rodata ? bpf_map__initial_value(rodata, &sz) : NULL;
    unsigned char data[256];
    if (!init || sz < len || sz > sizeof data)
        return -EINVAL;
    memcpy(data, init, sz);
    memcpy(data, settings, len);
    return bpf_map__set_initial_value(rodata, data, sz) ? -EINVAL : 0;
}

#endif
