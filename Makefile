# The course's commands. Each one creates the virtual environment (.venv) if there is none and
# installs the requirements and the library into it (make book: only what the build needs; make gpu-check:
# nothing); an installed torch is left as it is.
#   make book     build the HTML book into _build/html; installs only what the build needs
#                 (requirements-book.txt: no torch, no library), since the book never executes the notebooks
#   make test     library tests and every notebook through nbval, then every notebook again under the
#                 rehearsed T4 profile, and under the H100 and 8xH100 profiles those whose path they change:
#                 the GPU branches run on the CPU at toy sizes, so a bug in them fails here
#   make gpu-check PYTHON=python3   on a machine with an NVIDIA GPU, with the Python that has its CUDA torch (no
#                 venv is made, nothing installed: fine offline): the GPU suite, the GPU tests, compiled Triton
#                 kernels, the ladder, the workers on NCCL and the notebooks (where Jupyter is installed), within
#                 BUDGET seconds (default 510); writes bench_results/gpu-check-<gpu>.json after each item
#   make lab      JupyterLab on the notebooks
#   make outputs  re-execute every notebook in place on the best device present (DEVICE=cuda: fail without one), at
#                 the book run size (GPUFORMER_RUN=book: the case studies train until their models learn, up to
#                 about 25 minutes each on a CPU); ONLY="notebooks/15_*.ipynb" runs some; RUN=small stores a small run
#   Every other command runs the notebooks at the small run size (GPUFORMER_RUN=small: seconds, every code path).
#   make student  student copies of the notebooks (solutions removed) in _build/student
#   make clean    remove the build outputs in _build, keeping _build/student (the learners' working copies)
#   make format   wrap the notebooks' code to the book's column (black, 79 characters; tests check the width)
#   make grade SUBMISSIONS=dir [OUT=dir]   grade a class's notebooks (one folder or .ipynb per student):
#                 OUT/grades.csv and OUT/feedback/<student>.md, OUT defaults to _build/grades

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# make book's own stamp: requirements-book.txt installed (a subset of requirements.txt, so after STAMP's
# rule its install only finds every package already there)
BOOK_STAMP := $(VENV)/.installed-book
# Real data sets: read from $GPUFORMER_DATA if set, else from a shared data folder beside the
# repository if there is one (as in CI), else from data/ (downloaded there when missing). The rule is
# gpuformer_lib.data.data_dir()'s, so notebooks run without make agree; exporting it here also hands it
# to the tools that pass $GPUFORMER_DATA on (the grader's sandbox).
export GPUFORMER_DATA ?= $(if $(wildcard ../shared/data),$(abspath ../shared/data),)

# Two notebooks at a time (each kernel on one thread): on 2 cores the whole run stays under 20 minutes.
JOBS       ?= 2
REHEARSALS ?= t4 h100-80gb 8xh100
ifeq ($(JOBS),1)
PYTEST     := $(PY) -m pytest -p no:cacheprovider
else
PYTEST     := OMP_NUM_THREADS=1 $(PY) -m pytest -p no:cacheprovider
endif

.PHONY: book test rehearse lab outputs student grade format gpu-check clean

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "the course needs Python 3.10 or newer; set PYTHON=python3.X")'
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) requirements.txt pyproject.toml
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	@touch $@

# pip without --quiet: a first `make book` shows each package as it comes (about 90 packages, no torch).
$(BOOK_STAMP): $(PY) requirements-book.txt
	@echo "make book, step 1 of 2: installing what building the book needs (requirements-book.txt; no torch) into $(VENV)"
	$(PY) -m pip install --disable-pip-version-check -r requirements-book.txt
	@touch $@

book: $(BOOK_STAMP)
	@echo "make book, step 2 of 2: building the HTML book from the outputs stored in the notebooks (it runs none of them)"
	$(VENV)/bin/jupyter-book build . --warningiserror
	@echo "Open _build/html/index.html"

# Each part of test and rehearse starts with a line "== <part> @<seconds since 1970>": .ci/run reads them to say
# how long each part took.
# The notebooks run at the CPU preset's sizes on whatever device is there (make test checks that every cell runs;
# gpu-check and the GPU suite measure): on a GPU machine their own choice, the gpu preset, would take chapters 13
# and 14 past nbval's limits. $GPUFORMER_PRESET, or TEST_PRESET=gpu-small, chooses another; TEST_PRESET= (empty)
# leaves each notebook its own choice. On a CPU the sizes are the same either way.
TEST_PRESET ?= $(if $(GPUFORMER_PRESET),$(GPUFORMER_PRESET),cpu)
test: $(STAMP)
	@echo "== library tests and notebooks @$$(date +%s)"
	$(if $(TEST_PRESET),GPUFORMER_PRESET=$(TEST_PRESET) )$(PYTEST) -n $(JOBS) --dist loadfile
	$(MAKE) --no-print-directory rehearse

# The same notebook cells under each rehearsed GPU profile (see gpuformer_lib/profiles.py), one profile after
# another. Each rehearsal notes which fields of the profile every notebook read; a later profile rehearses only
# the notebooks that read, under an earlier one, a field the two profiles set differently (the others would run
# the same code on the same values again): see gpuformer_lib/tools/rehearsal_plan.py, which says why for each.
# A path another test rehearses more cheaply may be left out, said in the plan: one "PROFILE:NOTEBOOK:WHY".
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9]*.ipynb))
REHEARSE_LEAVE_OUT := "8xh100:notebooks/13_translation_case_study.ipynb:its 8-rank path is the translation worker, \
which tests/test_translation_worker.py runs on 8 ranks under this profile"
rehearse: $(STAMP)
	@reads=$$(mktemp -d); trap 'rm -rf "$$reads"' EXIT; \
	for profile in $(REHEARSALS); do \
	  echo "== rehearsing the $$profile profile on the CPU @$$(date +%s)"; \
	  books=$$($(PY) -m gpuformer_lib.tools.rehearsal_plan "$$reads" --profile $$profile \
	    $(if $(REHEARSE_LEAVE_OUT),--leave-out $(REHEARSE_LEAVE_OUT)) $(NOTEBOOKS)) || exit 1; \
	  [ -z "$$books" ] || GPUFORMER_REHEARSE=$$profile GPUFORMER_PROFILE_READS="$$reads/$$profile" \
	    $(PYTEST) -n $(JOBS) --dist loadfile -q $$books || exit 1; \
	done
	@echo "== rehearsals done @$$(date +%s)"

# Runs with $(PYTHON) as it is, from this folder (python -m puts it on sys.path; gpu_check hands it on to what it
# starts): no venv, no pip, so an offline GPU node's preinstalled CUDA torch is used (make gpu-check PYTHON=python3;
# PYTHON=.venv/bin/python for this repository's venv). BUDGET: the whole check's seconds (default 510, about 9
# minutes with start-up); GPU_CHECK_ARGS: more options (--quick, --suite-budget S, --out DIR; see --help).
gpu-check:
	$(PYTHON) -m gpuformer_lib.tools.gpu_check $(if $(BUDGET),--budget $(BUDGET)) $(GPU_CHECK_ARGS)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

# The run size (gpuformer_lib/book_run.py): make outputs stores the book run; the targets that check or hand out
# notebooks run the small one whatever the shell exports.
RUN ?= book
outputs: $(STAMP)
	GPUFORMER_RUN=$(RUN) $(PY) -m gpuformer_lib.tools.execute $(if $(DEVICE),--device $(DEVICE)) $(ONLY)

test rehearse grade student gpu-check: export GPUFORMER_RUN := small

student: $(STAMP)
	$(PY) -m gpuformer_lib.tools.student _build/student

# Each notebook in its own sandboxed process on the CPU; see gpuformer_lib/tools/grade.py and book/instructor_guide.md.
grade: $(STAMP)
	@test -n "$(SUBMISSIONS)" || { echo "make grade needs SUBMISSIONS=<folder holding one folder or one .ipynb per student>" >&2; exit 2; }
	$(PY) -m gpuformer_lib.tools.grade "$(SUBMISSIONS)" --out "$(or $(OUT),_build/grades)" --jobs $(JOBS)

# 79 characters: what the book's code column shows at 1280 px (tests/test_notebook_style.py); string splitting
# is black's preview feature, so long messages are wrapped too. Changing code means re-executing (make outputs).
format: $(STAMP)
	$(PY) -m black --quiet --line-length 79 --preview --enable-unstable-feature string_processing notebooks/

# Removes the build outputs in _build (the book's html/, jupyter_execute/, .doctrees/, grades/, screenshots/...)
# but keeps _build/student: make student writes the learners' copies there and they work in them.
clean:
	if [ -d _build ]; then find _build -mindepth 1 -maxdepth 1 ! -name student -exec rm -rf {} +; fi
