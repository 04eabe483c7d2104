# The two README commands: `make demo` (the main job) and `make test` (install + whole suite, the ray
# executor's tests included: install-test adds the `ray` extra and `bench` (cache-dit, for benchmark
# section h), after the pinned torch).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: venv install install-test demo test lint bench bench-smoke clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# torch first and pinned: an unpinned torch resolved by another package pulls a multi-GB CUDA build.
$(VENV)/.torch: | $(PY)
	$(PY) -m pip install --quiet torch==$(TORCH_VERSION)
	touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	$(PY) -m pip install --quiet -e ".[server]"
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[server,test,ray,bench]"
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# Eager on purpose: torch.compile on a 2-core CPU costs over a minute before the first image.
demo: install
	$(VENV)/bin/diffserve serve --enforce-eager --host 127.0.0.1 --port $${PORT:-8000}

test: install-test
	$(VENV)/bin/ruff check diffserve tests benchmarks
	$(PY) -m pytest -q

bench: install-test
	$(PY) -m benchmarks.run

bench-smoke: install-test
	$(PY) -m benchmarks.run --smoke

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
