# gspo-cli developer commands. `make setup` is all a fresh machine needs.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup test lint fmt typecheck bench quickstart clean

$(BIN)/gspo: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned: an unpinned torch requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[dev,deepspeed]"
	touch $(BIN)/gspo

setup: $(BIN)/gspo

lint: setup
	$(BIN)/ruff check gspo_cli tests benchmarks
	$(BIN)/ruff format --check gspo_cli tests benchmarks
	$(BIN)/mypy gspo_cli/algorithms gspo_cli/recipe

fmt: setup
	$(BIN)/ruff format gspo_cli tests benchmarks
	$(BIN)/ruff check --fix gspo_cli tests benchmarks

test: setup lint
	$(BIN)/pytest -q tests

bench: setup
	$(BIN)/python benchmarks/rl_step_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
