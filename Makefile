# payonce: `make run` brings up the whole stack, `make test` runs the whole suite. Both start from a clean
# clone: they create .venv, install what they need and migrate (the database is created if missing).
# `make run` installs only the stack (requirements.txt) and needs no root; `make test` adds the test
# packages (requirements-dev.txt), a chromium for the browser tests and PgBouncer for the tests behind one.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PORT   ?= 8000
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: python install install-dev browser pgbouncer migrate run test test-quick bench fuzz-api chaos chaos-upgrade chaos-pinned clean

# One line, before pip fails deep inside a package that needs a newer Python (macOS's python3 is 3.9).
python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "payonce needs Python 3.11 or newer, and '$(PYTHON)' is $$($(PYTHON) -c 'import platform; print(platform.python_version())' 2>/dev/null || echo 'not found'): name another, e.g. make run PYTHON=python3.12" >&2; exit 1; }

$(BIN)/python: | python
	$(PYTHON) -m venv $(VENV)

$(BIN)/.installed: requirements.txt | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

# The suite also drives the Python client library (clients/python), installed editable so a change to it
# is what the next run tests.
$(BIN)/.installed-dev: requirements-dev.txt clients/python/pyproject.toml $(BIN)/.installed
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ./clients/python
	touch $@

# The TypeScript client library's tests run on the machine's Node.js (18 or newer), with the packages its
# committed lock file names. Without npm this says so, and those tests fail saying the same.
TS_CLIENT := clients/typescript
$(TS_CLIENT)/node_modules/.installed: $(TS_CLIENT)/package-lock.json
	@if command -v npm >/dev/null; then \
	  cd $(TS_CLIENT) && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed; \
	else echo "npm not found: the TypeScript client's tests need Node.js 18 or newer with npm"; fi

install: $(BIN)/.installed

install-dev: $(BIN)/.installed-dev browser pgbouncer $(TS_CLIENT)/node_modules/.installed

# The browser tests drive an installed chromium through playwright, which never downloads one: CHROMIUM
# names it, else the first of chromium, chromium-browser, google-chrome on PATH. Where none is found and
# this is root on Debian or Ubuntu, Debian's chromium is installed; anywhere else this says how to get one,
# and the browser tests fail saying the same (tests/support/browser.py).
browser:
	@$(BIN)/python -m tests.support.browser --found >/dev/null 2>&1 || \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
	  else $(BIN)/python -m tests.support.browser --found; true; fi

# PgBouncer, for the tests of payonce behind one in transaction mode (tests/config/test_pgbouncer.py):
# Debian's package when run as root; anywhere else this says how to get it, and those tests fail saying
# the same.
pgbouncer:
	@command -v pgbouncer >/dev/null || test -x /usr/sbin/pgbouncer || \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends pgbouncer; \
	  else echo "pgbouncer not found: tests/config/test_pgbouncer.py needs it (Debian, Ubuntu: apt-get install pgbouncer; macOS: brew install pgbouncer)"; fi

migrate: install
	$(BIN)/python manage.py migrate --noinput

# honcho gives every process a PORT of its own (web 8000, worker 8100, ...): the links the worker writes
# into job outputs and emails must name the web process's port.
# The processes refuse the repository's development SECRET_KEY with DEBUG off (config.startup): unless
# SECRET_KEY is set, `make run` generates a random one into var/secret_key once (readable by its owner
# only) and every process of the stack reads it, so links mailed by one run still open after a restart.
# EMAIL_CONSOLE_LINKS: the printed report mail shows its link (config.mail), as the README says.
run: export PUBLIC_BASE_URL ?= http://127.0.0.1:$(PORT)
run: migrate
	mkdir -p var
	test -s var/secret_key || (umask 077 && $(BIN)/python -c "import secrets; print(secrets.token_urlsafe(50))" > var/secret_key)
	$(BIN)/python manage.py demo_client
	SECRET_KEY="$${SECRET_KEY:-$$(cat var/secret_key)}" LOG_FORMAT="$${LOG_FORMAT:-plain}" EMAIL_CONSOLE_LINKS="$${EMAIL_CONSOLE_LINKS:-1}" $(BIN)/python -m config.devrun -p $(PORT)

# The suite in two parts (docs/testing.md, "Running in parallel"). First every test not marked `alone`, on
# XDIST_WORKERS pytest-xdist workers, each with a Redis server, a test database and a PAYONCE_VAR_DIR of
# its own (tests/support/redis_server.py, tests/settings.py). Three workers on two cores: most of the
# suite waits on processes, HTTP and sleeps rather than computing (measured in docs/testing.md).
# --dist loadgroup hands out tests one by one (a long module is shared out, not left to one worker), but
# keeps an xdist_group's tests on one worker. Then the `alone` tests, serially, with the machine to
# themselves: the storms and the tests that measure load or timing. Exit status 5 (nothing selected, e.g.
# PYTEST_ARGS naming only tests of one part) is not a failure; make test fails if either part fails.
XDIST_WORKERS ?= 3
test: install-dev migrate
	@status=0; \
	$(BIN)/python -m pytest -n $(XDIST_WORKERS) --dist loadgroup -m "not alone" $(PYTEST_ARGS) || { s=$$?; [ $$s = 5 ] || status=$$s; }; \
	$(BIN)/python -m pytest -m alone $(PYTEST_ARGS) || { s=$$?; [ $$s = 5 ] || status=$$s; }; \
	exit $$status

# The inner loop, in under two minutes: no test that starts a process of its own (e2e: workers, web,
# subprocesses; tests/support/e2e_mark.py keeps the mark true), on two workers, stopping at the first
# failure. make test-quick PYTEST_ARGS=tests/executor narrows it to a folder; PYTEST_ARGS='-m "not storm
# and not fuzz and not browser"' brings the e2e tests back (their -m replaces this one).
test-quick: install-dev migrate
	$(BIN)/python -m pytest -n 2 --dist loadgroup -m "not e2e and not storm and not fuzz and not browser" -x -q $(PYTEST_ARGS)

# Every benchmark, one at a time, then one table of their figures into bench/README.md (bench/all.py).
bench: install-dev migrate
	$(BIN)/python bench/all.py $(BENCH_ARGS)

# tests/e2e/test_fuzz_api.py with 500 examples per operation: no 5xx, every answer as the schema says, no 4xx
# that wrote a row, queued a task or called a provider (tests/fuzz/api_schemathesis.py --help).
fuzz-api: install-dev migrate
	$(BIN)/python tests/fuzz/api_schemathesis.py

# The storm (tests/chaos): 500 paid jobs through faults, kills, a broker flush, and a restart of (and cut
# connections to) a PostgreSQL server of the storm's own (the machine's cluster is never touched),
# checked from the outside; prints one screen and fails if any check does. CHAOS_SEED=N replays a storm,
# BROKER=amqp runs it on RabbitMQ, HOSTS=1 puts every process in a network namespace of its own (root).
chaos: install-dev
	$(BIN)/python -m tests.chaos $(if $(BROKER),--broker $(BROKER)) $(if $(filter 1,$(HOSTS)),--hosts) $(CHAOS_ARGS)

# The upgrade storm (tests/chaos/upgrade.py): the stack starts on the previous release's code
# (deploy/previous-release, checked out under var/previous-release/), and while 150 paid jobs run, this
# release's migrations run, then web, the workers, webhooks and beat move to this checkout one at a time,
# the workers go back to the old code and forward again. CHAOS_SEED=N replays one.
chaos-upgrade: install-dev
	$(BIN)/python -m tests.chaos.upgrade $(CHAOS_ARGS)

# Every storm seed that once failed (tests/chaos/pinned.py), replayed one after another.
chaos-pinned: install-dev
	$(BIN)/python -m tests.chaos.pinned

clean:
	rm -rf $(VENV) var $(TS_CLIENT)/node_modules $(TS_CLIENT)/dist
