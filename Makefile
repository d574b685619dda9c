# The two commands of the README. Each installs what it needs into .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint bench clean deb

$(STAMP): pyproject.toml shm/_atomic.c shm/_queues_api.h shm/_record.h shm/_scan.h workers/_wire.c workers/_mqtt_wire.c workers/_mqtt_publish.h workers/_mqtt_flush.h workers/_lane_account.h workers/_ack_defer.h workers/_lane_device.h workers/_ack_read.h workers/_attrs.h workers/_barrier.h workers/_waker.h workers/_mqtt_front.h workers/_watched_pull.h
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

## Start the broker with sane defaults (0.0.0.0:5672, one IO worker per CPU).
run: $(STAMP)
	$(VENV)/bin/shoal $(ARGS)

## Run the test suite (unit, shared-memory races, integration with real clients).
## On as many processes as there are CPUs, up to 4 (pytest-xdist): most of a
## test's time is a broker starting, stopping, or waiting on a socket. ARGS="-n 0"
## runs it in one process (pdb, -s).
test: $(STAMP)
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist worksteal $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check broker workers shm store perf spark tests bench interop grafana
	$(VENV)/bin/ruff format --check broker workers shm store perf spark tests bench interop grafana
	@# The packages as shoal.*: through the links the editable install made
	@# (.build/import, pyproject [tool.mypy]).
	$(VENV)/bin/mypy

## Side-by-side throughput against RabbitMQ (needs rabbitmq-server installed).
bench: $(STAMP)
	$(PY) bench/compare.py --start-shoal --start-rabbitmq $(ARGS)

## A Debian package of this tree: dist/shoal_<version>_<arch>.deb (deploy/debian).
deb:
	bash deploy/debian/build.sh

clean:
	rm -rf $(VENV) build .build dist *.egg-info shm/*.so
