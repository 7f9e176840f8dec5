# Self-documenting Makefile: `make help` lists the targets.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help

help: ## Show this help
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (set PYTHON=...)"; exit 1; }
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned to the CPU build, so nothing pulls a CUDA wheel.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[dev,bench,sweep,docs]"
	touch $(STAMP)

venv: $(STAMP) ## Create .venv and install the project with its dev, bench, sweep and docs extras

train: $(STAMP) ## Train the default experiment (ppo_nav); pass extra overrides with ARGS="..."
	$(BIN)/python train.py +experiment=ppo_nav $(ARGS)

test: $(STAMP) ## Run the test suite (what CI runs)
	$(BIN)/python -m pytest -q $(ARGS)

docs: $(STAMP) ## Build the documentation site into site/ (strict: a broken link or reference fails)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

docs-serve: $(STAMP) ## Serve the documentation site with live reload (http://127.0.0.1:8000)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8000

lint: $(STAMP) ## ruff check + format check + import contracts (layers, no cycles)
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/lint-imports --no-cache

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

.PHONY: help venv train test docs docs-serve lint format smoke sweep-dry bench clean-outputs
