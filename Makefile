# The two commands users need: `make run` and `make test`. Both set everything up first and are
# idempotent: a second run reuses the virtualenv and the Debian packages already installed.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMPS := .stamps
SOURCES := $(shell find platform spark -type f \( -name '*.py' -o -name '*.pyx' -o -name '*.pyi' -o -name '*.spec' -o -name 'py.typed' -o -name '*.java' \) 2>/dev/null) pyproject.toml setup.py

.PHONY: run test test-fast lint typecheck layers codegen bench fuzz chaos clean setup setup-test

run: setup
	$(VENV)/bin/riverbed cluster up --brokers 3 --data-dir ./.riverbed --demo-topic demo

# Test files are spread over TEST_WORKERS processes (pytest-xdist; a file stays on one worker, so
# its module fixtures are built once, and tests/spark stays whole: tests/support/
# xdist_scheduling.py): most tests wait on brokers, ZooKeeper and timeouts rather than compute,
# and a serial run kept the 2 cores ~25% busy. Units go out in collection order, which puts
# tests/spark first. TEST_WORKERS=0 runs them serially.
TEST_WORKERS ?= 4

test: setup-test
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		$(PYTEST_ARGS)

# The unit tests, for a quick check while working: none that needs a process of its own
# (ZooKeeper, brokers, moto's S3 server, Spark, a CLI: marked `processes`, tests/support/
# processes.py), and each property test on at most 5 examples (tests/conftest.py). They compute
# rather than wait, so FAST_WORKERS is the number of cores; a test at a time (--dist load) keeps
# both busy to the end. FAST_WORKERS=0 runs them serially.
FAST_WORKERS ?= 2

test-fast: setup-test
	$(PY) -m pytest -q -p no:cacheprovider -m "not processes" --hypothesis-profile=riverbed-fast \
		-n $(FAST_WORKERS) --dist load $(PYTEST_ARGS)

lint: setup-test
	$(VENV)/bin/ruff check platform spark tests bench tools
	$(VENV)/bin/ruff format --check platform spark tests bench tools

typecheck: setup-test
	$(PY) -m tools.typecheck

# The import contract between layers (tools/layers.py, docs/architecture.md); `make test` checks
# it too (tests/repo/test_layers.py).
layers: setup-test
	$(PY) -m tools.layers

# Regenerate platform/protocol/messages.py and data_messages.py from the spec files, in the
# source tree (tools/codegen.py); `make test` fails while they are stale.
codegen: setup-test
	$(PY) -m tools.codegen

bench: setup-test
	$(PY) -m bench.run $(BENCH_ARGS)

# Coverage-guided fuzzing of the codec with atheris (tools/fuzz): each target in turn for
# FUZZ_SECONDS. The corpus grows in .fuzz/corpus/<target>/; a crashing input stops the run and is
# kept in .fuzz/crashes/<target>/. Not part of `make test`: docs/security-hostile-input.md.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= stream request records

fuzz: setup $(STAMPS)/fuzz-deps
	@for target in $(FUZZ_TARGETS); do \
		echo "fuzzing $$target for $(FUZZ_SECONDS)s"; \
		$(PY) -m tools.fuzz $$target --seconds $(FUZZ_SECONDS) || exit 1; \
	done

# Long randomised fault runs (tests/faults/chaos.py, docs/faults.md): CHAOS_SCHEDULES schedules of
# mixed faults on one cluster in network namespaces, within CHAOS_BUDGET_S; CHAOS_SEED replays a
# run. Not part of `make test`, which runs the fixed scenarios.
CHAOS_SEED ?= $(shell date +%s)
CHAOS_SCHEDULES ?= 100
CHAOS_BUDGET_S ?= 2400

chaos: setup-test
	$(PY) -m tests.faults.chaos --seed $(CHAOS_SEED) --schedules $(CHAOS_SCHEDULES) \
		--budget-s $(CHAOS_BUDGET_S)

setup: $(STAMPS)/debian-run $(STAMPS)/installed
setup-test: setup $(STAMPS)/debian-test $(STAMPS)/test-deps $(STAMPS)/installed $(STAMPS)/checkov

# Java and ZooKeeper come from Debian's packages; only install what is missing. javac builds
# riverbed_spark's column pruning jar (setup.py). Rechecked when this Makefile changes.
$(STAMPS)/debian-run: Makefile
	@mkdir -p $(STAMPS)
	@if ! dpkg -s zookeeper default-jre-headless >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zookeeper default-jre-headless; \
	fi
	@if ! command -v javac >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless; \
	fi
	@touch $@

# Tools the tests and benchmarks drive: kcat (librdkafka), redis-server (benchmark baseline),
# strace (proves fetches use sendfile), and for the fault harness (tests/faults, docs/faults.md)
# iproute2 and nftables (network namespaces, cut and slowed links) and e2fsprogs (a failing ext4).
DEBIAN_TEST_PACKAGES := kcat redis-server redis-tools strace iproute2 nftables e2fsprogs
$(STAMPS)/debian-test: $(STAMPS)/debian-run
	@if ! dpkg -s $(DEBIAN_TEST_PACKAGES) >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEBIAN_TEST_PACKAGES); \
	fi
	@touch $@

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel

# Runtime dependencies plus what building the package needs (Cython, for the record codec).
$(STAMPS)/runtime-deps: pyproject.toml | $(PY)
	@mkdir -p $(STAMPS)
	{ $(PY) -m tools.deps runtime; $(PY) -m tools.deps build; } | xargs $(PY) -m pip install -q
	@touch $@

# With the runtime dependencies in the same resolution, so a test tool (moto pulls boto3) cannot
# upgrade a library past what a runtime dependency allows (aiobotocore pins botocore).
$(STAMPS)/test-deps: pyproject.toml $(STAMPS)/runtime-deps | $(PY)
	{ $(PY) -m tools.deps runtime; $(PY) -m tools.deps test; } | xargs $(PY) -m pip install -q
	@touch $@

# atheris ships manylinux wheels (libFuzzer built in): no compiler step.
$(STAMPS)/fuzz-deps: pyproject.toml $(STAMPS)/runtime-deps | $(PY)
	{ $(PY) -m tools.deps runtime; $(PY) -m tools.deps fuzz; } | xargs $(PY) -m pip install -q
	@touch $@

# checkov (tests/deploy/test_terraform.py checks terraform/ with it) pins its own boto3, botocore,
# numpy and packaging: it gets a virtualenv of its own so it cannot move the project's. Remade
# when this Makefile changes (a new CHECKOV_VERSION); pip leaves a satisfied pin alone.
CHECKOV_VERSION := 3.3.30
CHECKOV_VENV := .venv-checkov

$(STAMPS)/checkov: Makefile
	@mkdir -p $(STAMPS)
	test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install -q --upgrade pip
	$(CHECKOV_VENV)/bin/python -m pip install -q checkov==$(CHECKOV_VERSION)
	@touch $@

# A regular (non-editable) install: the wheel's generated riverbed/__init__.py (see setup.py) is
# what users get, so it is what the tests import.
$(STAMPS)/installed: $(SOURCES) $(STAMPS)/runtime-deps $(STAMPS)/debian-run
	$(PY) -m pip install -q --no-deps --no-build-isolation --force-reinstall .
	@rm -rf build riverbed.egg-info
	@touch $@

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) $(STAMPS) build dist *.egg-info
