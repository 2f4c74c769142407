# costopt: `make run` starts the service on its embedded defaults; `make test` runs every check.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# uv installs the pinned dependencies (downloads in parallel: a fresh .venv in ~2.5 min here instead of
# pip's ~4.5), compiling their bytecode as pip does (else every test process compiles it at first import);
# pip stays the fallback if uv fails.
UV     := uv==0.13.9

.PHONY: setup run test lint typecheck unit bench clean browser fuzz mutate drills test-all-backends

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(UV)
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e '.[dev]' || $(BIN)/python -m pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

setup: $(STAMP)

# The allocators' settings the soak measured (docs/reliability.md "Soak"; the Dockerfile sets the same): glibc
# arenas capped, large blocks returned when freed, pyarrow through the same malloc. Read at process start only.
SERVICE_ENV := MALLOC_ARENA_MAX=2 MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=131072 ARROW_DEFAULT_MEMORY_POOL=system

run: setup
	$(BIN)/costopt db migrate
	$(SERVICE_ENV) $(BIN)/costopt serve

PY_DIRS := costopt pricing providers api tests bench experiments examples

lint: setup
	$(BIN)/ruff check $(PY_DIRS)
	$(BIN)/ruff format --check $(PY_DIRS)

# tests, bench and the experiments' scripts too (a cold cache adds ~15 s of CPU: 56 s for all 455 files against
# 42 s without tests and bench). The scripts import their folder's backtest_common / gavel_common by sys.path;
# mypy finds those by the folders given here (and bench's by mypy_path in pyproject.toml).
typecheck: setup
	$(BIN)/mypy costopt pricing providers api tests bench experiments

# One BLAS thread per test process (tests/conftest.py sets it too). Three xdist workers on the two cores: part of
# the suite waits on subprocesses, servers and clocks, which a third worker fills (measured on a quiet machine:
# 549 s with -n 3, 893 s of CPU; 638 s with -n 2 on a slightly older tree).
unit: setup browser
	OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/pytest -n 3 -q

test: lint typecheck unit

# The API fuzzed from its own OpenAPI document (schemathesis, in-process, valid and invalid keys): 250
# generated requests per operation (over 5,000), exit 1 on any 5xx or answer the document does not declare.
# `make test` runs a short version (tests/api/test_fuzz.py). Figures: docs/reliability.md.
fuzz: setup
	$(BIN)/python -m tests.api.fuzzing --examples 250 --min-requests 5000

# Every case of the modules marked one_backend_each on both backends too (make test runs each on one, in turn).
test-all-backends: setup browser
	COSTOPT_TEST_ALL_BACKENDS=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/pytest -n 3 -q

# Fault drills kept out of `make test` for time (the service killed and restarted); bench/kill_drill.py is the full one.
drills: setup
	$(BIN)/pytest -q -m drill

# Headless Chromium for the web page's browser test (tests/api/test_savings_page.py; Playwright comes
# with the dev dependencies and drives Debian's chromium, never a browser build of its own).
browser: setup
	command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium)

# Every benchmark (store, import, planner, collections, Gavel, backtest, preemption study, API, demo) in one
# table: figure, target, measured, pass/fail, load average; exit 1 when a figure misses its target.
# BENCH_ARGS=--quick for smaller sizes, BENCH_ARGS="--only soak" for the 10-minute soak, --no-fail to only
# report. Not part of `make test` (it takes many minutes). See docs/benchmarks.md.
bench: setup
	$(BIN)/python bench/run_all.py $(BENCH_ARGS)

# Mutation testing of the money and decision code ([tool.mutmut] in pyproject.toml: the modules and
# their own tests, SQLite only). A clean run from scratch, two workers; not part of `make test`.
# `$(BIN)/mutmut results` lists the survivors, `$(BIN)/mutmut show NAME` shows one. See docs/reliability.md.
MUTATE_CHILDREN ?= 2
mutate: setup
	rm -rf mutants
	COSTOPT_DATA_DIR=$${COSTOPT_DATA_DIR:-$(abspath ..)/shared/data} $(BIN)/mutmut run --max-children $(MUTATE_CHILDREN)
	$(BIN)/python bench/mutation_score.py

clean:
	rm -rf mutants $(VENV) var .pytest_cache .mypy_cache .ruff_cache
