# The two commands (README): `make notebooks` runs the main job, `make test` runs the tests.
# Both create the virtual environment first when it is missing (or when requirements.txt changed).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PROFILE ?=
# the venv's bin first on PATH, so papermill's "python3" kernel is the venv's interpreter
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: notebooks test bench lab env clean-results

env: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q -r requirements.txt
	$(BIN)/python -m pip install --disable-pip-version-check -q --no-deps -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (fedlib)" >/dev/null
	touch $@

## main job: execute every notebook with papermill (PROFILE=smoke|quick|paper; default quick)
notebooks: env
	$(BIN)/python scripts/run_notebooks.py $(if $(PROFILE),--profile $(PROFILE))

## tests: lint and format check (ruff), unit tests, then nbval over every notebook at the smoke profile (results in a
## scratch store)
test: env
	$(BIN)/ruff check fedlib tests scripts
	$(BIN)/ruff format --check fedlib tests scripts
	rm -rf build/test-results
	FEDLIB_PROFILE=smoke FEDLIB_RESULTS=$(CURDIR)/build/test-results OMP_NUM_THREADS=1 \
	  $(BIN)/python -m pytest -n 2 --dist loadfile -p no:cacheprovider tests notebooks --nbval --nbval-current-env

## stacked vs per-client loop executor timings
bench: env
	$(BIN)/python -m fedlib.bench

lab: env
	$(BIN)/jupyter lab notebooks/

clean-results:
	rm -rf build/test-results results/_tmp-*
