# Two commands for a fresh machine with Python 3.11+:
#   make run   - the whole service with a demo (embedded PostgreSQL where none is configured)
#   make test  - linter and every test, against real PostgreSQL (pytest-xdist, one worker per core)
#   make test PYTEST_ARGS="-m 'not e2e'"  - the fast tier only: no live server, worker, agent, browser
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000

.PHONY: run test lint venv clean-var help bench

help:
	@echo "make run    start the service with a demo fleet (PORT=$(PORT))"
	@echo "make test   install test needs, lint, run the whole suite (xdist: PYTEST_WORKERS=auto; 0 = one process)"
	@echo "make test PYTEST_ARGS=\"-m 'not e2e'\"   the fast tier only (e2e: live server, Celery worker, agents,"
	@echo "           browser, Prometheus, transactional_db; set in tests/conftest.py); PYTEST_ARGS go to pytest"
	@echo "make bench  every benchmark -> bench/results/*.json (BENCH_ARGS=--quick: smoke sizes, minutes)"

$(VENV)/.installed: requirements.txt requirements-dev.txt pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required, found " + sys.version' 
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt -r requirements-dev.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .  # gpubroker (docs/cli.md)
	@touch $@

venv: $(VENV)/.installed

run: venv
	$(PY) -m infra.run --port $(PORT)

test: venv
	$(PY) -m infra.test $(PYTEST_ARGS)

bench: venv
	$(PY) -m bench all $(BENCH_ARGS)

lint: venv
	$(VENV)/bin/ruff check .

clean-var:
	@echo "var/ holds the embedded database and demo credentials; remove it by hand if you mean it: rm -rf var"
