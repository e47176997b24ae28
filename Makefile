# Durable control plane: set-up, services, lint, tests.
#   make demo   - venv + services + migrations (+ the demo processes, later)
#   make test   - venv + services + lint + pytest but the whole-stack suites (.ci/run runs
#                 it, then make test-stack)
# GNU make 4.3; each recipe runs as one bash script (.ONESHELL) with -euo pipefail.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.ONESHELL:
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SERVICES_ENV := .data/services.env
PYTEST_ARGS ?=
BENCH_ARGS ?=

# Sources the URLs that `make services` resolved (shared or embedded servers).
LOAD_SERVICES := set -a; . ./$(SERVICES_ENV); set +a

.PHONY: help venv services services-stop browser nginx lint test test-stack bench soak fuzz property screenshot demo clean distclean

help:
	@echo "make demo    set up the venv, Postgres, Redis and the database, then run the demo"
	@echo "make test    lint + the test suite but the whole-stack suites (under 15 minutes)"
	@echo "make test-stack  the whole-stack suites: killed workers, the browser, the soak, the benchmarks' smoke runs"
	@echo "make soak    SOAK_SECONDS (600) of seeded load and faults on the real stack"
	@echo "make fuzz    schemathesis (every check) + huge numbers and deep nesting vs a real server"
	@echo "make property  PROPERTY_MINUTES (30) of the differential property test (tests/property)"
	@echo "other: venv services services-stop browser lint bench screenshot clean distclean"

venv: $(STAMP)

# Re-run only when the lock changes: the stamp is newer than requirements.txt.
$(STAMP): requirements.txt
	@if [ ! -x $(PY) ]; then
		echo "==> creating $(VENV) with $$($(PYTHON) --version)"
		$(PYTHON) -m venv $(VENV)
	fi
	echo "==> installing requirements.txt into $(VENV)"
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip check
	touch $@

services: venv
	@echo "==> services: finding or starting Postgres and Redis"
	$(PY) -m controlplane.dev.services ensure --env-file $(SERVICES_ENV)

services-stop:
	@if [ -x $(PY) ]; then $(PY) -m controlplane.dev.services stop --env-file $(SERVICES_ENV); fi

# Browser tests drive Debian's chromium (/usr/bin/chromium), never a browser Playwright
# downloads. Installed with apt-get when missing and we are root; otherwise say how.
browser:
	@if [ -x /usr/bin/chromium ]; then exit 0; fi
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "==> installing chromium and chromium-driver (apt-get)"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver
	else
		echo "!! /usr/bin/chromium is missing: the browser tests (tests/browser) will fail." >&2
		echo "!! Install it as root: apt-get install chromium chromium-driver" >&2
	fi

# The proxy tests (tests/unit/test_deploy_files.py, tests/e2e/test_proxy.py) run
# deploy/nginx.conf with Debian's nginx; installed with apt-get when missing and we are
# root, otherwise they are skipped saying so.
nginx:
	@if command -v nginx >/dev/null || [ -x /usr/sbin/nginx ]; then exit 0; fi
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "==> installing nginx-light (apt-get)"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light
	else
		echo "!! nginx is missing: the proxy tests will be skipped." >&2
		echo "!! Install it as root: apt-get install nginx-light" >&2
	fi

lint: venv
	@echo "==> ruff check"
	$(VENV)/bin/ruff check .
	echo "==> mypy $(wildcard kernel controlplane benchmarks)"
	$(VENV)/bin/mypy $(wildcard kernel controlplane benchmarks)

# `make test` is the inner loop and stays under 15 minutes: lint, then every test but the
# three suites that run the whole stack for minutes (Celery workers killed and waited
# out, Chromium against real servers, the soak). `make test-stack` runs those;
# CI (.ci/run) runs both.
# The benchmarks' smoke runs (each runs its benchmark briefly, on real workers for some)
# go with them: they take minutes, and what they guard is `make bench`.
STACK_SUITES := tests/chaos tests/browser tests/soak
BENCH_SMOKE := tests/integration/test_bench_*.py
test: venv services nginx
	@$(MAKE) --no-print-directory lint
	$(LOAD_SERVICES)
	echo "==> pytest tests/ but $(STACK_SUITES) and the benchmarks' smoke runs (DATABASE_URL=$$DATABASE_URL REDIS_URL=$$REDIS_URL)"
	$(VENV)/bin/pytest $(addprefix --ignore=,$(STACK_SUITES)) --ignore-glob='$(BENCH_SMOKE)' $(PYTEST_ARGS)

test-stack: venv services browser
	@$(LOAD_SERVICES)
	echo "==> pytest $(STACK_SUITES) and the benchmarks' smoke runs (DATABASE_URL=$$DATABASE_URL REDIS_URL=$$REDIS_URL)"
	$(VENV)/bin/pytest $(STACK_SUITES) $(wildcard $(BENCH_SMOKE)) $(PYTEST_ARGS)

# The soak (tests/soak): the real stack under seeded load and faults, then the invariants.
# SOAK_SECONDS (default 600) and SOAK_SEED (default: a fresh one, printed) reproduce a run;
# SOAK_FAULTS=all (or some of values,orphans,cancel-truth,bulk-set) adds the faults and
# checks today's kernel cannot survive yet (docs/reliability.md);
# the JSON report goes to .data/soak-report.json. `make test-stack` runs it for 20 s.
SOAK_SECONDS ?= 600
soak: venv services
	@$(LOAD_SERVICES)
	echo "==> soak for $(SOAK_SECONDS) s (SOAK_SEED=$${SOAK_SEED:-random}, SOAK_FAULTS=$${SOAK_FAULTS:-none})"
	SOAK_SECONDS=$(SOAK_SECONDS) SOAK_REPORT=$(CURDIR)/.data/soak-report.json \
		$(VENV)/bin/pytest -s -q tests/soak

# The differential property test (tests/property): Postgres with its fast paths, Postgres
# without, and the in-memory reference, in lockstep on random programs, for
# PROPERTY_MINUTES (default 30); it prints the seed and the example counts at the end.
# PROPERTY_SEED reproduces a run; PROPERTY_EXCLUDE leaves families of steps out (see
# tests/property/machine.py). Also runs the findings' regression tests (same marker).
PROPERTY_MINUTES ?= 30
property: venv services
	@$(LOAD_SERVICES)
	echo "==> differential property test for $(PROPERTY_MINUTES) minutes (PROPERTY_SEED=$${PROPERTY_SEED:-random})"
	PROPERTY_MINUTES=$(PROPERTY_MINUTES) $(VENV)/bin/pytest -s -q \
		-m property tests/property $(PYTEST_ARGS)

# The API fuzzed on a real Daphne with production settings (controlplane/dev/fuzz.py):
# targeted huge numbers and deep nesting, then `st run --checks all`; fails on any 5xx.
# FUZZ_ARGS passes options, e.g. FUZZ_ARGS="--max-examples 50 --seed 1". Long: not in `make test`.
FUZZ_ARGS ?=
fuzz: venv services
	@$(LOAD_SERVICES)
	echo "==> fuzz (python -m controlplane.dev.fuzz $(FUZZ_ARGS))"
	exec $(PY) -m controlplane.dev.fuzz $(FUZZ_ARGS)

# Benchmarks write their figures to docs/benchmarks.md. `make bench BENCH_ARGS=commit`
# runs one module; see benchmarks/__main__.py.
bench: venv services
	@$(LOAD_SERVICES)
	echo "==> benchmarks (python -m benchmarks $(BENCH_ARGS))"
	exec $(PY) -m benchmarks $(BENCH_ARGS)

# docs/ui-session.png: the session page at the end of the live demo-batch browser test;
# docs/screenshots/: every page, light and dark, as the accessibility test checked it.
screenshot: venv services browser
	@$(LOAD_SERVICES)
	UI_SCREENSHOT=$(CURDIR)/docs/ui-session.png $(VENV)/bin/pytest -q \
		"tests/browser/test_dashboard.py::test_the_demo_batch_goes_from_pending_to_succeeded_live"
	UI_SCREENSHOTS=$(CURDIR)/docs/screenshots $(VENV)/bin/pytest -q \
		"tests/browser/test_pages.py::test_every_page_passes_the_accessibility_check_in_light_and_dark_mode"

# Web (daphne), a worker, beat and the local email provider under honcho (Procfile);
# Ctrl-C stops them all. DEMO_PORT / EMAIL_PROVIDER_PORT move the ports.
demo: venv services
	@$(LOAD_SERVICES)
	export DEMO_PORT=$${DEMO_PORT:-8000} EMAIL_PROVIDER_PORT=$${EMAIL_PROVIDER_PORT:-8025}
	# A laptop demo: DEBUG on (the settings' built-in secret key is refused without it).
	export DJANGO_DEBUG=$${DJANGO_DEBUG:-1}
	export EMAIL_PROVIDER_URL=http://127.0.0.1:$$EMAIL_PROVIDER_PORT
	# The demo's Pydantic AI agent (offline), unless KERNEL_AGENTS names others.
	export KERNEL_AGENTS="$${KERNEL_AGENTS:-}"
	[ -n "$$KERNEL_AGENTS" ] || KERNEL_AGENTS='{"helpdesk": "kernel.hosts.pydantic_ai.demo.agent"}'
	echo "==> manage.py migrate"
	$(PY) manage.py migrate --noinput -v0
	echo "==> demo accounts and the five-email batch"
	$(PY) manage.py demo --url http://127.0.0.1:$$DEMO_PORT/
	echo "==> starting web, worker, beat and the email provider (Ctrl-C stops them all)"
	exec $(VENV)/bin/honcho start -f Procfile

# `remove` also deletes the embedded Postgres's data where it lives outside .data/ (as
# root, when the checkout is in a directory closed to other users).
clean:
	@if [ -x $(PY) ]; then $(PY) -m controlplane.dev.services remove --env-file $(SERVICES_ENV); fi
	echo "==> removing .data and caches"
	rm -rf .data .pytest_cache .mypy_cache .ruff_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	@rm -rf $(VENV)
