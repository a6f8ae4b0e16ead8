# Two commands on a fresh machine: `make run` and `make test`. Both build .venv themselves.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
CONFIG  ?= deploy/configs/quickstart.yaml
# tests run in this many pytest-xdist workers, one more than this machine's 2 cores: the job tests wait
# on their processes about a third of the time, and a third worker fills it (14.1 against 14.7 minutes
# of pytest with 2); a fourth only adds contention (20.3 against 17.3 minutes, back to back). A
# module's tests stay on one worker (tests/conftest.py), so its Ray instance and job fixtures start
# once. The modules go out in the order collected (the long benchmark rehearsals and end-to-end
# modules first, the short unit modules last), not reordered by their count of tests, which left the
# single-test rehearsals to the end, on one worker while the others idled.
JOBS    ?= 3
PYTEST  := $(BIN)/python -m pytest -q -n $(JOBS) --dist loadgroup --no-loadscope-reorder
RUN_DIR ?= runs/quickstart
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER = 0
export RAY_USAGE_STATS_ENABLED = 0

.PHONY: install compile run test test-fast lint test-unit test-e2e test-gpu study bench clean

# The project's own bytecode, written before a run: where PYTHONDONTWRITEBYTECODE is set, every process
# of the suite (hundreds: job drivers, Ray workers, rehearsal runners) would otherwise compile each of
# the project's modules it imports again. compileall skips what is up to date.
SOURCES := common coordinator deploy learner rollout stabledrl tests

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt torch==2.13.0 -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

compile: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 $(SOURCES)

run: compile
	$(BIN)/stabledrl train --config $(CONFIG) --overwrite  # make run starts the quickstart afresh each time
	$(BIN)/stabledrl plot $(RUN_DIR) --out $(RUN_DIR)/training.png

study: $(STAMP)
	$(BIN)/stabledrl study --config deploy/configs/study_cpu.yaml

test: compile  # the whole suite, as CI runs it: unit, end-to-end and every benchmark's CPU rehearsal
	$(BIN)/ruff check .
	$(PYTEST) -m "not gpu" tests

test-fast: compile  # ruff and the unit tests that start no Ray, DeepSpeed or job process (e2e-marked ones)
	$(BIN)/ruff check .
	$(PYTEST) -m "not e2e and not gpu" tests/unit

lint: $(STAMP)
	$(BIN)/ruff check .

test-unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

test-e2e: $(STAMP)
	$(BIN)/python -m pytest -q -m e2e tests

test-gpu:
	python -m pytest -q -m gpu tests/gpu

bench: $(STAMP)  # the component suite's CPU rehearsal (toy shapes); on GPUs: BENCHMARKS.md, "Running them"
	$(BIN)/python tests/benchmarks/run_all.py --tiny --quick --out runs/bench_cpu

clean:
	rm -rf $(VENV) runs .pytest_cache
