# kvstore: `make run` sets everything up and serves on 127.0.0.1:6380;
# `make test` sets everything up and runs the whole test suite (what CI runs).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 6380
DATA_DIR ?= data
APT_PACKAGES := gcc make libffi-dev redis-server redis-tools memcached iproute2
# DPDK 22.11 for --arch dpdk (built only when pkg-config finds libdpdk) and ethtool (its
# test turns veth checksum offload off) are installed too, so CI runs that test;
# `make dev DPDK=0` leaves them out: everything else builds and runs, and --arch dpdk
# then says it is missing.
DPDK ?= 1
ifeq ($(DPDK),1)
APT_PACKAGES += libdpdk-dev pkg-config ethtool
endif

.PHONY: run test deps venv dev ext clean

run: dev
	$(VENV)/bin/kvstore serve --port $(PORT) --data-dir $(DATA_DIR)

test: dev
	$(PY) -m pytest tests

# System packages, only those missing (apt-get update first, as apt needs fresh lists).
deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
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

# The package in editable mode (builds the C extension in place) with test and plot extras.
dev: deps venv
	$(PY) -m pip install -q -e '.[test,bench]'

# Rebuild only the compiled modules (kvstore._ext and kvstore._bench from ext/*.c,
# kvstore._ext_store from kvstore/_ext_store.pyx) after editing them. setup.py runs in the
# venv here, not in pip's isolated build environment: install the build requirements
# (pyproject.toml's list, Cython among them) into the venv first.
ext:
	$(PY) -m pip install -q $$($(PY) -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
	$(PY) setup.py -q build_ext -b build/ext
	@# replace by rename: running processes keep the old mapping instead of crashing
	for f in build/ext/kvstore/_ext*.so build/ext/kvstore/_bench*.so; do cp $$f kvstore/.ext.tmp && mv kvstore/.ext.tmp kvstore/$$(basename $$f); done

clean:
	rm -rf build *.egg-info kvstore/_ext*.so kvstore/_ext.c kvstore/_bench*.so kvstore/_bench.c tests/c/bin

# notebooks (deploy helper)
.PHONY: notebooks example-config
NOTEBOOK_PORT ?= 8888

# JupyterLab on 127.0.0.1 over notebooks/ (the `notebook` extra: JupyterLab, ipywidgets for the
# progress bars). The notebooks run the experiments at their small scale; see notebooks/README.md.
notebooks: dev
	$(PY) -m pip install -q $$($(PY) -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["notebook"]))')
	@# --allow-root: JupyterLab refuses to run as root otherwise (containers, CI machines)
	$(VENV)/bin/jupyter lab --ip 127.0.0.1 --port $(NOTEBOOK_PORT) --no-browser --notebook-dir notebooks \
		$$([ "$$(id -u)" = 0 ] && echo --allow-root)

# kvstore.example.toml from the settings' declarations (kvstore/config.py); run after adding or
# changing a setting (tests/integration/test_deploy.py fails until the committed file matches).
example-config: dev
	$(VENV)/bin/kvstore config example -o kvstore.example.toml
