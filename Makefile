# Two commands a newcomer needs: `make run` and `make test`. Both install first, once.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test test-fast bench lint format clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first, pinned: the local CPU wheel. A bare torch requirement pulls a multi-GB CUDA build.
	$(BIN)/pip install --disable-pip-version-check -q torch==2.13.0
	$(BIN)/pip install --disable-pip-version-check -q -e '.[dev,serve,cluster]'
	touch $(STAMP)

run: install
	$(BIN)/ferrum transcribe samples/librivox_sense_and_sensibility.wav

# Two processes, each given whole files (a file's fixtures, a Ray cluster among them, start once):
# much of the suite waits on real time (live pacing, servers, Ray), and the other process works
# meanwhile (docs/performance.md, "Several processes at once").
PYTEST := $(BIN)/pytest -q -n 2 --dist loadfile

test: install
	$(PYTEST)

test-fast: install  # without the cluster, the hour-long and the 1,000-file tests
	$(PYTEST) -m "not slow and not cluster"

bench: install
	$(BIN)/pip install --disable-pip-version-check -q -e '.[dev,serve,cluster,bench]'
	$(BIN)/python bench/run_bench.py

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
