# kvstore: `make run` builds what changed and serves on 127.0.0.1:6380, its data in ./data
# (durability disk, the default: the keys are there after a restart);
# `make test` installs everything the suite drives and runs the whole suite (what CI runs).
#   make run PORT=7000 DATA_DIR=/srv/kv      make run ARGS="--durability none --threads 2"
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 6380
DATA_DIR ?= data
ARGS ?=

# Serving needs only a C compiler, libffi (cffi) and Python's headers and venv (checked below).
RUN_APT := gcc libffi-dev libssl-dev
# The suite and the benchmarks drive these besides: redis-server, redis-cli and redis-benchmark
# as the reference, memcached, ip (network namespaces), promtool (the metrics tests), fio (the
# disk bar p000_nhd holds the data file's sweep to).
TEST_APT := $(RUN_APT) redis-server redis-tools memcached iproute2 prometheus openssl fio
# The block device (issue 15, `kvstore blockdev serve`): its tests and benchmarks drive real NBD
# clients -- libnbd-bin (nbdinfo, nbdcopy, nbdfuse), python3-libnbd (nbdsh), qemu-utils (qemu-img),
# fio's nbd engine -- put file systems on it through nbdfuse (fuse3) and a loop device (mount:
# losetup), made by e2fsprogs and xfsprogs, and compare it with nbdkit's memory plugin.
TEST_APT += nbdkit libnbd-bin python3-libnbd qemu-utils fuse3 mount e2fsprogs xfsprogs
# liburing for --datafile-io uring/uring-direct (built in when pkg-config finds it; without
# it those modes say so at start), so CI runs the data file's suites under io_uring too.
TEST_APT += liburing-dev pkg-config
# The pull cache's XDP program (issue 16, --pull-cache-slots): clang compiles it for the BPF
# target (llvm: llvm-strip), libbpf-dev loads it, linux-libc-dev has the kernel's headers; ethtool
# turns GRO on for the tests' veth (XDP_TX to a veth peer needs its NAPI). Without them the
# build leaves the cache out and --pull-cache-slots says so.
TEST_APT += clang llvm libbpf-dev linux-libc-dev ethtool
# Mosquitto, the MQTT broker the message queue is measured against (p004_write), and its clients.
TEST_APT += mosquitto mosquitto-clients
# etcd, the cluster's source of truth (kvstore/etcd.py, kvstore/cluster.py), and etcdctl.
TEST_APT += etcd-server etcd-client
# DPDK 22.11 for --arch dpdk (built in only when pkg-config finds libdpdk) and ethtool (its
# test turns veth checksum offload off), so CI runs that test; `make test DPDK=0` leaves
# them out: everything else builds and runs, and --arch dpdk then says it is missing.
DPDK ?= 1
ifeq ($(DPDK),1)
TEST_APT += libdpdk-dev pkg-config ethtool
endif

# How kvstore is installed into the venv: `pip install -e` without build isolation (the
# build requirements live in the venv, so nothing is downloaded again), which builds the
# compiled modules in place in kvstore/ and maps kvstore.cli -> cli/ and
# kvstore.experiments -> experiments/ through setuptools' editable finder, so an edited .py
# counts at once and `make ext` rebuilds the C. That finder sits at the end of
# sys.meta_path, after the path finder; seen from the clone's parent directory the clone
# itself (a folder named kvstore, no __init__.py) is a namespace package the path finder
# returns first, and `import kvstore` got that empty folder. $(FIRST_PTH) puts the
# finder first, so every directory -- the parent, the repo root, anywhere -- imports this
# build (tests/integration/test_install.py checks it). setuptools' strict editable mode
# (a link tree on sys.path) was not chosen: from the repo root the source folder kvstore/
# comes first on sys.path and, lacking cli/, `python -m kvstore.cli` (kvstore.Node's
# command) failed there; a non-editable install fails there the same way.
FIRST_PTH := kvstore-editable-first.pth
# Stamps: the install is redone when pyproject.toml or setup.py change; the compiled modules
# are rebuilt (as `make ext`) when the C, the cffi/Cython sources or the build configuration
# change. Python modules are used in place and need neither; nothing changed, nothing runs.
INSTALLED := $(VENV)/.kvstore-installed
BUILT := build/.kvstore-built
BUILD_CONFIG := build/config.txt
EXT_SOURCES := $(shell find ext -name '*.[ch]') $(wildcard kvstore/*.pyx kvstore/*.pxd) \
	kvstore/_build.py kvstore/_build_bench.py kvstore/_cdef.py
EXTRAS := $(VENV)/.kvstore-extras
# A list from pyproject.toml: $(1) is a Python expression over d, the parsed file.
toml_list = $$($(PY) -c 'import tomllib; d = tomllib.load(open("pyproject.toml", "rb")); print(" ".join($(1)))')

.PHONY: run test deps deps-test apt-install venv dev ext clean FORCE

run: deps
	@$(MAKE) --no-print-directory $(BUILT)
	$(VENV)/bin/kvstore serve --port $(PORT) --data-dir $(DATA_DIR) $(ARGS)

test: deps-test
	@$(MAKE) --no-print-directory $(BUILT) $(EXTRAS)
	$(PY) -m pytest tests

# What helpers and developers use: everything `make test` needs, built and installed.
dev: deps-test
	@$(MAKE) --no-print-directory $(BUILT) $(EXTRAS)

# System packages, only those missing (apt-get update first, as apt needs fresh lists).
deps:
	@$(MAKE) --no-print-directory apt-install PACKAGES="$(RUN_APT)"

deps-test:
	@$(MAKE) --no-print-directory apt-install PACKAGES="$(TEST_APT)"

apt-install:
	@missing=""; for p in $(PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if ! $(PYTHON) -c 'import sysconfig, os, ensurepip; assert os.path.exists(sysconfig.get_paths()["include"] + "/Python.h")' 2>/dev/null; then \
		missing="$$missing python3-dev python3-venv"; fi; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip

venv: $(VENV)/bin/python

$(INSTALLED): pyproject.toml setup.py | $(VENV)/bin/python
	$(PY) -m pip install -q $(call toml_list,d["build-system"]["requires"])
	@# setuptools' notice about folders named like the package is what FIRST_PTH settles
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -q --no-build-isolation -e .
	@echo '# kvstore (its Makefile): setuptools'"'"' editable finder first, see FIRST_PTH there' \
		> $$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/$(FIRST_PTH)
	@echo 'import sys; sys.meta_path.sort(key=lambda f: not getattr(f, "__module__", "").startswith("__editable___kvstore_"))' \
		>> $$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/$(FIRST_PTH)
	@touch $@

# The install builds the compiled modules; a source changed since rebuilds them as `make ext` does.
$(BUILT): $(EXT_SOURCES) $(BUILD_CONFIG) $(INSTALLED)
	@if [ -n "$$(find $(EXT_SOURCES) $(BUILD_CONFIG) -newer $(INSTALLED) | head -1)" ]; then \
		$(MAKE) --no-print-directory ext; fi
	@touch $@

# What the build found (libdpdk, libbpf and clang), rewritten only when it differs: installing
# DPDK or clang (make test) rebuilds with --arch dpdk or the pull cache.
$(BUILD_CONFIG): FORCE
	@mkdir -p build
	@c="libdpdk $$(pkg-config --modversion libdpdk 2>/dev/null || echo none) KVSTORE_NO_DPDK=$(KVSTORE_NO_DPDK)"; \
	c="$$c libbpf $$(pkg-config --modversion libbpf 2>/dev/null || echo none) clang $$(command -v clang || echo none)"; \
	[ "$$(cat $@ 2>/dev/null)" = "$$c" ] || echo "$$c" > $@

# The test and benchmark extras' packages (the package itself is installed above).
$(EXTRAS): pyproject.toml $(INSTALLED)
	$(PY) -m pip install -q $(call toml_list,d["project"]["optional-dependencies"]["test"] + d["project"]["optional-dependencies"]["bench"])
	@touch $@

# Rebuild only the compiled modules (kvstore._ext and kvstore._bench from ext/*.c,
# kvstore._ext_store from kvstore/_ext_store.pyx) after editing them. setup.py runs in the
# venv here, not in pip's isolated build environment: install the build requirements
# (pyproject.toml's list, Cython among them) into the venv first.
ext:
	$(PY) -m pip install -q $(call toml_list,d["build-system"]["requires"])
	$(PY) setup.py -q build_ext -b build/ext
	@# replace by rename: running processes keep the old mapping instead of crashing
	for f in build/ext/kvstore/_ext*.so build/ext/kvstore/_bench*.so; do cp $$f kvstore/.ext.tmp && mv kvstore/.ext.tmp kvstore/$$(basename $$f); done

clean:
	rm -rf build *.egg-info kvstore/_ext*.so kvstore/_ext.c kvstore/_bench*.so kvstore/_bench.c tests/c/bin \
		$(INSTALLED) $(EXTRAS)

.PHONY: notebooks notebooks-run example-config
NOTEBOOK_PORT ?= 8888

# JupyterLab on 127.0.0.1 over notebooks/ (the `notebook` extra: JupyterLab, ipywidgets for the
# progress bars). The notebooks run the experiments at their small scale; see notebooks/README.md.
notebooks: dev
	$(PY) -m pip install -q $(call toml_list,d["project"]["optional-dependencies"]["notebook"])
	@# --allow-root: JupyterLab refuses to run as root otherwise (containers, CI machines)
	$(VENV)/bin/jupyter lab --ip 127.0.0.1 --port $(NOTEBOOK_PORT) --no-browser --notebook-dir notebooks \
		$$([ "$$(id -u)" = 0 ] && echo --allow-root)

# Execute every notebook in place and save its outputs (plots, tables, reports), as committed:
# at the small scale, or `make notebooks-run KVSTORE_NOTEBOOK_SCALE=full` (the README's scale, hours,
# root for Table 1's namespaces and dpdk). NOTEBOOKS= picks some; a notebook whose cell fails is
# left unchanged and the target fails. Needs only the test extra (nbclient, ipykernel).
NOTEBOOKS ?=
notebooks-run: dev
	$(PY) notebooks/execute.py $(NOTEBOOKS)

# kvstore.example.toml from the settings' declarations (kvstore/config.py); run after adding or
# changing a setting (tests/integration/test_deploy.py fails until the committed file matches).
example-config: deps
	@$(MAKE) --no-print-directory $(BUILT)
	$(VENV)/bin/kvstore config example -o kvstore.example.toml
