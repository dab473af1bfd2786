"""kvstore/_cdef.py: the cffi declarations copied out of ext/'s headers at build time.
A header construct it misreads fails the build, or worse drops a declaration: each
construct the headers use is checked here on a small header, and the real SPECs of
both modules must resolve."""
import os
import runpy

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
cdef = runpy.run_path(os.path.join(ROOT, "kvstore", "_cdef.py"))["cdef"]

HEADER = r'''/* a header in the style of ext/ */
#ifndef X_H
#define X_H
#include <stdint.h>
#define X_LIMIT (1 << 4)   /* a macro */
#ifdef __cplusplus
extern "C" {
#endif
struct x_opaque;
typedef void (*x_fn)(void *arg, const char *v, size_t n);
struct x_stats {
    uint64_t a, b;           /* several declarators */
    char name[16];
    _Atomic uint32_t flag;   /* an atomic scalar: kept, without _Atomic */
    _Atomic(struct x_stats *) next; /* an atomic pointer: left to the compiler */
    struct inner { int y; } in;     /* a nested definition: left to the compiler */
    int (*cb)(int);
} __attribute__((aligned(64)));
extern __thread uint64_t x_tls __attribute__((tls_model("initial-exec")));
static inline int x_inline(int v) { int w = v; return w + 1; }
static inline void x_inline2(void) { x_tls = 0; }
int x_open(struct x_opaque **out, const char *path,
           char *err, size_t errlen) __attribute__((warn_unused_result));
int x_close(struct x_opaque *o);
#ifdef __cplusplus
}
#endif
#endif
'''


@pytest.fixture
def ext(tmp_path):
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "x.h").write_text(HEADER)
    return str(tmp_path)


def test_each_construct(ext):
    out = cdef(ext, [("core/x.h", ["struct x_opaque;", "typedef x_fn", "struct x_stats", "#define X_LIMIT",
                                    "x_open", "x_close"])])
    assert "struct x_opaque;" in out
    assert "typedef void (*x_fn)(void *arg, const char *v, size_t n);" in out
    assert "uint64_t a, b;" in out and "char name[16];" in out and "uint32_t flag;" in out
    assert "int (*cb)(int);" in out
    assert "_Atomic" not in out and "next;" not in out and "inner" not in out and "__attribute__" not in out
    assert "...;\n};" in out  # the layout is the compiler's
    assert "#define X_LIMIT ..." in out
    # a prototype after inline functions and spanning lines, its attribute dropped
    assert "int x_open(struct x_opaque **out, const char *path, char *err, size_t errlen);" in out
    assert "int x_close(struct x_opaque *o);" in out


def test_a_missing_name_names_its_header(ext):
    with pytest.raises(LookupError, match=r"ext/core/x.h: no declaration of function x_inline"):
        cdef(ext, [("core/x.h", ["x_inline"])])  # inline functions are not declarations cffi can bind
    with pytest.raises(LookupError, match="struct x_missing"):
        cdef(ext, [("core/x.h", ["struct x_missing"])])


@pytest.mark.parametrize("build", ["_build.py", "_build_bench.py"])
def test_the_modules_specs_resolve(build):
    """Both build scripts' SPECs against the real headers (what `make ext` runs)."""
    mod = runpy.run_path(os.path.join(ROOT, "kvstore", build), run_name="not_main")
    names = sum(len(items) for _, items in mod["SPEC"])
    assert mod["CDEF"].count(";") >= names
