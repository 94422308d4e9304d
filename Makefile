# The two quick-start commands: `make demo` and `make test`. Each creates .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CHROMIUM := /usr/bin/chromium

.PHONY: demo test check bench clean

$(STAMP): pyproject.toml benchmarks/pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,local]' -e ./benchmarks
	touch $(STAMP)

# Debian's Chromium for the trajectory viewer's browser test (tests/analysis/test_viewer_browser.py), when
# missing: 118 packages, about 460 MB installed, 25 s here (10 s with the packages cached). Where it cannot be
# installed (not root, no apt) the test skips, saying why.
$(CHROMIUM):
	-[ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && apt-get update -qq \
		&& DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null

demo: $(STAMP)
	$(BIN)/rcarun sweep

# Every test, slow ones included, on two workers (serially the suite takes 11-12 minutes here).
test: $(STAMP) $(CHROMIUM)
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks scripts
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -rs -n 2

# The inner loop: everything `make test` checks but the tests marked slow (the demo sweep, chaos, calibration,
# benchmarks, a full disk), on two cores. CI runs `make test`.
check: $(STAMP) $(CHROMIUM)
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks scripts
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -rs -n 2 -m "not slow and not live and not gpu"

bench: $(STAMP)
	$(BIN)/python benchmarks/performance.py --repeats 3

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache results.db results.db-* results.db.forward-cache results.db.serve-logs
