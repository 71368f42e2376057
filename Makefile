# make run: install into .venv, migrate, start the whole platform (see platform/Procfile).
# make test: install with the test extras and run the whole suite.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
CATALOGS := $(wildcard locale/*/LC_MESSAGES/django.po)
COMPILED := $(CATALOGS:.po=.mo)

# The runtime venv: the job runner (python -m runtime.run) with Paddle and torch. Its own
# because PaddleNLP needs numpy 1.x and the console's Label Studio SDK numpy 2.
RT_VENV := .venv-runtime
RT_PY := $(RT_VENV)/bin/python

# The lite venv: Paddle Lite's converter and runtime (runtime/lite.py), whose wheels stop at
# Python 3.10. Where the node has no Python 3.10, the lite export target fails saying so.
LITE_VENV := .venv-lite
LITE_PY := $(LITE_VENV)/bin/python
PY310 := $(firstword $(wildcard $(HOME)/.pyenv/versions/3.10.*/bin/python) $(shell command -v python3.10 2>/dev/null))

LS_VENV := .venv-labelstudio
# Label Studio runs from its own venv (it pins its own Django); none is installed when
# LABEL_STUDIO_URL points at an existing server.
ifeq ($(LABEL_STUDIO_URL),)
LABEL_STUDIO := labelstudio
endif

.PHONY: install install-test runtime lite labelstudio run test lint messages bench bench-smoke offline-bundle

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml platform/runtime-dist/pyproject.toml | $(PY)
	@# python-ldap (django-auth-ldap's) has no wheel: it builds against OpenLDAP's headers.
	@if [ ! -e /usr/include/ldap.h ] || [ ! -e /usr/include/sasl/sasl.h ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get install -y -q libldap2-dev libsasl2-dev >/dev/null || \
	    { apt-get update -q && apt-get install -y -q libldap2-dev libsasl2-dev; }; \
	  else echo "install OpenLDAP's headers first: apt-get install libldap2-dev libsasl2-dev"; exit 1; fi; \
	fi
	$(PY) -m pip install --quiet -e .
	# runtime/ and serving/ are a distribution of their own (with the backends' entry points),
	# installed in both venvs: the apps import them.
	$(PY) -m pip install --quiet --no-deps -e platform/runtime-dist
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml tests/oidc/package-lock.json tests/e2e/axe/package-lock.json
	$(PY) -m pip install --quiet -e '.[test,bench]'
	@# The single sign-on tests' OpenID provider (tests/oidc/): the certified oidc-provider;
	@# axe-core for the browser tests' accessibility check (tests/e2e/axe/).
	@if command -v npm >/dev/null; then npm ci --prefix tests/oidc --no-audit --no-fund --silent; \
	npm ci --prefix tests/e2e/axe --no-audit --no-fund --silent; \
	else echo "no npm: the single sign-on and accessibility tests will be skipped (install Node.js)"; fi
	touch $@

# Translations are compiled with Babel at install: no GNU gettext needed on the machine.
locale/%/LC_MESSAGES/django.mo: locale/%/LC_MESSAGES/django.po $(VENV)/.installed
	$(VENV)/bin/pybabel compile -i $< -o $@

$(RT_VENV)/.installed: platform/requirements/runtime.txt platform/runtime-dist/pyproject.toml
	test -x $(RT_PY) || $(PYTHON) -m venv $(RT_VENV)
	$(RT_PY) -m pip install --quiet --upgrade pip
	$(RT_PY) -m pip install --quiet -r platform/requirements/runtime.txt pytest pytest-xdist==3.8.0
	# runtime/ and serving/ only, with the backends' entry points: no Django, no app.
	$(RT_PY) -m pip uninstall --quiet --yes model-platform 2>/dev/null || true
	$(RT_PY) -m pip install --quiet --no-deps -e platform/runtime-dist
	touch $@

runtime: $(RT_VENV)/.installed
	@# As root, runners and predictors run as PLATFORM_RUNNER_USER (runtime/sandbox.py): it must
	@# reach the runtime's interpreter (a pyenv one under /root, say): o+x, passing, not listing.
	@if [ "$$(id -u)" = 0 ]; then d=$$(dirname "$$(readlink -f $(RT_PY))"); \
	  while [ "$$d" != / ]; do [ -n "$$(find "$$d" -maxdepth 0 -perm -o+x)" ] || \
	    { echo "chmod o+x $$d (for the runner's user)"; chmod o+x "$$d"; }; d=$$(dirname "$$d"); done; fi

$(LITE_VENV)/.installed: platform/requirements/lite.txt
	@if [ -z "$(PY310)" ]; then echo "lite: no Python 3.10 on this node: the lite export target will fail"; exit 0; fi; \
	  set -e; test -x $(LITE_PY) || $(PY310) -m venv $(LITE_VENV); \
	  $(LITE_PY) -m pip install --quiet --upgrade pip; \
	  $(LITE_PY) -m pip install --quiet -r platform/requirements/lite.txt; touch $@

lite: $(LITE_VENV)/.installed
	@# As for the runtime venv: the runner's user must reach the interpreter.
	@if [ "$$(id -u)" = 0 ] && [ -x $(LITE_PY) ]; then d=$$(dirname "$$(readlink -f $(LITE_PY))"); \
	  while [ "$$d" != / ]; do [ -n "$$(find "$$d" -maxdepth 0 -perm -o+x)" ] || \
	    { echo "chmod o+x $$d (for the runner's user)"; chmod o+x "$$d"; }; d=$$(dirname "$$d"); done; fi

install: $(VENV)/.installed $(COMPILED) runtime lite

install-test: install $(VENV)/.installed-test

$(LS_VENV)/.installed:
	$(PYTHON) -m venv $(LS_VENV)
	$(LS_VENV)/bin/pip install --quiet --upgrade pip
	$(LS_VENV)/bin/pip install --quiet label-studio==1.23.2
	touch $@

labelstudio: $(LS_VENV)/.installed

run: install $(LABEL_STUDIO)
	bash platform/start.sh

# tests/runtime runs in the runtime venv (backends, metrics: no Django), the rest in .venv.
# Each in TEST_PROCESSES processes (pytest-xdist): the suite mostly waits on one process at a
# time (a worker, a runner, Label Studio), so two keep both cores of a small machine busy.
# tests/settings.py keeps the processes apart. Each process takes the tests in the suite's
# order (pytest-django's: the transactional ones, with the session's workers, last); a module
# with fixtures of its own scope is one `xdist_group`, run whole in one process.
TEST_PROCESSES ?= 2
XDIST := -n $(TEST_PROCESSES) --dist loadgroup
test: install-test $(LABEL_STUDIO)
	$(RT_PY) -m pytest tests/runtime -p no:django -p no:cacheprovider --noconftest $(XDIST)
	$(PY) platform/embedded_redis.py run -- $(PY) platform/label_studio.py run -- $(PY) -m pytest $(XDIST)

# The gates .ci/run passes through before the suite: style, the contracts between the packages
# (import-linter, [tool.importlinter]), the types of runtime/ and serving/ (mypy, [tool.mypy]),
# and no model change without its migration.
lint: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	DJANGO_SETTINGS_MODULE=tests.settings $(PY) manage.py makemigrations --check --dry-run

# Refresh the catalogs from the sources (needs GNU gettext; developers only).
messages: install
	$(PY) manage.py makemessages --locale zh_Hans --no-obsolete --ignore '.venv/*' --ignore '.venv-runtime/*' --ignore '.venv-labelstudio/*' --ignore 'var/*' --ignore 'tests/*'

bench: install-test
	@set -e; for f in benchmarks/[!_]*.py; do [ -e "$$f" ] || continue; echo "== $$f"; $(PY) "$$f"; done

# Every benchmark at its smoke size (--smoke: seconds each), checking that it still ends with its
# JSON line, not its figures; `make test` runs the same test with the rest of the suite.
bench-smoke: install-test $(LABEL_STUDIO)
	$(PY) platform/embedded_redis.py run -- $(PY) platform/label_studio.py run -- $(PY) -m pytest tests/test_benchmarks.py

# The air-gapped install (platform/offline/README.md): on a machine with registry access, one
# archive with the wheelhouses of the three venvs, the static files and install.sh, in dist/.
OFFLINE_DIR ?= dist
offline-bundle: $(VENV)/.installed
	$(PY) platform/offline/build.py --output $(OFFLINE_DIR)
