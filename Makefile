# Set-up is automatic: every target creates .venv and installs what it needs on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# .venv (make test, demo, bench) runs Django 5.2 LTS; tox runs every supported series (tox.ini).
DJANGO ?= Django>=5.2,<6.0
# tox also finds Python 3.12 and 3.13 installed by pyenv (pyenv's shims answer only for the selected one).
PYENV_BINS := $(wildcard $(HOME)/.pyenv/versions/3.1[1-9]*/bin)
empty :=
space := $(empty) $(empty)
TOX_PATH := $(PATH)$(subst $(space),,$(foreach dir,$(PYENV_BINS),:$(dir)))

.PHONY: install lint types pytest test test-sqlite tox demo serve worker relay bench clean

$(VENV)/.installed: requirements.txt setup.cfg
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt -e . "$(DJANGO)"
	touch $@

install: $(VENV)/.installed

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

types: install
	$(VENV)/bin/mypy

pytest: install
	$(VENV)/bin/pytest --cov --cov-report=term-missing

# The same suite on SQLite (row-lock tests skip themselves there).
test-sqlite: install
	DATABASE_URL=sqlite:///test.sqlite3 $(VENV)/bin/pytest -q

# The README's test command: lint, types, the suite on PostgreSQL with branch coverage, then on SQLite.
test: lint types pytest test-sqlite

# Every supported Django series on PostgreSQL and SQLite; a Python that is not installed is skipped.
# Pass tox arguments in TOXARGS, e.g. `make tox TOXARGS="-e py313-django61-postgres"`.
tox: install
	PATH="$(TOX_PATH)" $(VENV)/bin/tox $(TOXARGS)

demo: install
	@$(PY) -m demo_project.check_redis
	$(PY) manage.py migrate --no-input -v 0
	$(PY) manage.py race_demo

serve: install
	@$(PY) -m demo_project.check_redis
	$(PY) manage.py migrate --no-input -v 0
	$(PY) manage.py demo_user --keep-existing
	$(PY) manage.py demo_serve

bench: install
	$(PY) benchmarks/bench.py

clean:
	rm -rf $(VENV) demo.sqlite3 test.sqlite3 .coverage htmlcov .tox
