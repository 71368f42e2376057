# make run: install into .venv, migrate, start the whole platform (see platform/Procfile).
# make test: install with the test extras and run the whole suite.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
CATALOGS := $(wildcard locale/*/LC_MESSAGES/django.po)
COMPILED := $(CATALOGS:.po=.mo)

.PHONY: install install-test run test lint messages bench

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $@

# Translations are compiled with Babel at install: no GNU gettext needed on the machine.
locale/%/LC_MESSAGES/django.mo: locale/%/LC_MESSAGES/django.po $(VENV)/.installed
	$(VENV)/bin/pybabel compile -i $< -o $@

install: $(VENV)/.installed $(COMPILED)

install-test: install $(VENV)/.installed-test

run: install
	bash platform/start.sh

test: install-test
	$(PY) platform/embedded_redis.py run -- $(PY) -m pytest

lint: install-test
	$(VENV)/bin/ruff check .

# Refresh the catalogs from the sources (needs GNU gettext; developers only).
messages: install
	$(PY) manage.py makemessages --locale zh_Hans --no-obsolete --ignore '.venv/*' --ignore 'var/*' --ignore 'tests/*'

bench: install-test
	@set -e; for f in benchmarks/*.py; do [ -e "$$f" ] || continue; echo "== $$f"; $(PY) "$$f"; done
