# payonce: `make run` brings up the whole stack, `make test` runs the whole suite. Both start from a clean
# clone: they create .venv, install requirements.txt and migrate (the database is created if missing).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PORT   ?= 8000
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: install migrate run test bench clean

$(BIN)/.installed: requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

install: $(BIN)/.installed

migrate: install
	$(BIN)/python manage.py migrate --noinput

run: migrate
	mkdir -p var
	$(BIN)/python manage.py demo_client
	$(BIN)/honcho start -f Procfile -p $(PORT)

test: migrate
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: migrate
	$(BIN)/python bench/api_create.py
	$(BIN)/python bench/e2e_throughput.py
	$(BIN)/python bench/in_flight.py
	$(BIN)/python bench/executor_overhead.py
	$(BIN)/python bench/webhooks.py

clean:
	rm -rf $(VENV) var
