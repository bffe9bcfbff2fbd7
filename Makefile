# Two commands do all the set-up on a fresh machine:
#   make demo   runs the whole pipeline on the embedded demo world (make demo SEEDS=3: three seeds,
#               reported as mean ± std in runs/demo/eval-seeds)
#   make demo-paragraph   the paper's second task on the demo world: paragraph-only baseline vs CLID
#               (data/demo-paragraph, runs/demo-paragraph)
#   make demo-compare   CLID against loss-based curation and a curriculum on the demo world, with its ground
#               truth (runs/demo-compare; SEEDS=3 as for make demo; TABLES=docs/measurements/<date>-demo also
#               writes the README's tables there, with SEEDS > 1: the evidence run of docs/demo-notes.md)
#   make checkpoint   a quick checkpoint: the demo world, its self-generated captions (03 --model sentences),
#               then one model trained 2,000 steps with 04 --recipe demo on one thread (runs/quick/model;
#               [quick] in recipes/demo.toml). Measured in a fresh clone on a 2-core machine, one other
#               one-thread job running: 13.1 minutes, set-up included (2026-11-29); on 2 cores loaded by
#               other jobs (load 5 to 7) 04 runs at half the speed: about 32 minutes
#   make test   runs the test suite (and compile-checks the CUDA sources when nvcc is present), import-linter
#               and ruff
#   make test-fast   the tests not marked slow, for the edit-test loop (tests/README.md; 124 s on 2 cores at
#               load 1 to 3, 2026-12-06); make test runs everything, the bad-input table included
#   make app   the web page's optional install (python -m clid.app; docs/running.md): pyproject.toml's app extra
#               (gradio) into .venv, with torch held at its pin; gradio needs pillow < 13, so it replaces
#               requirements.txt's pillow 13.0.0 by 12.3.0
#   make app-check   make app, Debian's chromium (apt, as root, where missing), then the page's tests
#               (tests/caption/test_app.py: its HTTP API and a screenshot in headless Chromium)
#   make slurm-check   the SLURM recipe (slurm/) on a real one-machine Slurm, started and stopped here: as root,
#               installs Debian's slurmctld, slurmd, slurm-client and munge where missing (tests/system/slurm/check.sh;
#               CHECK_NODES=0 leaves out its 2-node training runs, CHECK_KILL=0 the one whose rank 1 is killed)
# All create and fill .venv on first use: the pinned requirements, then this package with its
# C++/CUDA extension clid._C (pip install --no-build-isolation -e .), rebuilt when csrc/ changes.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO   ?= data/demo
RUNS   ?= runs/demo
CHECKPOINT ?= runs/quick
SEEDS  ?= 1
TABLES ?=
# pytest-xdist workers of make test
TEST_JOBS ?= 2

export TOKENIZERS_PARALLELISM := false

CSRC   := $(shell find csrc -name '*.cpp' -o -name '*.h' -o -name '*.cu') setup.py pyproject.toml

.PHONY: all venv test test-fast lint app app-check slurm-check demo demo-paragraph demo-compare checkpoint cuda-check clean

all: test

venv: $(STAMP)

$(STAMP): requirements.txt $(CSRC)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet -r requirements.txt
	$(VENV)/bin/pip install --quiet --no-build-isolation -e .
	touch $(STAMP)

test: $(STAMP) cuda-check lint
	$(PY) -m pytest -q -n $(TEST_JOBS) tests

test-fast: $(STAMP) lint
	$(PY) -m pytest -q -n $(TEST_JOBS) -m "not slow" tests

lint: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/ruff check .

APP_STAMP := $(VENV)/.app-installed

app: $(APP_STAMP)

# (the extra alone, read from pyproject.toml: `pip install -e .[app]` would build clid._C again)
$(APP_STAMP): $(STAMP) pyproject.toml
	grep '^torch==' requirements.txt > $(VENV)/torch-pin.txt
	$(PY) -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['app'])" \
		| xargs $(VENV)/bin/pip install --quiet -c $(VENV)/torch-pin.txt
	$(VENV)/bin/pip check
	touch $(APP_STAMP)

app-check: app
	command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] || { echo "error: installing chromium needs root" >&2; exit 1; }; \
		apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; }
	$(PY) -m pytest -q -rs tests/caption/test_app.py

slurm-check: $(STAMP)
	bash tests/system/slurm/check.sh

cuda-check:
	bash csrc/check_cuda.sh

demo: $(STAMP)
	SEEDS=$(SEEDS) bash demo.sh $(DEMO) $(RUNS)

checkpoint: $(STAMP)
	QUICK=1 bash demo.sh $(DEMO) $(CHECKPOINT)

demo-paragraph: $(STAMP)
	TASK=paragraph SEEDS=$(SEEDS) bash demo.sh $(DEMO)-paragraph $(RUNS)-paragraph

demo-compare: $(STAMP)
	COMPARE=1 SEEDS=$(SEEDS) TABLES=$(TABLES) bash demo.sh $(DEMO) $(RUNS)-compare

clean:
	rm -rf $(VENV) build .pytest_cache clid/_C*.so *.egg-info
