# gradwire: `make demo` runs the main job, `make test` runs the test suite.
# Both create the virtual environment on first use; a second run is fast.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SYSTEM_STAMP := .gradwire/.system-installed
PYTEST_ARGS ?=

.PHONY: setup system-deps lint test test-fast demo bench clean

setup: $(STAMP)

# Every extra the suite needs; CPU torch: pyproject.toml's `cpu` extra pins it (a bare `torch`
# would pull a CUDA build).
$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[cpu,workers,coordinator,bench,test]'
	@touch $(STAMP)

# Prometheus and Chromium (Debian packages) for the service and browser tests.
system-deps: $(SYSTEM_STAMP)

$(SYSTEM_STAMP):
	@mkdir -p .gradwire
	@if ! command -v prometheus >/dev/null || ! command -v chromium >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q prometheus chromium iproute2; \
	  else \
	    echo "Prometheus/Chromium missing and not root: their tests will be skipped with that reason"; \
	  fi; \
	fi
	@touch $(SYSTEM_STAMP)

# Lint and types first (seconds), then the suite.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: setup system-deps lint
	$(PY) -m pytest -q -rs $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest -q -rs -m "not slow" $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/gradwire demo

bench: setup
	$(PY) -m benchmarks.compressor_cost --json-out benchmarks/results/compressor_cost.json

clean:
	rm -rf $(VENV) .gradwire
