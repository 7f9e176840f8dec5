# Self-documenting Makefile: `make help` lists the targets.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
LOCK   := requirements.lock

.DEFAULT_GOAL := help

help: ## Show this help
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml $(LOCK)
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (set PYTHON=...)"; exit 1; }
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	# Every package at the version requirements.lock names (torch's is the CPU build, so nothing
	# pulls a CUDA wheel): pip and setuptools first, then the project in place with its extras.
	$(BIN)/pip install --quiet -c $(LOCK) pip setuptools
	$(BIN)/pip install --quiet --no-compile -c $(LOCK) --no-build-isolation -e ".[dev,bench,sweep,docs]"
	# Byte-compiled on every core (pip compiles one file at a time: 50 s of the 88 s here, on 2
	# cores). A file written for a newer Python (torch's py312 test helper) does not compile and
	# stays source, as pip leaves it: not an error.
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib || true
	# The environment is exactly the lock: pip freeze equals it, and pip check finds nothing.
	$(BIN)/python tools/lock.py check
	touch $(STAMP)

venv: $(STAMP) ## Create .venv: the project with its dev, bench, sweep and docs extras, at the lock's versions

lock: ## Regenerate requirements.lock from pyproject.toml (newest versions its ranges allow); prints what changed
	$(PYTHON) tools/lock.py write

train: $(STAMP) ## Train the default experiment (ppo_nav); pass extra overrides with ARGS="..."
	$(BIN)/python train.py +experiment=ppo_nav $(ARGS)

# The project's own modules byte-compiled first: where PYTHONDONTWRITEBYTECODE is set (this
# machine's shell and CI), every one of the suite's ~300 interpreters (CLI runs, DDP ranks,
# workers, benchmarks) would otherwise compile rl/ from source as it imports it (~0.2 s each).
test: $(STAMP) ## Run the test suite (what CI runs)
	$(BIN)/python -m compileall -qq -j 0 rl rl_envs tests bench tools train.py evaluate.py
	$(BIN)/python -m pytest -q $(ARGS)

# No --quiet: mkdocs stops counting warnings under it, and --strict then never fails
# (tests/test_docs_gate.py builds a page with a broken anchor through this recipe).
docs: $(STAMP) ## Build the documentation site into site/ (strict: a broken link or reference fails)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(STAMP) ## Serve the documentation site with live reload (http://127.0.0.1:8000)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8000

LINT_PATHS := rl rl_envs tests bench tools train.py evaluate.py

lint: $(STAMP) ## Lint: ruff, format check, mypy, import contracts
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/mypy rl rl_envs
	$(BIN)/lint-imports --no-cache

format: $(STAMP) ## Format the code with ruff
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

smoke: $(STAMP) ## A tiny end-to-end training run
	$(BIN)/python train.py +experiment=ppo_nav +debug=smoke

sweep-dry: $(STAMP) ## Show the composed ppo_nav config, resolved
	$(BIN)/python train.py +experiment=ppo_nav --cfg job --resolve

bench: $(STAMP) ## Training-throughput benchmark: ours vs stable-baselines3
	$(BIN)/python bench/train_fps.py $(ARGS)

clean-outputs: ## Remove outputs/, local wandb files and the built site
	rm -rf outputs wandb site

.PHONY: help venv lock train test docs docs-serve lint format smoke sweep-dry bench clean-outputs
