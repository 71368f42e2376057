"""Load: console users and inference clients at once, for a bounded time, on loopback.

    make bench   # or: .venv/bin/python benchmarks/load.py [--seconds S] [--users N] [--smoke]

The console runs as `make run` runs it: gunicorn with platform/Procfile's web line (2 workers,
4 threads each), DEBUG off, on a throwaway data directory and SQLite database, or on a throwaway
database created on the PostgreSQL server of DATABASE_URL (dropped at the end). Redis is always
a throwaway one (platform/embedded_redis.py): the jobs the users submit stay queued, with no
train worker, and no worker of another Redis ever sees them. The inference side is a real
serving host (``python -m serving`` in the runtime venv) with one revision of
``ernie-micro-char`` trained by the job runner (benchmarks/_harness.py's helpers: one replica,
max_batch_size 32, max_wait_ms 2).

- ``--users`` (50) console users, each logged in (a session of its own account, an owner of the
  team), browse the team's pages one after another — dashboard, datasets, a dataset, a version,
  labeling, training jobs, a job, models, a model, endpoints, an endpoint, members, audit log,
  API lists — and every ``--submit-every``-th step submit a training job through the console's
  form (GET the form, POST it: a redirect to the new job's page).
- ``--clients`` (64) inference clients, each on a keep-alive connection, send one text a request
  to the endpoint and the next as soon as it is answered.

Both run together for ``--seconds`` (20) after ``--warmup`` (3). Before them, in the same run,
the baselines, each alone for ``--baseline-seconds``: the console's login page under the same
users (the framework's cost a request: middleware and a template, no database), and the bare
predictor (``runtime.inference.Predictor`` in a process of its own, batches of 32). The
ratios say what share of those the pages and the endpoint keep under the mixed load; on a
machine of 2 cores the two sides, the clients and the predictor share the CPUs.

Prints requests, requests/s, p50, p95 and errors per route; an error is any answer but the
expected one (200, or the redirect of a submitted form) or a failed connection. Ends with one
JSON line: console_rps, console_p95_ms, inference_rps, inference_p95_ms, errors, then the
baselines and ratios.
"""

import argparse
import html
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from pathlib import Path

import requests
from _harness import (
    LABELS,
    ROOT,
    Bare,
    Connection,
    Endpoint,
    Host,
    bench_team,
    free_port,
    import_version,
    jsonl,
    parse,
    print_result,
    quantile,
    requests_for,
    review_rows,
    setup_django,
    stop,
    train_export,
    under_redis,
)

TEAM = "bench"
CSRF_FIELD = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


class Stats:
    """Latencies (ms) and errors per route, for the answers completed in the window."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ms: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)
        self.first_error: dict[str, str] = {}
        self.window = (0.0, 0.0)

    def add(self, route: str, started: float, ok: bool, detail: str = "") -> None:
        done = time.perf_counter()
        if not self.window[0] <= done < self.window[1]:
            return
        with self.lock:
            if ok:
                self.ms[route].append((done - started) * 1000)
            else:
                self.errors[route] += 1
                self.first_error.setdefault(route, detail[:300])

    def routes(self) -> list[str]:
        return sorted(set(self.ms) | set(self.errors))

    def all_ms(self) -> list[float]:
        return [x for ms in self.ms.values() for x in ms]

    def total_errors(self) -> int:
        return sum(self.errors.values())


def p95(ms: list[float]) -> float | None:
    return round(quantile(ms, 0.95), 1) if ms else None


def throwaway_database(tmp: Path) -> tuple[str, Callable[[], None]]:
    """A database for this run alone: SQLite in ``tmp``, or a new database on the PostgreSQL
    server of DATABASE_URL; its URL and how to drop it."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        return f"sqlite:///{tmp}/load.sqlite3", lambda: None
    import psycopg

    name = f"bench_load_{secrets.token_hex(4)}"
    parts = urllib.parse.urlparse(url)
    admin = urllib.parse.urlunparse(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return urllib.parse.urlunparse(parts._replace(path=f"/{name}")), drop


def make_world(users: int, rows: list[dict]) -> dict:
    """The team, its members (each with a session: the cookie value), a dataset version made by
    the real import path, and some jobs, model versions and endpoints to browse."""
    from django.conf import settings
    from django.contrib.auth import (
        BACKEND_SESSION_KEY,
        HASH_SESSION_KEY,
        SESSION_KEY,
        get_user_model,
    )
    from django.contrib.auth.hashers import make_password
    from django.utils.module_loading import import_string

    from console.models import Membership
    from console.roles import Role
    from deployment.models import Endpoint as EndpointRow
    from deployment.models import Revision
    from training.models import ModelVersion, TrainingJob

    user_model = get_user_model()
    admin, team = bench_team("bench-admin")  # the team TEAM
    unusable = make_password(None)  # the users never log in with a password: sessions below
    members = user_model.objects.bulk_create(
        user_model(username=f"user{i:02d}", password=unusable) for i in range(users)
    )
    Membership.objects.bulk_create(Membership(team=team, user=u, role=Role.OWNER) for u in members)
    store = import_string(settings.SESSION_ENGINE + ".SessionStore")
    sessions = []
    for user in members:
        session = store()
        session[SESSION_KEY] = str(user.pk)
        session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
        session[HASH_SESSION_KEY] = user.get_session_auth_hash()
        session.create()
        sessions.append(session.session_key)

    mapping = {"text": "text", "label": "label"}
    version = import_version(admin, team, jsonl(rows), "jsonl", mapping)
    jobs = TrainingJob.objects.bulk_create(
        TrainingJob(
            team=team,
            name=f"earlier-{i}",
            dataset_version=version,
            task_kind="text_classification",
            labels=LABELS,
            preset="ernie-micro-char",
            backend="paddle",
            status=TrainingJob.Status.SUCCEEDED,
            created_by=admin,
        )
        for i in range(100)
    )
    models = ModelVersion.objects.bulk_create(
        ModelVersion(
            team=team,
            name="reviews",
            number=i + 1,
            job=jobs[i],
            dataset_version=version,
            task_kind="text_classification",
            labels=LABELS,
            backend="paddle",
            runtime="paddle_inference",
            base="ernie-micro-char",
            metrics={"accuracy": 0.9, "macro_f1": 0.9},
            storage_prefix=f"models/{i}/",
            created_by=admin,
        )
        for i in range(40)
    )
    endpoints = EndpointRow.objects.bulk_create(
        EndpointRow(team=team, name=f"reviews-{i}", task_kind="text_classification")
        for i in range(10)
    )
    Revision.objects.bulk_create(
        Revision(endpoint=e, number=1, model_version=models[i]) for i, e in enumerate(endpoints)
    )
    return {
        "sessions": sessions,
        "dataset": version.dataset_id,
        "version": version.number,
        "version_pk": version.pk,
        "job": jobs[0].pk,
        "model": models[0].pk,
        "endpoint": endpoints[0].pk,
    }


class Web:
    """The console under gunicorn, as platform/Procfile's web line starts it."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [
            str(Path(sys.executable).with_name("gunicorn")),
            "console.wsgi:application",
            "--bind",
            f"127.0.0.1:{self.port}",
            "--workers",
            os.environ.get("WEB_WORKERS", "2"),
            "--threads",
            "4",
            "--graceful-timeout",
            "10",
        ]
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=out)
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(self.url + "/login/", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                sys.exit(f"the console did not start; its log:\n{log.read_text()[-3000:]}")
            time.sleep(0.3)

    def stop(self) -> None:
        stop(self.proc, timeout=20)


def console_routes(world: dict) -> list[tuple[str, str]]:
    """(route name, path) of the pages a user browses, in turn."""
    t, d = f"/t/{TEAM}", f"/t/{TEAM}/datasets/{world['dataset']}"
    return [
        ("dashboard", f"{t}/"),
        ("datasets", f"{t}/datasets/"),
        ("dataset", f"{d}/"),
        ("version", f"{d}/v/{world['version']}/"),
        ("version rows", f"{d}/v/{world['version']}/rows/"),
        ("labeling", f"{t}/labeling/"),
        ("jobs", f"{t}/training/"),
        ("job", f"{t}/training/{world['job']}/"),
        ("models", f"{t}/models/"),
        ("model", f"{t}/models/{world['model']}/"),
        ("endpoints", f"{t}/endpoints/"),
        ("endpoint", f"{t}/endpoints/{world['endpoint']}/"),
        ("members", f"{t}/members/"),
        ("audit", f"{t}/audit/"),
        ("api jobs", f"/api/v1/teams/{TEAM}/training-jobs/"),
        ("api datasets", f"/api/v1/teams/{TEAM}/datasets/"),
    ]


def console_user(
    web: Web, cookie: str, world: dict, index: int, stats: Stats, until: float, submit_every: int
) -> None:
    from django.conf import settings

    http = requests.Session()
    http.cookies.set(settings.SESSION_COOKIE_NAME, cookie)
    routes = console_routes(world)
    step = index  # users start at different pages
    while time.perf_counter() < until:
        step += 1
        if submit_every and step % submit_every == 0:
            submit_job(web, http, world, f"load-{index}-{step}", stats)
            continue
        name, path = routes[step % len(routes)]
        started = time.perf_counter()
        try:
            r = http.get(web.url + path, allow_redirects=False, timeout=60)
            stats.add(name, started, r.status_code == 200, f"{r.status_code} {r.text[:200]}")
        except requests.RequestException as exc:
            stats.add(name, started, False, f"{type(exc).__name__}: {exc}")


def submit_job(web: Web, http: requests.Session, world: dict, name: str, stats: Stats) -> None:
    """The new-job form: GET it, POST it; the answer is a redirect to the job's page."""
    form_url = f"{web.url}/t/{TEAM}/training/new/"
    started = time.perf_counter()
    try:
        page = http.get(form_url, allow_redirects=False, timeout=60)
        token = CSRF_FIELD.search(page.text)
        if page.status_code != 200 or token is None:
            stats.add("submit job", started, False, f"form {page.status_code} {page.text[:200]}")
            return
        answer = http.post(
            form_url,
            data={
                "csrfmiddlewaretoken": html.unescape(token.group(1)),
                "dataset_version": world["version_pk"],
                "backend": "paddle",
                "model": "preset:",
                "device_type": "cpu",
                "device_count": 1,
                "priority": 5,
                "metric": "macro_f1",
                "name": name,
                "epochs": 1,
            },
            headers={"Referer": form_url},
            allow_redirects=False,
            timeout=60,
        )
        ok = answer.status_code == 302 and "/training/" in answer.headers.get("Location", "")
        stats.add("submit job", started, ok, f"{answer.status_code} {answer.text[:300]}")
    except requests.RequestException as exc:
        stats.add("submit job", started, False, f"{type(exc).__name__}: {exc}")


def inference_client(port: int, prepared: list[bytes], index: int, stats: Stats, until: float):
    n, conn = index * 7, None
    while time.perf_counter() < until:
        started = time.perf_counter()
        try:
            conn = conn or Connection(port)
            status, body = conn.call(prepared[n % len(prepared)])
            stats.add("predict", started, status == 200, f"{status} {body[:200]!r}")
        except (OSError, RuntimeError) as exc:
            stats.add("predict", started, False, f"{type(exc).__name__}: {exc}")
            if conn is not None:
                conn.close()
            conn = None
        n += 1
    if conn is not None:
        conn.close()


def run_window(workers: list[Callable[[Stats, float], None]], warmup: float, seconds: float):
    """Run every worker (a thread each) over warm-up + window; the window's statistics."""
    stats = Stats()
    start = time.perf_counter() + 0.2
    stats.window = (start + warmup, start + warmup + seconds)
    until = stats.window[1]
    threads = [threading.Thread(target=w, args=(stats, until), daemon=True) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + warmup + 120)
    return stats


def report(title: str, stats: Stats, seconds: float) -> None:
    print(title)
    print(f"  {'route':<14} {'requests':>8} {'rps':>8} {'p50 ms':>8} {'p95 ms':>8} {'errors':>6}")
    for route in stats.routes():
        ms = stats.ms.get(route, [])
        print(
            f"  {route:<14} {len(ms):>8} {len(ms) / seconds:>8.1f} {quantile(ms, 0.5):>8.1f} "
            f"{quantile(ms, 0.95):>8.1f} {stats.errors.get(route, 0):>6}"
        )
    for route, detail in stats.first_error.items():
        print(f"  first error of {route}: {detail}")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--users", type=int, default=50, help="console users")
    parser.add_argument("--clients", type=int, default=64, help="inference clients")
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("LOAD_SECONDS", 20)))
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--baseline-seconds", type=float, default=5.0)
    parser.add_argument("--submit-every", type=int, default=10, help="a user's steps per job")
    parser.add_argument("--rows", type=int, default=400, help="training rows")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--export", type=Path, help="an existing export: no training")
    # --smoke: a few users and clients for a second, one epoch on a few rows.
    smoke = {"users": 2, "clients": 2, "seconds": 1.0, "warmup": 0.5, "baseline_seconds": 0.5}
    args = parse(parser, smoke={**smoke, "submit_every": 3, "rows": 40, "epochs": 1})
    under_redis("LOAD_BENCH_REDIS")  # the users' jobs stay queued there, seen by no worker

    rows = review_rows(args.rows, filler=(18, 58))
    texts = [r["text"] for r in review_rows(512, seed=1, filler=(18, 58))]
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp_name:
        tmp = Path(tmp_name)
        database_url, drop_database = throwaway_database(tmp)
        web = host = bare = None
        try:
            setup_django(tmp, database_url, DEBUG="0")
            from django.core.management import call_command

            call_command("collectstatic", interactive=False, verbosity=0)
            world = make_world(args.users, rows)
            export = args.export
            if export is None:
                print(f"training ernie-micro-char on {args.rows} rows, {args.epochs} epochs")
                started = time.perf_counter()
                export = train_export(tmp / "job", rows, args.epochs)
                print(f"  trained and exported in {time.perf_counter() - started:.1f} s")
            texts_file = tmp / "texts.json"
            texts_file.write_text(json.dumps(texts, ensure_ascii=False), encoding="utf-8")
            web = Web(tmp / "web.log")
            host = Host(tmp / "host.log")
            endpoint = Endpoint(host, export, "load", 32, 2.0)
            endpoint.check(texts[0])
            prepared = requests_for(host, endpoint.api_key, texts)
            print(
                f"console: gunicorn 2 workers × 4 threads at {web.url}, "
                f"{'PostgreSQL' if database_url.startswith('postgres') else 'SQLite'}; "
                f"serving host at {host.url}; {os.cpu_count()} CPUs, load average "
                f"{os.getloadavg()[0]:.2f}",
                flush=True,
            )

            # Baselines, each alone.
            def login_page(stats: Stats, until: float) -> None:
                http = requests.Session()
                while time.perf_counter() < until:
                    started = time.perf_counter()
                    try:
                        r = http.get(web.url + "/login/", timeout=60)
                        stats.add("login page", started, r.status_code == 200, str(r.status_code))
                    except requests.RequestException as exc:
                        stats.add("login page", started, False, str(exc))

            base = run_window([login_page] * args.users, 1.0, args.baseline_seconds)
            report(f"baseline: the login page, {args.users} users", base, args.baseline_seconds)
            bare = Bare(export, texts_file, tmp / "bare.log")
            bare_rate = bare.measure(32, args.baseline_seconds)["samples_per_s"]
            bare.close()
            bare = None
            print(f"baseline: the bare predictor, batches of 32: {bare_rate:.0f} samples/s")

            users = [
                partial(console_user, web, cookie, world, i, submit_every=args.submit_every)
                for i, cookie in enumerate(world["sessions"])
            ]
            clients = [
                partial(inference_client, host.port, prepared, i) for i in range(args.clients)
            ]
            stats = run_window(users + clients, args.warmup, args.seconds)
            report(
                f"load: {args.users} console users and {args.clients} inference clients, "
                f"{args.seconds:g} s",
                stats,
                args.seconds,
            )
        finally:
            if web is not None:
                web.stop()
            if host is not None:
                host.stop()
            if bare is not None:
                bare.close()
            from django.db import connections

            connections.close_all()
            drop_database()

    predict_ms = stats.ms.get("predict", [])
    console_ms = [x for route, ms in stats.ms.items() if route != "predict" for x in ms]
    base_rps = len(base.all_ms()) / args.baseline_seconds
    console_rps = len(console_ms) / args.seconds
    inference_rps = len(predict_ms) / args.seconds
    print(
        f"console / login page: {console_rps / base_rps:.3f}; "
        f"inference / bare predictor: {inference_rps / bare_rate:.3f}"
    )
    print_result(
        {
            "console_rps": round(console_rps, 1),
            "console_p95_ms": p95(console_ms),
            "inference_rps": round(inference_rps, 1),
            "inference_p95_ms": p95(predict_ms),
            "errors": stats.total_errors() + base.total_errors(),
            "baseline_login_page_rps": round(base_rps, 1),
            "console_vs_login_page": round(console_rps / base_rps, 3),
            "baseline_bare_samples_per_s": round(bare_rate, 1),
            "inference_vs_bare": round(inference_rps / bare_rate, 3),
        }
    )


if __name__ == "__main__":
    main()
