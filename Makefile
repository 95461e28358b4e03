# gym: the two commands the README promises, plus developer helpers.
#   make run    set up .venv (first time) and run flows/sft_then_dpo.py on the embedded gym-tiny
#   make test   set up .venv (first time), lint (ruff, mypy) and run the test suite (no network, no GPU)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Everything the tests exercise on CPU; GPU-only extras (flash-attn, unsloth, deepspeed) stay out.
EXTRAS := dev,eval,quant,ui,embed,api
export HF_HUB_OFFLINE ?= 1
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export TOKENIZERS_PARALLELISM ?= false

.PHONY: run test test-fast lint format bench clean-venv

$(STAMP): pyproject.toml constraints/cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints/cpu.txt -e ".[$(EXTRAS)]"
	touch $(STAMP)

run: $(STAMP)
	$(PY) flows/sft_then_dpo.py

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n auto --dist loadgroup

test-fast: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

bench: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) benchmarks/overhead.py --repeats 3

clean-venv:
	rm -rf $(VENV)
