# The two README commands: `make demo` (the main job; it prints the playground's URL) and `make test`
# (install + whole suite, the ray executor's tests included: install-test adds the `ray`, `gguf`, `quant`, `video`, `otel`, `ar` (vLLM) extras and `bench`
# (cache-dit, for benchmark section h), after the pinned torch; `browser` adds chromium for the playground).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
# pytest-xdist workers for `make test`; whole modules per worker (tests/conftest.py, docs/architecture.md#tests)
TEST_WORKERS ?= 3
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: venv install install-test browser postgres demo test test-kinds gpu-check lint bench bench-smoke clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# torch first and pinned: an unpinned torch resolved by another package pulls a multi-GB CUDA build.
$(VENV)/.torch: | $(PY)
	$(PY) -m pip install --quiet torch==$(TORCH_VERSION)
	touch $@

# The ar extra (vLLM) runs the demo's prompt rewrite (diffserve/assets/demo.yaml); its CPU build pulls PyPI's
# torchvision/torchaudio/torchcodec, CUDA builds that break `import vllm` beside the CPU torch: they go (text-only
# vLLM needs none; the tests that need torchvision skip).
$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	$(PY) -m pip install --quiet -e ".[server,ar]"
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[server,test,ray,bench,gguf,quant,video,postgres,otel,ar]"
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# Debian packages $(1) for $(2), installed when missing (the shell test $(3) fails) and this user can (root or
# passwordless sudo, apt-get); never fatal: without them those tests skip and say why.
define apt_install
	@if $(3); then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; \
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; \
	else echo "$@: not root and no passwordless sudo; $(2) will skip"; exit 0; fi; \
	if ! command -v apt-get >/dev/null 2>&1; then echo "$@: no apt-get; $(2) will skip"; exit 0; fi; \
	echo "$@: apt-get install $(1)"; \
	{ $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends $(1) >/dev/null; } \
	  || echo "$@: apt-get install failed; $(2) will skip"
endef

# The playground's browser test (tests/entrypoints/test_e2e_playground.py) drives Debian's chromium through
# chromium-driver (selenium, no browser download).
browser:
	$(call apt_install,chromium chromium-driver,the playground browser test,command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1)

# The job store's tests (tests/entrypoints/jobs) run on SQLite and on a throwaway PostgreSQL server
# (tests/pg_server.py) from Debian's postgresql.
postgres:
	$(call apt_install,postgresql,the PostgreSQL job store tests,command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1)

# Eager on purpose: torch.compile on a 2-core CPU costs over a minute before the first image.
# The two shipped toy models on one server (diffserve/assets/demo.yaml): toy-shapes (images, with its
# circles-to-stars LoRA registered as "stars") and toy-motion (videos).
DEMO_CONFIG := diffserve/assets/demo.yaml
demo: install
	@echo "diffserve playground: http://127.0.0.1:$${PORT:-8000}/ (open it once the server says it is serving)"
	$(VENV)/bin/diffserve serve --deploy-config $(DEMO_CONFIG) --enforce-eager --host 127.0.0.1 --port $${PORT:-8000}

# On a machine with a CUDA GPU (the `device` tool's H100/H200): every `gpu`-marked test (offload, fp8, the attention
# backends, CUDA devices per replica), then one FLUX.1-dev double and single block per contender (benchmarks/gpu_blocks.py
# -> benchmarks/RESULTS-GPU-BLOCKS.md, ~2 minutes), then whole images (benchmarks/gpu.py -> benchmarks/RESULTS-GPU.md),
# then mixed traffic (section s, engines and diffusers both on the GPU -> benchmarks/RESULTS-GPU-MIXED.md, ~2 minutes);
# sized for 10 minutes on one GPU (a contender that would start past its section's budget is reported as not run).
# Without a GPU the tests skip and the benchmarks say so.
gpu-check: install-test
	$(PY) -m pytest -q -m gpu -p no:cacheprovider tests
	$(PY) -m benchmarks.gpu_blocks --budget-s 120
	$(PY) -m benchmarks.gpu --budget-s 240
	$(PY) -m benchmarks.run --only mixed --out benchmarks/RESULTS-GPU-MIXED.md

# --durations=25: every run (CI's included) says where its minutes went, against the 15-minute budget.
# pytest writes bytecode caches whatever the caller's PYTHONDONTWRITEBYTECODE says: a run starts ~150 Python processes
# that import the package, and each xdist worker imports every test module (asserts rewritten by pytest). Measured on
# 2 cores: collection 9.4 -> 6.1 CPU-s a worker, a worker process's model load 5.3 -> 5.1 CPU-s, with the caches.
test: install-test browser postgres
	$(VENV)/bin/ruff check diffserve tests benchmarks
	$(VENV)/bin/mypy
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -n $(TEST_WORKERS) --durations=25
	$(MAKE) --no-print-directory test-kinds

# The numerics tests (`-m numerics`: parity, batch invariance, quality gates, platform defaults) again under every
# CPU kind below this machine's that the suite must hold on (AMX > AVX512_BF16 > AVX2), emulated by capping ATen's,
# oneDNN's and MKL's instructions (tests/cpu_kinds.py, diffserve/config/platform.py:emulation_env). An AVX2 machine
# has no kind below it: the main run is its check. KINDS=AVX2 picks kinds.
test-kinds: install-test
	PYTHONDONTWRITEBYTECODE= $(PY) tests/cpu_kinds.py $(if $(KINDS),--kinds $(KINDS)) -n $(TEST_WORKERS)

bench: install-test
	$(PY) -m benchmarks.run

bench-smoke: install-test
	$(PY) -m benchmarks.run --smoke

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
