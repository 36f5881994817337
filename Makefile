# Every target creates the virtual environment when it is missing (or older than the pins).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
WAREHOUSE ?= $(CURDIR)/warehouse
# an object-store warehouse (s3a://...) keeps Dagster's records in a local folder beside it
export DAGSTER_HOME ?= $(if $(findstring ://,$(WAREHOUSE)),$(CURDIR)/.dagster,$(WAREHOUSE)/.dagster)
export PYTHONPATH := $(CURDIR)
ARGS ?=

.PHONY: demo test test-long test-faults test-deploy test-tpch conformance ui bench soak setup minio clean

$(BIN)/.installed: pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "epochal needs Python 3.11 or newer")'
	@command -v java >/dev/null || { echo "epochal needs Java 17 on PATH (java -version)"; exit 1; }
	@echo "creating $(VENV) from constraints.txt (pip, a few minutes the first time)"
	@$(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install --quiet --upgrade pip
	@$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	@problems=$$($(BIN)/pip check) || { echo "$$problems"; exit 1; }
	@touch $@

# Spark resolves the Delta JARs from Maven Central on its first start; do it once, with a clear
# error. Ivy's report goes to $(VENV)/jars.log and is printed only when the resolution fails.
$(BIN)/.jars: $(BIN)/.installed
	@echo "resolving the Delta JARs (Spark's report: $(VENV)/jars.log)"
	@$(BIN)/python -m resources.session $(VENV)/jars.log
	@touch $@

setup: $(BIN)/.jars

demo: setup
	@mkdir -p $(DAGSTER_HOME)
	@$(BIN)/python -m ops.demo --warehouse $(WAREHOUSE) $(ARGS)

# Two workers (pytest-xdist), each with its own Spark driver, a test file at a time: one driver
# leaves a core idle while Python plans, commits and waits on its round trips to the JVM.
TEST_WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -m "not deploy and not long and not faults" -n $(TEST_WORKERS) --dist loadfile $(ARGS)

# the tests that start processes of their own (the demo, Dagster's CLI and webserver, the crash
# matrix, concurrent refreshes) and the longer twins of make test's (the Spark path of the decimal
# and floating-point tests, further differential runs); CI runs it after make test
test-long: setup
	$(BIN)/python -m pytest -m "long and not deploy" -n $(TEST_WORKERS) --dist loadfile $(ARGS)

# the fault matrix (tests/test_faults.py): a source recreated, overwritten, vacuumed, given deletion
# vectors, column mapping or a column; local copies damaged or their disk full; each case's refresh
# after the fault in a process of its own. Cases are independent: handed out one at a time.
test-faults: setup
	$(BIN)/python -m pytest -m faults -n $(TEST_WORKERS) --dist load $(ARGS)

# MinIO (the S3 deployment test's object store), built from its Go module at a pinned version.
TOOLS := $(CURDIR)/.tools
MINIO_VERSION := v0.0.0-20260212201848-7aac2a2c5b7c
$(TOOLS)/minio:
	@command -v go >/dev/null || { echo "building MinIO needs Go on PATH (go version)"; exit 1; }
	GOBIN=$(TOOLS) nice -n 10 go install github.com/minio/minio@$(MINIO_VERSION)

minio: $(TOOLS)/minio

# the deployments, each against real servers on 127.0.0.1: a standalone cluster, Spark Connect, S3 (MinIO)
test-deploy: setup $(TOOLS)/minio
	$(BIN)/python -m pytest -m deploy $(ARGS)

# all 22 TPC-H queries over 10 hourly batches, each epoch checked against the full recompute
test-tpch: setup
	EPOCHAL_TPCH_QUERIES=all EPOCHAL_TPCH_BATCHES=10 $(BIN)/python -m pytest tests/test_tpch_incremental.py $(ARGS)

# the conformance suite's long version: ROUNDS rounds of one run of every column type (about 20 cases
# a run), and the wide-decimal tests at both scales on both paths. Every case's outcome goes to
# conformance-results.jsonl; then they are kept in tests/conformance_cases/<code>.jsonl (one file
# per code under test: commit it, and later runs of the same code add to it), and the README's type x
# operator matrix is rendered from every kept case of the code checked out (fails on any mismatch).
# Stopped early, the finished runs' results are kept by
# `python -m tests.conformance_matrix conformance-results.jsonl --kept --readme README.md`.
CONFORMANCE_ROUNDS ?= 6
conformance: setup
	rm -f conformance-results.jsonl
	EPOCHAL_CONFORMANCE_ROUNDS=$(CONFORMANCE_ROUNDS) \
	EPOCHAL_CONFORMANCE_KEEP_GOING=1 EPOCHAL_CONFORMANCE_RESULTS=$(CURDIR)/conformance-results.jsonl \
	$(BIN)/python -m pytest tests/test_conformance.py tests/test_wide_decimals.py -n $(TEST_WORKERS) --maxschedchunk 1 -q $(ARGS)
	$(BIN)/python -m tests.conformance_matrix conformance-results.jsonl --kept --readme README.md

ui: setup
	@mkdir -p $(DAGSTER_HOME)
	EPOCHAL_WAREHOUSE=$(WAREHOUSE) $(BIN)/dagster dev -w dagster_workspace.yaml -h 127.0.0.1 -p $${PORT:-3000}

bench: setup
	$(BIN)/python -m bench $(ARGS)

soak: setup
	$(BIN)/python -m tests.soak $(ARGS)

clean:
	rm -rf $(VENV) warehouse .pytest_cache .hypothesis .tools
