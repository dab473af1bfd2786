/* glob.c - glob-style matching with Redis's stringmatchlen semantics (see glob.h).
 * Pure function of its arguments; patterns come from clients (untrusted): every
 * step is bounded by the pattern's and the string's lengths. */
#include "core/glob.h"

static inline int tolower_ascii(int ch) { return ch >= 'A' && ch <= 'Z' ? ch + 32 : ch; }

int glob_match(const char *p, size_t plen, const char *s, size_t slen, int nocase)
{
    while (plen && slen) {
        switch (*p) {
        case '*':
            while (plen > 1 && p[1] == '*') {
                p++;
                plen--;
            }
            if (plen == 1)
                return 1;
            for (size_t i = 0; i <= slen; i++)
                if (glob_match(p + 1, plen - 1, s + i, slen - i, nocase))
                    return 1;
            return 0;
        case '?':
            s++;
            slen--;
            break;
        case '[': {
            p++;
            plen--;
            int neg = plen && *p == '^';
            if (neg) {
                p++;
                plen--;
            }
            int match = 0;
            while (plen && *p != ']') {
                if (*p == '\\' && plen >= 2) {
                    p++;
                    plen--;
                    if (*p == *s)
                        match = 1;
                } else if (plen >= 3 && p[1] == '-') {
                    char lo = p[0], hi = p[2], ch = *s;
                    if (lo > hi) {
                        char t = lo;
                        lo = hi;
                        hi = t;
                    }
                    if (nocase) {
                        lo = (char)tolower_ascii(lo);
                        hi = (char)tolower_ascii(hi);
                        ch = (char)tolower_ascii(ch);
                    }
                    if (ch >= lo && ch <= hi)
                        match = 1;
                    p += 2;
                    plen -= 2;
                } else if (nocase ? tolower_ascii(*p) == tolower_ascii(*s) : *p == *s) {
                    match = 1;
                }
                p++;
                plen--;
            }
            if (!plen) /* unterminated class: treat like Redis, as the end */
                return 0;
            if (neg)
                match = !match;
            if (!match)
                return 0;
            s++;
            slen--;
            break;
        }
        case '\\':
            if (plen >= 2) {
                p++;
                plen--;
            }
            /* fall through */
        default:
            if (nocase ? tolower_ascii(*p) != tolower_ascii(*s) : *p != *s)
                return 0;
            s++;
            slen--;
            break;
        }
        p++;
        plen--;
    }
    while (plen && *p == '*') {
        p++;
        plen--;
    }
    return plen == 0 && slen == 0;
}
