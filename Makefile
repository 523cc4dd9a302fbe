# The README's two commands: `make demo` and `make test`. Both set up .venv first.
#
# On a machine without an NVIDIA GPU the CPU build of torch is installed before the package,
# so the package's broad torch range never pulls a multi-GB CUDA build: from a local CPU wheel
# if pip's find-links has one (then its dependencies from the usual index), else from
# PyTorch's CPU wheel index (TORCH_CPU_INDEX).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_CPU ?= torch==2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
STAMP := $(VENV)/.uqc-setup-stamp

.PHONY: setup demo test lint docs docs-site clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		echo "setup: NVIDIA GPU found: torch from the package range, onnxruntime-gpu"; \
		$(BIN)/pip install -q -e ".[gpu,dev,docs]"; \
	else \
		$(BIN)/python -c "import torch" 2>/dev/null || { \
			echo "setup: no GPU: installing the CPU build of torch ($(TORCH_CPU))"; \
			{ $(BIN)/pip install -q --no-index --no-deps $(TORCH_CPU) 2>/dev/null && \
			  $(BIN)/pip install -q $(TORCH_CPU); } || \
			$(BIN)/pip install -q $(TORCH_CPU) --index-url $(TORCH_CPU_INDEX); }; \
		$(BIN)/pip install -q -e ".[cpu,dev,docs]"; \
	fi
	@touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/uqc demo

# Lint, types and layering first, then the docs site, then the tests (pytest's summary is the
# last line CI prints).
test: setup lint docs-site
	$(BIN)/python -m pytest -q -n auto --dist loadscope

lint: setup
	$(BIN)/ruff check uqcompress tests benchmarks packaging
	$(BIN)/ruff format --check uqcompress tests benchmarks packaging
	$(BIN)/mypy
	$(BIN)/lint-imports --no-logo  # the layering contracts in pyproject.toml

# docs/cli.md: every command's --help; tests/cli/test_reference.py fails when it is stale.
docs: setup
	$(BIN)/python -m uqcompress.cli.reference > docs/cli.md

# The documentation site (mkdocs.yml, docs/) into site/; --strict fails on any warning (a broken
# link or anchor, a page missing from the nav).
docs-site: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d site

clean:
	rm -rf $(VENV) artifacts/demo artifacts/demo-quick .grimp_cache site
