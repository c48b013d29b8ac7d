# scalelab: `make repro` sets up .venv and runs the pipeline; `make test` runs the whole test suite,
# `make test-fast` its fast tier (for development).
PYTHON ?= python3
VENV   := .venv
BIN    := $(CURDIR)/$(VENV)/bin
STAMP  := $(VENV)/.installed
export PATH := $(BIN):$(PATH)
HOST ?= 127.0.0.1
PORT ?= 5000

.PHONY: setup repro dvc-lock test test-fast lint ui bench lock mlflow-server store store-stop slurm-up slurm-down clean

setup: $(STAMP)

# Exact versions from requirements.lock, each with its sha256: everything is installed with
# --require-hashes except torch, whose one pin takes the local CPU wheel on CPU machines and the CUDA
# build (and its nvidia packages) on GPU machines: different files, so no hash can hold for both.
# pip installs uv (by its hash) and torch (constrained to the lock's versions); uv installs the rest;
# then the venv's bytecode is compiled on every core (about 35 s in all here, pip took 80 s).
# As with pip, a file that does not compile on this Python (torch ships a 3.12-only module) is skipped.
# --system-certs: uv trusts the machine's CA store, as pip does (a proxy's CA may be installed there).
UV  := $(BIN)/uv pip install --quiet --system-certs --python $(BIN)/python
PIP := $(BIN)/pip install --quiet --disable-pip-version-check --no-compile
$(STAMP): requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	sed -n '/^uv==/,/[^\\]$$/p' requirements.lock > $(VENV)/uv.txt
	sed -e 's/ *\\$$//' -e '/^ *--hash/d' -e '/^#/d' requirements.lock > $(VENV)/pins.txt
	$(PIP) --require-hashes --no-deps -r $(VENV)/uv.txt
	$(PIP) -c $(VENV)/pins.txt $$(grep '^torch==' $(VENV)/pins.txt)
	grep -v '^torch==' requirements.lock > $(VENV)/hashed.txt
	$(UV) --require-hashes -r $(VENV)/hashed.txt
	$(UV) --no-deps -e .
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib || true
	touch $@

repro: setup
	$(BIN)/dvc repro
	$(BIN)/scalelab summary

# After a change to a stage's code or params.yaml: rerun what changed, so that the committed dvc.lock
# matches the tree (tests/layout/test_dvc_lock.py checks it); then commit dvc.lock and the metrics files.
dvc-lock: setup
	$(BIN)/dvc repro
	@echo "now: git add dvc.lock results/*/metrics.json results/speedup/speedup.json && git commit"

# The tiers (tests/conftest.py): test-fast leaves out the tests marked slow or needing a service;
# a test without a marker that takes over 5 s fails there. Both run on pytest-xdist workers (tests of
# one service share a worker: --dist loadgroup); PYTEST_ARGS adds options (a path, -k, a seed).
FAST_TIER    := not slow and not slurm and not browser and not postgres and not gpu
TEST_WORKERS ?= 5
FAST_WORKERS ?= 2
PYTEST_ARGS  ?=

# Bytecode for the project's own modules, written once: where PYTHONDONTWRITEBYTECODE is set, each of
# the suite's ~900 Python processes would otherwise compile the modules it imports again.
BYTECODE := $(BIN)/python -m compileall -q libs experiments

# Everything, services included; the fault tests' figures go to results/bench/reliability.json.
test: lint
	$(BYTECODE)
	SCALELAB_STRICT_CHECKOUT=1 SCALELAB_RELIABILITY_JSON=$(CURDIR)/results/bench/reliability.json \
	SCALELAB_TEST_ARTIFACTS=$(CURDIR)/results/test-artifacts \
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The fast tier in random order (its seed is printed: rerun with PYTEST_ARGS=--random-order-seed=N).
test-fast: setup
	$(BYTECODE)
	$(BIN)/pytest -m "$(FAST_TIER)" -n $(FAST_WORKERS) --dist loadgroup --random-order-bucket=module $(PYTEST_ARGS)

# ruff (pinned in requirements.lock): lint rules and formatting, configured in pyproject.toml.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The project's store (mlflow.db, or MLFLOW_TRACKING_URI); prints the address of the runs table.
# (A shared server from `make mlflow-server` serves its own UI.)
ui: setup
	$(BIN)/scalelab ui --params params.yaml --host $(HOST) --port $(PORT)

# The lab's tracking server (see slurm/README.md), for any lab, SLURM or not: binds 127.0.0.1 unless
# HOST is given; basic auth (MLFLOW_AUTH_ADMIN_PASSWORD) unless ALLOW_NO_AUTH=1; artifacts in the
# clone's store (<store>/mlflow-artifacts) when one is set.
mlflow-server: setup
	HOST=$(HOST) PORT=$(PORT) slurm/mlflow-server.sh

# A real S3 server on this machine (rclone serve s3 on 127.0.0.1:STORE_PORT, generated credentials),
# made this clone's store: DVC's default remote in .dvc/config.local. Objects stay under STORE_DIR.
STORE_DIR  ?= $(HOME)/.local/share/scalelab/store
STORE_PORT ?= 9010
store: setup
	$(BIN)/scalelab store serve --base $(STORE_DIR) --port $(STORE_PORT)

store-stop: setup
	$(BIN)/scalelab store stop --base $(STORE_DIR)

# Benchmarks: JSON figures under results/bench/.
bench: setup
	$(BIN)/scalelab bench all --out results/bench

# The local test SLURM cluster (as root): Debian packages, then munge, MariaDB, slurmdbd, slurmctld, 2 slurmd.
slurm-up:
	slurm/local/install.sh
	slurm/local/start.sh

slurm-down:
	slurm/local/stop.sh

# Re-resolve requirements.in into requirements.lock (keeps torch at the 2.13.0 pin).
# requirements.in -> requirements.lock: resolved in a fresh venv in a private temporary folder, then
# every pin but torch's gets the sha256 of each of its files on the index (uv pip compile).
lock:
	set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(PYTHON) -m venv "$$tmp/venv"; \
	"$$tmp/venv/bin/pip" install --quiet -r requirements.in; \
	"$$tmp/venv/bin/pip" freeze | sed -e 's/^torch==\(.*\)+cpu$$/torch==\1/' > "$$tmp/pins.txt"; \
	grep -v '^torch==' "$$tmp/pins.txt" > "$$tmp/rest.txt"; \
	"$$tmp/venv/bin/uv" pip compile --quiet --system-certs "$$tmp/rest.txt" --generate-hashes \
		--python-version 3.11 --no-header --no-annotate -o "$$tmp/hashed.txt"; \
	{ echo "# make lock writes this file: every package with its sha256 (make setup installs them with --require-hashes),"; \
	  echo "# except torch: its one pin takes the CPU wheel on CPU machines and the CUDA build on GPU machines (other files)."; \
	  grep '^torch==' "$$tmp/pins.txt"; cat "$$tmp/hashed.txt"; } > requirements.lock

clean:
	rm -rf results data/prepared
