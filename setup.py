# The cffi extension is declared here because cffi_modules has no pyproject.toml form;
# everything else lives in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["kvstore/_build.py:ffibuilder", "kvstore/_build_bench.py:ffibuilder"])
