# payonce: `make run` brings up the whole stack, `make test` runs the whole suite. Both start from a clean
# clone: they create .venv, install requirements.txt and migrate (the database is created if missing).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PORT   ?= 8000
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: install migrate run test bench fuzz-api chaos chaos-pinned clean

$(BIN)/.installed: requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	@# The report page's browser test drives Debian's chromium (never a downloaded browser).
	test -x /usr/bin/chromium || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium)
	touch $@

install: $(BIN)/.installed

migrate: install
	$(BIN)/python manage.py migrate --noinput

# honcho gives every process a PORT of its own (web 8000, worker 8100, ...): the links the worker writes
# into job outputs and emails must name the web process's port.
# The processes refuse the repository's development SECRET_KEY with DEBUG off (config.startup): unless
# SECRET_KEY is set, `make run` generates a random one into var/secret_key once (readable by its owner
# only) and every process of the stack reads it, so links mailed by one run still open after a restart.
run: export PUBLIC_BASE_URL ?= http://127.0.0.1:$(PORT)
run: migrate
	mkdir -p var
	test -s var/secret_key || (umask 077 && $(BIN)/python -c "import secrets; print(secrets.token_urlsafe(50))" > var/secret_key)
	$(BIN)/python manage.py demo_client
	SECRET_KEY="$${SECRET_KEY:-$$(cat var/secret_key)}" $(BIN)/honcho start -f Procfile -p $(PORT)

test: migrate
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Every benchmark, one at a time, then one table of their figures into bench/README.md (bench/all.py).
bench: migrate
	$(BIN)/python bench/all.py $(BENCH_ARGS)

# tests/test_fuzz_api.py with 500 examples per operation: no 5xx, every answer as the schema says, no 4xx
# that wrote a row, queued a task or called a provider (tests/fuzz/api_schemathesis.py --help).
fuzz-api: migrate
	$(BIN)/python tests/fuzz/api_schemathesis.py

# The storm (tests/chaos): 500 paid jobs through faults, kills, a broker flush, and a restart of (and cut
# connections to) a PostgreSQL server of the storm's own (the machine's cluster is never touched),
# checked from the outside; prints one screen and fails if any check does. CHAOS_SEED=N replays a storm,
# BROKER=amqp runs it on RabbitMQ, HOSTS=1 puts every process in a network namespace of its own (root).
chaos: install
	$(BIN)/python -m tests.chaos $(if $(BROKER),--broker $(BROKER)) $(if $(filter 1,$(HOSTS)),--hosts) $(CHAOS_ARGS)

# Every storm seed that once failed (tests/chaos/pinned.py), replayed one after another.
chaos-pinned: install
	$(BIN)/python -m tests.chaos.pinned

clean:
	rm -rf $(VENV) var
