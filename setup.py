# The compiled modules are declared here because cffi_modules has no pyproject.toml form;
# everything else lives in pyproject.toml. kvstore._ext (cffi) holds the server's C code
# (ext/ but bench/); kvstore._bench (cffi) the load generators and micro-benchmarks;
# kvstore._ext_store (Cython) is Store's fast path and calls the table through kvstore._ext
# (see kvstore/_table.pxd), so it compiles against the headers only. Both are named
# _ext* so that one ignore pattern and `make clean` cover them.
import glob

from Cython.Build import cythonize
from setuptools import Extension, setup

# depends: a change to a header it includes rebuilds it (setuptools looks at sources and depends only)
STORE = Extension("kvstore._ext_store", ["kvstore/_ext_store.pyx"], include_dirs=["ext"],
                  depends=sorted(glob.glob("ext/core/*.h")),
                  extra_compile_args=["-O2", "-Wall", "-Wno-unused-function"])

setup(
    cffi_modules=["kvstore/_build.py:ffibuilder", "kvstore/_build_bench.py:ffibuilder"],
    # the generated C goes under build/ (make clean removes it), not next to the .pyx
    ext_modules=cythonize([STORE], build_dir="build/cython", compiler_directives={"language_level": 3}),
)
