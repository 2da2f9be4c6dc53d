# Fire-Flyer developer actions. `make help` lists them.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
STATE  ?= .ff
PYTEST_ARGS ?=
# pytest-xdist workers (`auto`: one per CPU; tests start their own servers on free ports, in their
# own temp dirs and PostgreSQL schemas).  0, the default, runs them in one process: on two workers a
# mgmtd test once hung until its 120 s timeout inside grpc's asyncio event loop (README, 31st VM)
PYTEST_WORKERS ?= 0

.DEFAULT_GOAL := help
.PHONY: help setup test demo up down status proto lint bench clean

help: ## list the developer actions
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  make %-8s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,torch]'
	$(PY) -m fireflyer.api.build
	$(PY) -m fireflyer.hfreduce.precompile
	@# the dashboard's browser test (tests/e2e/test_dashboard.py) needs chromium; under CI it fails without it
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { command -v apt-get >/dev/null && { apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null; }; }; } || \
	  echo "WARNING: chromium/chromedriver missing and not installable with apt-get: the dashboard e2e test skips (fails under CI=true)" >&2
	touch $(STAMP)

setup: $(STAMP) ## create .venv, install fireflyer editable with dev tools, generate protos

test: $(STAMP) ## run the test suite (unit, integration against real nats-server/PostgreSQL, e2e)
	$(PY) -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

demo: $(STAMP) ## bring a local cluster up, show it working, bring it down
	$(VENV)/bin/ff demo --state-dir $(STATE)-demo

up: $(STAMP) ## start the local cluster (deploy/local.toml) under .ff (STATE=dir to change)
	$(VENV)/bin/ff up --state-dir $(STATE)

status: $(STAMP) ## show the local cluster's processes and health
	$(VENV)/bin/ff status --state-dir $(STATE)

down: $(STAMP) ## stop the local cluster started by `make up`
	$(VENV)/bin/ff down --state-dir $(STATE)

proto: $(STAMP) ## regenerate fireflyer.api from proto/ (grpcio-tools)
	$(PY) -m fireflyer.api.build

lint: $(STAMP) ## ruff, then the import rules (libs never import services; services never import each other; no import cycle inside a package; benchmarks only in fireflyer.bench)
	$(VENV)/bin/ruff check libs services tests
	$(PY) -m fireflyer.devtools.importrules libs services

bench: $(STAMP) ## run the benchmarks (one JSON object each on stdout)
	$(VENV)/bin/ff bench wire --size 64M --json
	$(VENV)/bin/ff bench kernels --size 64M --json

clean: ## remove the virtualenv, caches and local state dirs
	rm -rf $(VENV) .pytest_cache .ruff_cache $(STATE) $(STATE)-demo build *.egg-info libs/*.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
