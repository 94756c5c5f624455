# Two commands set up a fresh machine and run everything: `make demo`, `make test`.
# Both create (once) a local virtual environment in .venv with everything installed.
VENV   ?= .venv
PY     := $(VENV)/bin/python
# Without a CUDA driver the CPU build of torch is enough (the reference engine runs);
# with one, the default torch build and the GPU kernels' packages are installed.
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH  ?= $(if $(HAS_GPU),torch,torch==2.13.0)

.PHONY: demo test info venv clean bench test-gpu vendor-suite

$(VENV)/.installed: pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test,gpu,jax]"
	touch $@

venv: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) -m cudnn_ext demo

test: $(VENV)/.installed
	$(PY) -m pytest -q

info: $(VENV)/.installed
	$(PY) -m cudnn_ext info

# On a GPU machine: the benchmark behind README.md's table (writes benchmarks/results/<device>.json,
# replacing that device's previous result; see benchmarks/README.md) and the GPU test tier.
bench: $(VENV)/.installed
	$(PY) benchmarks/bench_dglu.py --reps 30 --warmup 5

test-gpu: $(VENV)/.installed
	$(PY) -m pytest -m gpu tests

# NVIDIA's own dGLU tests against cudnn_ext, from the folder tools/vendor_suite.py extract wrote
# (docs/api.md, "Running the vendor's test suite"); the summary goes to vendor-suite.json.
vendor-suite: $(VENV)/.installed
	$(PY) tools/vendor_suite.py run --tests .vendor-tests --out vendor-suite.json

clean:
	rm -rf $(VENV) .pytest_cache
