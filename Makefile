# Bootstraps .venv on first use; `make demo` and `make test` are the README's two commands.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Override to pick another torch, e.g. `make test TORCH_CONSTRAINTS=/dev/null`.
TORCH_CONSTRAINTS ?= constraints-cpu.txt
# Parallel by default (one worker per core); `make test PYTEST_ARGS="-n 0"` runs serially.
PYTEST_ARGS ?= -n auto

.PHONY: venv demo test lint format bench examples docs clean mutation

$(BIN)/.installed: pyproject.toml $(TORCH_CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c $(TORCH_CONSTRAINTS) -e '.[test]'
	touch $@

venv: $(BIN)/.installed

demo: venv
	$(BIN)/python examples/demo.py

test: venv
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check autoopt rules tests examples benchmarks
	$(BIN)/ruff format --check autoopt rules tests benchmarks

format: venv
	$(BIN)/ruff check --fix autoopt rules tests examples benchmarks
	$(BIN)/ruff format autoopt rules tests benchmarks

# Regenerate examples/rewritten/ from examples/naive/ with the current rules (a test checks it).
examples: venv
	rm -rf examples/rewritten && cp -r examples/naive examples/rewritten
	$(BIN)/autoopt rewrite --unsafe-fixes examples/rewritten

# Regenerate docs/rules.md (where every rule's URL points) from the rules' docstrings.
docs: venv
	mkdir -p docs && $(BIN)/autoopt rules --output-format markdown > docs/rules.md

bench: venv
	$(BIN)/python -m autoopt bench

# Mutation testing of the critical modules, one module at a time with its own fast tests (minutes
# each; not in CI). `make mutation MODULES="loss_scaling device_loader"` runs a few.
# Scores and the equivalent survivors: docs/benchmarks/mutation.md.
MODULES ?=
mutation: venv
	$(BIN)/python -m pip install -q -c $(TORCH_CONSTRAINTS) -e '.[mutation]'
	$(BIN)/python -m benchmarks.mutation $(MODULES)

clean:
	rm -rf $(VENV) .autoopt_cache .pytest_cache build *.egg-info mutants
