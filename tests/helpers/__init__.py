"""Helpers the test modules share, one module per concern. Test modules import from these
modules (``from tests.helpers.data import make_version``), never from a conftest; fixtures
live in the conftest modules. Nothing here imports Django at module level (each function
imports what it needs), so that the runtime venv's tests, which have no Django, and the
benchmarks may import these modules too.

- system: the repository's root (ROOT) and a small disk a test can fill
- data: datasets and versions made by the real upload and import path, rows for each kind
- workdir: a job's workdir and spec for the runtime's tests (runtime venv, no Django)
- label_studio: labeling projects pushed to Label Studio, annotations as its members
- models: base models on disk made in the runtime venv, stored model versions
- routes: the URLconf's routes and an object for each URL argument
- jobs: waiting for a job, its loss and log events
- workers: real Celery and train workers on the suite's Redis and database
- serving: the serving host's management API, its OpenAI-compatible client, bare engines
- browser: the browser tests' steps (Playwright)
"""
