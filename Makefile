# Two commands matter: `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SOURCES := goblin_claim tests examples benchmarks tools

.PHONY: demo test install redis-server lint typecheck pytest bench clean

demo: $(STAMP)
	$(BIN)/python examples/payment_webhook.py

test: $(STAMP) redis-server lint typecheck pytest

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --editable . --group dev
	touch $@

# Debian's redis-server package, installed once; the tests start their own
# servers on free ports, so the packaged service is kept from starting.
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

lint: $(STAMP)
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/ruff format --check $(SOURCES)

typecheck: $(STAMP)
	$(BIN)/mypy --strict goblin_claim tests/typecheck
	$(BIN)/python tools/gen_async.py --check

# pytest exits 5 when it collected no tests: that is a failure here, said out loud.
# Branch coverage of the package is reported after the run.
pytest: $(STAMP)
	@$(BIN)/python -m coverage run -m pytest; status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest ran no tests: failing" >&2; exit 1; fi; \
	$(BIN)/python -m coverage report --skip-covered --precision=1 || true; \
	exit $$status

bench: $(STAMP) redis-server
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .coverage
