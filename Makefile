# Two entry points, each installing what it needs into .venv first:
#   make book   build the executed book into _build/html (warnings are errors)
#   make test   pytest over tests/ and nbval over the committed outputs of book/

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

.PHONY: book test clean

book: $(VENV)/.installed
	mkdir -p $(IPYTHONDIR) $(MPLCONFIGDIR)
	$(VENV)/bin/jupyter-book build . -W

test: $(VENV)/.installed
	mkdir -p $(IPYTHONDIR) $(MPLCONFIGDIR)
	$(PYTHON) -m pytest tests book --nbval --nbval-sanitize-with book/sanitize.cfg

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

clean:
	rm -rf _build
