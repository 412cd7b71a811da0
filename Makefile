# The course's commands. Each one creates the virtual environment (.venv) if there is none and
# installs the requirements and the library into it; an installed torch is left as it is.
#   make book     build the HTML book into _build/html
#   make test     library tests and every notebook through nbval
#   make lab      JupyterLab on the notebooks
#   make outputs  re-execute every notebook in place on the best device present
#   make student  student copies of the notebooks (solutions removed) in _build/student

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Real data sets: read from $GPUFORMER_DATA if set, else from a shared data folder beside the
# repository if there is one (as in CI), else from data/ (downloaded there when missing).
export GPUFORMER_DATA ?= $(if $(wildcard ../shared/data),$(abspath ../shared/data),)

.PHONY: book test lab outputs student clean

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "the course needs Python 3.10 or newer; set PYTHON=python3.X")'
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) requirements.txt pyproject.toml
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	@touch $@

book: $(STAMP)
	$(VENV)/bin/jupyter-book build . --warningiserror
	@echo "Open _build/html/index.html"

test: $(STAMP)
	$(PY) -m pytest

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

outputs: $(STAMP)
	$(PY) -m gpuformer_lib.tools.execute

student: $(STAMP)
	$(PY) -m gpuformer_lib.tools.student _build/student

clean:
	rm -rf _build
