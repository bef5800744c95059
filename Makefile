# The two commands (README): `make notebooks` runs the main job, `make test` runs the tests; `make docs` builds the site.
# Both create the virtual environment first when it is missing (or when requirements.txt changed).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PROFILE ?=
JOBS ?=
# the venv's bin first on PATH, so papermill's "python3" kernel is the venv's interpreter
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: notebooks test docs bench lab env clean-results

env: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q -r requirements.txt
	$(BIN)/python -m pip install --disable-pip-version-check -q --no-deps -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (fedlib)" >/dev/null
	touch $@

## main job: execute every notebook with papermill, drawing the stored paper-profile results (training only what is
## missing). PROFILE=quick|smoke explores (results in the git-ignored results/_explore/); STORED_ONLY=1 trains nothing;
## what trains runs one process per core unless JOBS=N says how many.
notebooks: env
	$(BIN)/python scripts/run_notebooks.py $(if $(PROFILE),--profile $(PROFILE)) \
	  $(if $(filter 1 true True yes,$(STORED_ONLY)),--stored-only) $(if $(JOBS),--jobs $(JOBS))

## tests: lint and format check (ruff); types (mypy over the layers pyproject.toml names); the docs site, built strictly; unit tests plus every notebook executed at the
## smoke profile (papermill, scratch store); then nbval re-executes the committed notebooks from the committed
## paper-profile store and compares their tables. A ../shared/data folder beside the clone is the data root of both
## when FEDLIB_DATA is unset (tests/conftest.py).
## (the tests that start Jupyter kernels or Ray, marked `ports`, pick TCP ports: they run one at a time, beside the
## rest on two workers; nbval too runs one kernel at a time)
test: env
	$(BIN)/ruff check fedlib tests scripts benchmarks notebooks/conftest.py
	$(BIN)/ruff format --check fedlib tests scripts benchmarks notebooks/conftest.py
	$(BIN)/mypy
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d build/site
	rm -rf build/test-results
	export FEDLIB_PROFILE=smoke FEDLIB_RESULTS=$(CURDIR)/build/test-results OMP_NUM_THREADS=1; \
	  $(BIN)/python -m pytest -p no:cacheprovider -m ports tests & ports=$$!; \
	  $(BIN)/python -m pytest -n 2 --dist loadfile -p no:cacheprovider --durations=25 -m "not ports" tests; rest=$$?; \
	  wait $$ports; ports=$$?; test $$rest -eq 0 && test $$ports -eq 0
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadfile -p no:cacheprovider notebooks --nbval \
	  --nbval-current-env

## the documentation site (mkdocs.yml: docs/ and the notebooks with their stored outputs) into build/site; strict: a
## broken link, anchor or API reference fails. (Not -q: mkdocs drops warnings under -q before --strict counts them.)
docs: env
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d build/site

## the benchmark (benchmarks/, outside the package): stacked vs per-client loop executor timings; --e2e for whole rounds
bench: env
	$(BIN)/python -m benchmarks

## JupyterLab on working copies of the notebooks (build/lab/): exploring never rewrites the committed ones, whose
## outputs nbval compares; each notebook's kernel starts without asking. PORT=8888 chooses the port, FRESH=1 copies
## the committed notebooks again over the working copies. Kernels train on one thread unless OMP_NUM_THREADS is set.
lab: env
	$(BIN)/python scripts/lab.py $(if $(PORT),--port $(PORT)) $(if $(filter 1 true yes,$(FRESH)),--fresh)

clean-results:
	rm -rf build/test-results results/_tmp-* results/_explore
