# Two commands set up a fresh machine and run everything: `make demo`, `make test`.
# Both create (once) a local virtual environment in .venv with everything installed.
VENV   ?= .venv
PY     := $(VENV)/bin/python
# Without a CUDA driver the CPU build of torch is enough (the reference engine runs);
# with one, the default torch build and the GPU kernels' packages are installed.
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH  ?= $(if $(HAS_GPU),torch,torch==2.13.0)
# Without a GPU, torch's CPU build from PyTorch's own index (PyPI's torch is the CUDA build);
# where that index cannot be reached, whatever pip finds for the pin.
TORCH_INDEX ?= $(if $(HAS_GPU),,https://download.pytorch.org/whl/cpu)
# TorchTitan for its tests and benchmarks, without its training stack (datasets, wandb,
# tensorboard, ...): the package and what its model and MoE modules import. Python 3.11+.
TITAN      ?= torchtitan>=0.3,<0.4
TITAN_DEPS ?= spmd_types tyro triton
# pytest workers for the CPU suite: one per core, at most 4 (each compiles kernels on the CPU)
JOBS   ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)

.PHONY: demo test test-fast info venv clean bench test-gpu vendor-suite

$(VENV)/.installed: pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(if $(TORCH_INDEX),$(PY) -m pip install -q --retries 1 --timeout 20 --index-url $(TORCH_INDEX) "$(TORCH)" || )$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test,gpu,jax]"
	$(PY) -m pip install -q --no-deps "$(TITAN)" && $(PY) -m pip install -q $(TITAN_DEPS) \
	  || echo "torchtitan not installed (it needs Python 3.11+): tests/integrations skip"
	touch $@

venv: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) -m cudnn_ext demo

# Everything the CPU can run, the compile tier included (it compiles every Hopper kernel
# variant the engines can select, on the CPU: most of the time). --durations says where it goes.
test: $(VENV)/.installed
	$(PY) -m pytest -q -n $(JOBS) --durations=15

# The same without the compile tier (tests/compile): the contract, the reference engine,
# planning, the graph API, torch/JAX bindings and TorchTitan, in a few minutes.
test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -n $(JOBS) --durations=10 --ignore=tests/compile

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
