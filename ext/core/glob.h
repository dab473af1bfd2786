/* glob.h - glob-style matching as Redis's stringmatchlen: *, ?, [a-z], [^x], \\x.
 * Used by CONFIG GET today, KEYS and SCAN MATCH next. */
#ifndef KV_GLOB_H
#define KV_GLOB_H

#include <stddef.h>

/* 1 if s[0..slen) matches pat[0..plen), else 0; case-insensitive when nocase. */
int glob_match(const char *pat, size_t plen, const char *s, size_t slen, int nocase);

#endif
