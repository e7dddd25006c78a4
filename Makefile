# The two set-up commands: `make demo` (the whole loop on the bundled example) and `make test`.
# Both work on a fresh Debian machine as root: they create the venv, install the project, start a
# Docker engine (installing Debian's docker.io if absent) and build the images the lock lacks.

VENV   := .venv
PY     := $(VENV)/bin/python
CKO    := $(VENV)/bin/cko
PYTHON ?= python3

.PHONY: demo test venv native engine images registry lint typecheck unit gpu-test clean-store

# The ray extra too, so that tests/test_fleet.py runs its real local Ray cluster instead of skipping:
# ray[default], as users install it (plain ray lacks the grpcio Ray Client, ray://, needs).
# The mcp extra: `cko mcp` and its test with a real MCP client session.
$(VENV)/.installed: pyproject.toml Makefile
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "Python 3.11+ required"; exit 2; }
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null && $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,ray,mcp]'
	@# Headless Chromium renders the HTML report in its test (screenshot not blank, no console error);
	@# where it cannot be installed that half of the test skips and says why.
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1; } || echo "chromium not installed: the report's screenshot check will skip"
	@# The PyTorch example's CPU tests need torch; only a CPU build is worth its size here, and pip finds
	@# one only where the host offers it (a local wheel or a CPU index): elsewhere those tests skip.
	@$(PY) -m pip install -q 'torch==2.13.0+cpu' >/dev/null 2>&1 \
	  && echo "torch (CPU build) installed: the PyTorch example's CPU tests run" \
	  || echo "no CPU build of torch reachable: the PyTorch example's CPU tests will skip"
	@touch $@

venv: $(VENV)/.installed

# The compiled torch-trace scanner (C, libc only): built beside its source so the images take it.
# A host without a C compiler gets Debian's gcc; where even that fails, traces parse on the Python
# paths (same facts, slower) and `make test` says so.
native: venv
	@command -v cc >/dev/null 2>&1 || { echo "installing gcc (for the trace scanner)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null; } || true
	@$(PY) -m cko_perf.runner.native

engine:
	@bash images/ensure-host.sh

# Builds only what the lock lacks; a rebuild of the same inputs gives the same id and leaves
# cko-images.lock as it is (so `make test` leaves `git status` clean).
images: venv native engine
	$(CKO) images build cpu --if-missing

# Debian's registry, for tests/test_images_portable.py (push and pull by digest on localhost).
registry:
	@command -v docker-registry >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-registry >/dev/null; } || \
	  echo "docker-registry not installable: the registry test will skip"

lint: venv
	$(VENV)/bin/ruff check cko_perf runner operations knowledge tests benchmarks examples
	$(VENV)/bin/ruff format --check cko_perf runner operations knowledge tests benchmarks examples
	$(CKO) knowledge lint

typecheck: venv  # strict: pyproject.toml [tool.mypy]
	$(VENV)/bin/mypy

# Two pytest workers (pytest-xdist), a file each at a time: most of a test's wall is containers starting
# and the engine's work, so two overlap on two cores (CI: 1853 s of pytest alone, 748 s with two). A file
# stays on one worker, so its module fixtures (a frozen Target, a Ray cluster) are made once.
test: images registry lint typecheck
	CKO_REQUIRE_DOCKER=1 CKO_REQUIRE_NATIVE=$$(command -v cc >/dev/null && echo 1 || echo 0) \
	  $(VENV)/bin/pytest -q -n 2 --dist loadfile --durations=20

# On the lent H200 (no package index, no Docker: .carry from tests/gpu/make_carry.sh brings both):
# the engine, the cuda image, then every test marked gpu. See tests/gpu/README.md.
gpu-test:
	bash tests/gpu/acceptance.sh pytest

demo: images
	$(CKO) demo
