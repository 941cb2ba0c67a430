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

.PHONY: install lint types pytest test test-sqlite test-faults test-topologies test-all tox demo serve worker relay bench mutation docs clean

$(VENV)/.installed: requirements.txt setup.cfg
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt -e . "$(DJANGO)"
	touch $@

install: $(VENV)/.installed

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

types: install
	$(VENV)/bin/mypy

# Two pytest-xdist workers (XDIST=0 runs in one process), each on a test database and a Redis database of
# its own (tests/settings.py): most of the suite's time is spent waiting on workers, servers and the
# database, not on the cores. worksteal: a worker that runs out takes tests off the other's list.
XDIST ?= 2
PYTEST_XDIST := $(if $(filter 0,$(XDIST)),-p no:xdist,-n $(XDIST) --dist worksteal)

# --durations: the slowest tests, in every log. The fault scenarios (marked `faults`: they restart, kill
# or cut off servers of their own mid-burst) run in `make test-faults`, which `make test-all` and CI add.
# Their PostgreSQL failovers run on a Patroni cluster of their own: Debian's patroni and etcd-server
# packages are installed first if they are missing, as root (tests/patroni.py; docs/testing.md).
pytest: install
	$(VENV)/bin/pytest $(PYTEST_XDIST) -m "not faults and not topologies" --cov --cov-report=term-missing --durations=25

test-faults: install
	$(VENV)/bin/pytest $(PYTEST_XDIST) -m faults --durations=25

# Everything: make test, then the fault scenarios, then the topologies (CI runs this, with
# TOPOLOGY="pgbouncer-transaction pgbouncer-prepared").
test-all: test test-faults test-topologies

# The same suite on SQLite (row-lock tests skip themselves there).
# The fault scenarios start their own PostgreSQL and Redis whatever DATABASE_URL says, and the tests marked
# `once` use no database of the suite's (a wheel build, the demo's and the quick start's own projects):
# they run once, in the PostgreSQL pass.
test-sqlite: install
	DATABASE_URL=sqlite:///test.sqlite3 $(VENV)/bin/pytest $(PYTEST_XDIST) -q -m "not faults and not once and not topologies"

# The README's test command: lint, types, the suite on PostgreSQL with branch coverage, then on SQLite.
test: lint types pytest test-sqlite

# tests/test_topologies.py (the write path, the job path with a real rqworker, verify and purge) again
# under each other way of reaching PostgreSQL: through PgBouncer in transaction and in session mode (its
# own, on a free port; Debian's pgbouncer package is installed first if it is missing, as root), Django's
# connection pool, persistent connections. Each in a pytest of its own, on database <DATABASE_URL's>_topo.
# TOPOLOGY=pgbouncer-transaction (or several, "pgbouncer-transaction pgbouncer-prepared") runs those;
# docs/testing.md. pgbouncer-prepared builds PgBouncer 1.24 from Debian's source the first time (tests/pooler.py).
TOPOLOGY ?=
test-topologies: install
	$(VENV)/bin/pytest -q -p no:randomly --no-cov -m topologies tests/test_topologies.py \
		$(if $(TOPOLOGY),-k "$(subst $(space), or ,$(foreach topology,$(TOPOLOGY),[$(topology)]))")

# Every supported Django series on PostgreSQL and SQLite; a Python that is not installed is skipped.
# Pass tox arguments in TOXARGS, e.g. `make tox TOXARGS="-e py313-django61-postgres"`.
tox: install
	PATH="$(TOX_PATH)" $(VENV)/bin/tox $(TOXARGS)

# DELIVERY=tasks make demo: the same demo on Django tasks (django-tasks-db, db_worker), without Redis.
# DELIVERY=celery make demo: on the demo's Celery app with Celery prefork workers; its broker is the demo's
# Redis unless CELERY_BROKER_URL names another (amqp://guest:guest@127.0.0.1:5672// for RabbitMQ).
# The same DELIVERY for make serve.
demo: install
	@if [ "$(DELIVERY)" != "tasks" ]; then $(PY) -m demo_project.check_redis; fi
	$(PY) manage.py migrate --no-input -v 0
	$(PY) manage.py race_demo

serve: install
	@if [ "$(DELIVERY)" != "tasks" ]; then $(PY) -m demo_project.check_redis; fi
	$(PY) manage.py migrate --no-input -v 0
	$(PY) manage.py demo_user --keep-existing
	$(PY) manage.py demo_serve

# make bench: each operation against its naive equivalent (docs/benchmarks.md). make bench-latency: what a
# user waits at a steady load, a toggle's commit to the moment its row holds it, the app's path against the
# naive job it replaces, on RQ and Celery, 200 and 5 records (benchmarks/latency.py, about 6 minutes; it needs
# RabbitMQ for the Celery cells). LATENCYARGS="--cells rq-200,rq-200-plain --seconds 30" picks cells and times.
bench: install
	$(PY) benchmarks/bench.py

.PHONY: bench-latency
bench-latency: install
	$(PY) benchmarks/latency.py $(LATENCYARGS)

# update_if_newer(), save() and the drain against their naive ORM equivalents, directly and through a
# PgBouncer of its own in transaction mode, side by side (benchmarks/topology_bench.py; docs/benchmarks.md).
.PHONY: bench-topologies
bench-topologies: install
	$(PY) benchmarks/topology_bench.py $(TOPOLOGYARGS)

# At production size: per-operation costs over 0, 100k and 1M logged requests side by side, verify and
# purge at that size (docs/benchmarks.md). SCALEARGS="--quick" on a CI-sized machine, "--explain" for plans.
.PHONY: bench-scale
bench-scale: install
	$(PY) benchmarks/scale.py $(SCALEARGS)

# Mutation testing of the core modules with mutmut (not in CI: it takes hours; [mutmut] in setup.cfg).
# Needs PostgreSQL and Redis like make test. MUTATION_BUDGET=SECONDS stops the run after that long
# (an interrupt; killed two minutes later if it is still running: a test that runs an in-process RQ
# worker leaves RQ's own SIGINT handler in mutmut's process, which ignores the interrupt); stopped
# that way or with Ctrl-C, it still prints the figures so far, and the next run goes on from there.
# Prints the surviving mutants (`.venv/bin/mutmut show NAME` shows one) and the kill rate.
# MUTANTS="safeupdates.guard.* safeupdates.versions.*" runs only those mutants (names as listed).
# With DATABASE_URL=sqlite:... (the survivors of PostgreSQL named in MUTANTS) only the run's kills are
# saved: a mutant the SQLite pass kills is killed, but its "survived" never replaces PostgreSQL's verdict.
# The verdicts live on in MUTATION_RESULTS (in the repository; commit them): a run starts from those
# of earlier runs, on any machine, and checks only the mutants of functions changed since and those
# never checked (tests/mutation_report.py says how).
MUTATION_RESULTS ?= tests/mutation_results
MUTATION_BUDGET ?=
MUTANTS ?=
MUTMUT := $(VENV)/bin/mutmut

mutation: install
	$(PY) -m pip install --quiet -r requirements-mutation.txt
	$(PY) -m tests.mutation_report --restore $(MUTATION_RESULTS)
	@trap : INT; status=0; \
	PATH="$(abspath $(VENV))/bin:$$PATH" $(if $(MUTATION_BUDGET),timeout -s INT -k 120 $(MUTATION_BUDGET)) \
	    $(MUTMUT) run --max-children 1 \
	    $(foreach name,$(MUTANTS),'$(name)') || status=$$?; \
	$(MUTMUT) results; $(PY) -m tests.mutation_report --summary; \
	$(PY) -m tests.mutation_report --save $(MUTATION_RESULTS) $(if $(findstring sqlite,$(DATABASE_URL)),--kills-only); \
	[ $$status = 0 ] || [ $$status = 124 ] || [ $$status = 137 ] || exit $$status

# The documentation site (Sphinx + MyST) in docs/_build/html; any Sphinx warning fails the build.
# Its own venv, so that the docs tools never enter the test environment.
DOCS_VENV ?= .venv-docs

$(DOCS_VENV)/.installed: requirements-docs.txt setup.cfg
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(DOCS_VENV)/bin/python -m pip install --quiet -r requirements-docs.txt -e . "$(DJANGO)"
	touch $@

docs: $(DOCS_VENV)/.installed
	$(DOCS_VENV)/bin/sphinx-build -W --keep-going -b html docs docs/_build/html

clean:
	rm -rf $(VENV) demo.sqlite3 test.sqlite3 .coverage htmlcov .tox mutants
